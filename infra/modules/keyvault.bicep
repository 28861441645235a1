// Key Vault for the bank credential (BANK_API_KEY). Access is Azure RBAC only
// (no access policies); the app's identity gets Key Vault Secrets User on this
// vault in rbac.bicep and reads the secret through a Key Vault reference in its
// app settings. Soft delete and purge protection are on: a deleted credential
// can be recovered for softDeleteRetentionDays and nobody can purge it sooner.
//
// The secret is written only when a value is passed. A deployment without one
// keeps whatever version is current, so a rotation done outside the template
// (docs/runbook.md, "Rotating the bank credential") is not undone by the next deployment.

@description('Vault name (3-24 letters, digits and hyphens, globally unique).')
@minLength(3)
@maxLength(24)
param name string

@description('Azure region.')
param location string

@description('Tags applied to the vault.')
param tags object

@description('Enabled (public profile) or Disabled (private profile: reachable only through its private endpoint).')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Firewall default for the public endpoint: Allow (public profile) or Deny.')
@allowed([
  'Allow'
  'Deny'
])
param networkDefaultAction string

@description('Name of the secret that holds the bank credential.')
param bankApiKeySecretName string

@description('Bank credential. Empty: leave the current secret version as it is.')
@secure()
param bankApiKey string

@description('Log Analytics workspace that receives the vault audit log (who read which secret).')
param workspaceId string

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    enabledForDeployment: false
    enabledForDiskEncryption: false
    enabledForTemplateDeployment: false
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      defaultAction: networkDefaultAction
      bypass: 'None'
    }
  }
}

resource bankApiKeySecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(bankApiKey)) {
  parent: vault
  name: bankApiKeySecretName
  properties: {
    value: bankApiKey
    contentType: 'text/plain; bank API credential, sent as Authorization: Bearer'
  }
}

resource auditLog 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: vault
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'audit'
        enabled: true
      }
    ]
  }
}

output name string = vault.name
output id string = vault.id
// Without a version: the app follows the current version (rotation, docs/runbook.md §6).
output bankApiKeySecretUri string = '${vault.properties.vaultUri}secrets/${bankApiKeySecretName}'
