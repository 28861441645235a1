// Log Analytics workspace (or an existing one: a landing zone's central
// workspace) and a workspace-based Application Insights component. Local
// (instrumentation-key) auth is off: telemetry is accepted only with an Entra
// token, which the app gets from its managed identity.
//
// Private profiles: ingestion and query of Application Insights (and of the
// workspace, when this template creates it) are private only; they go through
// an Azure Monitor Private Link Scope (monitor-private-link.bicep, or the
// platform team's scope), whose private endpoint the app reaches over its VNet
// integration.

@description('Name of the Log Analytics workspace (created only when existingWorkspaceId is empty).')
param workspaceName string

@description('Resource id of an existing Log Analytics workspace; empty = create one.')
param existingWorkspaceId string

@description('Name of the Application Insights component.')
param appInsightsName string

@description('Azure region.')
param location string

@description('Tags applied to both resources.')
param tags object

@description('Days the created workspace keeps logs.')
@minValue(30)
@maxValue(730)
param retentionInDays int

@description('Enabled (public profile) or Disabled (private profiles: ingestion and query only through an Azure Monitor Private Link Scope).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

var createWorkspace = empty(existingWorkspaceId)

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = if (createWorkspace) {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    publicNetworkAccessForIngestion: publicNetworkAccess
    publicNetworkAccessForQuery: publicNetworkAccess
  }
}

var workspaceId = createWorkspace ? workspace.id : existingWorkspaceId

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspaceId
    IngestionMode: 'LogAnalytics'
    DisableLocalAuth: true
    publicNetworkAccessForIngestion: publicNetworkAccess
    publicNetworkAccessForQuery: publicNetworkAccess
  }
}

output workspaceId string = workspaceId
output workspaceCreated bool = createWorkspace
output appInsightsName string = appInsights.name
output appInsightsId string = appInsights.id
output connectionString string = appInsights.properties.ConnectionString
