// Service Bus namespace and the ClaimApproved queue. Standard in the public
// profile (duplicate detection needs Standard or Premium); Premium in the
// private profile, because only Premium namespaces take private endpoints.
// Local SAS auth is off; the app and the producers use Entra ID. In the private
// profile public network access is off: producers must send through a private
// endpoint too. docs/reference.md (section 3) explains every queue value.

@description('Namespace name (6-50 characters, starts with a letter).')
@minLength(6)
@maxLength(50)
param namespaceName string

@description('Azure region.')
param location string

@description('Tags applied to the namespace.')
param tags object

@description('Queue that carries ClaimApproved messages.')
param queueName string

@description('Deliveries before the broker dead-letters a message (MaxDeliveryCountExceeded).')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int

@description('Peek-lock duration. The Functions host renews it while an invocation runs.')
param lockDuration string

@description('How long the broker remembers a MessageId to drop re-sent duplicates (PT20S to P7D).')
param duplicateDetectionHistoryTimeWindow string

@description('Time to live of an unconsumed message; expired messages are dead-lettered.')
param defaultMessageTimeToLive string

@description('Log Analytics workspace that receives the namespace logs and exportable metrics.')
param workspaceId string

@description('Standard (public profile) or Premium (private profile; private endpoints need Premium). Changing an existing namespace is a migration, not a redeploy.')
@allowed([
  'Standard'
  'Premium'
])
param skuName string

@description('Enabled (public profile) or Disabled (private profile: private endpoint only).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

var premium = skuName == 'Premium'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  // One messaging unit: the smallest Premium size, far above this queue's volume.
  sku: premium ? {
    name: 'Premium'
    tier: 'Premium'
    capacity: 1
  } : {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: publicNetworkAccess
  }
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: queueName
  properties: {
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionHistoryTimeWindow
    defaultMessageTimeToLive: defaultMessageTimeToLive
    deadLetteringOnMessageExpiration: true
    requiresSession: false
    enablePartitioning: false
    enableBatchedOperations: true
    maxSizeInMegabytes: 1024
  }
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: namespace
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

output namespaceName string = namespace.name
output namespaceId string = namespace.id
output queueName string = queue.name
// <namespace>.servicebus.windows.net (or the sovereign-cloud equivalent).
output fullyQualifiedNamespace string = split(split(namespace.properties.serviceBusEndpoint, '//')[1], ':')[0]
