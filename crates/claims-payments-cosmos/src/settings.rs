//! `COSMOS_*` settings and the construction of the SDK client from them.
//!
//! | setting | meaning |
//! |---|---|
//! | `COSMOS_ENDPOINT` | account endpoint; required when `PAYMENTS_STORE=cosmos`. `http://` only for emulator hosts |
//! | `COSMOS_DATABASE` | database name, default `payments` |
//! | `COSMOS_CONTAINER` | container name, default `payments` |
//! | `COSMOS_KEY` | account key: key auth (emulator, dev accounts). Unset: Entra ID |
//! | `COSMOS_MANAGED_IDENTITY_CLIENT_ID` | client id of a user-assigned managed identity |
//! | `COSMOS_PREFERRED_REGION` | region to route to first; default `REGION_NAME` (set by App Service / Functions), else the account's order |
//!
//! Entra ID uses the managed identity when running in Azure (the host sets
//! `IDENTITY_ENDPOINT` or `MSI_ENDPOINT`) or when a client id is configured, and the
//! developer tools (Azure CLI, azd) otherwise: the rule and the credential are
//! [`claims_payments_settings::entra`]'s, shared with the process's other parts. The key is never logged or
//! put in an error.

use std::fmt;
use std::time::Duration;

use azure_core::credentials::Secret;
use azure_core::http::Url;
use azure_data_cosmos::options::{
    BinaryEncodingOptions, ConnectionPoolOptions, EndToEndOperationLatencyPolicy, OperationOptions,
    OperationOptionsBuilder, Region, ServerCertificateValidation, ThrottlingRetryOptionsBuilder,
};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosClientBuilder, CosmosRuntime,
    RoutingStrategy,
};
use base64::Engine;

use claims_payments_settings::entra::{self, EntraIdentity, Fallback};
use claims_payments_settings::names;
use claims_payments_settings::{non_blank, ConfigError};

/// The container name used by default and in `infra/cosmos-container.json`.
pub const DEFAULT_CONTAINER: &str = "payments";
/// The database name used by default.
pub const DEFAULT_DATABASE: &str = "payments";

/// How the service authenticates to Cosmos DB.
#[derive(Clone, PartialEq, Eq)]
pub enum CosmosAuth {
    /// Account key (`COSMOS_KEY`): the emulator and development accounts.
    Key(Secret),
    /// A managed identity: system-assigned, or user-assigned when a client id is given.
    ManagedIdentity { client_id: Option<String> },
    /// Azure CLI / Azure Developer CLI credentials of the developer.
    DeveloperTools,
}

impl fmt::Debug for CosmosAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CosmosAuth::Key(_) => f.write_str("Key(<redacted>)"),
            CosmosAuth::ManagedIdentity { client_id } => f
                .debug_struct("ManagedIdentity")
                .field("client_id", client_id)
                .finish(),
            CosmosAuth::DeveloperTools => f.write_str("DeveloperTools"),
        }
    }
}

impl CosmosAuth {
    /// A short description for logs ("key", "managed identity (user-assigned ...)", ...).
    pub fn describe(&self) -> String {
        match self {
            CosmosAuth::Key(_) => "account key".to_owned(),
            CosmosAuth::ManagedIdentity {
                client_id: Some(id),
            } => {
                format!("managed identity (user-assigned, client id {id})")
            }
            CosmosAuth::ManagedIdentity { client_id: None } => {
                "managed identity (system-assigned)".to_owned()
            }
            CosmosAuth::DeveloperTools => "developer tools credential (Azure CLI / azd)".to_owned(),
        }
    }
}

/// Where and how to reach the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosmosSettings {
    pub endpoint: Url,
    pub database: String,
    pub container: String,
    pub auth: CosmosAuth,
    preferred_region: Option<String>,
    /// `AZURE_COSMOS_EMULATOR_HOST`: a non-loopback host name the SDK treats as an
    /// emulator (plain http allowed).
    emulator_host: Option<String>,
    /// How long [`CosmosStore::connect`](super::CosmosStore::connect) keeps retrying an
    /// unreachable endpoint before giving up (the emulator may still be starting).
    pub startup_budget: Duration,
}

impl CosmosSettings {
    pub const DEFAULT_STARTUP_BUDGET: Duration = Duration::from_secs(30);

    /// Reads the settings through `lookup` (the environment, or a map in tests). Empty
    /// values count as unset, since app settings cannot always be removed.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| non_blank(&lookup, name);

