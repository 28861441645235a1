// Cosmos DB for NoSQL: the idempotency store. Keys are disabled; the app uses
// Entra ID with the built-in Data Contributor role (assigned in rbac.bicep).
// In the private profile public network access is off and the account is
// reached through its private endpoint (main.bicep). The payment documents are
// the permanent ledger: the production profile puts a CanNotDelete lock on the
// account.
// The container below must stay equal to infra/cosmos-container.json, which
// scripts/check_container_definition.py enforces in CI: the partition key and
// the unique key policy cannot be changed after creation.

@description('Cosmos DB account name (3-44 lowercase letters, digits, hyphens).')
@minLength(3)
@maxLength(44)
param accountName string

@description('Azure region (single region, single write location).')
param location string

@description('Tags applied to the account.')
param tags object

@description('serverless: pay per request unit, for spiky low volume. autoscale: provisioned throughput on the container.')
@allowed([
  'serverless'
  'autoscale'
])
param capacityMode string

@description('Autoscale ceiling in RU/s for the container (ignored when serverless).')
@minValue(1000)
@maxValue(1000000)
param autoscaleMaxThroughput int

@description('Default consistency. Strong (recommended) lets a reader that got a 409 see the committed document at once. BoundedStaleness and Session are supported: a read after another instance\'s 409 may miss the document for a moment, and the store answers retry-later (redelivery) instead of a store failure. Eventual and ConsistentPrefix are refused: their lag has no bound. See docs/reference.md section 5.')
@allowed([
  'Strong'
  'BoundedStaleness'
  'Session'
])
param consistencyLevel string

@description('Database name (COSMOS_DATABASE).')
param databaseName string

@description('Enabled (public profile) or Disabled (private profile: private endpoint only).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Spread the replicas over availability zones. Fixed when the account (region) is created.')
param zoneRedundant bool

@description('Put a CanNotDelete lock on the account (the payment ledger is permanent).')
param deleteLock bool

@description('Log Analytics workspace that receives the data-plane and control-plane logs and its metrics (diagnostic setting).')
param workspaceId string

var serverless = capacityMode == 'serverless'

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' = {
  name: accountName
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: consistencyLevel
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: zoneRedundant
      }
    ]
    capabilities: serverless ? [
      {
        name: 'EnableServerless'
      }
    ] : []
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: publicNetworkAccess
    enableAutomaticFailover: false
    enableMultipleWriteLocations: false
    enableFreeTier: false
    // Point-in-time restore of the payment ledger; the 7-day tier has no extra charge.
    backupPolicy: {
      type: 'Continuous'
      continuousModeProperties: {
        tier: 'Continuous7Days'
      }
    }
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-11-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
  }
}

resource container 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'payments'
  properties: {
    // Written out literally (not loadJsonContent) so the CI comparison with
    // infra/cosmos-container.json checks what is really deployed.
    resource: {
      id: 'payments'
      partitionKey: {
        paths: [
          '/claimId'
        ]
        kind: 'Hash'
        version: 2
      }
      defaultTtl: -1
      uniqueKeyPolicy: {
        uniqueKeys: [
          {
            paths: [
              '/docType'
              '/dedupKey'
            ]
          }
        ]
      }
      // Only what the queries filter or sort on and the unique key paths: every
      // indexed value costs request units on each write (see
      // crates/claims-payments-cosmos/src/container.rs INDEXED_PATHS). Changeable in place.
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          {
            path: '/docType/?'
          }
          {
            path: '/dedupKey/?'
          }
          {
            path: '/createdAt/?'
          }
          {
            path: '/status/?'
          }
        ]
        excludedPaths: [
          {
            path: '/*'
          }
          {
            path: '/"_etag"/?'
          }
        ]
      }
    }
    options: serverless ? {} : {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    }
  }
}

// The account, its database and container (children are covered by the lock).
// Deleting them needs the lock removed first, which needs
// Microsoft.Authorization/locks/delete (Owner or User Access Administrator).
resource ledgerLock 'Microsoft.Authorization/locks@2020-05-01' = if (deleteLock) {
  name: 'payments-ledger-cannot-delete'
  scope: account
  properties: {
    level: 'CanNotDelete'
    notes: 'Payment documents are the permanent ledger of claims paid; they must never be deleted with the account.'
  }
}

// Data-plane requests (status codes, RU, 429s) and control-plane changes, in resource-specific tables.
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: account
  properties: {
    workspaceId: workspaceId
    logAnalyticsDestinationType: 'Dedicated'
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'Requests'
        enabled: true
      }
    ]
  }
}

output accountName string = account.name
output accountId string = account.id
output endpoint string = account.properties.documentEndpoint
output databaseName string = database.name
output containerName string = container.name
