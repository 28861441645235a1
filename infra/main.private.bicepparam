using 'main.bicep'

// PRODUCTION parameter file. Private profile: the app runs VNet-integrated
// behind a NAT gateway (static outbound IP for the bank's allow list), and
// Cosmos DB, host storage, Service Bus (Premium), Key Vault and the app itself
// are reachable only through private endpoints. docs/deploy.md ("Network profiles",
// "Deploying from outside the VNet", "Secrets") and docs/runbook.md ("Alerts") explain
// every value. scripts/check-infra.sh enforces what production needs here:
// private profile, zone redundancy, ZRS storage, the Cosmos delete lock and an
// alert receiver.

param networkProfile = 'private'
param vnetAddressPrefix = '10.42.0.0/16'
param appSubnetPrefix = '10.42.0.0/24'
param privateEndpointSubnetPrefix = '10.42.1.0/24'
param toolsSubnetPrefix = '10.42.2.0/24'
// Static outbound IP for the bank's allow list.
param natGateway = true

param baseName = 'claimspay'
param environmentName = 'prod'

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
// Zone-redundant high availability needs a GeneralPurpose (or MemoryOptimized) size and a
// region with availability zones.
param postgresSkuName = 'Standard_D2ds_v5'
param postgresSkuTier = 'GeneralPurpose'
param postgresStorageSizeGB = 64
// A standby in another zone, synchronous commit, automatic failover.
param postgresHighAvailability = 'ZoneRedundant'
param postgresBackupRetentionDays = 35
// Fixed at server creation; Enabled needs a region whose pair supports it.
param postgresGeoRedundantBackup = 'Disabled'
// The payment ledger is permanent.
param postgresDeleteLock = true
// Private profile: no public endpoint, so no firewall address.
param postgresOperatorClientIp = ''

param cosmosCapacityMode = 'serverless'
param cosmosAutoscaleMaxThroughput = 1000
param cosmosConsistencyLevel = 'Strong'
// Fixed at account creation: decide before the first deployment.
param cosmosZoneRedundant = true
// The payment ledger is permanent.
param cosmosDeleteLock = true

param maximumInstanceCount = 10
param instanceMemoryMB = 2048
// Needs a region listed by: az functionapp list-flexconsumption-locations --zone-redundant=true
param planZoneRedundant = true
param storageSkuName = 'Standard_ZRS'
param logRetentionDays = 90
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

// Alerts must reach someone: either name an existing action group (the
// payments on-call) here, or export ALERT_EMAIL_ADDRESS. Without a default the
// deployment cannot even start when the variable is missing.
// Signed-in callers (docs/deploy.md, "Signed-in callers"): the client id of the API's
// Entra app registration with the app roles Payments.Pay and Payments.Read.
param apiClientId = readEnvironmentVariable('API_CLIENT_ID')
// Callers reach the API through its private endpoint (a gateway in the hub, an
// internal web client). Set the web client's origin here if a browser page on
// another origin calls it; it is the only CORS origin.
param staticWebApp = false
param webClientOrigin = ''

param alertActionGroupId = ''
param alertEmailAddress = readEnvironmentVariable('ALERT_EMAIL_ADDRESS')
param spikeMinCount = 20
param spikeFactor = 3
param cosmosThrottleThreshold = 10
