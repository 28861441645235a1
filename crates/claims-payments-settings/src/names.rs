//! The name of every setting, defined once: the configuration, the stores' settings,
//! the simulator and the benchmark all use these constants.

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
/// How long one store call waits for an unreachable PostgreSQL server (a failover).
pub const PAYMENTS_POSTGRES_OUTAGE_WAIT_MS: &str = "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS";
/// `none` (PostgreSQL itself) or `pgbouncer-transaction` (a transaction-pooling PgBouncer).
pub const PAYMENTS_POSTGRES_POOLER: &str = "PAYMENTS_POSTGRES_POOLER";
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
/// The Service Bus namespace (`{name}.servicebus.windows.net`), the app's own setting.
pub const SERVICE_BUS_NAMESPACE: &str = "ServiceBusConnection__fullyQualifiedNamespace";
/// The queue the trigger reads, the app's own setting.
pub const CLAIM_APPROVED_QUEUE: &str = "CLAIM_APPROVED_QUEUE";
/// `dead-letters`: another Service Bus endpoint (a loopback stand-in), instead of the namespace.
pub const SERVICEBUS_ENDPOINT: &str = "SERVICEBUS_ENDPOINT";
/// `dead-letters`: per Service Bus request.
pub const SERVICEBUS_TIMEOUT_MS: &str = "SERVICEBUS_TIMEOUT_MS";
/// `dead-letters`: the user-assigned managed identity (in a pipeline) for Service Bus.
pub const SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID: &str = "SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID";
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
    PAYMENTS_POSTGRES_OUTAGE_WAIT_MS,
    PAYMENTS_POSTGRES_POOLER,
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
    SERVICE_BUS_NAMESPACE,
    CLAIM_APPROVED_QUEUE,
    SERVICEBUS_ENDPOINT,
    SERVICEBUS_TIMEOUT_MS,
    SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
];
