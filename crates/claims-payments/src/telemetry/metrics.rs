//! The service's metrics, as OpenTelemetry instruments.
//!
//! Application Insights stores each one in `customMetrics` (`name` below, the dimensions
//! in `customDimensions`), aggregated per export interval (`valueSum`, `valueCount`,
//! `valueMin`, `valueMax`). Nothing here is created unless telemetry is exported
//! ([`super::enabled`]): without an exporter a count is one atomic add, as before.
//!
//! Metrics are never sampled: every count reaches its instrument, whatever the traces'
//! sampling decides. The hot path allocates nothing: each counter's instrument and
//! attribute set are built on first use and kept (the engine's
//! [`Binding`](claims_payments_engine::telemetry::Binding)), the dimensions known
//! only at the call are `&'static str` or kept sets ([`http_answer`]), and the SDK finds
//! a kept set's aggregator with one hash lookup under a read lock.
//!
//! | metric | kind | dimensions |
//! |---|---|---|
//! | `claims_payments.outcomes` | counter | `outcome` (the log line's label) |
//! | `claims_payments.dead_letter_bound` | counter | `outcome` (`conflict`, `invalid-message`, `store-failure`) |
//! | `claims_payments.invocations` | counter | `function` |
//! | `claims_payments.takeovers`, `.lease_waits`, `.own_writes_recognised` | counter | |
//! | `claims_payments.owners_found_gone` | counter | lease owners whose process had ended (taken over at once) |
//! | `claims_payments.bank.calls` | counter | `operation` (`payout`, `lookup`) |
//! | `claims_payments.bank.retries`, `.bank.service_faults` | counter | |
//! | `claims_payments.clock_refusals` | counter | payouts refused on a clock beyond the bound |
//! | `claims_payments.bank.duration` | histogram, ms | `operation`, `answer` (answer class) |
//! | `claims_payments.http.answers` | counter | `route`, `status` |
//! | `claims_payments.http.idempotency` | counter | `result` (`request`, `replayed`, `in-flight`, `key-reused`) |
//! | `claims_payments.reconcile.runs` | counter | |
//! | `claims_payments.reconcile.results` | counter | `result` |
//! | `claims_payments.reconcile.backlog` | gauge | `state` (`needs-reconciliation`, `orphaned-in-progress`, `still-unknown`) |
//! | `claims_payments.store.round_trips`, `.store.transient_errors`, `.store.outage_waits` | counter | outage waits: connection attempts repeated while PostgreSQL was unreachable |
//! | `claims_payments.cosmos.request_units` | counter (RU) | |
//! | `claims_payments.starts` | counter | (exported at once: a restart loop still shows) |

use std::sync::{OnceLock, RwLock};

use opentelemetry::metrics::{Counter, Gauge, Histogram};
use opentelemetry::KeyValue;

/// The metric names, one place (the alerts and the workbook in infra/ use them).
pub(crate) mod names {
    // The engine's counters, the store adapters' among them, have their names in the
    // engine (`claims_payments_engine::telemetry::names`).
    pub(crate) const DEAD_LETTER_BOUND: &str = "claims_payments.dead_letter_bound";
    pub(crate) const INVOCATIONS: &str = "claims_payments.invocations";
    pub(crate) const BANK_DURATION: &str = "claims_payments.bank.duration";
    pub(crate) const HTTP_ANSWERS: &str = "claims_payments.http.answers";
    pub(crate) const HTTP_IDEMPOTENCY: &str = "claims_payments.http.idempotency";
    pub(crate) const RECONCILE_RESULTS: &str = "claims_payments.reconcile.results";
    pub(crate) const RECONCILE_BACKLOG: &str = "claims_payments.reconcile.backlog";
    pub(crate) const STARTS: &str = "claims_payments.starts";
}

// The meter every instrument comes from (the global provider `super::export` installs).
use claims_payments_engine::telemetry::meter;

/// The instruments that take dimensions known only at the call.
struct Instruments {
    bank_duration: Histogram<f64>,
    http_answers: Counter<u64>,
    dead_letter_bound: Counter<u64>,
    reconcile_results: Counter<u64>,
    reconcile_backlog: Gauge<u64>,
}

fn instruments() -> Option<&'static Instruments> {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    if !super::enabled() {
        return None;
    }
    Some(INSTRUMENTS.get_or_init(|| {
        let meter = meter();
        Instruments {
            bank_duration: meter
                .f64_histogram(names::BANK_DURATION)
                .with_unit("ms")
                .with_description("Duration of one bank request, to the answer's headers")
                .build(),
            http_answers: meter
                .u64_counter(names::HTTP_ANSWERS)
                .with_description("Answers of the handler's HTTP server, by route and status")
                .build(),
            dead_letter_bound: meter
                .u64_counter(names::DEAD_LETTER_BOUND)
                .with_description(
                    "Answers that fail a message for good: after maxDeliveryCount it is dead-lettered",
                )
                .build(),
            reconcile_results: meter.u64_counter(names::RECONCILE_RESULTS).build(),
            reconcile_backlog: meter
                .u64_gauge(names::RECONCILE_BACKLOG)
                .with_description("Payments the last reconcile run found unsettled, by state")
                .build(),
        }
    }))
}

/// `serve` started: counted (`super::started` exports it at once).
pub(crate) fn count_start() -> bool {
    if !super::enabled() {
        return false;
    }
    meter().u64_counter(names::STARTS).build().add(1, &[]);
    true
}

