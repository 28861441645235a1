// claims-payments: Service Bus queue -> Flex Consumption function app (Rust
// custom handler) -> Cosmos DB or, with storeKind 'postgres', Azure Database for
// PostgreSQL flexible server (Entra only), all reached with one user-assigned identity.
// Two network profiles (networkProfile), three parameter files:
//   public  - infra/main.bicepparam: services on their public endpoints, Entra ID
//             only, keys off. For development and evaluation.
//   private - infra/main.private.bicepparam (production): its own VNet with an
//             NSG on every subnet, NAT gateway with a static outbound IP,
//             private endpoints and private DNS zones for Cosmos DB, host
//             storage, Service Bus (Premium), Key Vault, Azure Monitor (AMPLS),
//             PostgreSQL (storeKind 'postgres') and the app itself; public
//             network access off everywhere.
//   private in a landing zone - infra/main.landingzone.bicepparam: the platform
//             team's spoke subnets (their NSGs, their route to the hub
//             firewall), central privatelink.* zones, workspace, action group
//             and Azure Monitor Private Link Scope are passed in; the template
//             creates no VNet, NAT gateway, public IP, private DNS zone,
//             workspace or action group of its own.
// Every profile puts App Service Authentication (Entra ID) in front of the HTTP
// API (HTTP_AUTH=appservice); app roles Payments.Pay and Payments.Read.
// Deploy: az deployment group create -g <rg> -f infra/main.bicep -p infra/main.private.bicepparam
// Values and their reasons: docs/reference.md; deploying it: docs/deploy.md.
targetScope = 'resourceGroup'

@description('public: public endpoints (development). private: VNet, private endpoints, public access off (production).')
@allowed([
  'public'
  'private'
])
param networkProfile string = 'public'

@description('Private profile: address space of the virtual network.')
param vnetAddressPrefix string = '10.42.0.0/16'

@description('Private profile: subnet delegated to the Flex Consumption app (Microsoft.App/environments).')
param appSubnetPrefix string = '10.42.0.0/24'

@description('Private profile: subnet for the private endpoints.')
param privateEndpointSubnetPrefix string = '10.42.1.0/24'

@description('Private profile: subnet for deployment runners or a jump host.')
param toolsSubnetPrefix string = '10.42.2.0/24'

@description('Private profile, own network: a NAT gateway with a static public IP for outbound calls (the bank\'s allow list). Off: outbound follows the subnets\' default route. Not used with existing subnets.')
param natGateway bool = true

@description('Landing zone: resource id of an existing subnet for VNet integration, delegated to Microsoft.App/environments, with the platform team\'s NSG and route table (egress through the hub). Set together with existingPrivateEndpointSubnetId and privateDnsZoneResourceGroupId; the template then creates no virtual network, NSG, NAT gateway or public IP.')
param existingAppSubnetId string = ''

@description('Landing zone: resource id of an existing subnet for the private endpoints.')
param existingPrivateEndpointSubnetId string = ''

@description('Landing zone: resource id of the resource group holding the central privatelink.* private DNS zones (privatelink.documents.azure.com, privatelink.blob/queue/table.<storage suffix>, privatelink.servicebus.windows.net, privatelink.vaultcore.azure.net, privatelink.azurewebsites.net and, without existingPrivateLinkScopeId, the four Azure Monitor zones). The private endpoints register there; no zone is created.')
param privateDnsZoneResourceGroupId string = ''

@description('Existing Log Analytics workspace (resource id) for Application Insights and every diagnostic setting; empty = create one.')
param existingLogAnalyticsWorkspaceId string = ''

@description('Private profile: existing Azure Monitor Private Link Scope (resource id) that Application Insights (and a created workspace) join; empty = create one with its private endpoint.')
param existingPrivateLinkScopeId string = ''

@description('Client id (application id) of the API\'s Entra app registration, the one that defines the app roles Payments.Pay and Payments.Read (docs/deploy.md, "Signed-in callers"). App Service Authentication accepts tokens for it.')
param apiClientId string

@description('Create an Azure Static Web App (Standard) for the Angular client with the function app as its linked backend: the platform signs the user in and forwards the principal.')
param staticWebApp bool = false

