//! Logs, traces and metrics.
//!
//! Logs are structured `tracing` events; in Azure they are one JSON object per line on
//! stdout, which the Functions host forwards to Application Insights (`traces`, category
//! `Host.Function.Console`). Every invocation ends with one `invocation finished` event
//! carrying `claimId`, `messageId`, `deliveryCount` and `outcome`.
//!
//! Traces and metrics are OpenTelemetry, through `tracing` ([`export`] sets it up): with
//! `APPLICATIONINSIGHTS_CONNECTION_STRING` they go to Application Insights, with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` to an OTLP endpoint, without either nowhere (and no span
//! is even created: [`enabled`] is false). Each invocation is a server span (a request in
//! Application Insights) whose parent is the caller's `traceparent` or the message's
//! `Diagnostic-Id` ([`trace`]); store calls and bank calls are client spans
//! (dependencies), and the bank request carries `traceparent`.
//!
//! Traces are sampled ([`sampling`]): every invocation that went other than plainly well
//! is exported whole, and `TELEMETRY_SAMPLE_PERCENT` (default 5) of the plain successes;
//! each exported item carries its sample rate, so Application Insights' counts are
//! estimated totals. Until an invocation ends its spans are plain records
//! ([`trace::Recorder`]); OpenTelemetry spans are built only for the traces kept.
//!
//! Counters are process-wide atomics: cheap on the hot path, logged as a summary every
//! minute and at shutdown, and served as JSON on `GET /metrics` for local runs. When
//! telemetry is exported, each counter is also an OpenTelemetry counter with its
//! dimensions ([`metrics`]), so Application Insights gets real metrics, not log lines.

/// The span processor methods that a processor wrapping another (`self.inner`) hands on
/// unchanged: flushing, shutting down and the resource. Used inside `impl SpanProcessor`.
macro_rules! forward_lifecycle_to_inner {
    () => {
        fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
            self.inner.force_flush()
        }

        fn shutdown_with_timeout(
            &self,
            timeout: std::time::Duration,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            self.inner.shutdown_with_timeout(timeout)
        }

        fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
            self.inner.set_resource(resource);
        }
    };
}
use forward_lifecycle_to_inner;

/// For tests: settings read from `pairs`, as from the process environment.
#[cfg(test)]
fn lookup<'a>(pairs: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_string())
    }
}

pub mod export;
pub(crate) mod metrics;
mod record;
pub mod sampling;
pub(crate) mod trace;

pub(crate) use export::{enabled, init_exporter, TelemetryGuard, TelemetrySettings};

/// `serve` started: counted and exported at once, so a handler that keeps crashing soon
/// after its start still shows its starts.
pub(crate) fn started() {
    if metrics::count_start() {
        export::flush_metrics();
    }
}

use std::sync::OnceLock;

use serde::Serialize;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

pub(crate) use claims_payments_engine::telemetry::Counter;

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

/// What `serve` runs first (through `Settings::start_telemetry`, which read these with
/// the process's other settings): builds the exporter where `settings` say telemetry
/// goes and installs the subscriber (logs, and spans when exported). The guard flushes
/// at shutdown. Call inside the runtime.
pub(crate) fn start(
    format: LogFormat,
    settings: &TelemetrySettings,
    policy: sampling::Policy,
) -> anyhow::Result<Option<TelemetryGuard>> {
    match init_exporter(settings, policy)? {
        Some((recorder, guard)) => {
            init_with(format, Some(recorder));
            tracing::info!(
                telemetry = settings.name(),
                samplePercent = policy.percent,
                honourCallerSampling = policy.honour_parent,
                slowMs = policy.slow.as_millis() as u64,
                "telemetry exported"
            );
            Ok(Some(guard))
        }
        None => {
            init(format);
            Ok(None)
        }
    }
}

/// Installs the global subscriber (logs only, nothing exported). `RUST_LOG` overrides the
/// default `info` filter.
pub(crate) fn init(format: LogFormat) {
    init_with(format, None);
}

/// Installs the global subscriber: the log lines, and the span recorder when an exporter
/// was built (see [`export::init_exporter`]). A second init (tests, simulate) keeps the
/// first subscriber.
pub(crate) fn init_with(format: LogFormat, recorder: Option<trace::Recorder>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The log line stays what it was: no span list, no current span. So the JSON lines
    // never see a span (else each span's fields would be formatted, for nothing).
    let logs = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stdout)
            .with_filter(filter.and(filter_fn(|meta| meta.is_event())))
            .boxed(),
        LogFormat::Text => fmt::layer()
            .compact()
            .with_writer(std::io::stdout)
            .with_filter(filter)
            .boxed(),
    };
    let otel = recorder.map(trace::layer);
    let result = tracing_subscriber::registry()
        .with(logs)
        .with(otel)
        .try_init();
    drop(result);
}

