// Flex Consumption (FC1) plan and the Linux function app that runs the Rust
// custom handler. On Flex the runtime lives in functionAppConfig.runtime, so
// FUNCTIONS_WORKER_RUNTIME, FUNCTIONS_EXTENSION_VERSION, WEBSITE_RUN_FROM_PACKAGE
// and WEBSITE_CONTENT* must not be app settings.
//
// Private profile: the app joins the delegated subnet (virtualNetworkSubnetId;
// Flex routes all outbound traffic through it, so vnetRouteAllEnabled is not
// set) and public network access is off; callers of POST /api/payments and the
// one-deploy client reach it through its private endpoint (main.bicep).
//
// Callers: App Service Authentication (authsettingsV2) answers 401 to any HTTP
// request without a valid Entra ID token for the API's app registration (or,
// with a linked Static Web App, without the Static Web App's signed-in user),
// and forwards the caller's principal in X-MS-CLIENT-PRINCIPAL; the handler
// (HTTP_AUTH=appservice) scopes Idempotency-Keys by it and checks the app roles
// Payments.Pay (POST) and Payments.Read (GET of any payment).

@description('Function app name (also the default host name).')
param name string

@description('Flex Consumption plan name.')
param planName string

@description('Azure region (must offer Flex Consumption).')
param location string

@description('Tags applied to the plan and the app.')
param tags object

@description('Resource id of the user-assigned identity.')
param identityId string

@description('Client id of the user-assigned identity.')
param identityClientId string

@description('Host storage account name.')
param storageAccountName string

@description('Blob endpoint of the host storage account, with trailing slash.')
param storageBlobEndpoint string

@description('Blob container that receives deployed packages.')
param deploymentContainerName string

