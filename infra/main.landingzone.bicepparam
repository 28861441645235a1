using 'main.bicep'

// PRODUCTION parameter file for an Azure landing zone (a spoke of a hub-and-spoke
// network run by the platform team). Same private profile as
// main.private.bicepparam, but what the platform team provides is passed in and
// the template creates none of it: no virtual network, NSG, NAT gateway, public IP,
// private DNS zone, Log Analytics workspace, action group or Azure Monitor Private
// Link Scope (scripts/check-infra.sh checks that). docs/deploy.md ("Landing zone")
// lists what the platform team provides and which parameter takes it.
//
// The resource ids come from the environment, with no default: the deployment cannot
// start without them, and no id of someone else's subscription is written here.

param networkProfile = 'private'
// The spoke's subnet for VNet integration: delegated to Microsoft.App/environments,
// with the platform's NSG and the route table that sends 0.0.0.0/0 to the hub
// firewall (egress through the hub; allow the bank's host name there).
// /subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet>
param existingAppSubnetId = readEnvironmentVariable('LZ_APP_SUBNET_ID')
// The spoke's subnet for private endpoints.
param existingPrivateEndpointSubnetId = readEnvironmentVariable('LZ_PRIVATE_ENDPOINT_SUBNET_ID')
// The hub resource group with the central privatelink.* zones:
// /subscriptions/<sub>/resourceGroups/<rg>
param privateDnsZoneResourceGroupId = readEnvironmentVariable('LZ_PRIVATE_DNS_ZONE_RESOURCE_GROUP_ID')
// The central Log Analytics workspace (App Insights and every diagnostic setting).
param existingLogAnalyticsWorkspaceId = readEnvironmentVariable('LZ_LOG_ANALYTICS_WORKSPACE_ID')
// The platform's Azure Monitor Private Link Scope; App Insights is added to it.
param existingPrivateLinkScopeId = readEnvironmentVariable('LZ_PRIVATE_LINK_SCOPE_ID')
// No NAT gateway: egress is the hub's.
param natGateway = false

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

// Signed-in callers (docs/deploy.md, "Signed-in callers"): the client id of the API's
// Entra app registration with the app roles Payments.Pay and Payments.Read.
param apiClientId = readEnvironmentVariable('API_CLIENT_ID')
// Callers reach the API through its private endpoint (a gateway in the hub, an
// internal web client). Set the web client's origin here if a browser page on
// another origin calls it; it is the only CORS origin.
param staticWebApp = false
param webClientOrigin = readEnvironmentVariable('WEB_CLIENT_ORIGIN', '')

// Alerts go to an existing action group (the payments on-call's, or the platform's).
param alertActionGroupId = readEnvironmentVariable('LZ_ACTION_GROUP_ID')
param alertEmailAddress = ''
param spikeMinCount = 20
param spikeFactor = 3
param cosmosThrottleThreshold = 10
