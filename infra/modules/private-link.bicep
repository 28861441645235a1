// One private endpoint with its private DNS zone: the zone (for example
// privatelink.documents.azure.com or privatelink.postgres.database.azure.com), its link to the virtual network, the
// endpoint in the private-endpoint subnet and the zone group that writes the
// endpoint's A records into the zone. Every target service has its own zone,
// so each call creates exactly one zone. In a landing zone (existingDnsZoneId
// set) the central zone of the hub is used: no zone and no link are created,
// only the endpoint and its zone group.

@description('Private endpoint name.')
param name string

@description('Azure region of the endpoint (the zone and its link are global).')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Resource id of the subnet that holds private endpoints.')
param subnetId string

@description('Resource id of the virtual network that resolves the zone (own network only; empty with existingDnsZoneId).')
param vnetId string

@description('Resource id of the service the endpoint connects to.')
param targetResourceId string

@description('Private link sub-resource: Sql (Cosmos DB), postgresqlServer, blob, queue, table, namespace, vault or sites.')
@allowed([
  'Sql'
  'postgresqlServer'
  'blob'
  'queue'
  'table'
  'namespace'
  'vault'
  'sites'
])
param groupId string

@description('Private DNS zone of that sub-resource, for example privatelink.blob.core.windows.net.')
param privateDnsZoneName string

@description('Resource id of an existing (central) private DNS zone with that name; empty = create the zone and link it to vnetId.')
param existingDnsZoneId string = ''

var createZone = empty(existingDnsZoneId)

resource zone 'Microsoft.Network/privateDnsZones@2020-06-01' = if (createZone) {
  name: privateDnsZoneName
  location: 'global'
  tags: tags
}

resource vnetLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = if (createZone) {
  parent: zone
  name: 'link-${last(split(vnetId, '/'))}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnetId
    }
  }
}

resource endpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: name
        properties: {
          privateLinkServiceId: targetResourceId
          groupIds: [
            groupId
          ]
        }
      }
    ]
  }
}

resource zoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: endpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: replace(privateDnsZoneName, '.', '-')
        properties: {
          privateDnsZoneId: createZone ? zone.id : existingDnsZoneId
        }
      }
    ]
  }
  dependsOn: [
    vnetLink
  ]
}

output endpointId string = endpoint.id
output zoneId string = createZone ? zone.id : existingDnsZoneId