@description('Upper bound of instances; each runs up to host.json maxConcurrentCalls invocations.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory per instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

@description('Allow basic-auth (publishing profile) deployments. Entra-authenticated deployments work without it.')
param allowBasicPublishingCredentials bool

@description('Application Insights connection string.')
param appInsightsConnectionString string

@description('Service Bus namespace host name, e.g. sb-x.servicebus.windows.net.')
param serviceBusFullyQualifiedNamespace string

@description('Queue the ClaimApproved function reads.')
param queueName string

@description('PAYMENTS_STORE: cosmos or postgres. Only that store\'s settings are written (COSMOS_* or PAYMENTS_POSTGRES_*).')
@allowed([
  'cosmos'
  'postgres'
])
param storeKind string

@description('Cosmos DB account endpoint (storeKind cosmos).')
param cosmosEndpoint string

@description('Cosmos DB database.')
param cosmosDatabaseName string

@description('Cosmos DB container.')
param cosmosContainerName string

@description('PostgreSQL server host name, <server>.postgres.database.azure.com (storeKind postgres).')
param postgresHost string

@description('PostgreSQL database (storeKind postgres).')
param postgresDatabaseName string

@description('PostgreSQL role the app logs in as: the user-assigned identity\'s name, created in the server with pgaadauth_create_principal_with_oid (docs/deploy.md, 4.6).')
param postgresUser string

@description('Days an inbox record lives (Cosmos ttl; the Purge timer on PostgreSQL).')
param inboxRetentionDays int

@description('Consumer name stored in inbox documents.')
param consumerName string

@description('Bank payout API base URL; empty means ledger only.')
param bankApiUrl string

@description('Timeout of one bank call in ms.')
param bankTimeoutMs int

@description('Hours the bank honours an Idempotency-Key.')
param bankKeyWindowHours int

@description('Total retry budget of one invocation in ms.')
param retryBudgetMs int

@description('Processing lease in ms.')
param leaseMs int

@description('Wait for a live attempt of the same message in ms.')
param inflightWaitMs int

@description('NCRONTAB schedule of the Reconcile timer function (RECONCILE_SCHEDULE): every 10 minutes by default.')
param reconcileSchedule string = '0 */10 * * * *'

@description('NCRONTAB schedule of the Purge timer function (PURGE_SCHEDULE): daily at 03:30. It applies INBOX_RETENTION_DAYS on PostgreSQL and SQLite; on Cosmos DB the ttl does it and a run only says so.')
param purgeSchedule string = '0 30 3 * * *'

@description('RECONCILE_MIN_AGE_MS: an in_progress payout is settled by the timer only once its lease ran out this long ago (three leases).')
param reconcileMinAgeMs int = 360000

@description('HTTP_AUTH: how the payments API scopes callers. appservice: App Service Authentication (authsettingsV2 below, Entra ID) in front, scope = caller tenant + object id, app roles checked by the handler. functionkey: no App Service Authentication (local runs only: the package\'s HTTP functions are anonymous at the host).')
@allowed([
  'functionkey'
  'appservice'
])
param httpAuth string

@description('Client id of the API\'s Entra app registration (defines the app roles Payments.Pay and Payments.Read); App Service Authentication accepts access tokens issued for it.')
param apiClientId string

@description('Default host name of the Static Web App whose linked backend this app is; empty = none.')
param staticWebAppHostName string

@description('Log Analytics workspace that receives the app\'s logs and metrics (diagnostic setting).')
param workspaceId string

@description('IDEMPOTENCY_KEY_RETENTION_HOURS: how long an HTTP Idempotency-Key is remembered.')
param idempotencyKeyRetentionHours int = 24

@description('Origins allowed to call the payments API from a browser (CORS, enforced by the platform in front of the handler): the web client\'s origin only, never *. Empty: no cross-origin callers (a Static Web App calls same-origin through its linked backend). The handler itself only listens on 127.0.0.1 behind the host.')
param corsAllowedOrigins array

@description('The queue\'s maxDeliveryCount, passed to the handler (MAX_DELIVERY_COUNT) for its start-up check.')
@minValue(2)
@maxValue(2000)
param maxDeliveryCount int

@description('Key Vault secret URI of the bank credential, without a version (the app follows the current version).')
param bankApiKeySecretUri string

@description('Enabled (public profile) or Disabled (private profile: private endpoint only, for the app and its SCM/one-deploy endpoint).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Subnet delegated to Microsoft.App/environments for VNet integration; empty = none (public profile).')
param virtualNetworkSubnetId string

@description('Zone-redundant plan (needs a region that supports it and ZRS host storage; keeps at least two always-ready instances per function group, which are billed).')
param zoneRedundant bool

var storageSuffix = environment().suffixes.storage
var usePostgres = storeKind == 'postgres'

// App settings every store shares; the store's own follow (cosmosSettings or
// postgresSettings), so a deployment carries only the settings of the store it uses.
var commonSettings = [
    {
      name: 'AzureWebJobsStorage__credential'
      value: 'managedidentity'
    }
    {
      name: 'AzureWebJobsStorage__clientId'
      value: identityClientId
    }
    {
      name: 'AzureWebJobsStorage__blobServiceUri'
      value: 'https://${storageAccountName}.blob.${storageSuffix}'
    }
    {
      name: 'AzureWebJobsStorage__queueServiceUri'
      value: 'https://${storageAccountName}.queue.${storageSuffix}'
    }
    {
      name: 'AzureWebJobsStorage__tableServiceUri'
      value: 'https://${storageAccountName}.table.${storageSuffix}'
    }
    {
      name: 'ServiceBusConnection__fullyQualifiedNamespace'
      value: serviceBusFullyQualifiedNamespace
    }
    {
      name: 'ServiceBusConnection__credential'
      value: 'managedidentity'
    }
    {
      name: 'ServiceBusConnection__clientId'
      value: identityClientId
    }
    {
      name: 'CLAIM_APPROVED_QUEUE'
      value: queueName
    }
    {
      name: 'INBOX_RETENTION_DAYS'
      value: string(inboxRetentionDays)
    }
    {
      name: 'CONSUMER_NAME'
      value: consumerName
    }
    {
      name: 'BANK_API_URL'
      value: bankApiUrl
    }
    {
      // Resolved by the platform from Key Vault; the value never appears in the template or the settings.
      name: 'BANK_API_KEY'
      value: '@Microsoft.KeyVault(SecretUri=${bankApiKeySecretUri})'
    }
    {
      name: 'BANK_TIMEOUT_MS'
      value: string(bankTimeoutMs)
    }
    {
      name: 'BANK_KEY_WINDOW_HOURS'
      value: string(bankKeyWindowHours)
    }
    {
      name: 'RETRY_BUDGET_MS'
      value: string(retryBudgetMs)
    }
    {
      name: 'LEASE_MS'
      value: string(leaseMs)
    }
    {
      name: 'INFLIGHT_WAIT_MS'
      value: string(inflightWaitMs)
    }
    {
      name: 'MAX_DELIVERY_COUNT'
      value: string(maxDeliveryCount)
    }
    {
      name: 'RECONCILE_SCHEDULE'
      value: reconcileSchedule
    }
    {
      name: 'PURGE_SCHEDULE'
      value: purgeSchedule
    }
    {
      name: 'HTTP_AUTH'
      value: httpAuth
    }
    {
      name: 'IDEMPOTENCY_KEY_RETENTION_HOURS'
      value: string(idempotencyKeyRetentionHours)
    }
    {
      name: 'RECONCILE_MIN_AGE_MS'
      value: string(reconcileMinAgeMs)
    }
    {
      name: 'LOG_FORMAT'
      value: 'json'
    }
    {
      name: 'RUST_LIB_BACKTRACE'
      value: '0'
    }
    {
      name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
      value: appInsightsConnectionString
    }
    {
      name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
      value: 'ClientId=${identityClientId};Authorization=AAD'
    }
]

var cosmosSettings = [
  {
    name: 'PAYMENTS_STORE'
    value: 'cosmos'
  }
  {
    name: 'COSMOS_ENDPOINT'
    value: cosmosEndpoint
  }
  {
    name: 'COSMOS_DATABASE'
    value: cosmosDatabaseName
  }
  {
    name: 'COSMOS_CONTAINER'
    value: cosmosContainerName
  }
  {
    name: 'COSMOS_MANAGED_IDENTITY_CLIENT_ID'
    value: identityClientId
  }
]

// Entra only: the identity's token is the password, so the URL holds no secret (a plain
// setting, not a Key Vault reference). sslmode=verify-full: TLS with the certificate
// chain and the host name checked (the handler refuses a weaker mode for a remote host).
var postgresSettings = [
  {
    name: 'PAYMENTS_STORE'
    value: 'postgres'
  }
  {
    name: 'PAYMENTS_POSTGRES_URL'
    value: 'postgresql://${postgresUser}@${postgresHost}:5432/${postgresDatabaseName}?sslmode=verify-full'
  }
  {
    name: 'PAYMENTS_POSTGRES_AUTH'
    value: 'entra'
  }
  {
    name: 'PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID'
    value: identityClientId
  }
]

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    clientCertEnabled: false
    publicNetworkAccess: publicNetworkAccess
    virtualNetworkSubnetId: empty(virtualNetworkSubnetId) ? null : virtualNetworkSubnetId
    // Key Vault references (BANK_API_KEY) resolve with the user-assigned identity.
    keyVaultReferenceIdentity: identityId
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      // A front end on another origin calls POST /api/payments from the browser: the
      // platform answers the preflight; Idempotency-Key must be an allowed header, and
      // Retry-After / Idempotent-Replayed / Location are read only where exposed (the
      // web client decides by status and problem type, so it stays correct without them).
      cors: {
        allowedOrigins: corsAllowedOrigins
        supportCredentials: !empty(corsAllowedOrigins)
      }
      appSettings: concat(commonSettings, usePostgres ? postgresSettings : cosmosSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storageBlobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'custom'
        version: '1.0'
      }
    }
  }
}

resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: allowBasicPublishingCredentials
  }
}

resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

// App Service Authentication in front of every HTTP route: no token, no request
// reaches the handler (401). Bearer tokens for the API registration are validated
// (issuer = this tenant, audience = the API); no client secret, no login redirect:
// browsers sign in through the Static Web App (or get a token with MSAL).
resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (httpAuth == 'appservice') {
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
    }
    httpSettings: {
      requireHttps: true
      routes: {
        apiPrefix: '/.auth'
      }
      forwardProxy: {
        convention: 'NoProxy'
      }
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: apiClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${apiClientId}'
            apiClientId
          ]
        }
      }
      // A linked Static Web App signs its users in and calls the backend with its own token.
      azureStaticWebApps: {
        enabled: !empty(staticWebAppHostName)
        registration: {
          clientId: staticWebAppHostName
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: site
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output name string = site.name
output id string = site.id
output defaultHostName string = site.properties.defaultHostName
