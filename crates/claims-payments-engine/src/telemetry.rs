//! The engine's counters: process-wide atomics, cheap on the hot path, each also an
//! OpenTelemetry counter (a metric with its dimensions) once the composing process has
//! turned metrics on ([`enable`]). Only the `opentelemetry` API is used here: the process
//! that installs an SDK and an exporter decides where the metrics go.
//!
//! | metric | kind | dimensions |
//! |---|---|---|
//! | `claims_payments.outcomes` | counter | `outcome` (the log line's label) |
//! | `claims_payments.takeovers`, `.lease_waits`, `.own_writes_recognised` | counter | |
//! | `claims_payments.owners_found_gone` | counter | lease owners whose process had ended |
//! | `claims_payments.bank.calls` | counter | `operation` (`payout`, `lookup`) |
//! | `claims_payments.bank.retries`, `.bank.service_faults` | counter | |
//! | `claims_payments.clock_refusals` | counter | payouts refused on a clock beyond the bound |
//! | `claims_payments.reconcile.runs` | counter | |
//! | `claims_payments.store.round_trips`, `.store.transient_errors` | counter | |
//! | `claims_payments.store.outage_waits` | counter | connection attempts repeated while PostgreSQL was unreachable |
//! | `claims_payments.cosmos.request_units` | counter (RU) | |
//!
//! The store adapters count here too (transient errors, outage waits, SQLite's group
//! commits and syncs, Cosmos DB's request units): the store port is the engine's, and each
//! adapter is a crate of its own below the product.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use opentelemetry::metrics::Counter as OtelCounter;
use opentelemetry::KeyValue;