@description('Region of the Static Web App (a Static Web Apps region, for example westeurope).')
param staticWebAppLocation string = 'westeurope'

@description('Origin of a web client hosted elsewhere (for example https://claims.example.com) that calls the API cross-origin; the only CORS origin. Empty: none (the Static Web App calls same-origin through its linked backend).')
param webClientOrigin string = ''

@description('Zone-redundant Flex Consumption plan (needs Standard_ZRS host storage and a region that supports it; keeps at least two always-ready instances per function group, billed).')
param planZoneRedundant bool = false

@description('Where the ledger and the inbox live. cosmos: Azure Cosmos DB for NoSQL (serverless or autoscale). postgres: Azure Database for PostgreSQL flexible server, Entra authentication only; no Cosmos DB account is deployed. Decide before the first deployment: changing it later moves no data, and the app would start on an empty store (docs/deploy.md, 4.6).')
@allowed([
  'cosmos'
  'postgres'
])
param storeKind string = 'cosmos'

@description('Object id of the operators\' Entra group (every profile): Azure Service Bus Data Receiver and Data Sender on the queue, for `claims-payments dead-letters` (docs/runbook.md §5).')
@minLength(36)
@maxLength(36)
param operatorsGroupObjectId string

@description('storeKind postgres: object id of the server\'s Microsoft Entra administrator, a group of operators (recommended). It creates the app identity\'s database role once and runs claims-payments provision (docs/deploy.md, 4.6).')
param postgresAdminObjectId string = ''

@description('storeKind postgres: display name of that principal (for a group, the group\'s name): the PostgreSQL role its members log in as.')
param postgresAdminName string = ''

@description('storeKind postgres: type of the Entra administrator.')
@allowed([
  'Group'
  'User'
  'ServicePrincipal'
])
param postgresAdminType string = 'Group'

@description('storeKind postgres: PostgreSQL major version.')
@allowed([
  '16'
  '17'
])
param postgresVersion string = '17'

@description('storeKind postgres: compute size (Standard_B1ms is Burstable; zone-redundant high availability needs a GeneralPurpose or MemoryOptimized size such as Standard_D2ds_v5).')
param postgresSkuName string = 'Standard_B1ms'

@description('storeKind postgres: compute tier of postgresSkuName.')
@allowed([
  'Burstable'
  'GeneralPurpose'
  'MemoryOptimized'
])
param postgresSkuTier string = 'Burstable'

@description('storeKind postgres: storage in GB (grows automatically).')
@minValue(32)
@maxValue(32767)
param postgresStorageSizeGB int = 32

@description('storeKind postgres: high availability. ZoneRedundant (production): a standby in another availability zone, synchronous replication, automatic failover. Disabled: one server.')
@allowed([
  'Disabled'
  'ZoneRedundant'
  'SameZone'
])
param postgresHighAvailability string = 'Disabled'

@description('storeKind postgres: days of point-in-time restore (7-35).')
@minValue(7)
@maxValue(35)
param postgresBackupRetentionDays int = 7

@description('storeKind postgres: geo-redundant backup (fixed when the server is created).')
@allowed([
  'Enabled'
  'Disabled'
])
param postgresGeoRedundantBackup string = 'Disabled'

@description('storeKind postgres: CanNotDelete lock on the server: the payment ledger is permanent.')
param postgresDeleteLock bool = false

@description('storeKind postgres, public profile only: an operator\'s IPv4 address let through the server\'s firewall (one-time role set-up, provision, psql); empty = none.')
param postgresOperatorClientIp string = ''

@description('Zone-redundant Cosmos DB region. Fixed when the account is created; changing it later is a region remove/add, not a redeploy.')
param cosmosZoneRedundant bool = false

@description('CanNotDelete lock on the Cosmos DB account: the payment ledger is permanent.')
param cosmosDeleteLock bool = false

@description('Azure region for every resource; it must offer Flex Consumption.')
param location string = resourceGroup().location

@description('Lowercase letters and digits; prefix of every resource name.')
@minLength(3)
@maxLength(11)
param baseName string = 'claimspay'

@description('Environment label, used in tags.')
param environmentName string = 'dev'

@description('Extra tags for every resource.')
param tags object = {}