        let endpoint = get(names::COSMOS_ENDPOINT).ok_or_else(|| {
            ConfigError::new(names::COSMOS_ENDPOINT, "is required when PAYMENTS_STORE=cosmos (e.g. https://<account>.documents.azure.com:443/)")
        })?;
        let emulator_host = get(names::AZURE_COSMOS_EMULATOR_HOST);
        let endpoint = parse_endpoint(&endpoint, emulator_host.as_deref())?;

        let database = get(names::COSMOS_DATABASE).unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
        validate_name(names::COSMOS_DATABASE, &database)?;
        let container =
            get(names::COSMOS_CONTAINER).unwrap_or_else(|| DEFAULT_CONTAINER.to_owned());
        validate_name(names::COSMOS_CONTAINER, &container)?;

        let client_id = get(names::COSMOS_MANAGED_IDENTITY_CLIENT_ID);
        if let Some(id) = &client_id {
            uuid::Uuid::try_parse(id).map_err(|_| {
                ConfigError::new(
                    names::COSMOS_MANAGED_IDENTITY_CLIENT_ID,
                    format!("{id:?} is not a client id (a GUID)"),
                )
            })?;
        }
        let auth = match get(names::COSMOS_KEY) {
            Some(key) => {
                let decoded = base64::engine::general_purpose::STANDARD.decode(key.as_bytes());
                if !decoded.is_ok_and(|bytes| !bytes.is_empty()) {
                    return Err(ConfigError::new(
                        names::COSMOS_KEY,
                        "is not a base64 account key (copy the primary key of the account, or the emulator's key)",
                    ));
                }
                CosmosAuth::Key(Secret::new(key))
            }
            None => match entra::choose(&get, client_id, Fallback::DeveloperToolsUnlessNamed) {
                EntraIdentity::ManagedIdentity { client_id } => {
                    CosmosAuth::ManagedIdentity { client_id }
                }
                EntraIdentity::DeveloperTools => CosmosAuth::DeveloperTools,
            },
        };
        let preferred_region =
            get(names::COSMOS_PREFERRED_REGION).or_else(|| get(names::REGION_NAME));
        Ok(CosmosSettings {
            endpoint,
            database,
            container,
            auth,
            preferred_region,
            emulator_host,
            startup_budget: Self::DEFAULT_STARTUP_BUDGET,
        })
    }

    /// Settings for an emulator at `endpoint` with key auth (the emulator does not check
    /// the key's signature; any base64 key works).
    pub fn for_emulator(endpoint: Url, key: &str) -> Self {
        CosmosSettings {
            endpoint,
            database: DEFAULT_DATABASE.to_owned(),
            container: DEFAULT_CONTAINER.to_owned(),
            auth: CosmosAuth::Key(Secret::new(key.to_owned())),
            preferred_region: None,
            emulator_host: None,
            startup_budget: Self::DEFAULT_STARTUP_BUDGET,
        }
    }

    /// Whether the endpoint is one the SDK treats as an emulator (loopback, or the host
    /// named in `AZURE_COSMOS_EMULATOR_HOST`).
    pub fn is_emulator_endpoint(&self) -> bool {
        is_emulator_host(&self.endpoint, self.emulator_host.as_deref())
    }

    /// Builds the SDK client: one attempt. The SDK build is eager (it reads the account and,
    /// for Entra ID, acquires a token), so this fails fast when the endpoint is unreachable.
    pub async fn build_client(&self) -> anyhow::Result<CosmosClient> {
        self.build_client_configured(Ok).await
    }

    /// [`build_client`](Self::build_client) with `configure` applied to the SDK's builder
    /// last: the extension point for tests (fault injection rules, a custom transport).
    pub async fn build_client_configured(
        &self,
        configure: impl FnOnce(CosmosClientBuilder) -> anyhow::Result<CosmosClientBuilder>,
    ) -> anyhow::Result<CosmosClient> {
        let endpoint: AccountEndpoint = self
            .endpoint
            .as_str()
            .parse()
            .map_err(|e| anyhow::anyhow!("COSMOS_ENDPOINT: {e}"))?;
        let emulator = self.is_emulator_endpoint();
        let account = match &self.auth {
            CosmosAuth::Key(key) => {
                AccountReference::with_authentication_key(endpoint, key.clone())
            }
            CosmosAuth::ManagedIdentity { client_id } => AccountReference::with_credential(
                endpoint,
                entra::credential(&EntraIdentity::ManagedIdentity {
                    client_id: client_id.clone(),
                })?,
            ),
            CosmosAuth::DeveloperTools => AccountReference::with_credential(
                endpoint,
                entra::credential(&EntraIdentity::DeveloperTools)?,
            ),
        };
        let mut builder =
            CosmosClientBuilder::new().with_default_operation_options(operation_options());
        if emulator {
            // The local emulators serve a self-signed certificate (relaxed for emulator hosts
            // only), and the Linux emulator cannot handle the binary encoding.
            let pool = ConnectionPoolOptions::builder()
                .with_server_certificate_validation(
                    ServerCertificateValidation::RequiredUnlessEmulator,
                )
                .build()?;
            let runtime = CosmosRuntime::builder()
                .with_connection_pool(pool)
                .build()
                .await?;
            builder = builder
                .with_runtime(runtime)
                .with_binary_encoding_options(BinaryEncodingOptions::new().with_enabled(false));
        }
        let builder = configure(builder)?;
        Ok(builder.build(account, self.routing()).await?)
    }

    pub fn routing(&self) -> RoutingStrategy {
        match &self.preferred_region {
            Some(region) => RoutingStrategy::ProximityTo(Region::from(region.clone())),
            // An empty preference list makes the SDK follow the account's own region order.
            None => RoutingStrategy::PreferredRegions(Vec::new()),
        }
    }
}