/// The metric names the engine's counters are exported under (the alerts and the
/// workbook in infra/ use them).
pub mod names {
    pub const OUTCOMES: &str = "claims_payments.outcomes";
    pub const TAKEOVERS: &str = "claims_payments.takeovers";
    pub const LEASE_WAITS: &str = "claims_payments.lease_waits";
    pub const OWN_WRITES_RECOGNISED: &str = "claims_payments.own_writes_recognised";
    pub const OWNERS_FOUND_GONE: &str = "claims_payments.owners_found_gone";
    pub const BANK_CALLS: &str = "claims_payments.bank.calls";
    pub const BANK_RETRIES: &str = "claims_payments.bank.retries";
    pub const BANK_SERVICE_FAULTS: &str = "claims_payments.bank.service_faults";
    pub const CLOCK_REFUSALS: &str = "claims_payments.clock_refusals";
    pub const RECONCILE_RUNS: &str = "claims_payments.reconcile.runs";
    pub const STORE_ROUND_TRIPS: &str = "claims_payments.store.round_trips";
    pub const STORE_TRANSIENT_ERRORS: &str = "claims_payments.store.transient_errors";
    pub const STORE_OUTAGE_WAITS: &str = "claims_payments.store.outage_waits";
    pub const COSMOS_REQUEST_UNITS: &str = "claims_payments.cosmos.request_units";
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static SPAN_FLAG: OnceLock<fn(&'static str)> = OnceLock::new();
static CALL_CHARGE: OnceLock<fn(f64)> = OnceLock::new();

/// Turns the instruments on: from now on each count also reaches its OpenTelemetry
/// counter, a counter that flags (e.g. `takeover`) calls `flag_span` with its flag, so
/// the process's tracing can mark the invocation under way, and each request charge
/// ([`RequestUnits`]) is also handed to `charge_call`, so the store call in progress
/// carries it. Called once, by the process that exports telemetry; without it a count is
/// one atomic add.
pub fn enable(flag_span: fn(&'static str), charge_call: fn(f64)) {
    let _ = SPAN_FLAG.set(flag_span);
    let _ = CALL_CHARGE.set(charge_call);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether metrics are on ([`enable`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A [`Counter`]'s metric: created on first use, and only when metrics are on.
#[derive(Debug, Default)]
pub struct Binding {
    name: Option<&'static str>,
    dimension: Option<(&'static str, &'static str)>,
    instrument: OnceLock<Option<(OtelCounter<u64>, Vec<KeyValue>)>>,
}

impl Binding {
    pub const fn new(name: &'static str, dimension: Option<(&'static str, &'static str)>) -> Self {
        Binding {
            name: Some(name),
            dimension,
            instrument: OnceLock::new(),
        }
    }

    pub fn add(&self, n: u64) {
        if !enabled() {
            return;
        }
        let instrument = self.instrument.get_or_init(|| {
            let name = self.name?;
            let attributes = self
                .dimension
                .map(|(k, v)| vec![KeyValue::new(k, v)])
                .unwrap_or_default();
            Some((meter().u64_counter(name).build(), attributes))
        });
        if let Some((counter, attributes)) = instrument {
            counter.add(n, attributes);
        }
    }
}

/// The meter every instrument comes from (the global provider the process installs).
pub fn meter() -> opentelemetry::metrics::Meter {
    opentelemetry::global::meter("claims-payments")
}

/// A monotonically increasing count; also an OpenTelemetry counter (a metric with its
/// dimensions) when metrics are on.
#[derive(Debug, Default)]
pub struct Counter {
    value: AtomicU64,
    metric: Binding,
    /// Set to `true` on the current invocation's span when counted (e.g. `takeover`).
    span_flag: Option<&'static str>,
}

impl Counter {
    /// A count that is also the metric `name`, with one dimension `key = value` (or none).
    pub const fn metric(
        name: &'static str,
        dimension: Option<(&'static str, &'static str)>,
    ) -> Self {
        Counter {
            value: AtomicU64::new(0),
            metric: Binding::new(name, dimension),
            span_flag: None,
        }
    }

    /// The same, and each count also marks the current invocation's span with `flag`.
    pub fn flagging(mut self, flag: &'static str) -> Self {
        self.span_flag = Some(flag);
        self
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
        self.metric.add(n);
        if let Some(flag) = self.span_flag {
            if enabled() {
                if let Some(flag_span) = SPAN_FLAG.get() {
                    flag_span(flag);
                }
            }
        }
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A floating-point counter without dimensions (request units).
#[derive(Debug, Default)]
struct F64Binding {
    name: Option<&'static str>,
    instrument: OnceLock<Option<opentelemetry::metrics::Counter<f64>>>,
}

impl F64Binding {
    const fn new(name: &'static str) -> Self {
        F64Binding {
            name: Some(name),
            instrument: OnceLock::new(),
        }
    }

    fn add(&self, value: f64) {
        if !enabled() {
            return;
        }
        let instrument = self
            .instrument
            .get_or_init(|| self.name.map(|name| meter().f64_counter(name).build()));
        if let Some(counter) = instrument {
            counter.add(value, &[]);
        }
    }
}

/// Request units, kept in hundredths so an atomic integer can hold them. Each charge is
/// also added to the store call in progress (its dependency span carries the charge,
/// through [`enable`]'s `charge_call`) and to the metric `claims_payments.cosmos.request_units`.
#[derive(Debug, Default)]
pub struct RequestUnits {
    value: AtomicU64,
    metric: F64Binding,
}

impl RequestUnits {
    pub fn add(&self, ru: f64) {
        if ru.is_finite() && ru > 0.0 {
            self.value
                .fetch_add((ru * 100.0).round() as u64, Ordering::Relaxed);
            self.metric.add(ru);
            if let Some(charge_call) = CALL_CHARGE.get() {
                charge_call(ru);
            }
        }
    }

    pub fn get(&self) -> f64 {
        self.value.load(Ordering::Relaxed) as f64 / 100.0
    }
}

/// What the engine counts. Outcome counters mirror the `outcome` log field.
#[derive(Debug)]
pub struct Counters {
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
    /// Lease owners found to belong to a process that has ended (each such process
    /// counted once per process that found it).
    pub owners_found_gone: Counter,
    pub bank_calls: Counter,
    pub bank_retries: Counter,
    /// Bank answers that are the service's own fault (credential, URL, method, format).
    pub bank_service_faults: Counter,
    /// Payouts refused because this instance's clock is too far from the bank's.
    pub clock_refusals: Counter,
    pub bank_lookups: Counter,
    /// Reconcile runs, and the payments they settled or left unknown.
    pub reconcile_runs: Counter,
    pub reconcile_settled: Counter,
    pub reconcile_unknown: Counter,
    pub store_round_trips: Counter,
    pub store_transient_errors: Counter,
    /// Connection attempts repeated while the PostgreSQL server could not be reached.
    pub store_outage_waits: Counter,
    /// SQLite group commits, and the write jobs they carried: jobs / commits is the
    /// average group size. Syncs (`fdatasync` of the WAL) each cover one or more groups.
    pub sqlite_commits: Counter,
    pub sqlite_committed_jobs: Counter,
    pub sqlite_syncs: Counter,
    pub cosmos_request_units: RequestUnits,
}

impl Default for Counters {
    fn default() -> Self {
        use self::names::*;
        let outcome = |label| Counter::metric(OUTCOMES, Some(("outcome", label)));
        Counters {
            paid: outcome("paid"),
            recorded: outcome("recorded"),
            duplicates_skipped: outcome("duplicate"),
            business_duplicates: outcome("business-duplicate"),
            conflicts: outcome("conflict"),
            invalid_messages: outcome("invalid-message"),
            retry_later: outcome("retry-later"),
            store_failures: outcome("store-failure"),
            rejected: outcome("rejected"),
            needs_reconciliation: outcome("needs-reconciliation"),
            takeovers: Counter::metric(TAKEOVERS, None).flagging("takeover"),
            // Each marks the invocation's trace, which the sampling then keeps.
            lease_waits: Counter::metric(LEASE_WAITS, None).flagging("leaseWait"),
            own_write_recognised: Counter::metric(OWN_WRITES_RECOGNISED, None)
                .flagging("ownWriteRecognised"),
            owners_found_gone: Counter::metric(OWNERS_FOUND_GONE, None).flagging("ownerFoundGone"),
            bank_calls: Counter::metric(BANK_CALLS, Some(("operation", "payout"))),
            bank_retries: Counter::metric(BANK_RETRIES, None),
            bank_service_faults: Counter::metric(BANK_SERVICE_FAULTS, None),
            clock_refusals: Counter::metric(CLOCK_REFUSALS, None),
            bank_lookups: Counter::metric(BANK_CALLS, Some(("operation", "lookup"))),
            reconcile_runs: Counter::metric(RECONCILE_RUNS, None),
            // The process records each result with its kind, as a metric of its own.
            reconcile_settled: Counter::default(),
            reconcile_unknown: Counter::default(),
            store_round_trips: Counter::metric(STORE_ROUND_TRIPS, None),
            store_transient_errors: Counter::metric(STORE_TRANSIENT_ERRORS, None),
            store_outage_waits: Counter::metric(STORE_OUTAGE_WAITS, None),
            sqlite_commits: Counter::default(),
            sqlite_committed_jobs: Counter::default(),
            sqlite_syncs: Counter::default(),
            cosmos_request_units: RequestUnits {
                value: AtomicU64::new(0),
                metric: F64Binding::new(COSMOS_REQUEST_UNITS),
            },
        }
    }
}

/// The process-wide counters.
pub fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}