@description('Queue that carries ClaimApproved messages (CLAIM_APPROVED_QUEUE).')
param queueName string = 'claim-approved'

@description('Deliveries before Service Bus dead-letters a message; also MAX_DELIVERY_COUNT for the handler, which needs at least 2 (a dead attempt is taken over by the next delivery).')
@minValue(2)
@maxValue(2000)
param maxDeliveryCount int = 10

@description('Peek-lock duration; renewed by the host up to maxAutoLockRenewalDuration (host.json).')
param lockDuration string = 'PT1M'

@description('Duplicate detection window for re-sent MessageIds.')
param duplicateDetectionHistoryTimeWindow string = 'PT1H'

@description('Time to live of an unconsumed message before it is dead-lettered.')
param messageTimeToLive string = 'P14D'

@description('Cosmos DB capacity mode.')
@allowed([
  'serverless'
  'autoscale'
])
param cosmosCapacityMode string = 'serverless'

@description('Autoscale ceiling in RU/s (autoscale mode only).')
@minValue(1000)
@maxValue(1000000)
param cosmosAutoscaleMaxThroughput int = 1000

@description('Cosmos DB default consistency level.')
@allowed([
  'Strong'
  'BoundedStaleness'
  'Session'
])
param cosmosConsistencyLevel string = 'Strong'

@description('Most instances Flex Consumption may run (each handles host.json maxConcurrentCalls messages).')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 10

@description('Memory per Flex Consumption instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Host storage redundancy.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
])
param storageSkuName string = 'Standard_LRS'

@description('Log Analytics retention in days.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

@description('Allow basic-auth publishing credentials on the SCM site (off: deploy with Entra ID).')
param allowBasicPublishingCredentials bool = false

@description('Bank payout API base URL; empty = ledger only (no payout call).')
param bankApiUrl string = ''

@description('BANK_TIMEOUT_MS: timeout of one bank call.')
@minValue(1)
@maxValue(120000)
param bankTimeoutMs int = 5000

@description('BANK_KEY_WINDOW_HOURS: how long the bank honours an Idempotency-Key; older unfinished payouts need reconciliation, not a resend.')
@minValue(1)
param bankKeyWindowHours int = 24

@description('RETRY_BUDGET_MS: time an invocation may spend retrying; must stay well below functionTimeout (host.json).')
@minValue(0)
@maxValue(600000)
param retryBudgetMs int = 60000

@description('LEASE_MS: processing lease; longer than a worst-case invocation, shorter than functionTimeout.')
@minValue(100)
@maxValue(3600000)
param leaseMs int = 120000

@description('INFLIGHT_WAIT_MS: how long a delivery waits for another live attempt of the same message before failing.')
@minValue(0)
@maxValue(600000)
param inflightWaitMs int = 15000

@description('INBOX_RETENTION_DAYS: lifetime of inbox documents (Cosmos ttl).')
@minValue(1)
@maxValue(3650)
param inboxRetentionDays int = 30

@description('CONSUMER_NAME stored in inbox documents.')
param consumerName string = 'ClaimApprovedHandler'

@description('Bank credential (BANK_API_KEY), written to Key Vault. Empty: keep the current secret version. Never put it in a parameter file; read it from the environment.')
@secure()
param bankApiKey string

@description('Existing action group for every alert; empty = create one that e-mails alertEmailAddress.')
param alertActionGroupId string = ''

@description('E-mail receiver of the created action group (ignored when alertActionGroupId is set). No default: every parameter file decides; the production one must name a receiver.')
param alertEmailAddress string

@description('Spike alert: retry-later or duplicate outcomes in 15 minutes below which nothing is reported.')
@minValue(1)
param spikeMinCount int = 20

@description('Spike alert: fire above this multiple of the previous day\'s average 15-minute count.')
@minValue(1)
param spikeFactor int = 3

@description('Cosmos throttling alert: 429 answers on the payments container in 5 minutes above which it fires.')
@minValue(0)
param cosmosThrottleThreshold int = 10

var suffix = uniqueString(resourceGroup().id, baseName)
var allTags = union(tags, {
  application: 'claims-payments'
  environment: environmentName
})
// Fixed: the Rust provisioning code and infra/cosmos-container.json use these names.
var cosmosDatabaseName = 'payments'
var cosmosContainerName = 'payments'
var deploymentContainerName = 'app-package'
var bankApiKeySecretName = 'bank-api-key'
// PostgreSQL: the database the service's schema lives in (claims-payments provision creates the tables).
var postgresDatabaseName = 'payments'
var usePostgres = storeKind == 'postgres'
var useCosmos = !usePostgres
var privateNetworking = networkProfile == 'private'
// Landing zone: the platform team's subnets, zones, workspace and scope.
var existingSubnets = !empty(existingAppSubnetId)
var createNetwork = privateNetworking && !existingSubnets
var existingDnsZones = !empty(privateDnsZoneResourceGroupId)
var dnsZones = '${privateDnsZoneResourceGroupId}/providers/Microsoft.Network/privateDnsZones'
var existingMonitorScope = !empty(existingPrivateLinkScopeId)
// Subscription and resource group of the existing scope (a harmless stand-in when there is none,
// so the module's scope expression is valid even when the module is not deployed).
var monitorScopeIdParts = split(existingMonitorScope ? existingPrivateLinkScopeId : '${resourceGroup().id}/providers/none/none/none', '/')
var publicAccess = privateNetworking ? 'Disabled' : 'Enabled'
var storageSuffix = environment().suffixes.storage
// Subnets of the private profiles: the platform team's, or the ones network.bicep creates.
var appSubnetId = existingSubnets ? existingAppSubnetId : (createNetwork ? network.outputs.appSubnetId : '')
var peSubnetId = existingSubnets ? existingPrivateEndpointSubnetId : (createNetwork ? network.outputs.privateEndpointSubnetId : '')
var vnetId = createNetwork ? network.outputs.vnetId : ''

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-${baseName}-${suffix}'
    location: location
    tags: allTags
  }
}

