// Azure Static Web App (Standard: linked backends need it) that hosts the
// Angular client (web/, `ng build` output, with web/staticwebapp.config.json).
// The platform signs users in with Entra ID, puts their Static Web Apps roles
// (role assignments or invitations: docs/deploy.md, "Signed-in callers") in the
// principal, and forwards /api/* to the linked function app
// (staticwebapp-backend.bicep) with X-MS-CLIENT-PRINCIPAL. The page calls
// /api on its own origin: no CORS, no key in the browser.

@description('Static Web App name.')
param name string

@description('Static Web Apps region (the content is served globally).')
param location string

@description('Tags applied to the site.')
param tags object

resource site 'Microsoft.Web/staticSites@2023-12-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    // The app is deployed by a pipeline with the deployment token; no repository link.
    provider: 'None'
    allowConfigFileUpdates: true
    stagingEnvironmentPolicy: 'Disabled'
    enterpriseGradeCdnStatus: 'Disabled'
  }
}

output name string = site.name
output id string = site.id
output defaultHostName string = site.properties.defaultHostname
