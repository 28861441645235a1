//! Logs and counters.
//!
//! Logs are structured `tracing` events; in Azure they are one JSON object per line on
//! stdout, which the Functions host forwards to Application Insights (`traces`, category
//! `Host.Function.Console`). Every invocation ends with one `invocation finished` event
//! carrying `claimId`, `messageId`, `deliveryCount` and `outcome`.
//!
//! Counters are process-wide atomics: cheap on the hot path, logged as a summary every
//! minute and at shutdown, and served as JSON on `GET /metrics` for local runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::Serialize;
use tracing_subscriber::{fmt, EnvFilter};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Stops azure_core from capturing a backtrace for every error it discards, which it
/// does when `RUST_BACKTRACE=1` and which slows every Cosmos call several times; panics
/// keep theirs. Call first thing in `main`, before any thread starts. An explicit
/// `RUST_LIB_BACKTRACE` wins. The one place this is decided: child processes the dev
/// tools and tests start inherit it.
pub fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY (edition 2024 marks set_var unsafe): called before any other thread exists.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` filter.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stdout);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.compact().try_init(),
    };
    // A second init (tests, simulate) keeps the first subscriber.
    drop(result);
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Request units, kept in hundredths so an atomic integer can hold them.
#[derive(Debug, Default)]
pub struct RequestUnits(AtomicU64);

impl RequestUnits {
    pub fn add(&self, ru: f64) {
        if ru.is_finite() && ru > 0.0 {
            self.0
                .fetch_add((ru * 100.0).round() as u64, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> f64 {
        self.0.load(Ordering::Relaxed) as f64 / 100.0
    }
}

/// What the service counts. Outcome counters mirror the `outcome` log field.
#[derive(Debug, Default)]
pub struct Counters {
    pub invocations: Counter,
    pub paid: Counter,
    pub recorded: Counter,
    pub duplicates_skipped: Counter,
    pub business_duplicates: Counter,
    pub conflicts: Counter,
    pub invalid_messages: Counter,
    pub retry_later: Counter,
    pub store_failures: Counter,
    pub rejected: Counter,
    pub needs_reconciliation: Counter,
    pub takeovers: Counter,
    pub lease_waits: Counter,
    pub own_write_recognised: Counter,
    pub bank_calls: Counter,
    pub bank_retries: Counter,
    /// Bank answers that are the service's own fault (credential, URL, method, format).
    pub bank_service_faults: Counter,
    pub bank_lookups: Counter,
    /// `POST /api/payments`: requests, stored answers replayed, refused while in flight
    /// (409), keys reused with another request (422).
    pub http_requests: Counter,
    pub http_replays: Counter,
    pub http_in_flight: Counter,
    pub http_key_mismatches: Counter,
    /// Reconcile runs, and the payments they settled or left unknown.
    pub reconcile_runs: Counter,
    pub reconcile_settled: Counter,
    pub reconcile_unknown: Counter,
    pub store_transient_errors: Counter,
    pub store_round_trips: Counter,
    /// SQLite group commits, and the write jobs they carried: jobs / commits is the
    /// average group size. Syncs (`fdatasync` of the WAL) each cover one or more groups.
    pub sqlite_commits: Counter,
    pub sqlite_committed_jobs: Counter,
    pub sqlite_syncs: Counter,
    pub cosmos_request_units: RequestUnits,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountersSnapshot {
    pub invocations: u64,
    pub paid: u64,
    pub recorded: u64,
    pub duplicates_skipped: u64,
    pub business_duplicates: u64,
    pub conflicts: u64,
    pub invalid_messages: u64,
    pub retry_later: u64,
    pub store_failures: u64,
    pub rejected: u64,
    pub needs_reconciliation: u64,
    pub takeovers: u64,
    pub lease_waits: u64,
    pub own_write_recognised: u64,
    pub bank_calls: u64,
    pub bank_retries: u64,
    pub bank_service_faults: u64,
    pub bank_lookups: u64,
    pub http_requests: u64,
    pub http_replays: u64,
    pub http_in_flight: u64,
    pub http_key_mismatches: u64,
    pub reconcile_runs: u64,
    pub reconcile_settled: u64,
    pub reconcile_unknown: u64,
    pub store_transient_errors: u64,
    pub store_round_trips: u64,
    pub sqlite_commits: u64,
    pub sqlite_committed_jobs: u64,
    pub sqlite_syncs: u64,
    pub cosmos_request_units: f64,
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            invocations: self.invocations.get(),
            paid: self.paid.get(),
            recorded: self.recorded.get(),
            duplicates_skipped: self.duplicates_skipped.get(),
            business_duplicates: self.business_duplicates.get(),
            conflicts: self.conflicts.get(),
            invalid_messages: self.invalid_messages.get(),
            retry_later: self.retry_later.get(),
            store_failures: self.store_failures.get(),
            rejected: self.rejected.get(),
            needs_reconciliation: self.needs_reconciliation.get(),
            takeovers: self.takeovers.get(),
            lease_waits: self.lease_waits.get(),
            own_write_recognised: self.own_write_recognised.get(),
            bank_calls: self.bank_calls.get(),
            bank_retries: self.bank_retries.get(),
            bank_service_faults: self.bank_service_faults.get(),
            bank_lookups: self.bank_lookups.get(),
            http_requests: self.http_requests.get(),
            http_replays: self.http_replays.get(),
            http_in_flight: self.http_in_flight.get(),
            http_key_mismatches: self.http_key_mismatches.get(),
            reconcile_runs: self.reconcile_runs.get(),
            reconcile_settled: self.reconcile_settled.get(),
            reconcile_unknown: self.reconcile_unknown.get(),
            store_transient_errors: self.store_transient_errors.get(),
            store_round_trips: self.store_round_trips.get(),
            sqlite_commits: self.sqlite_commits.get(),
            sqlite_committed_jobs: self.sqlite_committed_jobs.get(),
            sqlite_syncs: self.sqlite_syncs.get(),
            cosmos_request_units: self.cosmos_request_units.get(),
        }
    }
}

/// The process-wide counters.
pub fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

/// Logs the counters as one structured event.
pub fn log_counters() {
    let c = counters().snapshot();
    tracing::info!(
        invocations = c.invocations,
        paid = c.paid,
        recorded = c.recorded,
        duplicatesSkipped = c.duplicates_skipped,
        businessDuplicates = c.business_duplicates,
        conflicts = c.conflicts,
        invalidMessages = c.invalid_messages,
        retryLater = c.retry_later,
        storeFailures = c.store_failures,
        rejected = c.rejected,
        needsReconciliation = c.needs_reconciliation,
        takeovers = c.takeovers,
        bankRetries = c.bank_retries,
        bankServiceFaults = c.bank_service_faults,
        storeTransientErrors = c.store_transient_errors,
        cosmosRequestUnits = c.cosmos_request_units,
        "counters"
    );
}
