// Private profile only: the virtual network the Flex Consumption app joins, a
// NAT gateway that gives every outbound call (the bank included) one static
// public IP, and the subnets for private endpoints and deployment runners.
// Private DNS zones and endpoints are in private-link.bicep, one per service.
//
// Flex Consumption needs the integration subnet delegated to
// Microsoft.App/environments (not Microsoft.Web/serverFarms), a subnet name
// without underscores, and the Microsoft.App resource provider registered in
// the subscription. Flex routes all outbound traffic of the app through the
// integrated subnet by itself; vnetRouteAllEnabled is not needed (and not set).

@description('Virtual network name.')
param vnetName string

@description('NAT gateway name.')
param natGatewayName string

@description('Name of the NAT gateway public IP.')
param publicIpName string

@description('Azure region (the same as the function app).')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Address space of the virtual network.')
param addressPrefix string

@description('Subnet delegated to the Flex Consumption app (a single app uses up to about 40 addresses).')
param appSubnetPrefix string

@description('Subnet that holds the private endpoints.')
param privateEndpointSubnetPrefix string

@description('Subnet for deployment runners or a jump host (one-deploy must reach the app privately).')
param toolsSubnetPrefix string

resource publicIp 'Microsoft.Network/publicIPAddresses@2024-05-01' = {
  name: publicIpName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Regional'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
    publicIPAddressVersion: 'IPv4'
    idleTimeoutInMinutes: 4
  }
}

resource natGateway 'Microsoft.Network/natGateways@2024-05-01' = {
  name: natGatewayName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    idleTimeoutInMinutes: 4
    publicIpAddresses: [
      {
        id: publicIp.id
      }
    ]
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: vnetName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: 'snet-app'
        properties: {
          addressPrefix: appSubnetPrefix
          natGateway: {
            id: natGateway.id
          }
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: 'snet-pe'
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
        }
      }
      {
        name: 'snet-tools'
        properties: {
          addressPrefix: toolsSubnetPrefix
          natGateway: {
            id: natGateway.id
          }
        }
      }
    ]
  }
}

output vnetId string = vnet.id
output vnetName string = vnet.name
output appSubnetId string = '${vnet.id}/subnets/snet-app'
output privateEndpointSubnetId string = '${vnet.id}/subnets/snet-pe'
output toolsSubnetId string = '${vnet.id}/subnets/snet-tools'
// Give this address to the bank for its allow list: every outbound call of the app leaves from it.
output natPublicIp string = publicIp.properties.ipAddress
