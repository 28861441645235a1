//! Settings, read once from the environment (Functions app settings arrive as
//! environment variables), by [`Settings::from_env`], for `serve` and the operator
//! commands alike: each module's own parser (the stores, the bank, telemetry, the
//! dead-letter queue) reads its group, here, and nowhere else. An invalid value stops
//! the process at start with a message naming the setting, before the host sends any
//! work. Where a part authenticates with Microsoft Entra ID, the identity is chosen
//! here too, by [`crate::entra`]'s one rule.

use std::path::PathBuf;
use std::time::Duration;

pub(crate) use crate::bank::BankSettings;
use crate::consumer::Policy;
use crate::env_setting::whole_number_within;
use crate::functions::FunctionSettings;
use crate::payments_api::CallerAuth;
use crate::servicebus::settings::QueueSettings;
use crate::store::cosmos::CosmosSettings;
use crate::store::postgres::PostgresSettings;
use crate::telemetry::{sampling, LogFormat, TelemetryGuard, TelemetrySettings};

// The names and the error live below every module that reads a setting (`env_setting`,
// which the dev crate and the tests read through `seams`).
use crate::env_setting::{millis, names, ConfigError};

/// Where the guard lives (`PAYMENTS_STORE`), with what that store needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StoreSettings {
    /// The embedded store: one file (`PAYMENTS_SQLITE_PATH`), one process.
    Sqlite { path: PathBuf },
    /// Cosmos DB (`COSMOS_*`): what runs in Azure. Boxed: read once, and far larger.
    Cosmos(Box<CosmosSettings>),
    /// PostgreSQL (`PAYMENTS_POSTGRES_*`): several instances on one database.
    Postgres(Box<PostgresSettings>),
}

