// Alerts that reach someone: every rule below notifies one action group, either
// an existing one (actionGroupId) or the one created here with an e-mail
// receiver. Each rule has a runbook entry in docs/runbook.md (section 1,
// "Alerts", one heading per rule); the rule descriptions point there.
//
// Log rules read the handler's OpenTelemetry data in Application Insights, never
// the text of a log line: its metrics (customMetrics, name claims_payments.*, the
// dimensions in customDimensions, aggregated per export as valueSum/valueMax) and
// its bank dependencies (dependencies, customDimensions["bank.answer"]; a failed
// dependency's trace is never sampled away, and counts use itemCount anyway). Every
// query returns only the rows that need attention (no summarize without `by`,
// which would return a row even for zero), and every log rule fires when it
// returns at least one row.

@description('Prefix of the alert rule names.')
param namePrefix string

@description('Azure region of the scheduled query rules (the Application Insights region).')
param location string

@description('Tags applied to every rule and the action group.')
param tags object

@description('Existing action group resource id; empty = create one with alertEmailAddress as receiver.')
param actionGroupId string

@description('E-mail receiver of the created action group. Empty creates it without a receiver (never in production: scripts/check-infra.sh rejects that for infra/main.private.bicepparam).')
param alertEmailAddress string

@description('Name of the action group created when actionGroupId is empty.')
param actionGroupName string

@description('Resource id of the Service Bus namespace.')
param serviceBusNamespaceId string

@description('Queue whose dead-letter count is watched (metric dimension EntityName).')
param queueName string

@description('cosmos: the Cosmos DB throttling alert below. postgres: none (the store answers retry-later, which the spike alert counts).')
@allowed([
  'cosmos'
  'postgres'
])
param storeKind string

@description('Resource id of the Cosmos DB account (storeKind cosmos; empty otherwise).')
param cosmosAccountId string

@description('Cosmos database of the payments container (metric dimension DatabaseName).')
param cosmosDatabaseName string

@description('Cosmos container (metric dimension CollectionName).')
param cosmosContainerName string

@description('Resource id of the Application Insights component that receives the handler logs.')
param appInsightsId string

@description('Retry-later or duplicate outcomes in 15 minutes below which no spike is reported.')
@minValue(1)
param spikeMinCount int

@description('A spike is more than this many times the average 15-minute count of the previous day.')
@minValue(1)
param spikeFactor int

@description('Cosmos 429 answers on the payments container in 5 minutes above which the throttling alert fires.')
@minValue(0)
param cosmosThrottleThreshold int

var createActionGroup = empty(actionGroupId)
var notify = createActionGroup ? actionGroup.id : actionGroupId
var runbook = 'Runbook: docs/runbook.md, section 1 "Alerts", entry'

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (createActionGroup) {
  name: actionGroupName
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: take('claimspay', 12)
    enabled: true
    emailReceivers: empty(alertEmailAddress) ? [] : [
      {
        name: 'payments-on-call'
        emailAddress: alertEmailAddress
        useCommonAlertSchema: true
      }
    ]
  }
}

// A dead-lettered ClaimApproved message is an approved claim that was not paid.
resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages in the dead-letter queue of ${queueName}: approved claims that were not paid. ${runbook} dead-letters.'
    severity: 1
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                queueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: notify
      }
    ]
  }
}

