// Least-privilege data-plane roles for the app's user-assigned identity.
// PostgreSQL (storeKind postgres) has no Azure role for data: the identity is a
// database role created in the server, with grants on the service's tables only
// (docs/deploy.md, 4.6).
// Every assignment names principalType so a freshly created identity does not
// fail on directory replication delay.

@description('Principal (object) id of the user-assigned identity.')
param principalId string

@description('Host storage account (AzureWebJobsStorage and the deployment container).')
param storageAccountName string

@description('Service Bus namespace that holds the queue.')
param serviceBusNamespaceName string

@description('Queue the trigger reads.')
param queueName string

@description('cosmos: the Cosmos DB data role below. postgres: no Azure role; the database role is created in the server.')
@allowed([
  'cosmos'
  'postgres'
])
param storeKind string

@description('Cosmos DB account (storeKind cosmos; empty otherwise).')
param cosmosAccountName string

@description('Cosmos DB database the app reads and writes.')
param cosmosDatabaseName string

@description('Application Insights component the host sends telemetry to with Entra auth.')
param appInsightsName string

@description('Key Vault that holds the bank credential.')
param keyVaultName string

@description('Object id of the operators\' Entra group: runs `claims-payments dead-letters` (docs/runbook.md §5), so it gets Azure Service Bus Data Receiver (peek-lock and delete on the queue\'s dead-letter sub-queue) and Data Sender (resubmit) on this one queue.')
@minLength(36)
@maxLength(36)
param operatorsGroupObjectId string

// Built-in role definition ids (identical in every tenant).
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
// Cosmos DB Built-in Data Contributor (data plane: items and metadata reads, no control plane).
var cosmosDataContributor = '00000000-0000-0000-0000-000000000002'
// Key Vault Secrets User: read secret values, nothing else.
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: serviceBus
  name: queueName
}

var useCosmos = storeKind == 'cosmos'

resource cosmos 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' existing = if (useCosmos) {
  name: cosmosAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource keyVault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: keyVaultName
}

// Host storage: blob leases, keys and the deployment package (Blob Data Owner),
// host queues (Queue Data Contributor) and tables (Table Data Contributor).
resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

resource queueContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Receive only, on this one queue. Data Owner would let the scaler read exact
// queue counts, but it also grants Send and Manage: a compromised payer could
// then enqueue its own ClaimApproved messages. The scaler falls back to
// peek-based estimation instead (docs/reference.md §6, "Scaling and Service Bus rights").
resource sbReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, principalId, serviceBusDataReceiver)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Entra-authenticated telemetry (APPLICATIONINSIGHTS_AUTHENTICATION_STRING).
resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, principalId, monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// Cosmos DB data plane, scoped to the payments database only.
resource cosmosData 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (useCosmos) {
  parent: cosmos
  name: guid(cosmos.id, principalId, cosmosDataContributor, cosmosDatabaseName)
  properties: {
    principalId: principalId
    roleDefinitionId: '${cosmos.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    scope: '${cosmos.id}/dbs/${cosmosDatabaseName}'
  }
}

// Key Vault references (BANK_API_KEY): read secrets of this one vault only.
resource kvSecretsUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(keyVault.id, principalId, keyVaultSecretsUser)
  scope: keyVault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

// The operators' dead-letter tool (`claims-payments dead-letters`, docs/runbook.md §5):
// receive on the queue (its dead-letter sub-queue is part of it: peek-lock, unlock,
// delete) and send to it (resubmit), on this one queue and nothing else. Data Owner
// is not needed: the tool manages nothing.
resource operatorsReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, operatorsGroupObjectId, serviceBusDataReceiver)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: operatorsGroupObjectId
    principalType: 'Group'
  }
}

resource operatorsSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, operatorsGroupObjectId, serviceBusDataSender)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: operatorsGroupObjectId
    principalType: 'Group'
  }
}