module network 'modules/network.bicep' = if (createNetwork) {
  name: 'network'
  params: {
    vnetName: 'vnet-${baseName}-${suffix}'
    nsgNamePrefix: 'nsg-${baseName}-${suffix}'
    natGateway: natGateway
    natGatewayName: 'ng-${baseName}-${suffix}'
    publicIpName: 'pip-ng-${baseName}-${suffix}'
    location: location
    tags: allTags
    addressPrefix: vnetAddressPrefix
    appSubnetPrefix: appSubnetPrefix
    privateEndpointSubnetPrefix: privateEndpointSubnetPrefix
    toolsSubnetPrefix: toolsSubnetPrefix
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    workspaceName: 'log-${baseName}-${suffix}'
    existingWorkspaceId: existingLogAnalyticsWorkspaceId
    appInsightsName: 'appi-${baseName}-${suffix}'
    location: location
    tags: allTags
    retentionInDays: logRetentionDays
    publicNetworkAccess: publicAccess
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    name: take('st${baseName}${suffix}', 24)
    location: location
    tags: allTags
    skuName: storageSkuName
    deploymentContainerName: deploymentContainerName
    publicNetworkAccess: publicAccess
    networkDefaultAction: privateNetworking ? 'Deny' : 'Allow'
    workspaceId: monitoring.outputs.workspaceId
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    namespaceName: 'sb-${baseName}-${suffix}'
    location: location
    tags: allTags
    queueName: queueName
    maxDeliveryCount: maxDeliveryCount
    lockDuration: lockDuration
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    defaultMessageTimeToLive: messageTimeToLive
    workspaceId: monitoring.outputs.workspaceId
    skuName: privateNetworking ? 'Premium' : 'Standard'
    publicNetworkAccess: publicAccess
  }
}

module cosmos 'modules/cosmos.bicep' = if (useCosmos) {
  name: 'cosmos'
  params: {
    accountName: 'cosmos-${baseName}-${suffix}'
    location: location
    tags: allTags
    capacityMode: cosmosCapacityMode
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    consistencyLevel: cosmosConsistencyLevel
    databaseName: cosmosDatabaseName
    publicNetworkAccess: publicAccess
    zoneRedundant: cosmosZoneRedundant
    deleteLock: cosmosDeleteLock
    workspaceId: monitoring.outputs.workspaceId
  }
}

