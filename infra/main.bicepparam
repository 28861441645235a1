using 'main.bicep'

// Public profile: development and evaluation. Services keep their public
// endpoints (Entra ID only, keys and SAS off). Production uses
// infra/main.private.bicepparam. Every value is explained in docs/reference.md; the
// timing values must keep: worst-case invocation < LEASE_MS < functionTimeout
// (host.json) < maxAutoLockRenewalDuration (host.json).

param networkProfile = 'public'
param baseName = 'claimspay'
param environmentName = 'dev'

param queueName = 'claim-approved'
param maxDeliveryCount = 10
param lockDuration = 'PT1M'
param duplicateDetectionHistoryTimeWindow = 'PT1H'
param messageTimeToLive = 'P14D'
// The operators' Entra group: Service Bus Data Receiver and Data Sender on the queue for
// `claims-payments dead-letters` (docs/runbook.md §5). Export OPERATORS_GROUP_OBJECT_ID.
param operatorsGroupObjectId = readEnvironmentVariable('OPERATORS_GROUP_OBJECT_ID')

// Where the ledger lives: 'cosmos' (Cosmos DB, serverless) or 'postgres' (Azure Database
// for PostgreSQL flexible server, Entra only; no Cosmos DB account then). Decide before the
// first deployment and keep it in this file: changing it later moves no data
// (docs/deploy.md, 4.6). With 'postgres', export POSTGRES_ADMIN_OBJECT_ID and
// POSTGRES_ADMIN_NAME (the operators' Entra group) before deploying.
param storeKind = 'cosmos'
param postgresAdminObjectId = readEnvironmentVariable('POSTGRES_ADMIN_OBJECT_ID', '')
param postgresAdminName = readEnvironmentVariable('POSTGRES_ADMIN_NAME', '')
param postgresAdminType = 'Group'
param postgresVersion = '17'
// Development: one small burstable server, no standby.
param postgresSkuName = 'Standard_B1ms'
param postgresSkuTier = 'Burstable'
param postgresStorageSizeGB = 32
param postgresHighAvailability = 'Disabled'
param postgresBackupRetentionDays = 7
param postgresGeoRedundantBackup = 'Disabled'
param postgresDeleteLock = false
// Your own IPv4 address, let through the server's firewall for the one-time role set-up
// and claims-payments provision (docs/deploy.md, 4.6); empty = none.
param postgresOperatorClientIp = readEnvironmentVariable('POSTGRES_OPERATOR_CLIENT_IP', '')

param cosmosCapacityMode = 'serverless'
param cosmosAutoscaleMaxThroughput = 1000
param cosmosConsistencyLevel = 'Strong'
param cosmosZoneRedundant = false
param cosmosDeleteLock = false

param maximumInstanceCount = 10
param instanceMemoryMB = 2048
param planZoneRedundant = false
param storageSkuName = 'Standard_LRS'
param logRetentionDays = 30
param allowBasicPublishingCredentials = false

// Empty = ledger only: payments are recorded but no bank payout is sent.
param bankApiUrl = ''
param bankTimeoutMs = 5000
// Set to the bank's documented Idempotency-Key retention.
param bankKeyWindowHours = 24
param retryBudgetMs = 60000
param leaseMs = 120000
param inflightWaitMs = 15000
param inboxRetentionDays = 30
param consumerName = 'ClaimApprovedHandler'

// The bank credential never lives in a file: export BANK_API_KEY before the
// deployment to write a new secret version; unset, the current one stays.
param bankApiKey = readEnvironmentVariable('BANK_API_KEY', '')

// Alerts go to the action group this template creates. Without an address it
// has no receiver, which is accepted for development only.
// Signed-in callers (docs/deploy.md, "Signed-in callers"): the client id of the API's
// Entra app registration with the app roles Payments.Pay and Payments.Read. No default:
// App Service Authentication cannot be configured without it.
param apiClientId = readEnvironmentVariable('API_CLIENT_ID')
// The Angular client on a Static Web App with the function app as its linked backend.
param staticWebApp = true
param staticWebAppLocation = 'westeurope'
param webClientOrigin = ''

param alertActionGroupId = ''
param alertEmailAddress = readEnvironmentVariable('ALERT_EMAIL_ADDRESS', '')
param spikeMinCount = 20
param spikeFactor = 3
param cosmosThrottleThreshold = 10