/// What the service counts: the engine's counters (outcomes, leases, the bank, reconcile,
/// the store and its adapters; reached through `Deref`), and the product's own on top.
#[derive(Debug)]
pub struct Counters {
    engine: &'static claims_payments_engine::telemetry::Counters,
    pub(crate) invocations: Counter,
    /// `POST /api/payments`: requests, stored answers replayed, refused while in flight
    /// (409), keys reused with another request (422).
    pub(crate) http_requests: Counter,
    pub(crate) http_replays: Counter,
    pub(crate) http_in_flight: Counter,
    pub(crate) http_key_mismatches: Counter,
    /// Telemetry that never reached its endpoint: spans dropped because the export queue
    /// was full, and items in exports that failed (endpoint slow, down or refusing).
    pub(crate) telemetry_dropped: Counter,
    telemetry_export_failures: Counter,
    /// Invocations (local root spans) whose trace was exported, and those sampled away.
    pub(crate) telemetry_traces_kept: Counter,
    pub(crate) telemetry_traces_sampled_out: Counter,
}

impl std::ops::Deref for Counters {
    type Target = claims_payments_engine::telemetry::Counters;

    fn deref(&self) -> &Self::Target {
        self.engine
    }
}

impl Default for Counters {
    fn default() -> Self {
        use self::metrics::names::*;
        let http = |result| Counter::metric(HTTP_IDEMPOTENCY, Some(("result", result)));
        Counters {
            engine: claims_payments_engine::telemetry::counters(),
            invocations: Counter::metric(INVOCATIONS, Some(("function", "ClaimApproved"))),
            http_requests: http("request"),
            http_replays: http("replayed"),
            http_in_flight: http("in-flight"),
            http_key_mismatches: http("key-reused"),
            // Counted here and logged; as metrics they would travel the road that failed.
            telemetry_dropped: Counter::default(),
            telemetry_export_failures: Counter::default(),
            telemetry_traces_kept: Counter::default(),
            telemetry_traces_sampled_out: Counter::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountersSnapshot {
    invocations: u64,
    paid: u64,
    recorded: u64,
    duplicates_skipped: u64,
    business_duplicates: u64,
    conflicts: u64,
    invalid_messages: u64,
    retry_later: u64,
    store_failures: u64,
    rejected: u64,
    needs_reconciliation: u64,
    takeovers: u64,
    lease_waits: u64,
    own_write_recognised: u64,
    owners_found_gone: u64,
    bank_calls: u64,
    bank_retries: u64,
    bank_service_faults: u64,
    clock_refusals: u64,
    bank_lookups: u64,
    http_requests: u64,
    http_replays: u64,
    http_in_flight: u64,
    http_key_mismatches: u64,
    reconcile_runs: u64,
    reconcile_settled: u64,
    reconcile_unknown: u64,
    store_transient_errors: u64,
    store_outage_waits: u64,
    store_round_trips: u64,
    sqlite_commits: u64,
    sqlite_committed_jobs: u64,
    sqlite_syncs: u64,
    cosmos_request_units: f64,
    telemetry_dropped: u64,
    telemetry_export_failures: u64,
    telemetry_traces_kept: u64,
    telemetry_traces_sampled_out: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> CountersSnapshot {
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
            owners_found_gone: self.owners_found_gone.get(),
            bank_calls: self.bank_calls.get(),
            bank_retries: self.bank_retries.get(),
            bank_service_faults: self.bank_service_faults.get(),
            clock_refusals: self.clock_refusals.get(),
            bank_lookups: self.bank_lookups.get(),
            http_requests: self.http_requests.get(),
            http_replays: self.http_replays.get(),
            http_in_flight: self.http_in_flight.get(),
            http_key_mismatches: self.http_key_mismatches.get(),
            reconcile_runs: self.reconcile_runs.get(),
            reconcile_settled: self.reconcile_settled.get(),
            reconcile_unknown: self.reconcile_unknown.get(),
            store_transient_errors: self.store_transient_errors.get(),
            store_outage_waits: self.store_outage_waits.get(),
            store_round_trips: self.store_round_trips.get(),
            sqlite_commits: self.sqlite_commits.get(),
            sqlite_committed_jobs: self.sqlite_committed_jobs.get(),
            sqlite_syncs: self.sqlite_syncs.get(),
            cosmos_request_units: self.cosmos_request_units.get(),
            telemetry_dropped: self.telemetry_dropped.get(),
            telemetry_export_failures: self.telemetry_export_failures.get(),
            telemetry_traces_kept: self.telemetry_traces_kept.get(),
            telemetry_traces_sampled_out: self.telemetry_traces_sampled_out.get(),
        }
    }
}

/// The process-wide counters.
pub fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

/// Logs the counters as one structured event.
pub(crate) fn log_counters() {
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
        ownersFoundGone = c.owners_found_gone,
        bankRetries = c.bank_retries,
        bankServiceFaults = c.bank_service_faults,
        clockRefusals = c.clock_refusals,
        storeTransientErrors = c.store_transient_errors,
        storeOutageWaits = c.store_outage_waits,
        cosmosRequestUnits = c.cosmos_request_units,
        telemetryDropped = c.telemetry_dropped,
        telemetryExportFailures = c.telemetry_export_failures,
        telemetryTracesKept = c.telemetry_traces_kept,
        telemetryTracesSampledOut = c.telemetry_traces_sampled_out,
        "counters"
    );
}
