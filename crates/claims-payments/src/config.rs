//! Settings, read once from the environment (Functions app settings arrive as
//! environment variables). An invalid value stops the process at start with a
//! message naming the setting, before the host sends any work.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};

use crate::store::cosmos::CosmosSettings;
use crate::store::postgres::PostgresSettings;
use crate::telemetry::LogFormat;

/// The name of every setting, defined once: the parser below, the Cosmos settings, the
/// simulator and the benchmark all use these constants.
pub mod names {
    /// The loopback port the Functions host gives the handler.
    pub const FUNCTIONS_CUSTOMHANDLER_PORT: &str = "FUNCTIONS_CUSTOMHANDLER_PORT";
    /// Set by App Service on every instance: we run in Azure.
    pub const WEBSITE_INSTANCE_ID: &str = "WEBSITE_INSTANCE_ID";
    /// `sqlite`, `cosmos` or `postgres`.
    pub const PAYMENTS_STORE: &str = "PAYMENTS_STORE";
    /// The SQLite file (embedded store).
    pub const PAYMENTS_SQLITE_PATH: &str = "PAYMENTS_SQLITE_PATH";
    /// The PostgreSQL store's libpq URI.
    pub const PAYMENTS_POSTGRES_URL: &str = "PAYMENTS_POSTGRES_URL";
    /// `password` (the URI's) or `entra` (a Microsoft Entra token as the password).
    pub const PAYMENTS_POSTGRES_AUTH: &str = "PAYMENTS_POSTGRES_AUTH";
    /// The user-assigned managed identity whose Entra token logs in to PostgreSQL.
    pub const PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID: &str =
        "PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID";
    /// The Cosmos DB account endpoint.
    pub const COSMOS_ENDPOINT: &str = "COSMOS_ENDPOINT";
    /// An account key: emulators and dev accounts only.
    pub const COSMOS_KEY: &str = "COSMOS_KEY";
    /// The database (default `payments`).
    pub const COSMOS_DATABASE: &str = "COSMOS_DATABASE";
    /// The container (default `payments`).
    pub const COSMOS_CONTAINER: &str = "COSMOS_CONTAINER";
    /// The user-assigned managed identity used for Cosmos DB.
    pub const COSMOS_MANAGED_IDENTITY_CLIENT_ID: &str = "COSMOS_MANAGED_IDENTITY_CLIENT_ID";
    /// The region the SDK prefers.
    pub const COSMOS_PREFERRED_REGION: &str = "COSMOS_PREFERRED_REGION";
    /// Set by App Service: the app's region, the preferred one when none is named.
    pub const REGION_NAME: &str = "REGION_NAME";
    /// A non-loopback host name that may use plain http (an emulator).
    pub const AZURE_COSMOS_EMULATOR_HOST: &str = "AZURE_COSMOS_EMULATOR_HOST";
    /// Set by App Service when a managed identity is available.
    pub const IDENTITY_ENDPOINT: &str = "IDENTITY_ENDPOINT";
    /// The older name of IDENTITY_ENDPOINT.
    pub const MSI_ENDPOINT: &str = "MSI_ENDPOINT";
    /// How long inbox records are kept.
    pub const INBOX_RETENTION_DAYS: &str = "INBOX_RETENTION_DAYS";
    /// The consumer's name in inbox keys.
    pub const CONSUMER_NAME: &str = "CONSUMER_NAME";
    /// The bank's payout API (absent: ledger-only).
    pub const BANK_API_URL: &str = "BANK_API_URL";
    /// The bank credential, sent as a bearer token.
    pub const BANK_API_KEY: &str = "BANK_API_KEY";
    /// Per bank request.
    pub const BANK_TIMEOUT_MS: &str = "BANK_TIMEOUT_MS";
    /// How long the bank recognises an Idempotency-Key.
    pub const BANK_KEY_WINDOW_HOURS: &str = "BANK_KEY_WINDOW_HOURS";
    /// The same in milliseconds (sandboxes, simulations).
    pub const BANK_KEY_WINDOW_MS: &str = "BANK_KEY_WINDOW_MS";
    /// Everything one invocation may spend retrying the bank.
    pub const RETRY_BUDGET_MS: &str = "RETRY_BUDGET_MS";
    /// How long an attempt owns a message.
    pub const LEASE_MS: &str = "LEASE_MS";
    /// How long a delivery waits for a live attempt of the same message.
    pub const INFLIGHT_WAIT_MS: &str = "INFLIGHT_WAIT_MS";
    /// The queue's maxDeliveryCount.
    pub const MAX_DELIVERY_COUNT: &str = "MAX_DELIVERY_COUNT";
    /// How long an orphaned payout waits before reconcile settles it.
    pub const RECONCILE_MIN_AGE_MS: &str = "RECONCILE_MIN_AGE_MS";
    /// How HTTP callers are told apart (`functionkey` or `appservice`).
    pub const HTTP_AUTH: &str = "HTTP_AUTH";
    /// How long an HTTP Idempotency-Key is remembered.
    pub const IDEMPOTENCY_KEY_RETENTION_HOURS: &str = "IDEMPOTENCY_KEY_RETENTION_HOURS";
    /// `json` or `text`.
    pub const LOG_FORMAT: &str = "LOG_FORMAT";
    /// Dev only: `consumer`, `naive` or `noop`.
    pub const PAYMENTS_DEV_HANDLER: &str = "PAYMENTS_DEV_HANDLER";
    /// Dev only: probability of a SIGKILL after commit.
    pub const PAYMENTS_FAULT_CRASH_AFTER_COMMIT: &str = "PAYMENTS_FAULT_CRASH_AFTER_COMMIT";
    /// Dev only: delay added to every store call.
    pub const PAYMENTS_FAULT_STORE_DELAY_MS: &str = "PAYMENTS_FAULT_STORE_DELAY_MS";

