// claims-payments: Service Bus queue -> Flex Consumption function app (Rust
// custom handler) -> Cosmos DB, all reached with one user-assigned identity.
// Deploy: az deployment group create -g <rg> -f infra/main.bicep -p infra/main.bicepparam
// Values and their reasons: docs/deploy.md.
targetScope = 'resourceGroup'

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

@description('Deliveries before Service Bus dead-letters a message.')
@minValue(1)
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
param inflightWaitMs int = 5000

@description('INBOX_RETENTION_DAYS: lifetime of inbox documents (Cosmos ttl).')
@minValue(1)
@maxValue(3650)
param inboxRetentionDays int = 30

@description('CONSUMER_NAME stored in inbox documents.')
param consumerName string = 'ClaimApprovedHandler'

@description('Action group resource id for the dead-letter alert; empty = alert without notification.')
param alertActionGroupId string = ''

var suffix = uniqueString(resourceGroup().id, baseName)
var allTags = union(tags, {
  application: 'claims-payments'
  environment: environmentName
})
// Fixed: the Rust provisioning code and infra/cosmos-container.json use these names.
var cosmosDatabaseName = 'payments'
var cosmosContainerName = 'payments'
var deploymentContainerName = 'app-package'

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-${baseName}-${suffix}'
    location: location
    tags: allTags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    workspaceName: 'log-${baseName}-${suffix}'
    appInsightsName: 'appi-${baseName}-${suffix}'
    location: location
    tags: allTags
    retentionInDays: logRetentionDays
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
  }
}

module cosmos 'modules/cosmos.bicep' = {
  name: 'cosmos'
  params: {
    accountName: 'cosmos-${baseName}-${suffix}'
    location: location
    tags: allTags
    capacityMode: cosmosCapacityMode
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    consistencyLevel: cosmosConsistencyLevel
    databaseName: cosmosDatabaseName
  }
}

module rbac 'modules/rbac.bicep' = {
  name: 'rbac'
  params: {
    principalId: identity.outputs.principalId
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    queueName: serviceBus.outputs.queueName
    cosmosAccountName: cosmos.outputs.accountName
    cosmosDatabaseName: cosmos.outputs.databaseName
    appInsightsName: monitoring.outputs.appInsightsName
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  // Roles first: the host authenticates with the identity on its first start.
  dependsOn: [
    rbac
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
    cosmosEndpoint: cosmos.outputs.endpoint
    cosmosDatabaseName: cosmos.outputs.databaseName
    cosmosContainerName: cosmos.outputs.containerName
    inboxRetentionDays: inboxRetentionDays
    consumerName: consumerName
    bankApiUrl: bankApiUrl
    bankTimeoutMs: bankTimeoutMs
    bankKeyWindowHours: bankKeyWindowHours
    retryBudgetMs: retryBudgetMs
    leaseMs: leaseMs
    inflightWaitMs: inflightWaitMs
  }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    name: 'alert-${baseName}-dead-letters'
    tags: allTags
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    queueName: serviceBus.outputs.queueName
    actionGroupId: alertActionGroupId
  }
}

output functionAppName string = functionApp.outputs.name
output resourceGroupName string = resourceGroup().name
output cosmosEndpoint string = cosmos.outputs.endpoint
output cosmosAccountName string = cosmos.outputs.accountName
output serviceBusNamespaceFqdn string = serviceBus.outputs.fullyQualifiedNamespace
output serviceBusQueueName string = serviceBus.outputs.queueName
output identityClientId string = identity.outputs.clientId
output storageAccountName string = storage.outputs.name
output appInsightsName string = monitoring.outputs.appInsightsName