// storeKind postgres: the server, Entra only, with its administrator and database.
module postgres 'modules/postgres.bicep' = if (usePostgres) {
  name: 'postgres'
  params: {
    serverName: 'psql-${baseName}-${suffix}'
    location: location
    tags: allTags
    version: postgresVersion
    skuName: postgresSkuName
    skuTier: postgresSkuTier
    storageSizeGB: postgresStorageSizeGB
    highAvailability: postgresHighAvailability
    backupRetentionDays: postgresBackupRetentionDays
    geoRedundantBackup: postgresGeoRedundantBackup
    publicNetworkAccess: publicAccess
    operatorClientIp: postgresOperatorClientIp
    administratorObjectId: postgresAdminObjectId
    administratorName: postgresAdminName
    administratorType: postgresAdminType
    databaseName: postgresDatabaseName
    deleteLock: postgresDeleteLock
    workspaceId: monitoring.outputs.workspaceId
  }
}

module keyVault 'modules/keyvault.bicep' = {
  name: 'keyvault'
  params: {
    name: take('kv${baseName}${suffix}', 24)
    location: location
    tags: allTags
    publicNetworkAccess: publicAccess
    networkDefaultAction: privateNetworking ? 'Deny' : 'Allow'
    bankApiKeySecretName: bankApiKeySecretName
    bankApiKey: bankApiKey
    workspaceId: monitoring.outputs.workspaceId
  }
}

// Private endpoints, each with its private DNS zone linked to the VNet (or, in a
// landing zone, registered in the central zone). The storage endpoints exist
// before the app, whose host needs them on first start.
module cosmosPrivateLink 'modules/private-link.bicep' = if (privateNetworking && useCosmos) {
  name: 'pl-cosmos'
  params: {
    name: 'pe-cosmos-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: useCosmos ? cosmos.outputs.accountId : ''
    groupId: 'Sql'
    privateDnsZoneName: 'privatelink.documents.azure.com'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.documents.azure.com' : ''
  }
}

// The app resolves <server>.postgres.database.azure.com through this zone to the endpoint.
module postgresPrivateLink 'modules/private-link.bicep' = if (privateNetworking && usePostgres) {
  name: 'pl-postgres'
  params: {
    name: 'pe-psql-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: usePostgres ? postgres.outputs.serverId : ''
    groupId: 'postgresqlServer'
    privateDnsZoneName: 'privatelink.postgres.database.azure.com'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.postgres.database.azure.com' : ''
  }
}

module blobPrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-blob'
  params: {
    name: 'pe-blob-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: storage.outputs.id
    groupId: 'blob'
    privateDnsZoneName: 'privatelink.blob.${storageSuffix}'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.blob.${storageSuffix}' : ''
  }
}

module queuePrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-queue'
  params: {
    name: 'pe-queue-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: storage.outputs.id
    groupId: 'queue'
    privateDnsZoneName: 'privatelink.queue.${storageSuffix}'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.queue.${storageSuffix}' : ''
  }
}

module tablePrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-table'
  params: {
    name: 'pe-table-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: storage.outputs.id
    groupId: 'table'
    privateDnsZoneName: 'privatelink.table.${storageSuffix}'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.table.${storageSuffix}' : ''
  }
}

module serviceBusPrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-servicebus'
  params: {
    name: 'pe-sb-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: serviceBus.outputs.namespaceId
    groupId: 'namespace'
    privateDnsZoneName: 'privatelink.servicebus.windows.net'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.servicebus.windows.net' : ''
  }
}

module keyVaultPrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-keyvault'
  params: {
    name: 'pe-kv-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: keyVault.outputs.id
    groupId: 'vault'
    privateDnsZoneName: 'privatelink.vaultcore.azure.net'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.vaultcore.azure.net' : ''
  }
}

