// Landing zone: adds resources to the platform team's existing Azure Monitor
// Private Link Scope. Deployed into the scope's resource group (main.bicep sets
// the module scope from existingPrivateLinkScopeId), which needs write access
// to Microsoft.Insights/privateLinkScopes/scopedResources there.

@description('Name of the existing private link scope.')
param scopeName string

@description('Resource ids to add (Application Insights, and the workspace when this deployment created it).')
param scopedResourceIds array

@description('Short, unique name stem for the scoped-resource entries.')
param entryPrefix string

resource scope 'Microsoft.Insights/privateLinkScopes@2021-07-01-preview' existing = {
  name: scopeName
}

resource scoped 'Microsoft.Insights/privateLinkScopes/scopedResources@2021-07-01-preview' = [for (id, i) in scopedResourceIds: {
  parent: scope
  name: '${entryPrefix}-${i}'
  properties: {
    linkedResourceId: id
  }
}]