    /// Every setting the product reads.
    pub const PRODUCT: &[&str] = &[
        FUNCTIONS_CUSTOMHANDLER_PORT,
        WEBSITE_INSTANCE_ID,
        PAYMENTS_STORE,
        PAYMENTS_SQLITE_PATH,
        PAYMENTS_POSTGRES_URL,
        PAYMENTS_POSTGRES_AUTH,
        PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID,
        COSMOS_ENDPOINT,
        COSMOS_KEY,
        COSMOS_DATABASE,
        COSMOS_CONTAINER,
        COSMOS_MANAGED_IDENTITY_CLIENT_ID,
        COSMOS_PREFERRED_REGION,
        REGION_NAME,
        AZURE_COSMOS_EMULATOR_HOST,
        IDENTITY_ENDPOINT,
        MSI_ENDPOINT,
        INBOX_RETENTION_DAYS,
        CONSUMER_NAME,
        BANK_API_URL,
        BANK_API_KEY,
        BANK_TIMEOUT_MS,
        BANK_KEY_WINDOW_HOURS,
        BANK_KEY_WINDOW_MS,
        RETRY_BUDGET_MS,
        LEASE_MS,
        INFLIGHT_WAIT_MS,
        MAX_DELIVERY_COUNT,
        RECONCILE_MIN_AGE_MS,
        HTTP_AUTH,
        IDEMPOTENCY_KEY_RETENTION_HOURS,
        LOG_FORMAT,
    ];
}

/// A setting that cannot be used, named as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {setting}: {problem}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub problem: String,
}

impl ConfigError {
    pub fn new(setting: &'static str, problem: impl Into<String>) -> Self {
        ConfigError {
            setting,
            problem: problem.into(),
        }
    }
}

/// Where the guard lives (`PAYMENTS_STORE`), with what that store needs.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreSettings {
    /// The embedded store: one file (`PAYMENTS_SQLITE_PATH`), one process.
    Sqlite { path: PathBuf },
    /// Cosmos DB (`COSMOS_*`): what runs in Azure. Boxed: read once, and far larger.
    Cosmos(Box<CosmosSettings>),
    /// PostgreSQL (`PAYMENTS_POSTGRES_*`): several instances on one database.
    Postgres(Box<PostgresSettings>),
}