module rbac 'modules/rbac.bicep' = {
  name: 'rbac'
  params: {
    principalId: identity.outputs.principalId
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    queueName: serviceBus.outputs.queueName
    // storeKind postgres: no Cosmos role; the database role is created in the server (docs/deploy.md, 4.6).
    storeKind: storeKind
    cosmosAccountName: useCosmos ? cosmos.outputs.accountName : ''
    cosmosDatabaseName: useCosmos ? cosmos.outputs.databaseName : ''
    appInsightsName: monitoring.outputs.appInsightsName
    keyVaultName: keyVault.outputs.name
    operatorsGroupObjectId: operatorsGroupObjectId
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  // Roles and private endpoints first: the host authenticates with the identity
  // on its first start and, in the private profile, reaches its storage, the
  // queue, Cosmos DB or PostgreSQL and Key Vault only through their private endpoints.
  dependsOn: [
    rbac
    cosmosPrivateLink
    postgresPrivateLink
    blobPrivateLink
    queuePrivateLink
    tablePrivateLink
    serviceBusPrivateLink
    keyVaultPrivateLink
    monitorPrivateLink
    monitorScopeLink
  ]
  params: {
    name: 'func-${baseName}-${suffix}'
    planName: 'plan-${baseName}-${suffix}'
    location: location
    tags: allTags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    storageBlobEndpoint: storage.outputs.blobEndpoint
    deploymentContainerName: storage.outputs.deploymentContainerName
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    allowBasicPublishingCredentials: allowBasicPublishingCredentials
    appInsightsConnectionString: monitoring.outputs.connectionString
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    queueName: serviceBus.outputs.queueName
    storeKind: storeKind
    cosmosEndpoint: useCosmos ? cosmos.outputs.endpoint : ''
    cosmosDatabaseName: useCosmos ? cosmos.outputs.databaseName : ''
    cosmosContainerName: useCosmos ? cosmos.outputs.containerName : ''
    // The app's database role is named after its identity (created once by the Entra administrator).
    postgresHost: usePostgres ? postgres.outputs.fqdn : ''
    postgresDatabaseName: usePostgres ? postgres.outputs.databaseName : ''
    postgresUser: identity.outputs.name
    inboxRetentionDays: inboxRetentionDays
    consumerName: consumerName
    bankApiUrl: bankApiUrl
    bankTimeoutMs: bankTimeoutMs
    bankKeyWindowHours: bankKeyWindowHours
    retryBudgetMs: retryBudgetMs
    leaseMs: leaseMs
    inflightWaitMs: inflightWaitMs
    maxDeliveryCount: maxDeliveryCount
    bankApiKeySecretUri: keyVault.outputs.bankApiKeySecretUri
    publicNetworkAccess: publicAccess
    virtualNetworkSubnetId: appSubnetId
    workspaceId: monitoring.outputs.workspaceId
    // The package's HTTP functions are anonymous at the host: App Service Authentication
    // (Entra ID, or the linked Static Web App) signs the caller in, the handler reads the
    // principal and checks the app roles (HTTP_AUTH=appservice).
    httpAuth: 'appservice'
    apiClientId: apiClientId
    staticWebAppHostName: staticWebApp ? swa.outputs.defaultHostName : ''
    corsAllowedOrigins: empty(webClientOrigin) ? [] : [
      webClientOrigin
    ]
    zoneRedundant: planZoneRedundant
  }
}

// Inbound: POST /api/payments and the SCM (one-deploy) endpoint, from the VNet only.
module sitePrivateLink 'modules/private-link.bicep' = if (privateNetworking) {
  name: 'pl-site'
  params: {
    name: 'pe-func-${baseName}-${suffix}'
    location: location
    tags: allTags
    subnetId: peSubnetId
    vnetId: vnetId
    targetResourceId: functionApp.outputs.id
    groupId: 'sites'
    privateDnsZoneName: 'privatelink.azurewebsites.net'
    existingDnsZoneId: existingDnsZones ? '${dnsZones}/privatelink.azurewebsites.net' : ''
  }
}

// Azure Monitor over private link: Application Insights (and the workspace, when
// created here) answer ingestion and query only through a private link scope.
module monitorPrivateLink 'modules/monitor-private-link.bicep' = if (privateNetworking && !existingMonitorScope) {
  name: 'pl-monitor'
  params: {
    name: 'pls-${baseName}-${suffix}'
    location: location
    tags: allTags
    scopedResourceIds: monitoring.outputs.workspaceCreated ? [
      monitoring.outputs.appInsightsId
      monitoring.outputs.workspaceId
    ] : [
      monitoring.outputs.appInsightsId
    ]
    subnetId: peSubnetId
    vnetId: vnetId
    blobZoneId: blobPrivateLink.outputs.zoneId
    existingDnsZoneResourceGroupId: privateDnsZoneResourceGroupId
  }
}

module monitorScopeLink 'modules/monitor-scope-link.bicep' = if (privateNetworking && existingMonitorScope) {
  name: 'pls-scoped-${baseName}'
  scope: resourceGroup(monitorScopeIdParts[2], monitorScopeIdParts[4])
  params: {
    scopeName: last(monitorScopeIdParts)
    entryPrefix: '${baseName}-${suffix}'
    scopedResourceIds: monitoring.outputs.workspaceCreated ? [
      monitoring.outputs.appInsightsId
      monitoring.outputs.workspaceId
    ] : [
      monitoring.outputs.appInsightsId
    ]
  }
}

// The Angular client on Azure Static Web Apps; /api/* goes to the function app
// (linked backend) with the signed-in user's principal.
module swa 'modules/staticwebapp.bicep' = if (staticWebApp) {
  name: 'staticwebapp'
  params: {
    name: 'stapp-${baseName}-${suffix}'
    location: staticWebAppLocation
    tags: allTags
  }
}

module swaBackend 'modules/staticwebapp-backend.bicep' = if (staticWebApp) {
  name: 'staticwebapp-backend'
  params: {
    staticWebAppName: staticWebApp ? swa.outputs.name : ''
    backendResourceId: functionApp.outputs.id
    backendRegion: location
  }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    namePrefix: 'alert-${baseName}'
    location: location
    tags: allTags
    actionGroupId: alertActionGroupId
    alertEmailAddress: alertEmailAddress
    actionGroupName: 'ag-${baseName}-${suffix}'
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    queueName: serviceBus.outputs.queueName
    storeKind: storeKind
    cosmosAccountId: useCosmos ? cosmos.outputs.accountId : ''
    cosmosDatabaseName: useCosmos ? cosmos.outputs.databaseName : ''
    cosmosContainerName: useCosmos ? cosmos.outputs.containerName : ''
    appInsightsId: monitoring.outputs.appInsightsId
    spikeMinCount: spikeMinCount
    spikeFactor: spikeFactor
    cosmosThrottleThreshold: cosmosThrottleThreshold
  }
}