// Requests on the payments container answered 429 (request rate too large).
// The SDK retries them; sustained 429s eat the retry budget and turn into
// retry-later outcomes.
resource cosmosThrottleAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = if (storeKind == 'cosmos') {
  name: '${namePrefix}-cosmos-throttling'
  location: 'global'
  tags: tags
  properties: {
    description: 'Cosmos DB answered more than ${cosmosThrottleThreshold} requests on ${cosmosDatabaseName}/${cosmosContainerName} with 429 in 5 minutes. ${runbook} cosmos-throttling.'
    severity: 2
    enabled: true
    scopes: [
      cosmosAccountId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'Throttled'
          metricNamespace: 'Microsoft.DocumentDB/databaseAccounts'
          metricName: 'TotalRequests'
          dimensions: [
            {
              name: 'StatusCode'
              operator: 'Include'
              values: [
                '429'
              ]
            }
            {
              name: 'DatabaseName'
              operator: 'Include'
              values: [
                cosmosDatabaseName
              ]
            }
            {
              name: 'CollectionName'
              operator: 'Include'
              values: [
                cosmosContainerName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: cosmosThrottleThreshold
          timeAggregation: 'Count'
        }
      ]
    }
    actions: [
      {
        actionGroupId: notify
      }
    ]
  }
}

// The handler's metrics (see crates/claims-payments/src/telemetry/metrics.rs):
// __METRIC__ is the metric name without the claims_payments. prefix.
var metric = 'customMetrics | where name == "claims_payments.__METRIC__"'
var outcomes = '${replace(metric, '__METRIC__', 'outcomes')} | extend outcome = tostring(customDimensions.outcome)'

var logRules = [
  {
    key: 'needs-reconciliation'
    severity: 1
    frequency: 'PT5M'
    window: 'PT5M'
    timeRange: ''
    description: 'A payment ended as needs-reconciliation: the bank may or may not have paid it and no resend is allowed. A person must settle it. ${runbook} needs-reconciliation.'
    query: '${outcomes} | where outcome == "needs-reconciliation" | summarize payments = sum(valueSum), firstSeen = min(timestamp), lastSeen = max(timestamp) by cloud_RoleInstance | where payments > 0'
  }
  {
    key: 'conflict-or-invalid'
    severity: 2
    frequency: 'PT5M'
    window: 'PT5M'
    timeRange: ''
    description: 'A message was refused as conflict (same key, different payload) or invalid-message. It fails every delivery and will be dead-lettered. ${runbook} conflict-or-invalid.'
    query: '${replace(metric, '__METRIC__', 'dead_letter_bound')} | extend outcome = tostring(customDimensions.outcome) | where outcome in ("conflict", "invalid-message") | summarize answers = sum(valueSum), firstSeen = min(timestamp), lastSeen = max(timestamp) by outcome | where answers > 0'
  }
  {
    key: 'retry-or-duplicate-spike'
    severity: 2
    frequency: 'PT5M'
    window: 'PT15M'
    // The query compares the last 15 minutes with the previous day, so it needs more than the window.
    timeRange: 'P2D'
    description: 'retry-later or duplicate outcomes in the last 15 minutes are at least ${spikeMinCount} and more than ${spikeFactor} times the average 15 minutes of the previous day. ${runbook} retry-or-duplicate-spike.'
    query: 'let recent = 15m; let history = 1d; let counted = ${outcomes} | where timestamp > ago(history + recent) and outcome in ("retry-later", "duplicate"); let lastWindow = counted | where timestamp > ago(recent) | summarize current = sum(valueSum) by outcome; let previousDay = counted | where timestamp <= ago(recent) | summarize baseline = sum(valueSum) / (history / recent) by outcome; lastWindow | join kind=leftouter previousDay on outcome | extend baseline = coalesce(baseline, 0.0) | where current >= ${spikeMinCount} and current > ${spikeFactor} * baseline | project outcome, current, baseline'
  }
  {
    key: 'payments-stuck'
    severity: 2
    frequency: 'PT15M'
    window: 'PT1H'
    timeRange: ''
    description: 'The reconcile run found payments in progress past their lease (orphaned-in-progress) or payouts whose outcome the bank lookup could not settle (still-unknown). ${runbook} payments-stuck.'
    query: '${replace(metric, '__METRIC__', 'reconcile.backlog')} | extend state = tostring(customDimensions.state) | where state in ("orphaned-in-progress", "still-unknown") | summarize backlog = max(valueMax), lastSeen = max(timestamp) by state | where backlog > 0'
  }
  {
    key: 'reconcile-mismatch'
    severity: 1
    frequency: 'PT15M'
    window: 'PT1H'
    timeRange: ''
    description: 'Payments whose bank record contradicts the ledger (mismatched, double payments included) wait for a person: the reconcile run reports them on every run until they are settled by hand. ${runbook} reconcile-mismatch.'
    query: '${replace(metric, '__METRIC__', 'reconcile.backlog')} | extend state = tostring(customDimensions.state) | where state == "needs-a-person" | summarize mismatched = max(valueMax), lastSeen = max(timestamp) by state | where mismatched > 0'
  }
  {
    key: 'bank-service-fault'
    severity: 1
    frequency: 'PT5M'
    window: 'PT5M'
    timeRange: ''
    description: 'The bank refused the service\'s own request (401/403 credential, 404/405 URL or method, 407 proxy, 413/415 format). No payout goes out until it is fixed. ${runbook} bank-service-fault.'
    query: 'dependencies | where tostring(customDimensions["bank.answer"]) == "service-fault" | summarize faults = sum(itemCount), firstSeen = min(timestamp), lastSeen = max(timestamp), example = take_any(operation_Id) by bankStatus = toint(resultCode)'
  }
  {
    key: 'handler-restarts'
    severity: 2
    frequency: 'PT10M'
    window: 'PT30M'
    timeRange: ''
    description: 'The custom handler started more than once on one instance within 30 minutes: it crashed or hit functionTimeout and was restarted. ${runbook} handler-restarts.'
    query: '${replace(metric, '__METRIC__', 'starts')} | summarize starts = sum(valueSum), firstSeen = min(timestamp), lastSeen = max(timestamp) by cloud_RoleInstance | where starts > 1'
  }
]

resource logAlerts 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [for rule in logRules: {
  name: '${namePrefix}-${rule.key}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: '${namePrefix}-${rule.key}'
    description: rule.description
    severity: rule.severity
    enabled: true
    scopes: [
      appInsightsId
    ]
    evaluationFrequency: rule.frequency
    windowSize: rule.window
    overrideQueryTimeRange: empty(rule.timeRange) ? null : rule.timeRange
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: rule.query
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        notify
      ]
    }
  }
}]

output actionGroupId string = notify
output logAlertNames array = [for rule in logRules: '${namePrefix}-${rule.key}']
