// The service's Azure Workbook (Application Insights > Workbooks > claims-payments):
// one page an operator reads top to bottom. Every chart reads the handler's
// OpenTelemetry data (customMetrics named claims_payments.*, its requests and
// dependencies) or the queue's platform metric; none parses a log line.
// Requests and dependencies are sampled (every failure, a share of the successes):
// a chart on them weighs each row by its itemCount (100 / sampleRate).
// docs/runbook.md §2 explains each panel and the query behind it.

@description('Display name of the workbook.')
param displayName string

@description('Azure region of the workbook.')
param location string

@description('Tags applied to the workbook.')
param tags object

@description('Resource id of the Application Insights component the workbook reads (its source).')
param appInsightsId string

@description('Resource id of the Service Bus namespace (dead-letter depth).')
param serviceBusNamespaceId string

@description('Queue whose dead-letter depth is shown (metric dimension EntityName).')
param queueName string

var m = 'customMetrics | where timestamp {TimeRange} | where name == "claims_payments.__METRIC__"'

var panels = [
  {
    title: 'Outcomes over time'
    query: '${replace(m, '__METRIC__', 'outcomes')} | summarize count = sum(valueSum) by outcome = tostring(customDimensions.outcome), bin(timestamp, {TimeRange:grain})'
    visualization: 'timechart'
  }
  {
    title: 'Duplicate ratio (duplicates and business duplicates / all outcomes)'
    query: '${replace(m, '__METRIC__', 'outcomes')} | extend outcome = tostring(customDimensions.outcome) | summarize duplicates = sumif(valueSum, outcome in ("duplicate", "business-duplicate")), all = sum(valueSum) by bin(timestamp, {TimeRange:grain}) | project timestamp, duplicateRatio = iff(all > 0, duplicates / all, 0.0)'
    visualization: 'timechart'
  }
  {
    title: 'Takeovers of another attempt\'s lease'
    query: '${replace(m, '__METRIC__', 'takeovers')} | summarize takeovers = sum(valueSum) by bin(timestamp, {TimeRange:grain})'
    visualization: 'barchart'
  }
  {
    title: 'Answers that send a message to the dead-letter queue, by outcome'
    query: '${replace(m, '__METRIC__', 'dead_letter_bound')} | summarize answers = sum(valueSum) by outcome = tostring(customDimensions.outcome), bin(timestamp, {TimeRange:grain})'
    visualization: 'barchart'
  }
  {
    title: 'Bank latency p50 / p99 (ms, payout requests)'
    query: 'dependencies | where timestamp {TimeRange} | where tostring(customDimensions["bank.operation"]) == "payout" | summarize p50 = percentilew(duration, itemCount, 50), p99 = percentilew(duration, itemCount, 99) by bin(timestamp, {TimeRange:grain})'
    visualization: 'timechart'
  }
  {
    title: 'Bank answers by class'
    query: '${replace(m, '__METRIC__', 'bank.duration')} | summarize requests = sum(valueCount) by answer = tostring(customDimensions.answer), bin(timestamp, {TimeRange:grain})'
    visualization: 'barchart'
  }
  {
    title: 'Reconciliation backlog (last run, by state)'
    query: '${replace(m, '__METRIC__', 'reconcile.backlog')} | summarize backlog = max(valueMax) by state = tostring(customDimensions.state), bin(timestamp, {TimeRange:grain})'
    visualization: 'timechart'
  }
  {
    title: 'Reconciliation results'
    query: '${replace(m, '__METRIC__', 'reconcile.results')} | summarize payments = sum(valueSum) by result = tostring(customDimensions.result), bin(timestamp, {TimeRange:grain})'
    visualization: 'barchart'
  }
  {
    title: 'Request units per message (Cosmos DB)'
    query: 'customMetrics | where timestamp {TimeRange} | where name in ("claims_payments.cosmos.request_units", "claims_payments.outcomes") | summarize ru = sumif(valueSum, name == "claims_payments.cosmos.request_units"), messages = sumif(valueSum, name == "claims_payments.outcomes") by bin(timestamp, {TimeRange:grain}) | project timestamp, ruPerMessage = iff(messages > 0, ru / messages, 0.0)'
    visualization: 'timechart'
  }
  {
    title: 'HTTP answers by route and status'
    query: '${replace(m, '__METRIC__', 'http.answers')} | summarize answers = sum(valueSum) by answer = strcat(tostring(customDimensions.route), " ", tostring(customDimensions.status)), bin(timestamp, {TimeRange:grain})'
    visualization: 'barchart'
  }
]

var panelItems = [for (p, i) in panels: {
  type: 3
  name: 'panel-${i}'
  content: {
    version: 'KqlItem/1.0'
    title: p.title
    query: p.query
    size: 0
    queryType: 0
    resourceType: 'microsoft.insights/components'
    visualization: p.visualization
    timeContextFromParameter: 'TimeRange'
  }
}]

var content = {
  version: 'Notebook/1.0'
  items: concat([
    {
      type: 1
      name: 'intro'
      content: {
        json: '## claims-payments\nOne trace per claim: open a request under Transaction search or Failures to see the Service Bus send, the invocation, the store calls and the bank call as one operation.'
      }
    }
    {
      type: 9
      name: 'parameters'
      content: {
        version: 'KqlParameterItem/1.0'
        parameters: [
          {
            id: 'time-range'
            version: 'KqlParameterItem/1.0'
            name: 'TimeRange'
            type: 4
            isRequired: true
            value: {
              durationMs: 86400000
            }
            typeSettings: {
              selectableValues: [
                { durationMs: 3600000 }
                { durationMs: 14400000 }
                { durationMs: 86400000 }
                { durationMs: 604800000 }
              ]
            }
          }
        ]
      }
    }
    {
      type: 10
      name: 'dead-letter-depth'
      content: {
        chartId: 'dead-letter-depth'
        version: 'MetricsItem/2.0'
        size: 0
        chartType: 2
        resourceType: 'microsoft.servicebus/namespaces'
        metricScope: 0
        resourceIds: [
          serviceBusNamespaceId
        ]
        timeContextFromParameter: 'TimeRange'
        timeContext: {
          durationMs: 86400000
        }
        metrics: [
          {
            namespace: 'microsoft.servicebus/namespaces'
            metric: 'microsoft.servicebus/namespaces--DeadletteredMessages'
            aggregation: 3
          }
        ]
        filters: [
          {
            key: 'EntityName'
            operator: 0
            values: [
              queueName
            ]
          }
        ]
        title: 'Dead-letter depth of ${queueName}'
      }
    }
  ], panelItems)
}

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, appInsightsId, 'claims-payments-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    sourceId: appInsightsId
    version: 'Notebook/1.0'
    serializedData: string(content)
  }
}

output workbookId string = workbook.id
