// Private profile with its own network: an Azure Monitor Private Link Scope
// (AMPLS) in private-only mode for ingestion and query, the Application
// Insights component and the workspace as its scoped resources, and its private
// endpoint (group azuremonitor) with the five zones Azure Monitor resolves
// through: monitor, oms, ods, agentsvc and the blob zone (shared with host
// storage's blob endpoint). In a landing zone the platform team's scope is used
// instead (monitor-scope-link.bicep): one scope per DNS namespace, so a second
// scope with its own endpoint would take over the shared privatelink zones.

@description('Name of the private link scope.')
param name string

@description('Azure region of the private endpoint (the scope itself is global).')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Resource ids to add to the scope (Application Insights, the workspace).')
param scopedResourceIds array

@description('Resource id of the subnet that holds private endpoints.')
param subnetId string

@description('Resource id of the virtual network that resolves the zones (own network; empty with existing zones).')
param vnetId string

@description('Resource id of the privatelink.blob zone, created for the host storage endpoint.')
param blobZoneId string

@description('Resource group id of the central privatelink zones (landing zone); empty = create the zones here and link them to vnetId.')
param existingDnsZoneResourceGroupId string

var createZones = empty(existingDnsZoneResourceGroupId)
// The zones of this resource group (created above) or of the central one.
var zoneIdPrefix = createZones ? '${resourceGroup().id}/providers/Microsoft.Network/privateDnsZones' : '${existingDnsZoneResourceGroupId}/providers/Microsoft.Network/privateDnsZones'
var ownZoneNames = [
  'privatelink.monitor.azure.com'
  'privatelink.oms.opinsights.azure.com'
  'privatelink.ods.opinsights.azure.com'
  'privatelink.agentsvc.azure-automation.net'
]

resource scope 'Microsoft.Insights/privateLinkScopes@2021-07-01-preview' = {
  name: name
  location: 'global'
  tags: tags
  properties: {
    accessModeSettings: {
      ingestionAccessMode: 'PrivateOnly'
      queryAccessMode: 'PrivateOnly'
    }
  }
}

resource scoped 'Microsoft.Insights/privateLinkScopes/scopedResources@2021-07-01-preview' = [for (id, i) in scopedResourceIds: {
  parent: scope
  name: 'scoped-${i}'
  properties: {
    linkedResourceId: id
  }
}]

resource zones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for zone in ownZoneNames: if (createZones) {
  name: zone
  location: 'global'
  tags: tags
}]

resource links 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (zone, i) in ownZoneNames: if (createZones) {
  parent: zones[i]
  name: 'link-${last(split(vnetId, '/'))}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnetId
    }
  }
}]

resource endpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: 'pe-${name}'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: 'pe-${name}'
        properties: {
          privateLinkServiceId: scope.id
          groupIds: [
            'azuremonitor'
          ]
        }
      }
    ]
  }
  dependsOn: [
    scoped
  ]
}

resource zoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: endpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: 'privatelink-monitor-azure-com'
        properties: {
          privateDnsZoneId: '${zoneIdPrefix}/privatelink.monitor.azure.com'
        }
      }
      {
        name: 'privatelink-oms-opinsights-azure-com'
        properties: {
          privateDnsZoneId: '${zoneIdPrefix}/privatelink.oms.opinsights.azure.com'
        }
      }
      {
        name: 'privatelink-ods-opinsights-azure-com'
        properties: {
          privateDnsZoneId: '${zoneIdPrefix}/privatelink.ods.opinsights.azure.com'
        }
      }
      {
        name: 'privatelink-agentsvc-azure-automation-net'
        properties: {
          privateDnsZoneId: '${zoneIdPrefix}/privatelink.agentsvc.azure-automation.net'
        }
      }
      {
        name: 'privatelink-blob'
        properties: {
          privateDnsZoneId: blobZoneId
        }
      }
    ]
  }
  dependsOn: [
    links
  ]
}

output scopeId string = scope.id
