using 'main.bicep'

// Production-shaped values. Every one is explained in docs/deploy.md; the
// timing values must keep: worst-case invocation < LEASE_MS < functionTimeout
// (host.json) < maxAutoLockRenewalDuration (host.json).

param baseName = 'claimspay'
param environmentName = 'prod'

param queueName = 'claim-approved'
param maxDeliveryCount = 10
param lockDuration = 'PT1M'
param duplicateDetectionHistoryTimeWindow = 'PT1H'
param messageTimeToLive = 'P14D'

param cosmosCapacityMode = 'serverless'
param cosmosAutoscaleMaxThroughput = 1000
param cosmosConsistencyLevel = 'Strong'

param maximumInstanceCount = 10
param instanceMemoryMB = 2048
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
param inflightWaitMs = 5000
param inboxRetentionDays = 30
param consumerName = 'ClaimApprovedHandler'

// Resource id of an existing action group (e.g. the payments on-call); empty
// creates the dead-letter alert without notifications.
param alertActionGroupId = ''
