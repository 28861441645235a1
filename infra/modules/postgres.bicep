// Azure Database for PostgreSQL flexible server: the store when storeKind is
// 'postgres' (main.bicep). Microsoft Entra authentication only: password
// authentication is off, so no password exists anywhere. One Entra principal
// (an operators' group, recommended) is the server's Entra administrator; it
// creates the app identity's database role once and runs
// `claims-payments provision` (docs/deploy.md, 4.6). The app logs in as its
// user-assigned identity with an Entra token as the password.
//
// Order matters: the database is created after the Entra administrator. Created
// on an Entra-only server before any administrator exists, it would belong to
// azuresu, the service's own superuser, and nobody could grant on it
// (hashicorp/terraform-provider-azurerm#27895); after it, it belongs to the
// administrator, whose members can then create the schema in it.
//
// TLS: require_secure_transport is on by default on flexible server; it is set
// here explicitly (with TLS 1.2 as the lowest version) so that a later change in
// the portal is undone by the next deployment and CI can check it.
// Private profiles: public network access off, reached through a private
// endpoint (main.bicep, privatelink.postgres.database.azure.com). The public
// profile keeps the public endpoint with firewall rules (Azure services, and an
// optional operator address).

@description('Server name (3-63 lowercase letters, digits, hyphens); the host is <name>.postgres.database.azure.com.')
@minLength(3)
@maxLength(63)
param serverName string

@description('Azure region.')
param location string

@description('Tags applied to the server.')
param tags object

@description('PostgreSQL major version.')
@allowed([
  '16'
  '17'
])
param version string

@description('Compute size, for example Standard_B1ms (Burstable) or Standard_D2ds_v5 (GeneralPurpose).')
param skuName string

@description('Compute tier of skuName. High availability needs GeneralPurpose or MemoryOptimized.')
@allowed([
  'Burstable'
  'GeneralPurpose'
  'MemoryOptimized'
])
param skuTier string

@description('Storage in GB (grows automatically).')
@minValue(32)
@maxValue(32767)
param storageSizeGB int

@description('Disabled, ZoneRedundant (standby in another availability zone: production) or SameZone.')
@allowed([
  'Disabled'
  'ZoneRedundant'
  'SameZone'
])
param highAvailability string

@description('Days of point-in-time restore.')
@minValue(7)
@maxValue(35)
param backupRetentionDays int

@description('Geo-redundant backup (fixed when the server is created).')
@allowed([
  'Enabled'
  'Disabled'
])
param geoRedundantBackup string

@description('Enabled (public profile: firewall rules below) or Disabled (private profiles: private endpoint only).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Public profile only: an operator\'s IPv4 address allowed through the firewall (one-time role set-up, provision, psql); empty = none.')
param operatorClientIp string

@description('Object id of the Microsoft Entra administrator (a group of operators, recommended).')
param administratorObjectId string

@description('Display name of the Entra administrator: the PostgreSQL role name its members log in with.')
param administratorName string

@description('Type of the Entra administrator.')
@allowed([
  'Group'
  'User'
  'ServicePrincipal'
])
param administratorType string

@description('Database the service uses (in PAYMENTS_POSTGRES_URL).')
param databaseName string

@description('CanNotDelete lock on the server: the payment ledger is permanent.')
param deleteLock bool

@description('Log Analytics workspace that receives the server\'s logs and metrics (diagnostic setting).')
param workspaceId string

var publicEndpoint = publicNetworkAccess == 'Enabled'

resource server 'Microsoft.DBforPostgreSQL/flexibleServers@2025-08-01' = {
  name: serverName
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuTier
  }
  properties: {
    version: version
    // Entra only: no administratorLogin, no password.
    authConfig: {
      activeDirectoryAuth: 'Enabled'
      passwordAuth: 'Disabled'
      tenantId: tenant().tenantId
    }
    storage: {
      storageSizeGB: storageSizeGB
      autoGrow: 'Enabled'
    }
    backup: {
      backupRetentionDays: backupRetentionDays
      geoRedundantBackup: geoRedundantBackup
    }
    highAvailability: {
      mode: highAvailability
    }
    network: {
      publicNetworkAccess: publicNetworkAccess
    }
    createMode: 'Default'
  }
}

resource administrator 'Microsoft.DBforPostgreSQL/flexibleServers/administrators@2025-08-01' = {
  parent: server
  name: administratorObjectId
  properties: {
    principalName: administratorName
    principalType: administratorType
    tenantId: tenant().tenantId
  }
}

// After the administrator: the administrator's role owns the database (see the top).
resource database 'Microsoft.DBforPostgreSQL/flexibleServers/databases@2025-08-01' = {
  parent: server
  name: databaseName
  properties: {
    charset: 'UTF8'
    collation: 'en_US.utf8'
  }
  dependsOn: [
    administrator
  ]
}

// One server operation at a time: each waits for the one before.
resource secureTransport 'Microsoft.DBforPostgreSQL/flexibleServers/configurations@2025-08-01' = {
  parent: server
  name: 'require_secure_transport'
  properties: {
    value: 'on'
    source: 'user-override'
  }
  dependsOn: [
    database
  ]
}

resource minTls 'Microsoft.DBforPostgreSQL/flexibleServers/configurations@2025-08-01' = {
  parent: server
  name: 'ssl_min_protocol_version'
  properties: {
    value: 'TLSv1.2'
    source: 'user-override'
  }
  dependsOn: [
    secureTransport
  ]
}

// Public profile: the Flex Consumption app calls from shared Azure addresses it cannot
// pin, so the firewall lets Azure's addresses in (0.0.0.0 is Azure's marker for that);
// what lets a caller in is an Entra token of a principal with a role in this server.
resource allowAzure 'Microsoft.DBforPostgreSQL/flexibleServers/firewallRules@2025-08-01' = if (publicEndpoint) {
  parent: server
  name: 'AllowAllAzureServicesAndResourcesWithinAzureIps'
  properties: {
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
  dependsOn: [
    minTls
  ]
}

resource allowOperator 'Microsoft.DBforPostgreSQL/flexibleServers/firewallRules@2025-08-01' = if (publicEndpoint && !empty(operatorClientIp)) {
  parent: server
  name: 'operator'
  properties: {
    startIpAddress: operatorClientIp
    endIpAddress: operatorClientIp
  }
  dependsOn: [
    allowAzure
  ]
}

resource ledgerLock 'Microsoft.Authorization/locks@2020-05-01' = if (deleteLock) {
  name: 'payments-ledger-cannot-delete'
  scope: server
  properties: {
    level: 'CanNotDelete'
    notes: 'The payments table is the permanent ledger of claims paid; it must never be deleted with the server.'
  }
}

// Server logs (PostgreSQLLogs: connections, errors, failovers) and metrics, in resource-specific tables.
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: server
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
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output serverName string = server.name
output serverId string = server.id
output fqdn string = server.properties.fullyQualifiedDomainName
output databaseName string = database.name