impl StoreSettings {
    /// The name operators use in `PAYMENTS_STORE`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StoreSettings::Sqlite { .. } => "sqlite",
            StoreSettings::Cosmos(_) => "cosmos",
            StoreSettings::Postgres(_) => "postgres",
        }
    }

    /// Which database this is, without any secret: tells two stores apart.
    pub(crate) fn identity(&self) -> String {
        match self {
            StoreSettings::Sqlite { path } => {
                let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                format!("sqlite:{}", path.display())
            }
            StoreSettings::Cosmos(c) => {
                format!("cosmos:{}/{}/{}", c.endpoint, c.database, c.container)
            }
            StoreSettings::Postgres(p) => format!("postgres:{}", p.describe_target()),
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

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub(crate) port: u16,
    pub(crate) store: StoreSettings,
    pub(crate) inbox_retention: Duration,
    pub(crate) consumer_name: String,
    pub(crate) bank: Option<BankSettings>,
    /// Everything one invocation may spend retrying the bank.
    pub(crate) retry_budget: Duration,
    /// How long an attempt owns a message before another attempt may take it over.
    pub(crate) lease: Duration,
    /// How long a delivery waits for another live attempt of the same message.
    pub(crate) inflight_wait: Duration,
    /// The queue's maxDeliveryCount (`MAX_DELIVERY_COUNT`, set by the Bicep from the
    /// queue's own value).
    max_delivery_count: u32,
    /// `reconcile` settles an `in_progress` payment only once its lease ran out longer
    /// ago than this (`RECONCILE_MIN_AGE_MS`, default three leases), so no request of a
    /// dead attempt can still be on its way to the bank.
    pub(crate) reconcile_min_age: Duration,
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
    pub(crate) http_auth: CallerAuth,
    /// How long an HTTP Idempotency-Key is remembered (`IDEMPOTENCY_KEY_RETENTION_HOURS`).
    pub(crate) key_retention: Duration,
    pub log_format: LogFormat,
    /// Where telemetry goes (`OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `APPLICATIONINSIGHTS_CONNECTION_STRING`, ...): checked even when nothing is
    /// exported, so a bad value is found before it matters.
    pub(crate) telemetry: TelemetrySettings,
    /// Which invocations' spans are kept (`TELEMETRY_SAMPLE_PERCENT`, ...).
    pub(crate) sampling: sampling::Policy,
    /// Where the operator's `dead-letters` finds the queue (`serve` does not use it).
    pub(crate) dead_letter_queue: QueueSettings,
}

impl Settings {
    pub(crate) const DEFAULT_PORT: u16 = 3000;

    /// What the functions read: the payments API's callers and keys, reconcile's age.
    pub fn functions(&self) -> FunctionSettings {
        FunctionSettings {
            http_auth: self.http_auth,
            key_retention: self.key_retention,
            reconcile_min_age: self.reconcile_min_age,
        }
    }

    /// Starts the process's telemetry as these settings say (see
    /// `telemetry::start`): `serve` does, first thing; the operator commands log to
    /// stderr only.
    pub fn start_telemetry(&self) -> anyhow::Result<Option<TelemetryGuard>> {
        crate::telemetry::start(self.log_format, &self.telemetry, self.sampling)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (tests pass a map). Empty values count as unset,
    /// because app settings are often blanked rather than removed.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        // One parser per group, in this order, so the first invalid setting is the one named.
        let port = port(&get)?;
        let store = store_settings(&lookup, &get)?;
        let inbox_retention = inbox_retention(&get)?;
        let consumer_name = consumer_name(&get)?;
        let (bank, bank_timeout) = crate::bank::settings::from_lookup(&get)?;
        let timings = Timings::from_lookup(&get, bank_timeout)?;
        if let StoreSettings::Postgres(postgres) = &store {
            lease_outlasts_an_outage_wait(&timings, bank_timeout, postgres)?;
        }
        let (http_auth, key_retention) = http_settings(&get)?;
        let log_format = log_format(&get)?;
        let telemetry = TelemetrySettings::from_lookup(&lookup)?;
        let sampling = sampling::Policy::from_lookup(&lookup)?;
        let dead_letter_queue = crate::servicebus::settings::from_lookup(&get)?;
        refuse_dev_only_settings(&get)?;
        Ok(Settings {
            port,
            store,
            inbox_retention,
            consumer_name,
            bank,
            retry_budget: timings.retry_budget,
            lease: timings.lease,
            inflight_wait: timings.inflight_wait,
            max_delivery_count: timings.max_delivery_count,
            reconcile_min_age: timings.reconcile_min_age,
            http_auth,
            key_retention,
            log_format,
            telemetry,
            sampling,
            dead_letter_queue,
        })
    }
}

impl Settings {
    /// The consumer's policy these settings describe.
    pub fn policy(&self) -> Policy {
        Policy {
            consumer_name: self.consumer_name.clone(),
            inbox_retention: self.inbox_retention,
            lease: self.lease,
            inflight_wait: self.inflight_wait,
            retry_budget: self.retry_budget,
            // Ledger-only makes no payout, so the window is never reached; the default.
            bank_key_window: self
                .bank
                .as_ref()
                .map_or(crate::bank::DEFAULT_KEY_WINDOW, |b| b.key_window),
        }
    }
}

/// `FUNCTIONS_CUSTOMHANDLER_PORT`.
fn port(get: &dyn Fn(&str) -> Option<String>) -> Result<u16, ConfigError> {
    let port = match get(names::FUNCTIONS_CUSTOMHANDLER_PORT) {
        None => Settings::DEFAULT_PORT,
        Some(v) => v.trim().parse::<u16>().map_err(|_| {
            ConfigError::new(
                names::FUNCTIONS_CUSTOMHANDLER_PORT,
                format!("{v:?} is not a TCP port (0-65535)"),
            )
        })?,
    };
    Ok(port)
}

/// `PAYMENTS_STORE` and what the named store needs.
fn store_settings(
    lookup: &impl Fn(&str) -> Option<String>,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreSettings, ConfigError> {
    // The guard depends on the store, so it is never chosen by accident: a blank
    // value is an error, and in Azure it must be named (see `in_azure`).
    let in_azure = get(names::WEBSITE_INSTANCE_ID).is_some();
    let named_store = lookup(names::PAYMENTS_STORE);
    let store = match named_store.as_deref().map(str::trim) {
        None if in_azure => {
            return Err(ConfigError::new(
                names::PAYMENTS_STORE,
                "is not set; in Azure it must name the store (cosmos or postgres)",
            ))
        }
        None => "sqlite",
        Some("") => {
            return Err(ConfigError::new(
                names::PAYMENTS_STORE,
                "is blank; name the store (sqlite, cosmos or postgres) or remove the setting",
            ))
        }
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
        StoreSettings::Cosmos(Box::new(CosmosSettings::from_lookup(lookup)?))
    } else if store == "postgres" {
        StoreSettings::Postgres(Box::new(PostgresSettings::from_lookup(lookup)?))
    } else {
        StoreSettings::Sqlite {
            path: PathBuf::from(
                get(names::PAYMENTS_SQLITE_PATH).unwrap_or_else(|| "payments.db".into()),
            ),
        }
    };
    Ok(store)
}

/// `INBOX_RETENTION_DAYS`.
fn inbox_retention(get: &dyn Fn(&str) -> Option<String>) -> Result<Duration, ConfigError> {
    let retention_days = get(names::INBOX_RETENTION_DAYS)
        .map(|v| whole_number_within(names::INBOX_RETENTION_DAYS, &v, 1..=3650, " days"))
        .transpose()?
        .unwrap_or(30);
    Ok(Duration::from_secs(retention_days * 24 * 3600))
}

/// `CONSUMER_NAME`.
fn consumer_name(get: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let consumer_name = get(names::CONSUMER_NAME).unwrap_or_else(|| "ClaimApprovedHandler".into());
    if consumer_name.len() > 64 || consumer_name.contains('/') {
        return Err(ConfigError::new(
            names::CONSUMER_NAME,
            "must be at most 64 characters and contain no '/'",
        ));
    }
    // The pseudo-consumers whose records share the inbox: a message's record must never
    // be mistaken for one of theirs.
    let reserved = [
        crate::payments_api::KEY_CONSUMER,
        crate::reconcile::RUN_LEASE_CONSUMER,
        crate::lease::liveness::CONSUMER,
    ];
    if reserved.contains(&consumer_name.as_str()) {
        return Err(ConfigError::new(
            names::CONSUMER_NAME,
            format!(
                "{consumer_name:?} is reserved (used by: {})",
                reserved.join(", ")
            ),
        ));
    }
    Ok(consumer_name)
}

/// The consumer's timings, checked against each other and the bank's timeout so that no
/// live attempt loses its lease and no dead one is dead-lettered before it runs out.
struct Timings {
    retry_budget: Duration,
    lease: Duration,
    inflight_wait: Duration,
    max_delivery_count: u32,
    reconcile_min_age: Duration,
}

impl Timings {
    fn from_lookup(
        get: &dyn Fn(&str) -> Option<String>,
        bank_timeout: Duration,
    ) -> Result<Self, ConfigError> {
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
        // A delivery whose attempt died is taken over by the next delivery of the same
        // message (a higher DeliveryCount, see the consumer): there must be one.
        let max_delivery_count = get(names::MAX_DELIVERY_COUNT)
            .map(|v| {
                whole_number_within(
                    names::MAX_DELIVERY_COUNT,
                    &v,
                    2..=2000,
                    "; with fewer than 2 deliveries a message whose handler died would be \
                     dead-lettered instead of taken over",
                )
            })
            .transpose()?
            .unwrap_or(10);
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
            None => default_reconcile_min_age(lease),
            Some(v) => millis(names::RECONCILE_MIN_AGE_MS, &v, 0, 30 * 86_400_000)?,
        };
        Ok(Timings {
            retry_budget,
            lease,
            inflight_wait,
            max_delivery_count: max_delivery_count as u32,
            reconcile_min_age,
        })
    }
}

/// The lease is taken before the claim, and the claim may wait for an unreachable
/// PostgreSQL server: what is left of the lease must still cover the bank's budget, or a
/// second attempt could take over a live payout.
fn lease_outlasts_an_outage_wait(
    timings: &Timings,
    bank_timeout: Duration,
    postgres: &PostgresSettings,
) -> Result<(), ConfigError> {
    let needed = postgres.outage_wait + timings.retry_budget + bank_timeout;
    if timings.lease <= needed {
        return Err(ConfigError::new(
            names::PAYMENTS_POSTGRES_OUTAGE_WAIT_MS,
            format!(
                "{} ms + RETRY_BUDGET_MS + BANK_TIMEOUT_MS = {} ms does not fit in LEASE_MS ({} ms): \
                 a claim that waited for the server would leave too little lease for the bank; \
                 lower it or raise LEASE_MS",
                postgres.outage_wait.as_millis(),
                needed.as_millis(),
                timings.lease.as_millis()
            ),
        ));
    }
    Ok(())
}

/// `IDEMPOTENCY_KEY_RETENTION_HOURS` when unset.
const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// `RECONCILE_MIN_AGE_MS` when unset: three leases.
fn default_reconcile_min_age(lease: Duration) -> Duration {
    lease * 3
}

/// `HTTP_AUTH` and `IDEMPOTENCY_KEY_RETENTION_HOURS`: the payments API's callers and keys.
fn http_settings(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(CallerAuth, Duration), ConfigError> {
    let http_auth = one_of(
        get,
        names::HTTP_AUTH,
        "a caller authentication",
        [
            ("functionkey", CallerAuth::FunctionKey),
            ("appservice", CallerAuth::AppService),
        ],
    )?;
    let key_retention = get(names::IDEMPOTENCY_KEY_RETENTION_HOURS)
        .map(|v| {
            whole_number_within(
                names::IDEMPOTENCY_KEY_RETENTION_HOURS,
                &v,
                1..=24 * 90,
                " hours",
            )
        })
        .transpose()?
        .map_or(DEFAULT_KEY_RETENTION, |hours| {
            Duration::from_secs(hours * 3600)
        });
    Ok((http_auth, key_retention))
}

/// `LOG_FORMAT`.
fn log_format(get: &dyn Fn(&str) -> Option<String>) -> Result<LogFormat, ConfigError> {
    one_of(
        get,
        names::LOG_FORMAT,
        "a log format",
        [("json", LogFormat::Json), ("text", LogFormat::Text)],
    )
}

/// A setting that names one of two `choices`, trimmed; the first when unset. Anything
/// else is refused, shown, and said not to be `what`.
fn one_of<T: Copy>(
    get: &dyn Fn(&str) -> Option<String>,
    setting: &'static str,
    what: &str,
    choices: [(&str, T); 2],
) -> Result<T, ConfigError> {
    let Some(value) = get(setting) else {
        return Ok(choices[0].1);
    };
    let value = value.trim();
    choices
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, choice)| *choice)
        .ok_or_else(|| {
            ConfigError::new(
                setting,
                format!(
                    "{value:?} is not {what}; use {} or {}",
                    choices[0].0, choices[1].0
                ),
            )
        })
}

