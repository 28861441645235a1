// Private profile, own network only (no existing subnets passed in): the virtual
// network the Flex Consumption app joins, one network security group per subnet,
// and optionally a NAT gateway that gives every outbound call (the bank
// included) one static public IP. In a landing zone (existingAppSubnetId and
// existingPrivateEndpointSubnetId in main.bicep) this module is not deployed:
// the platform team's spoke subnets, NSGs and route tables are used as they are.
// Private DNS zones and endpoints are in private-link.bicep, one per service.
//
// Flex Consumption needs the integration subnet delegated to
// Microsoft.App/environments (not Microsoft.Web/serverFarms), a subnet name
// without underscores, and the Microsoft.App resource provider registered in
// the subscription. The app's outbound traffic goes through the integrated
// subnet (vnetRouteAllEnabled, set in functionapp.bicep), so these NSGs and the
// subnet's route table (a landing zone's user-defined route to the hub
// firewall) apply to all of it.
//
// The NSG rules allow exactly the traffic the deployment needs:
//   snet-app   out: 443, 5671-5672 (Service Bus AMQP) and 5432 (PostgreSQL) to the
//                   private-endpoint subnet; 443 to the internet (Entra ID tokens,
//                   the bank); in: nothing.
//   snet-pe    in:  443 from the virtual network (the app, the tools subnet and,
//                   through peering, callers of the API); 5671-5672 from the app
//                   subnet; 5432 from the app and tools subnets.
//   snet-tools out: 443 and 5432 to the private-endpoint subnet, 443 to the internet
//                   (runner agents, Entra ID, ARM); in: nothing.
// The 5432 rules do not depend on storeKind: with Cosmos DB no endpoint in snet-pe
// listens on 5432, and the rules stay the same when a deployment moves to PostgreSQL.
// Everything else is denied, inbound from the internet explicitly.

@description('Virtual network name.')
param vnetName string

@description('Prefix of the NSG names (nsg-<prefix>-app, -pe, -tools).')
param nsgNamePrefix string

@description('Create a NAT gateway with a static public IP for the app and tools subnets. Off: outbound leaves through the default route of the subnet (for example a user-defined route to a hub firewall added by the platform team).')
param natGateway bool

@description('NAT gateway name (natGateway only).')
param natGatewayName string

@description('Name of the NAT gateway public IP (natGateway only).')
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

resource publicIp 'Microsoft.Network/publicIPAddresses@2024-05-01' = if (natGateway) {
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

resource nat 'Microsoft.Network/natGateways@2024-05-01' = if (natGateway) {
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

resource appNsg 'Microsoft.Network/networkSecurityGroups@2024-05-01' = {
  name: '${nsgNamePrefix}-app'
  location: location
  tags: tags
  properties: {
    securityRules: [
      {
        name: 'deny-internet-inbound'
        properties: {
          description: 'The integration subnet takes no inbound traffic; callers reach the app through its private endpoint.'
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: 'Internet'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
      {
        name: 'deny-all-inbound'
        properties: {
          priority: 4096
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
      {
        name: 'allow-private-endpoints-https'
        properties: {
          description: 'Cosmos DB, host storage, Service Bus, Key Vault, Azure Monitor (AMPLS): their private endpoints.'
          priority: 100
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '443'
        }
      }
      {
        name: 'allow-private-endpoints-amqp'
        properties: {
          description: 'The Service Bus trigger speaks AMQP to the namespace\'s private endpoint.'
          priority: 110
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5671-5672'
        }
      }
      {
        name: 'allow-private-endpoints-postgres'
        properties: {
          description: 'storeKind postgres: the PostgreSQL server\'s private endpoint.'
          priority: 120
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5432'
        }
      }
      {
        name: 'allow-internet-https'
        properties: {
          description: 'Entra ID token requests and the bank payout API (HTTPS only).'
          priority: 200
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: 'Internet'
          destinationPortRange: '443'
        }
      }
      {
        name: 'deny-all-outbound'
        properties: {
          priority: 4096
          direction: 'Outbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
    ]
  }
}

resource peNsg 'Microsoft.Network/networkSecurityGroups@2024-05-01' = {
  name: '${nsgNamePrefix}-pe'
  location: location
  tags: tags
  properties: {
    securityRules: [
      {
        name: 'allow-vnet-https'
        properties: {
          description: 'The app, the tools subnet and peered callers of the API (HTTPS to the private endpoints).'
          priority: 100
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: 'VirtualNetwork'
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '443'
        }
      }
      {
        name: 'allow-app-amqp'
        properties: {
          description: 'The Service Bus trigger of the app (AMQP).'
          priority: 110
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5671-5672'
        }
      }
      {
        name: 'allow-app-postgres'
        properties: {
          description: 'storeKind postgres: the app to the PostgreSQL server.'
          priority: 120
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: appSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5432'
        }
      }
      {
        name: 'allow-tools-postgres'
        properties: {
          description: 'storeKind postgres: operators on the jump host or runner (role set-up, claims-payments provision, psql).'
          priority: 130
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: toolsSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5432'
        }
      }
      {
        name: 'deny-internet-inbound'
        properties: {
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: 'Internet'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
      {
        name: 'deny-all-inbound'
        properties: {
          priority: 4096
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
    ]
  }
}

resource toolsNsg 'Microsoft.Network/networkSecurityGroups@2024-05-01' = {
  name: '${nsgNamePrefix}-tools'
  location: location
  tags: tags
  properties: {
    securityRules: [
      {
        name: 'deny-internet-inbound'
        properties: {
          description: 'Runner agents poll their service; nothing connects in.'
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: 'Internet'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
      {
        name: 'deny-all-inbound'
        properties: {
          priority: 4096
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
      {
        name: 'allow-private-endpoints-https'
        properties: {
          description: 'One-deploy to the app\'s private endpoint, the package container, Key Vault.'
          priority: 100
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: toolsSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '443'
        }
      }
      {
        name: 'allow-private-endpoints-postgres'
        properties: {
          description: 'storeKind postgres: role set-up, claims-payments provision and psql against the server\'s private endpoint.'
          priority: 110
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: toolsSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: privateEndpointSubnetPrefix
          destinationPortRange: '5432'
        }
      }
      {
        name: 'allow-internet-https'
        properties: {
          description: 'Runner agent service, Entra ID, Azure Resource Manager.'
          priority: 200
          direction: 'Outbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: toolsSubnetPrefix
          sourcePortRange: '*'
          destinationAddressPrefix: 'Internet'
          destinationPortRange: '443'
        }
      }
      {
        name: 'deny-all-outbound'
        properties: {
          priority: 4096
          direction: 'Outbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: '*'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
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
          networkSecurityGroup: {
            id: appNsg.id
          }
          natGateway: natGateway ? {
            id: nat.id
          } : null
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
          networkSecurityGroup: {
            id: peNsg.id
          }
          // Without this, NSG rules are not applied to private endpoints.
          privateEndpointNetworkPolicies: 'NetworkSecurityGroupEnabled'
        }
      }
      {
        name: 'snet-tools'
        properties: {
          addressPrefix: toolsSubnetPrefix
          networkSecurityGroup: {
            id: toolsNsg.id
          }
          natGateway: natGateway ? {
            id: nat.id
          } : null
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
output natPublicIp string = natGateway ? publicIp.properties.ipAddress : ''