/// One bank request took `millis` and was answered as `answer`.
pub(crate) fn bank_duration(operation: &'static str, answer: &'static str, millis: f64) {
    if let Some(i) = instruments() {
        i.bank_duration.record(
            millis,
            &[
                KeyValue::new("operation", operation),
                KeyValue::new("answer", answer),
            ],
        );
    }
}

/// The HTTP server answered `route` with `status`. The attribute sets are built once
/// per (route, status) and kept (routes are the router's few patterns, so a short scan
/// under a read lock finds them): no allocation per request.
pub(crate) fn http_answer(route: &str, status: u16) {
    /// More pairs than this are counted without being kept.
    const KEPT: usize = 64;
    type Sets = Vec<(Box<str>, u16, [KeyValue; 2])>;
    static SETS: RwLock<Sets> = RwLock::new(Vec::new());
    let Some(i) = instruments() else { return };
    {
        let sets = SETS.read().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, attributes)) =
            sets.iter().find(|(r, s, _)| *s == status && &**r == route)
        {
            i.http_answers.add(1, attributes);
            return;
        }
    }
    let attributes = [
        KeyValue::new("route", route.to_owned()),
        KeyValue::new("status", i64::from(status)),
    ];
    i.http_answers.add(1, &attributes);
    let mut sets = SETS.write().unwrap_or_else(|e| e.into_inner());
    if sets.len() < KEPT && !sets.iter().any(|(r, s, _)| *s == status && &**r == route) {
        sets.push((route.into(), status, attributes));
    }
}

/// A delivery was answered so that the message will end in the dead-letter queue.
pub(crate) fn dead_letter_bound(outcome: &'static str) {
    if let Some(i) = instruments() {
        i.dead_letter_bound
            .add(1, &[KeyValue::new("outcome", outcome)]);
    }
}

/// What one reconcile run settled, and what it found unsettled.
pub(crate) struct ReconcileRun {
    pub(crate) paid_by_lookup: u64,
    pub(crate) paid_now: u64,
    pub(crate) rejected: u64,
    pub(crate) still_unknown: u64,
    pub(crate) mismatches: u64,
    pub(crate) double_payments: u64,
    pub(crate) skipped: u64,
    pub(crate) waiting: u64,
    pub(crate) not_reached: u64,
    pub(crate) needs_a_person: u64,
    pub(crate) needs_reconciliation_before: u64,
    pub(crate) orphaned_in_progress_before: u64,
}

pub(crate) fn reconcile_run(run: &ReconcileRun) {
    let Some(i) = instruments() else { return };
    for (result, n) in [
        ("paid-by-lookup", run.paid_by_lookup),
        ("paid-now", run.paid_now),
        ("rejected", run.rejected),
        ("still-unknown", run.still_unknown),
        ("mismatch", run.mismatches),
        ("double-payment", run.double_payments),
        ("skipped", run.skipped),
        ("waiting", run.waiting),
        ("not-reached", run.not_reached),
    ] {
        if n > 0 {
            i.reconcile_results
                .add(n, &[KeyValue::new("result", result)]);
        }
    }
    for (state, n) in [
        ("needs-reconciliation", run.needs_reconciliation_before),
        ("orphaned-in-progress", run.orphaned_in_progress_before),
        ("still-unknown", run.still_unknown),
        ("needs-a-person", run.needs_a_person),
    ] {
        i.reconcile_backlog
            .record(n, &[KeyValue::new("state", state)]);
    }
}

#[cfg(test)]
mod tests {
    //! The metric path per message, on its own: what it allocates (nothing, once each
    //! instrument and attribute set exists) and, printed, what it takes.
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    /// The system allocator, counting this thread's allocations.
    struct Counting;

    // SAFETY: forwards every call to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// A metric exporter that keeps nothing.
    #[derive(Debug)]
    struct Discard;

    impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for Discard {
        async fn export(
            &self,
            _metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
        fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(
            &self,
            _timeout: std::time::Duration,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
        fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
            opentelemetry_sdk::metrics::Temporality::Delta
        }
    }

    fn allocations() -> u64 {
        ALLOCATIONS.with(Cell::get)
    }

    #[test]
    fn the_metric_path_of_a_message_allocates_nothing() {
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(Discard).build())
            .build();
        opentelemetry::global::set_meter_provider(provider);
        super::super::export::enable_for_test();
        let c = super::super::counters();
        // What one paid message counts: the invocation, its outcome, store round trips,
        // the bank call and its latency, the host's HTTP answer.
        let message = || {
            c.invocations.inc();
            c.paid.inc();
            c.store_round_trips.add(2);
            c.bank_calls.inc();
            bank_duration("payout", "success", 12.5);
            http_answer("/ClaimApproved", 200);
            dead_letter_bound("conflict");
        };
        message(); // the first builds the instruments and attribute sets
        let before = allocations();
        let started = std::time::Instant::now();
        const N: u32 = 10_000;
        for _ in 0..N {
            message();
        }
        let took = started.elapsed();
        let allocated = allocations() - before;
        eprintln!(
            "metric path: {:.0} ns per message ({} build), {allocated} allocations in {N}",
            took.as_nanos() as f64 / f64::from(N),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        assert_eq!(allocated, 0, "the metric path allocated per message");
    }
}