impl StoreSettings {
    /// The name operators use in `PAYMENTS_STORE`.
    pub fn name(&self) -> &'static str {
        match self {
            StoreSettings::Sqlite { .. } => "sqlite",
            StoreSettings::Cosmos(_) => "cosmos",
            StoreSettings::Postgres(_) => "postgres",
        }
    }
}

/// Settings that only `claims-payments-dev serve` reads (alternative handlers and
/// faults). The product refuses to start when one is set, so a fault knob copied into
/// production configuration is noticed at once instead of being ignored.
pub const DEV_ONLY_SETTINGS: [&str; 3] = [
    names::PAYMENTS_DEV_HANDLER,
    names::PAYMENTS_FAULT_CRASH_AFTER_COMMIT,
    names::PAYMENTS_FAULT_STORE_DELAY_MS,
];

/// Where payouts go. Absent: ledger-only mode (payments are recorded, no bank is called).
#[derive(Debug, Clone)]
pub struct BankSettings {
    /// Scheme, host and path only: a credential never travels in the URL.
    pub url: Url,
    /// `BANK_API_KEY`, sent as `Authorization: Bearer`. Never logged or echoed
    /// (`SecretString` prints as redacted).
    pub api_key: Option<SecretString>,
    /// Per request.
    pub timeout: Duration,
    /// How long after a payout was first requested the bank still recognises its
    /// Idempotency-Key. Past it, resending could pay twice, so we stop and reconcile.
    pub key_window: Duration,
}

impl PartialEq for BankSettings {
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url
            && self.api_key.as_ref().map(|k| k.expose_secret())
                == other.api_key.as_ref().map(|k| k.expose_secret())
            && self.timeout == other.timeout
            && self.key_window == other.key_window
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub port: u16,
    pub store: StoreSettings,
    pub inbox_retention: Duration,
    pub consumer_name: String,
    pub bank: Option<BankSettings>,
    /// Everything one invocation may spend retrying the bank.
    pub retry_budget: Duration,
    /// How long an attempt owns a message before another attempt may take it over.
    pub lease: Duration,
    /// How long a delivery waits for another live attempt of the same message.
    pub inflight_wait: Duration,
    /// The queue's maxDeliveryCount (`MAX_DELIVERY_COUNT`, set by the Bicep from the
    /// queue's own value).
    pub max_delivery_count: u32,
    /// `reconcile` settles an `in_progress` payment only once its lease ran out longer
    /// ago than this (`RECONCILE_MIN_AGE_MS`, default three leases), so no request of a
    /// dead attempt can still be on its way to the bank.
    pub reconcile_min_age: Duration,
    /// Who an HTTP caller is (`HTTP_AUTH`).
    ///
    /// `functionkey` (default): function keys are shared secrets, so every key holder is
    /// one trust domain: any holder may pay, and read every payment. The body's
    /// `tenantId` partitions Idempotency-Keys as a namespace, not a security boundary
    /// (a holder may name any tenant, and so replay or block that tenant's keys).
    ///
    /// `appservice`: App Service Authentication signs the caller in and sets
    /// `X-MS-CLIENT-PRINCIPAL`; every route needs that principal (401 without), `POST`
    /// needs the app role `Payments.Pay` and `GET` `Payments.Read` (or `Payments.Pay`, for
    /// the payer's own payments; 403 otherwise). Each principal's keys are its own.
    pub http_auth: crate::payments_api::CallerAuth,
    /// How long an HTTP Idempotency-Key is remembered (`IDEMPOTENCY_KEY_RETENTION_HOURS`).
    pub key_retention: Duration,
    pub log_format: LogFormat,
}

fn parse_u64(setting: &'static str, value: &str) -> Result<u64, ConfigError> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| ConfigError::new(setting, format!("{value:?} is not a whole number")))
}

