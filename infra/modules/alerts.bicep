// Alert as soon as anything sits in the dead-letter queue: a dead-lettered
// ClaimApproved message is an approved claim that was not paid.

@description('Alert rule name.')
param name string

@description('Tags applied to the alert rule.')
param tags object

@description('Resource id of the Service Bus namespace.')
param serviceBusNamespaceId string

@description('Queue whose dead-letter count is watched (metric dimension EntityName).')
param queueName string

@description('Action group resource id to notify; empty creates the rule without notifications.')
param actionGroupId string

resource deadLetterAlert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: name
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages in the dead-letter queue of ${queueName}: approved claims that were not paid. Inspect and re-drive (docs/deploy.md, Operations).'
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
    actions: empty(actionGroupId) ? [] : [
      {
        actionGroupId: actionGroupId
      }
    ]
  }
}

output id string = deadLetterAlert.id