/// The options every client of this service uses: the SDK's default throttling policy can
/// hold one call for about 100 s on a hot partition, longer than a message lock is worth.
/// At most 3 throttling retries (each honouring the server's retry-after) within 2 s, and
/// an end-to-end limit of 5 s per operation; past that the store answers `Transient` and
/// the broker redelivers.
pub fn operation_options() -> OperationOptions {
    OperationOptionsBuilder::new()
        .with_throttling_retry_options(
            ThrottlingRetryOptionsBuilder::new()
                .with_max_retry_count(3)
                .with_max_retry_wait_time(Duration::from_secs(2))
                .build(),
        )
        .with_end_to_end_latency_policy(EndToEndOperationLatencyPolicy::new(Duration::from_secs(5)))
        .build()
}

fn parse_endpoint(raw: &str, emulator_host: Option<&str>) -> Result<Url, ConfigError> {
    let url = Url::parse(raw).map_err(|e| {
        ConfigError::new(
            names::COSMOS_ENDPOINT,
            format!("{raw:?} is not a URL ({e})"),
        )
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(
            names::COSMOS_ENDPOINT,
            format!("{raw:?} has no host"),
        ));
    }
    match url.scheme() {
        "https" => {}
        "http" if is_emulator_host(&url, emulator_host) => {}
        "http" => {
            return Err(ConfigError::new(
                names::COSMOS_ENDPOINT,
                format!(
                    "{raw:?} uses http://, which is allowed only for an emulator on loopback or on the \
                     host named in AZURE_COSMOS_EMULATOR_HOST"
                ),
            ))
        }
        other => {
            return Err(ConfigError::new(
                names::COSMOS_ENDPOINT,
                format!("{raw:?} has scheme {other:?}; expected https (or http for an emulator)"),
            ))
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(
            names::COSMOS_ENDPOINT,
            "must not carry credentials; use COSMOS_KEY",
        ));
    }
    Ok(url)
}

fn is_emulator_host(url: &Url, emulator_host: Option<&str>) -> bool {
    let host = url.host_str().unwrap_or_default();
    emulator_host.is_some_and(|h| !h.is_empty() && host.eq_ignore_ascii_case(h))
        || ["localhost", "127.0.0.1", "[::1]", "[0:0:0:0:0:0:0:1]"]
            .iter()
            .any(|h| host.eq_ignore_ascii_case(h))
}