module workbook 'modules/workbook.bicep' = {
  name: 'workbook'
  params: {
    displayName: 'claims-payments (${baseName})'
    location: location
    tags: allTags
    appInsightsId: monitoring.outputs.appInsightsId
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    queueName: serviceBus.outputs.queueName
  }
}

output functionAppName string = functionApp.outputs.name
output resourceGroupName string = resourceGroup().name
output storeKind string = storeKind
output cosmosEndpoint string = useCosmos ? cosmos.outputs.endpoint : ''
output cosmosAccountName string = useCosmos ? cosmos.outputs.accountName : ''
// storeKind postgres: what the one-time role set-up and claims-payments provision need (docs/deploy.md, 4.6).
output postgresServerName string = usePostgres ? postgres.outputs.serverName : ''
output postgresHost string = usePostgres ? postgres.outputs.fqdn : ''
output postgresDatabaseName string = usePostgres ? postgres.outputs.databaseName : ''
output identityName string = identity.outputs.name
output identityPrincipalId string = identity.outputs.principalId
output serviceBusNamespaceFqdn string = serviceBus.outputs.fullyQualifiedNamespace
output serviceBusQueueName string = serviceBus.outputs.queueName
output identityClientId string = identity.outputs.clientId
output storageAccountName string = storage.outputs.name
output appInsightsName string = monitoring.outputs.appInsightsName
output keyVaultName string = keyVault.outputs.name
output actionGroupId string = alerts.outputs.actionGroupId
output networkProfile string = networkProfile
// Private profile: the static public IP every outbound call (the bank's included) leaves from.
output outboundPublicIp string = createNetwork ? network.outputs.natPublicIp : ''
output staticWebAppHostName string = staticWebApp ? swa.outputs.defaultHostName : ''
