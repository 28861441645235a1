// Links the function app to the Static Web App as its backend: requests to
// https://<static web app>/api/* are forwarded to the function app with the
// signed-in user's principal. The function app's App Service Authentication
// accepts the Static Web App (azureStaticWebApps provider, functionapp.bicep).

@description('Name of the Static Web App.')
param staticWebAppName string

@description('Resource id of the function app.')
param backendResourceId string

@description('Region of the function app.')
param backendRegion string

resource site 'Microsoft.Web/staticSites@2023-12-01' existing = {
  name: staticWebAppName
}

resource backend 'Microsoft.Web/staticSites/linkedBackends@2023-12-01' = {
  parent: site
  name: 'payments-api'
  properties: {
    backendResourceId: backendResourceId
    region: backendRegion
  }
}