/// Database and container ids: 1 to 255 characters, none of `/ \ ? #`, no trailing space.
fn validate_name(setting: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.chars().count() > 255 {
        return Err(ConfigError::new(setting, "is longer than 255 characters"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| matches!(c, '/' | '\\' | '?' | '#') || c.is_control())
    {
        return Err(ConfigError::new(
            setting,
            format!("{name:?} contains {bad:?}, which Cosmos DB does not allow in a name"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<CosmosSettings, ConfigError> {
        CosmosSettings::from_lookup(claims_payments_settings::lookup_in(pairs))
    }

    const KEY: &str =
        "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

    #[test]
    fn defaults_and_key_auth() {
        let s = settings(&[
            ("COSMOS_ENDPOINT", "https://acct.documents.azure.com:443/"),
            ("COSMOS_KEY", KEY),
        ])
        .unwrap();
        assert_eq!(
            (s.database.as_str(), s.container.as_str()),
            ("payments", "payments")
        );
        assert!(matches!(s.auth, CosmosAuth::Key(_)));
        assert!(
            !format!("{s:?}").contains(KEY),
            "the key must not appear in Debug output"
        );
    }

    #[test]
    fn entra_id_choice() {
        let endpoint = ("COSMOS_ENDPOINT", "https://acct.documents.azure.com/");
        let local = settings(&[endpoint]).unwrap();
        assert!(matches!(local.auth, CosmosAuth::DeveloperTools));
        let azure = settings(&[
            endpoint,
            ("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token"),
        ])
        .unwrap();
        assert!(matches!(
            azure.auth,
            CosmosAuth::ManagedIdentity { client_id: None }
        ));
        let user = settings(&[
            endpoint,
            ("MSI_ENDPOINT", "http://127.0.0.1:41741/MSI/token/"),
            (
                "COSMOS_MANAGED_IDENTITY_CLIENT_ID",
                "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
            ),
        ])
        .unwrap();
        assert!(matches!(
            user.auth,
            CosmosAuth::ManagedIdentity { client_id: Some(_) }
        ));
    }

    #[test]
    fn invalid_values_name_the_setting() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "COSMOS_ENDPOINT"),
            (&[("COSMOS_ENDPOINT", "   ")], "COSMOS_ENDPOINT"),
            (&[("COSMOS_ENDPOINT", "not a url")], "COSMOS_ENDPOINT"),
            (
                &[("COSMOS_ENDPOINT", "http://acct.documents.azure.com/")],
                "COSMOS_ENDPOINT",
            ),
            (
                &[("COSMOS_ENDPOINT", "ftp://localhost/")],
                "COSMOS_ENDPOINT",
            ),
            (
                &[
                    ("COSMOS_ENDPOINT", "https://localhost:8081/"),
                    ("COSMOS_KEY", "not base64!"),
                ],
                "COSMOS_KEY",
            ),
            (
                &[
                    ("COSMOS_ENDPOINT", "https://localhost:8081/"),
                    ("COSMOS_CONTAINER", "a/b"),
                ],
                "COSMOS_CONTAINER",
            ),
            (
                &[
                    ("COSMOS_ENDPOINT", "https://localhost:8081/"),
                    ("COSMOS_DATABASE", "x#y"),
                ],
                "COSMOS_DATABASE",
            ),
            (
                &[
                    ("COSMOS_ENDPOINT", "https://localhost:8081/"),
                    ("COSMOS_MANAGED_IDENTITY_CLIENT_ID", "me"),
                ],
                "COSMOS_MANAGED_IDENTITY_CLIENT_ID",
            ),
        ];
        for (pairs, setting) in cases {
            let err = settings(pairs).expect_err(setting);
            assert_eq!(err.setting, *setting, "{err}");
            assert!(
                err.to_string().contains(&format!("setting {setting}:")),
                "{err}"
            );
        }
        let bad_key = settings(&[
            ("COSMOS_ENDPOINT", "https://localhost/"),
            ("COSMOS_KEY", "s3cr3t!"),
        ])
        .unwrap_err();
        assert!(
            !bad_key.to_string().contains("s3cr3t"),
            "the key must not be echoed: {bad_key}"
        );
    }

    #[test]
    fn http_is_accepted_for_emulator_hosts_only() {
        assert!(settings(&[("COSMOS_ENDPOINT", "http://127.0.0.1:8081/")]).is_ok());
        assert!(settings(&[("COSMOS_ENDPOINT", "http://localhost:8081/")]).is_ok());
        assert!(settings(&[("COSMOS_ENDPOINT", "http://cosmosdb:8081/")]).is_err());
        assert!(settings(&[
            ("COSMOS_ENDPOINT", "http://cosmosdb:8081/"),
            ("AZURE_COSMOS_EMULATOR_HOST", "cosmosdb")
        ])
        .is_ok());
    }
}