fn millis(setting: &'static str, value: &str, min: u64, max: u64) -> Result<Duration, ConfigError> {
    let ms = parse_u64(setting, value)?;
    if !(min..=max).contains(&ms) {
        return Err(ConfigError::new(
            setting,
            format!("{ms} ms is outside {min}..={max} ms"),
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// `BANK_API_URL`: an http(s) URL with a host, and no credential in it (userinfo or a
/// query string): the credential goes in `BANK_API_KEY`. Errors never echo the value,
/// which is exactly what could hold a secret.
fn bank_url(value: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(value.trim()).map_err(|e| {
        ConfigError::new(
            names::BANK_API_URL,
            format!("is not a URL ({e}); the value is not shown"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "must be an http(s) URL with a host",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "carries a user name or password; put the credential in BANK_API_KEY (a Key Vault reference in Azure); the value is not shown",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "carries a query string or fragment, where keys hide; put the credential in BANK_API_KEY (a Key Vault reference in Azure); the value is not shown",
        ));
    }
    Ok(url)
}

/// `BANK_API_KEY`. An app setting whose Key Vault reference the platform could not
/// resolve (missing secret, missing role) arrives as the reference text itself; sending
/// that as a credential would only fail every payout, so it is refused at start-up.
fn bank_api_key(value: String) -> Result<SecretString, ConfigError> {
    let value = value.trim();
    if value.starts_with("@Microsoft.KeyVault(") {
        return Err(ConfigError::new(
            names::BANK_API_KEY,
            "is an unresolved Key Vault reference: check that the secret exists and that the app's identity may read it (Key Vault Secrets User)",
        ));
    }
    Ok(SecretString::from(value.to_owned()))
}

impl Settings {
    pub(crate) const DEFAULT_PORT: u16 = 3000;

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (tests pass a map). Empty values count as unset,
    /// because app settings are often blanked rather than removed.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());

        let port = match get(names::FUNCTIONS_CUSTOMHANDLER_PORT) {
            None => Self::DEFAULT_PORT,
            Some(v) => v.trim().parse::<u16>().map_err(|_| {
                ConfigError::new(
                    names::FUNCTIONS_CUSTOMHANDLER_PORT,
                    format!("{v:?} is not a TCP port (0-65535)"),
                )
            })?,
        };

        // The guard depends on the store, so it is never chosen by accident: a blank
        // value is an error, and in Azure it must be named (see `in_azure`).
        let in_azure = get(names::WEBSITE_INSTANCE_ID).is_some();
        let named_store = lookup(names::PAYMENTS_STORE);
        let store =
            match named_store.as_deref().map(str::trim) {
                None if in_azure => {
                    return Err(ConfigError::new(
                        names::PAYMENTS_STORE,
                        "is not set; in Azure it must name the store (cosmos or postgres)",
                    ))
                }
                None => "sqlite",
                Some("") => return Err(ConfigError::new(
                    names::PAYMENTS_STORE,
                    "is blank; name the store (sqlite, cosmos or postgres) or remove the setting",
                )),
                Some("sqlite") if in_azure => {
                    return Err(ConfigError::new(
                        names::PAYMENTS_STORE,
                        "sqlite is refused in Azure (WEBSITE_INSTANCE_ID is set): each instance \
                     would keep its own guard on its own disk, and a redelivery to another \
                     instance or after a recycle would pay the claim again; use cosmos or postgres",
                    ))
                }
                Some(name @ ("sqlite" | "cosmos" | "postgres")) => name,
                Some(other) => {
                    return Err(ConfigError::new(
                        names::PAYMENTS_STORE,
                        format!("{other:?} is not a store; use sqlite, cosmos or postgres"),
                    ))
                }
            };
        let store = if store == "cosmos" {
            StoreSettings::Cosmos(Box::new(
                CosmosSettings::from_lookup(&lookup)
                    .map_err(|e| ConfigError::new(e.setting, e.problem))?,
            ))
        } else if store == "postgres" {
            StoreSettings::Postgres(Box::new(
                PostgresSettings::from_lookup(&lookup)
                    .map_err(|e| ConfigError::new(e.setting, e.problem))?,
            ))
        } else {
            StoreSettings::Sqlite {
                path: PathBuf::from(
                    get(names::PAYMENTS_SQLITE_PATH).unwrap_or_else(|| "payments.db".into()),
                ),
            }
        };

        let retention_days = match get(names::INBOX_RETENTION_DAYS) {
            None => 30,
            Some(v) => parse_u64(names::INBOX_RETENTION_DAYS, &v)?,
        };
        if !(1..=3650).contains(&retention_days) {
            return Err(ConfigError::new(
                names::INBOX_RETENTION_DAYS,
                format!("{retention_days} is outside 1..=3650 days"),
            ));
        }

        let consumer_name =
            get(names::CONSUMER_NAME).unwrap_or_else(|| "ClaimApprovedHandler".into());
        if consumer_name.len() > 64 || consumer_name.contains('/') {
            return Err(ConfigError::new(
                names::CONSUMER_NAME,
                "must be at most 64 characters and contain no '/'",
            ));
        }

        let bank_timeout = match get(names::BANK_TIMEOUT_MS) {
            None => Duration::from_millis(5_000),
            Some(v) => millis(names::BANK_TIMEOUT_MS, &v, 1, 120_000)?,
        };
        let key_window = match (
            get(names::BANK_KEY_WINDOW_HOURS),
            get(names::BANK_KEY_WINDOW_MS),
        ) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    names::BANK_KEY_WINDOW_MS,
                    "set either BANK_KEY_WINDOW_HOURS or BANK_KEY_WINDOW_MS, not both",
                ))
            }
            (None, None) => Duration::from_secs(24 * 3600),
            // For sandboxes and simulations, whose banks forget keys within minutes.
            (None, Some(v)) => millis(names::BANK_KEY_WINDOW_MS, &v, 1_000, 30 * 86_400_000)?,
            (Some(v), None) => {
                let hours = parse_u64(names::BANK_KEY_WINDOW_HOURS, &v)?;
                if hours == 0 {
                    return Err(ConfigError::new(
                        names::BANK_KEY_WINDOW_HOURS,
                        "must be at least 1",
                    ));
                }
                Duration::from_secs(hours * 3600)
            }
        };
        let bank = match get(names::BANK_API_URL) {
            None => None,
            Some(v) => Some(BankSettings {
                url: bank_url(&v)?,
                api_key: get(names::BANK_API_KEY).map(bank_api_key).transpose()?,
                timeout: bank_timeout,
                key_window,
            }),
        };

        let retry_budget = match get(names::RETRY_BUDGET_MS) {
            None => Duration::from_millis(60_000),
            Some(v) => millis(names::RETRY_BUDGET_MS, &v, 0, 600_000)?,
        };
        // A budget shorter than one request would give up on a payout the bank makes.
        if retry_budget < bank_timeout {
            return Err(ConfigError::new(
                names::RETRY_BUDGET_MS,
                format!(
                    "{} ms is shorter than BANK_TIMEOUT_MS ({} ms); it must allow at least one full bank request",
                    retry_budget.as_millis(),
                    bank_timeout.as_millis()
                ),
            ));
        }
        let lease = match get(names::LEASE_MS) {
            None => retry_budget + bank_timeout + Duration::from_secs(25),
            Some(v) => millis(names::LEASE_MS, &v, 100, 3_600_000)?,
        };
        // A live attempt must never lose its lease while it may still be calling the bank.
        if lease <= retry_budget + bank_timeout {
            return Err(ConfigError::new(
                names::LEASE_MS,
                format!(
                    "{} ms must exceed RETRY_BUDGET_MS + BANK_TIMEOUT_MS ({} ms), or a second attempt could take over a live payout",
                    lease.as_millis(),
                    (retry_budget + bank_timeout).as_millis()
                ),
            ));
        }
        let inflight_wait = match get(names::INFLIGHT_WAIT_MS) {
            None => Duration::from_millis(15_000),
            Some(v) => millis(names::INFLIGHT_WAIT_MS, &v, 0, 600_000)?,
        };
        let max_delivery_count = match get(names::MAX_DELIVERY_COUNT) {
            None => 10,
            Some(v) => parse_u64(names::MAX_DELIVERY_COUNT, &v)?,
        };
        // A delivery whose attempt died is taken over by the next delivery of the same
        // message (a higher DeliveryCount, see the consumer): there must be one.
        if !(2..=2000).contains(&max_delivery_count) {
            return Err(ConfigError::new(
                names::MAX_DELIVERY_COUNT,
                format!(
                    "{max_delivery_count} is outside 2..=2000; with fewer than 2 deliveries a \
                     message whose handler died would be dead-lettered instead of taken over"
                ),
            ));
        }
        // Where the DeliveryCount cannot tell (a DLQ re-drive or a producer's re-send is a
        // new broker message, counting from 1 again), only the lease frees a message
        // whose attempt died. The deliveries left must be able to wait it out, or the
        // message would be dead-lettered with its payout in progress.
        let waits = inflight_wait * (max_delivery_count as u32 - 1);
        if waits <= lease {
            return Err(ConfigError::new(
                names::INFLIGHT_WAIT_MS,
                format!(
                    "{} ms x {} remaining deliveries (MAX_DELIVERY_COUNT - 1) = {} ms does not outlast \
                     LEASE_MS ({} ms): a message whose handler died would be dead-lettered before its \
                     lease runs out; raise INFLIGHT_WAIT_MS above {} ms",
                    inflight_wait.as_millis(),
                    max_delivery_count - 1,
                    waits.as_millis(),
                    lease.as_millis(),
                    lease.as_millis() / u128::from(max_delivery_count - 1)
                ),
            ));
        }

        let reconcile_min_age = match get(names::RECONCILE_MIN_AGE_MS) {
            None => lease * 3,
            Some(v) => millis(names::RECONCILE_MIN_AGE_MS, &v, 0, 30 * 86_400_000)?,
        };

        let http_auth = match get(names::HTTP_AUTH).as_deref().map(str::trim) {
            None | Some("functionkey") => crate::payments_api::CallerAuth::FunctionKey,
            Some("appservice") => crate::payments_api::CallerAuth::AppService,
            Some(other) => {
                return Err(ConfigError::new(
                    names::HTTP_AUTH,
                    format!(
                        "{other:?} is not a caller authentication; use functionkey or appservice"
                    ),
                ))
            }
        };
        let key_retention = match get(names::IDEMPOTENCY_KEY_RETENTION_HOURS) {
            None => Duration::from_secs(24 * 3600),
            Some(v) => {
                let hours = parse_u64(names::IDEMPOTENCY_KEY_RETENTION_HOURS, &v)?;
                if !(1..=24 * 90).contains(&hours) {
                    return Err(ConfigError::new(
                        names::IDEMPOTENCY_KEY_RETENTION_HOURS,
                        format!("{hours} is outside 1..=2160 hours"),
                    ));
                }
                Duration::from_secs(hours * 3600)
            }
        };

        let log_format = match get(names::LOG_FORMAT).as_deref().map(str::trim) {
            None | Some("json") => LogFormat::Json,
            Some("text") => LogFormat::Text,
            Some(other) => {
                return Err(ConfigError::new(
                    names::LOG_FORMAT,
                    format!("{other:?} is not a log format; use json or text"),
                ))
            }
        };

        if let Some(knob) = DEV_ONLY_SETTINGS
            .into_iter()
            .find(|name| get(name).is_some())
        {
            return Err(ConfigError::new(
                knob,
                "is read only by claims-payments-dev (alternative handlers and fault injection); remove it",
            ));
        }

        Ok(Settings {
            port,
            store,
            inbox_retention: Duration::from_secs(retention_days * 24 * 3600),
            consumer_name,
            bank,
            retry_budget,
            lease,
            inflight_wait,
            max_delivery_count: max_delivery_count as u32,
            reconcile_min_age,
            http_auth,
            key_retention,
            log_format,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.port, 3000);
        assert_eq!(
            s.store,
            StoreSettings::Sqlite {
                path: PathBuf::from("payments.db")
            }
        );
        assert_eq!(s.inbox_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(s.consumer_name, "ClaimApprovedHandler");
        assert_eq!(s.bank, None);
        assert_eq!(s.retry_budget, Duration::from_secs(60));
        assert_eq!(s.lease, Duration::from_secs(90));
        assert_eq!(s.log_format, LogFormat::Json);
    }

    #[test]
    fn every_invalid_value_names_its_setting() {
        let cases: &[(&str, &str)] = &[
            ("FUNCTIONS_CUSTOMHANDLER_PORT", "http"),
            ("PAYMENTS_STORE", "mysql"),
            ("INBOX_RETENTION_DAYS", "0"),
            ("INBOX_RETENTION_DAYS", "ten"),
            ("CONSUMER_NAME", "a/b"),
            ("BANK_API_URL", "not a url"),
            ("BANK_API_URL", "ftp://bank.example"),
            ("BANK_TIMEOUT_MS", "-1"),
            ("RETRY_BUDGET_MS", "soon"),
            ("LEASE_MS", "1000"),
            ("INFLIGHT_WAIT_MS", "x"),
            ("LOG_FORMAT", "xml"),
            // Dev knobs are refused by the product whatever their value.
            ("PAYMENTS_DEV_HANDLER", "naive"),
            ("PAYMENTS_FAULT_CRASH_AFTER_COMMIT", "0.5"),
            ("PAYMENTS_FAULT_STORE_DELAY_MS", "10"),
        ];
        let err = settings(&[("PAYMENTS_STORE", "cosmos")]).unwrap_err();
        assert_eq!(err.setting, "COSMOS_ENDPOINT", "{err}");
        let err = settings(&[("PAYMENTS_STORE", "postgres")]).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL", "{err}");
        for (name, value) in cases {
            let err = settings(&[(name, value)]).expect_err(&format!("{name}={value}"));
            assert_eq!(err.setting, *name, "{err}");
        }
    }

    #[test]
    fn blank_values_count_as_unset_except_the_store() {
        let s = settings(&[("BANK_API_URL", " "), ("LEASE_MS", "")]).unwrap();
        assert_eq!(s.bank, None);
        let err = settings(&[("PAYMENTS_STORE", " ")]).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_STORE", "{err}");
        assert!(err.problem.contains("blank"), "{err}");
    }

    #[test]
    fn in_azure_the_store_must_be_named_and_cannot_be_sqlite() {
        let azure = ("WEBSITE_INSTANCE_ID", "a1b2c3");
        for store in [None, Some("sqlite"), Some("")] {
            let mut pairs = vec![azure];
            pairs.extend(store.map(|v| ("PAYMENTS_STORE", v)));
            let err = settings(&pairs).expect_err(&format!("{store:?}"));
            assert_eq!(err.setting, "PAYMENTS_STORE", "{err}");
        }
        let err = settings(&[azure, ("PAYMENTS_STORE", "sqlite")]).unwrap_err();
        assert!(err.problem.contains("pay the claim again"), "{err}");
        // Named explicitly, the production store passes this check (and then needs its own settings).
        let err = settings(&[azure, ("PAYMENTS_STORE", "cosmos")]).unwrap_err();
        assert_eq!(err.setting, "COSMOS_ENDPOINT", "{err}");
        let err = settings(&[azure, ("PAYMENTS_STORE", "postgres")]).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL", "{err}");
        // Locally (no WEBSITE_INSTANCE_ID) the embedded store stays the default.
        assert_eq!(settings(&[]).unwrap().store.name(), "sqlite");
    }

    #[test]
    fn postgres_settings_are_read_and_never_show_the_password() {
        let s = settings(&[
            ("PAYMENTS_STORE", "postgres"),
            (
                "PAYMENTS_POSTGRES_URL",
                "postgresql://app:pw-SECRET@db.example.com:5432/payments?sslmode=require",
            ),
        ])
        .unwrap();
        assert_eq!(s.store.name(), "postgres");
        assert!(!format!("{s:?}").contains("SECRET"), "{s:?}");
        let err = settings(&[
            ("PAYMENTS_STORE", "postgres"),
            (
                "PAYMENTS_POSTGRES_URL",
                "postgresql://app:pw-SECRET@db.example.com/payments?sslmode=disable",
            ),
        ])
        .unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL", "{err}");
        assert!(err.problem.contains("sslmode=disable is refused"), "{err}");
        assert!(!err.to_string().contains("SECRET"), "{err}");
    }

    #[test]
    fn a_retry_budget_shorter_than_one_bank_request_is_refused() {
        let err = settings(&[("RETRY_BUDGET_MS", "0")]).unwrap_err();
        assert_eq!(err.setting, "RETRY_BUDGET_MS", "{err}");
        let err =
            settings(&[("RETRY_BUDGET_MS", "4999"), ("BANK_TIMEOUT_MS", "5000")]).unwrap_err();
        assert_eq!(err.setting, "RETRY_BUDGET_MS", "{err}");
        let s = settings(&[("RETRY_BUDGET_MS", "5000"), ("BANK_TIMEOUT_MS", "5000")]).unwrap();
        assert_eq!(s.retry_budget, Duration::from_secs(5));
    }

    #[test]
    fn the_deliveries_left_outlast_a_dead_attempts_lease() {
        // The deployed values (infra/main.bicepparam) pass: 9 x 15 s > 120 s.
        let s = settings(&[("LEASE_MS", "120000"), ("INFLIGHT_WAIT_MS", "15000")]).unwrap();
        assert_eq!(s.inflight_wait, Duration::from_secs(15));
        // 9 x 5 s < 120 s: a re-driven message would meet the dead lease on every delivery.
        let err = settings(&[("LEASE_MS", "120000"), ("INFLIGHT_WAIT_MS", "5000")]).unwrap_err();
        assert_eq!(err.setting, "INFLIGHT_WAIT_MS", "{err}");
        let err = settings(&[
            ("LEASE_MS", "120000"),
            ("INFLIGHT_WAIT_MS", "15000"),
            ("MAX_DELIVERY_COUNT", "5"),
        ])
        .unwrap_err();
        assert_eq!(err.setting, "INFLIGHT_WAIT_MS", "{err}");
    }

    #[test]
    fn max_delivery_count_leaves_room_for_a_takeover() {
        assert_eq!(settings(&[]).unwrap().max_delivery_count, 10);
        for bad in ["0", "1", "many"] {
            let err = settings(&[("MAX_DELIVERY_COUNT", bad)]).unwrap_err();
            assert_eq!(err.setting, "MAX_DELIVERY_COUNT", "{err}");
        }
    }

    #[test]
    fn bank_credentials_never_ride_in_the_url_nor_appear_in_errors() {
        for url in [
            "https://user:pw-SECRET@bank.example/api",
            "https://bank.example/api?code=KEY-SECRET",
            "https://bank.example/api#KEY-SECRET",
            "https://bank.example:notaport/SECRET",
            "SECRET not a url",
        ] {
            let err = settings(&[("BANK_API_URL", url)]).expect_err(url);
            assert_eq!(err.setting, "BANK_API_URL");
            assert!(!err.to_string().contains("SECRET"), "{url}: {err}");
        }
        let s = settings(&[
            ("BANK_API_URL", "https://bank.example/api"),
            ("BANK_API_KEY", " key-SECRET "),
        ])
        .unwrap();
        let bank = s.bank.as_ref().unwrap();
        assert_eq!(bank.api_key.as_ref().unwrap().expose_secret(), "key-SECRET");
        let err = settings(&[
            ("BANK_API_URL", "https://bank.example/api"),
            (
                "BANK_API_KEY",
                "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/bank-api-key)",
            ),
        ])
        .unwrap_err();
        assert_eq!(err.setting, "BANK_API_KEY", "{err}");
        assert!(
            !format!("{s:?}").contains("SECRET"),
            "Debug must redact the key"
        );
    }
}