/// The dev crate's knobs have no business in a deployment.
fn refuse_dev_only_settings(get: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    if let Some(knob) = DEV_ONLY_SETTINGS
        .into_iter()
        .find(|name| get(name).is_some())
    {
        return Err(ConfigError::new(
            knob,
            "is read only by claims-payments-dev (alternative handlers and fault injection); remove it",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_lookup(crate::env_setting::lookup_in(pairs))
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
    fn the_functions_read_the_settings_defaults() {
        let s = settings(&[]).unwrap();
        let functions = s.functions();
        assert_eq!(functions.http_auth, CallerAuth::FunctionKey);
        assert_eq!(functions.key_retention, Duration::from_secs(24 * 3600));
        assert_eq!(functions.reconcile_min_age, s.lease * 3);
        let s = settings(&[
            ("HTTP_AUTH", "appservice"),
            ("RECONCILE_MIN_AGE_MS", "5000"),
        ])
        .unwrap();
        assert_eq!(s.functions().http_auth, CallerAuth::AppService);
        assert_eq!(s.functions().reconcile_min_age, Duration::from_secs(5));
    }

    #[test]
    fn every_invalid_value_names_its_setting() {
        let cases: &[(&str, &str)] = &[
            ("FUNCTIONS_CUSTOMHANDLER_PORT", "http"),
            ("PAYMENTS_STORE", "mysql"),
            ("INBOX_RETENTION_DAYS", "0"),
            ("INBOX_RETENTION_DAYS", "ten"),
            ("CONSUMER_NAME", "a/b"),
            ("CONSUMER_NAME", "process"),
            ("CONSUMER_NAME", "payments-api"),
            ("CONSUMER_NAME", "reconcile-run"),
            ("BANK_API_URL", "not a url"),
            ("BANK_API_URL", "ftp://bank.example"),
            ("BANK_TIMEOUT_MS", "-1"),
            ("RETRY_BUDGET_MS", "soon"),
            ("LEASE_MS", "1000"),
            ("INFLIGHT_WAIT_MS", "x"),
            ("LOG_FORMAT", "xml"),
            // Read for every command, so an operator command refuses them too.
            ("TELEMETRY_SAMPLE_PERCENT", "101"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("TELEMETRY_SLOW_MS", "0"),
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                "not-a-connection-string",
            ),
            ("SERVICEBUS_TIMEOUT_MS", "soon"),
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

    /// The operator's `dead-letters` finds the queue in the settings every command reads,
    /// not in a second reading of the environment.
    #[test]
    fn the_dead_letter_queue_and_telemetry_are_read_with_the_rest() {
        use crate::servicebus::settings::QueueEndpoint;
        let s = settings(&[
            ("SERVICEBUS_ENDPOINT", "http://127.0.0.1:5300"),
            ("CLAIM_APPROVED_QUEUE", "claims"),
            ("SERVICEBUS_TIMEOUT_MS", "250"),
            ("TELEMETRY_SAMPLE_PERCENT", "100"),
        ])
        .unwrap();
        assert_eq!(
            s.dead_letter_queue.endpoint,
            QueueEndpoint::Loopback("http://127.0.0.1:5300".into())
        );
        assert_eq!(s.dead_letter_queue.queue, "claims");
        assert_eq!(s.dead_letter_queue.timeout, Duration::from_millis(250));
        assert_eq!(s.sampling.percent, 100.0);
        assert_eq!(s.telemetry, TelemetrySettings::Off);
    }

    /// In Azure, with the one identity the Bicep names everywhere, the stores, telemetry
    /// and the dead-letter tool choose the same identity and get the same credential.
    #[test]
    fn the_parts_that_name_one_identity_share_one_credential() {
        use crate::entra::{credential, EntraIdentity};
        use crate::servicebus::settings::QueueEndpoint;
        use crate::store::cosmos::CosmosAuth;
        let id = "0b5c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        let authentication = format!("ClientId={id};Authorization=AAD");
        let s = settings(&[
            ("WEBSITE_INSTANCE_ID", "a1b2c3"),
            ("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token"),
            ("PAYMENTS_STORE", "cosmos"),
            ("COSMOS_ENDPOINT", "https://acct.documents.azure.com/"),
            ("COSMOS_MANAGED_IDENTITY_CLIENT_ID", id),
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                "InstrumentationKey=00000000-0000-0000-0000-000000000001;IngestionEndpoint=https://ingest.example/",
            ),
            ("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", &authentication),
            ("SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID", id),
            ("ServiceBusConnection__fullyQualifiedNamespace", "ns.servicebus.windows.net"),
        ])
        .unwrap();
        let expected = EntraIdentity::ManagedIdentity {
            client_id: Some(id.to_owned()),
        };
        let StoreSettings::Cosmos(cosmos) = &s.store else {
            panic!("{:?}", s.store)
        };
        let CosmosAuth::ManagedIdentity { client_id } = &cosmos.auth else {
            panic!("{:?}", cosmos.auth)
        };
        let store = EntraIdentity::ManagedIdentity {
            client_id: client_id.clone(),
        };
        let TelemetrySettings::AppInsights {
            entra: Some(telemetry),
            ..
        } = &s.telemetry
        else {
            panic!("{:?}", s.telemetry)
        };
        let QueueEndpoint::Namespace {
            identity: queue, ..
        } = &s.dead_letter_queue.endpoint
        else {
            panic!("{:?}", s.dead_letter_queue)
        };
        for identity in [&store, telemetry, queue] {
            assert_eq!(identity, &expected);
        }
        let built = credential(&store).unwrap();
        assert!(std::sync::Arc::ptr_eq(
            &built,
            &credential(telemetry).unwrap()
        ));
        assert!(std::sync::Arc::ptr_eq(&built, &credential(queue).unwrap()));
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
        let postgres = |url| {
            settings(&[
                ("PAYMENTS_STORE", "postgres"),
                ("PAYMENTS_POSTGRES_URL", url),
            ])
        };
        let s = postgres("postgresql://app:pw-SECRET@db.example.com:5432/payments?sslmode=require")
            .unwrap();
        assert_eq!(s.store.name(), "postgres");
        assert!(!format!("{s:?}").contains("SECRET"), "{s:?}");
        let err = postgres("postgresql://app:pw-SECRET@db.example.com/payments?sslmode=disable")
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
    fn a_postgres_outage_wait_leaves_the_lease_to_the_bank() {
        let postgres = [
            ("PAYMENTS_STORE", "postgres"),
            (
                "PAYMENTS_POSTGRES_URL",
                "postgresql://app:pw@127.0.0.1/payments",
            ),
        ];
        // The defaults fit: 20 s + 60 s + 5 s < 90 s; so do the deployed ones (120 s).
        assert!(settings(&postgres).is_ok());
        let deployed = [postgres.as_slice(), &[("LEASE_MS", "120000")]].concat();
        assert!(settings(&deployed).is_ok());
        let long_wait = [
            postgres.as_slice(),
            &[("PAYMENTS_POSTGRES_OUTAGE_WAIT_MS", "30000")],
        ]
        .concat();
        let err = settings(&long_wait).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS", "{err}");
        // The same wait with a lease that covers it.
        let covered = [long_wait.as_slice(), &[("LEASE_MS", "120000")]].concat();
        assert!(settings(&covered).is_ok());
    }

    #[test]
    fn a_number_out_of_range_names_the_range_and_why() {
        for (pair, problem) in [
            (("INBOX_RETENTION_DAYS", "0"), "0 is outside 1..=3650 days"),
            (
                ("IDEMPOTENCY_KEY_RETENTION_HOURS", "2161"),
                "2161 is outside 1..=2160 hours",
            ),
            (
                ("MAX_DELIVERY_COUNT", "1"),
                "1 is outside 2..=2000; with fewer than 2 deliveries a message whose handler \
                 died would be dead-lettered instead of taken over",
            ),
        ] {
            assert_eq!(settings(&[pair]).unwrap_err().problem, problem);
        }
    }

    #[test]
    fn a_choice_not_offered_is_shown_with_the_choices() {
        for (pair, problem) in [
            (
                ("LOG_FORMAT", " xml "),
                r#""xml" is not a log format; use json or text"#,
            ),
            (
                ("HTTP_AUTH", "basic"),
                r#""basic" is not a caller authentication; use functionkey or appservice"#,
            ),
        ] {
            assert_eq!(settings(&[pair]).unwrap_err().problem, problem);
        }
        let s = settings(&[("LOG_FORMAT", " text "), ("HTTP_AUTH", "appservice")]).unwrap();
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.http_auth, CallerAuth::AppService);
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
        let with_key = |key| {
            settings(&[
                ("BANK_API_URL", "https://bank.example/api"),
                ("BANK_API_KEY", key),
            ])
        };
        let s = with_key(" key-SECRET ").unwrap();
        let bank = s.bank.as_ref().unwrap();
        assert_eq!(bank.api_key.as_ref().unwrap().expose_secret(), "key-SECRET");
        let err = with_key(
            "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/bank-api-key)",
        )
        .unwrap_err();
        assert_eq!(err.setting, "BANK_API_KEY", "{err}");
        assert!(
            !format!("{s:?}").contains("SECRET"),
            "Debug must redact the key"
        );
    }
}
