//! `bench`'s figures and how they are printed.

use std::fmt::Write as _;

use super::*;

/// Throughput and latency of one phase of one variant, over all rounds.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseFigures {
    pub requests: usize,
    /// Transport errors and non-2xx answers.
    pub errors: usize,
    /// 2xx answers with another outcome than the phase expects.
    pub unexpected_outcomes: usize,
    pub invocations_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Store calls per invocation, from the handler's counters.
    pub store_round_trips_per_message: f64,
    /// CPU time (user + system) the serve process spent per invocation.
    pub server_cpu_us_per_message: f64,
    /// CPU time the load generator (this process) spent per invocation.
    pub generator_cpu_us_per_message: f64,
    /// `server_cpu_us_per_message` split by the serve threads that spent it.
    pub server_cpu_us_by_thread: ThreadCpu,
    /// Bytes the SQLite writer thread wrote per invocation: WAL frames (page + 24-byte
    /// header) and WAL headers.
    pub wal_bytes_per_message: f64,
    /// Bytes the checkpointer copied from the WAL into the database file per invocation.
    pub checkpoint_bytes_per_message: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantFigures {
    pub variant: Variant,
    pub fresh: PhaseFigures,
    /// Duplicates the process answers from its memory of completed messages.
    pub duplicate: PhaseFigures,
    /// The same duplicates after a restart: answered from the store.
    pub duplicate_at_store: PhaseFigures,
    /// `POST /api/payments` with a new Idempotency-Key for a new claim (consumer only).
    pub http_fresh: Option<PhaseFigures>,
    /// The same requests again, same keys: the stored answer replayed (consumer only).
    pub http_replay: Option<PhaseFigures>,
    /// Peak resident memory of the serve process after the load, KiB.
    pub peak_rss_kib: Option<u64>,
}

/// Store (and bank) work per message, from counter deltas.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundTrips {
    pub messages: usize,
    pub errors: usize,
    pub store_round_trips_per_message: f64,
    pub bank_calls_per_message: f64,
    /// Cosmos only (0 for SQLite).
    pub request_units_per_message: f64,
    /// SQLite only: jobs carried per group commit, and per WAL sync (a sync can cover
    /// several commits): how much each durable write was shared.
    pub jobs_per_commit: Option<f64>,
    pub jobs_per_sync: Option<f64>,
    pub invocations_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreRoundTrips {
    pub store: String,
    /// What the request units are: the SDK emulator's constant charge, or charges measured elsewhere.
    pub request_units_are: String,
    pub fresh: RoundTrips,
    /// Duplicates the process saw completed: answered from memory.
    pub duplicate: RoundTrips,
    /// Duplicates a process that did not see them answers (another instance, a restart).
    pub duplicate_at_store: RoundTrips,
    /// A second message (new MessageId) for a claim already recorded.
    pub business_duplicate: RoundTrips,
    pub fresh_with_payout: RoundTrips,
    pub duplicate_with_payout: RoundTrips,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Startup {
    pub configuration: String,
    pub starts: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

/// Where the load runs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pinning {
    /// The core every `serve` process runs on (one variant is loaded at a time).
    pub serve_cpu: Option<usize>,
    /// The core of the load generator (this process) during the throughput phases.
    pub generator_cpu: Option<usize>,
    /// Why the processes were not pinned, if they were not.
    pub warning: Option<String>,
}

/// One of the targets, as this run found it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    pub name: String,
    /// "measured" or "computed".
    pub basis: &'static str,
    pub value: f64,
    pub limit: f64,
    /// The value must be at most the limit (else: at least).
    pub at_most: bool,
    pub unit: &'static str,
    pub met: bool,
}

impl Target {
    pub(super) fn new(
        name: impl Into<String>,
        basis: &'static str,
        value: f64,
        at_most: bool,
        limit: f64,
        unit: &'static str,
    ) -> Self {
        // Round to the printed precision first, so that a printed 12.00 never "misses" 12.
        let shown = (value * 1000.0).round() / 1000.0;
        Target {
            name: name.into(),
            basis,
            value,
            limit,
            at_most,
            unit,
            met: if at_most {
                shown <= limit
            } else {
                shown >= limit
            },
        }
    }

    pub(super) fn verdict(&self) -> String {
        if self.met {
            return "met".to_owned();
        }
        let by = if self.limit != 0.0 {
            format!(
                " by {:.0}%",
                ((self.value - self.limit) / self.limit).abs() * 100.0
            )
        } else {
            String::new()
        };
        format!("MISSED{by}")
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    pub build: String,
    pub cores: usize,
    pub pinning: Pinning,
    pub concurrency: usize,
    pub requests_per_phase: usize,
    pub rounds: usize,
    pub variants: Vec<VariantFigures>,
    /// consumer / noop, invocations per second.
    pub fresh_vs_ceiling: f64,
    pub duplicate_vs_ceiling: f64,
    pub duplicate_at_store_vs_ceiling: f64,
    /// consumer / naive, invocations per second.
    pub fresh_vs_naive: f64,
    pub duplicate_vs_naive: f64,
    pub duplicate_at_store_vs_naive: f64,
    pub round_trips: Vec<StoreRoundTrips>,
    pub startup: Vec<Startup>,
    /// Why the Cosmos part over HTTP did not run, if it did not.
    pub cosmos_skipped: Option<String>,
    /// Request units per message computed from Microsoft's rules (see [`ru`]).
    pub cosmos_computed: Vec<ru::CaseCost>,
    /// Cosmos cost per million messages from the computed figures: (label, after, before).
    pub cosmos_cost: Vec<CostRow>,
    /// Why nothing was measured at `COSMOS_TEST_ENDPOINT`, if nothing was.
    pub cosmos_measured_skipped: Option<String>,
    pub targets: Vec<Target>,
    /// `serve` with telemetry off beside exporting to a local endpoint.
    pub telemetry: Option<telemetry::TelemetryOverhead>,
    /// The consumer on PostgreSQL beside SQLite, in the same rounds.
    pub postgres: Option<pg::StoreComparison>,
    /// Why the PostgreSQL part did not run, if it did not.
    pub postgres_skipped: Option<String>,
}

/// The Cosmos cost of a million messages of one kind, under the deployed indexing policy
/// and the one deployed before it (every path but the payout request indexed).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CostRow {
    pub kind: String,
    pub after: ru::CostPerMillion,
    pub before: ru::CostPerMillion,
}

pub(super) fn variant_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Consumer => "consumer",
        Variant::Noop => "noop (ceiling)",
        Variant::Naive => "naive",
    }
}

pub(super) fn thread_split(t: &ThreadCpu) -> String {
    format!(
        "runtime {:.0}, writer {:.0}, syncer {:.0}, other {:.0}",
        t.runtime, t.sqlite_writer, t.sqlite_syncer, t.other
    )
}

impl BenchReport {
    /// `POST /api/payments` beside the message path, on the consumer's process.
    pub(super) fn print_http_beside_messages(&self, o: &mut impl std::fmt::Write) {
        let Some(v) = self
            .variants
            .iter()
            .find(|v| v.variant == Variant::Consumer)
        else {
            return;
        };
        let (Some(http_fresh), Some(http_replay)) = (&v.http_fresh, &v.http_replay) else {
            return;
        };
        let _ = writeln!(
            o,
            "consumer, message path and POST /api/payments on the same process and store:"
        );
        let _ = writeln!(
            o,
            "  {:<34}{:>9}{:>8}{:>8}{:>7}{:>9}",
            "", "req/s", "p50ms", "p99ms", "cpuus", "store rt"
        );
        let rows = [
            ("ClaimApproved, fresh", &v.fresh),
            ("ClaimApproved, duplicate (memory)", &v.duplicate),
            ("ClaimApproved, duplicate (store)", &v.duplicate_at_store),
            ("POST /api/payments, new key", http_fresh),
            ("POST /api/payments, replayed key", http_replay),
        ];
        for (name, p) in rows {
            let _ = writeln!(
                o,
                "  {:<34}{:>9.0}{:>8.2}{:>8.2}{:>7.0}{:>9.2}",
                name,
                p.invocations_per_second,
                p.p50_ms,
                p.p99_ms,
                p.server_cpu_us_per_message,
                p.store_round_trips_per_message
            );
        }
        let problems: usize = [http_fresh, http_replay]
            .iter()
            .map(|p| p.errors + p.unexpected_outcomes)
            .sum();
        if problems > 0 {
            let _ = writeln!(
                o,
                "  !! {problems} HTTP errors or unexpected answers (a new key must get 201, a replay 201 with Idempotent-Replayed: true)"
            );
        }
        let _ = writeln!(
            o,
            "  HTTP/message ratios: new key / fresh message {:.2}x, replay / duplicate at the store {:.2}x",
            ratio(http_fresh.invocations_per_second, v.fresh.invocations_per_second),
            ratio(
                http_replay.invocations_per_second,
                v.duplicate_at_store.invocations_per_second
            )
        );
    }

    /// The compact table.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "claims-payments-dev bench: {} build, {} cores, closed loop of {} concurrent invocations, {} per phase in {} rounds",
            self.build, self.cores, self.concurrency, self.requests_per_phase, self.rounds
        );
        match (
            &self.pinning.warning,
            self.pinning.serve_cpu,
            self.pinning.generator_cpu,
        ) {
            (None, Some(serve), Some(generator)) => {
                let _ = writeln!(
                    o,
                    "pinned: every serve process on CPU {serve}, the load generator on CPU {generator} (sched_setaffinity)"
                );
            }
            (Some(warning), _, _) => {
                let _ = writeln!(o, "{warning}");
            }
            _ => {}
        }
        self.render_throughput(&mut o);
        self.render_round_trips(&mut o);
        self.render_cosmos(&mut o);
        for s in &self.startup {
            let _ = writeln!(
                o,
                "start-up ({}): median {:.1} ms (min {:.1}, max {:.1}) over {} starts, exec to first answer on GET /",
                s.configuration, s.median_ms, s.min_ms, s.max_ms, s.starts
            );
        }
        if !self.targets.is_empty() {
            let _ = writeln!(o, "performance targets, this run:");
            for t in &self.targets {
                let value = match t.unit {
                    "x" => format!("{:.2}x", t.value),
                    "B" => format!("{:.0} B", t.value),
                    "RU" => format!("{:.2} RU", t.value),
                    _ => format!("{:.2}", t.value),
                };
                let limit = match t.unit {
                    "x" => format!("{:.2}x", t.limit),
                    "B" => format!("{:.0} B", t.limit),
                    "RU" => format!("{:.0} RU", t.limit),
                    _ => format!("{:.0}", t.limit),
                };
                let _ = writeln!(
                    o,
                    "  {:<52} {:>10} ({}) {} {:<8}  {}",
                    t.name,
                    value,
                    t.basis,
                    if t.at_most { "<=" } else { ">=" },
                    limit,
                    t.verdict()
                );
            }
        }
        if let Some(telemetry) = &self.telemetry {
            telemetry.render_text(&mut o);
        }
        o
    }

    /// The throughput table, ratios, CPU by thread, PostgreSQL beside SQLite.
    fn render_throughput(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "full HTTP path to `serve`; SQLite WAL, every answer after its WAL sync (pipelined group commit); ledger-only; info logs"
        );
        let _ = writeln!(
            o,
            "{:<16}{:>9}{:>7}{:>7}{:>6}  {:>8}{:>7}{:>7}{:>6}  {:>9}{:>7}{:>6}  {:>9}",
            "",
            "fresh/s",
            "p50ms",
            "p99ms",
            "cpuus",
            "dup/s",
            "p50ms",
            "p99ms",
            "cpuus",
            "store-dup",
            "p50ms",
            "cpuus",
            "peak RSS"
        );
        for v in &self.variants {
            let rss = v.peak_rss_kib.map_or("n/a".to_owned(), |k| {
                format!("{:.1} MiB", k as f64 / 1024.0)
            });
            let _ = writeln!(
                o,
                "{:<16}{:>9.0}{:>7.2}{:>7.2}{:>6.0}  {:>8.0}{:>7.2}{:>7.2}{:>6.0}  {:>9.0}{:>7.2}{:>6.0}  {:>9}",
                variant_name(v.variant),
                v.fresh.invocations_per_second,
                v.fresh.p50_ms,
                v.fresh.p99_ms,
                v.fresh.server_cpu_us_per_message,
                v.duplicate.invocations_per_second,
                v.duplicate.p50_ms,
                v.duplicate.p99_ms,
                v.duplicate.server_cpu_us_per_message,
                v.duplicate_at_store.invocations_per_second,
                v.duplicate_at_store.p50_ms,
                v.duplicate_at_store.server_cpu_us_per_message,
                rss
            );
            let problems: usize = [&v.fresh, &v.duplicate, &v.duplicate_at_store]
                .iter()
                .map(|p| p.errors + p.unexpected_outcomes)
                .sum();
            if problems > 0 {
                let _ = writeln!(
                    o,
                    "{:<16}!! {} errors / unexpected outcomes: the figures above are not comparable",
                    "", problems
                );
            }
        }
        let generator: Vec<String> = self
            .variants
            .iter()
            .map(|v| {
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    v.fresh.generator_cpu_us_per_message,
                    v.duplicate.generator_cpu_us_per_message,
                    v.duplicate_at_store.generator_cpu_us_per_message
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "dup = duplicate answered from the process's memory; store-dup = the same after a restart, answered from the store"
        );
        let _ = writeln!(
            o,
            "cpuus = serve CPU (user+system) per invocation, us; the load generator spent {} us per request (fresh/dup/store-dup, same order)",
            generator.join(", ")
        );
        self.print_http_beside_messages(o);
        let _ = writeln!(o, "serve cpu us per invocation by thread:");
        for v in &self.variants {
            let _ = writeln!(
                o,
                "  {:<15} fresh {}; dup {}; store-dup {}",
                variant_name(v.variant),
                thread_split(&v.fresh.server_cpu_us_by_thread),
                thread_split(&v.duplicate.server_cpu_us_by_thread),
                thread_split(&v.duplicate_at_store.server_cpu_us_by_thread)
            );
        }
        let _ = writeln!(
            o,
            "SQLite bytes written per fresh message (write calls of the writer thread = WAL frames, of the checkpointer = database pages):"
        );
        for v in self.variants.iter().filter(|v| v.variant != Variant::Noop) {
            let _ = writeln!(
                o,
                "  {:<15} WAL {:.0} B ({:.1} KiB, {:.1} frames of 2 KiB + 24 B), checkpointed {:.0} B",
                variant_name(v.variant),
                v.fresh.wal_bytes_per_message,
                v.fresh.wal_bytes_per_message / 1024.0,
                v.fresh.wal_bytes_per_message / 2072.0,
                v.fresh.checkpoint_bytes_per_message
            );
        }
        let _ = writeln!(
            o,
            "ours/ceiling    fresh {:.0}%, duplicate {:.0}%, duplicate at store {:.0}%",
            self.fresh_vs_ceiling * 100.0,
            self.duplicate_vs_ceiling * 100.0,
            self.duplicate_at_store_vs_ceiling * 100.0
        );
        let _ = writeln!(
            o,
            "ours/naive      fresh {:.2}x, duplicate {:.2}x, duplicate at store {:.2}x",
            self.fresh_vs_naive, self.duplicate_vs_naive, self.duplicate_at_store_vs_naive
        );
        if let Some(comparison) = &self.postgres {
            comparison.render(o);
        }
    }

    /// Store round trips per message, per store and case.
    fn render_round_trips(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "store round trips per message (from GET /metrics deltas):"
        );
        for rt in &self.round_trips {
            let cosmos = rt.store.starts_with("cosmos");
            let line = |label: &str, r: &RoundTrips| {
                let mut s = format!(
                    "  {label:<24} {:>5.2} round trips",
                    r.store_round_trips_per_message
                );
                if r.bank_calls_per_message > 0.0 {
                    s.push_str(&format!(", {:.2} bank calls", r.bank_calls_per_message));
                }
                if cosmos {
                    s.push_str(&format!(", {:.2} RU", r.request_units_per_message));
                }
                if let Some(j) = r.jobs_per_commit {
                    s.push_str(&format!(", {j:.1} jobs per commit"));
                }
                if let Some(j) = r.jobs_per_sync {
                    s.push_str(&format!(", {j:.1} per WAL sync"));
                }
                s.push_str(&format!(
                    " ({} msgs, {:.0}/s",
                    r.messages, r.invocations_per_second
                ));
                if r.errors > 0 {
                    s.push_str(&format!(", {} errors", r.errors));
                }
                s.push(')');
                s
            };
            if rt.request_units_are.is_empty() {
                let _ = writeln!(o, " {}", rt.store);
            } else {
                let _ = writeln!(o, " {} (RU: {})", rt.store, rt.request_units_are);
            }
            for (label, r) in [
                ("fresh", &rt.fresh),
                ("duplicate from memory", &rt.duplicate),
                ("duplicate at the store", &rt.duplicate_at_store),
                ("business duplicate", &rt.business_duplicate),
                ("fresh with payout", &rt.fresh_with_payout),
                ("duplicate with payout", &rt.duplicate_with_payout),
            ] {
                let _ = writeln!(o, "{}", line(label, r));
            }
        }
        if let Some(why) = &self.postgres_skipped {
            let _ = writeln!(o, " postgres: skipped ({why})");
        }
        if let Some(why) = &self.cosmos_skipped {
            let _ = writeln!(o, " cosmos over HTTP: skipped ({why})");
        }
        if let Some(why) = &self.cosmos_measured_skipped {
            let _ = writeln!(o, " cosmos, measured charges: none ({why})");
        }
    }

    /// Cosmos request units computed from the rules, and their cost.
    fn render_cosmos(&self, o: &mut String) {
        if !self.cosmos_computed.is_empty() {
            let _ = writeln!(
                o,
                "Cosmos RU per message, COMPUTED from Microsoft's published rules (create 5 + 0.2/indexed term, replace 10 + 0.2/changed term, \
                 read 1/KiB x2 under Strong, batch = sum) for the documents the real consumer wrote on the SDK emulator ({} per case):",
                self.cosmos_computed.first().map_or(0, |c| c.messages)
            );
            let _ = writeln!(
                o,
                "  {:<24}{:>7}{:>9}{:>9}{:>9}   {:>9}{:>9}   {:>8}{:>7}",
                "",
                "trips",
                "RU now",
                "+TTL del",
                "refused",
                "RU before",
                "+TTL del",
                "terms",
                "bytes"
            );
            for c in &self.cosmos_computed {
                let _ = writeln!(
                    o,
                    "  {:<24}{:>7.2}{:>9.2}{:>9.2}{:>9.2}   {:>9.2}{:>9.2}   {:>4.0}/{:<3.0}{:>7}",
                    c.case.label(),
                    c.round_trips,
                    c.request_units,
                    c.ttl_delete_request_units,
                    c.refused_requests,
                    c.before_request_units,
                    c.before_ttl_delete_request_units,
                    c.terms_per_document,
                    c.before_terms_per_document,
                    c.largest_document_bytes
                );
            }
            let _ = writeln!(
                o,
                "  now = the deployed indexing policy, before = every path but payoutRequest; +TTL del = the inbox document's later expiry \
                 (billed on serverless); refused = requests refused with 409 per message, whose charge is not published (not included); \
                 terms = indexed values per created document now/before; bytes = largest stored document"
            );
        }
        if !self.cosmos_cost.is_empty() {
            let _ = writeln!(
                o,
                "Cosmos cost per million messages, COMPUTED (list prices: serverless $0.25 per million RU; manual $0.008 per 100 RU/s-hour, \
                 autoscale 1.5x; now / before):"
            );
            for row in &self.cosmos_cost {
                let _ = writeln!(
                    o,
                    "  {:<50} {:>5.1}/{:<5.1} RU  serverless ${:.2}/${:.2}  manual at full use ${:.2}/${:.2}  autoscale ${:.2}/${:.2}  \
                     break-even vs 400 RU/s {:.1}M/{:.1}M msgs a month",
                    row.kind,
                    row.after.request_units_per_message,
                    row.before.request_units_per_message,
                    row.after.serverless,
                    row.before.serverless,
                    row.after.manual_at_full_use,
                    row.before.manual_at_full_use,
                    row.after.autoscale_at_full_use,
                    row.before.autoscale_at_full_use,
                    row.after.break_even_messages_per_month / 1e6,
                    row.before.break_even_messages_per_month / 1e6
                );
            }
        }
    }
}

/// One multi-instance run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancesFigures {
    pub instances: usize,
    pub messages: usize,
    pub deliveries: usize,
    pub errors: usize,
    pub unexpected_outcomes: usize,
    pub deliveries_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Cosmos requests per message (all instances).
    pub round_trips_per_message: f64,
    /// The emulator's constant charge per message, not Azure's (see the computed table).
    pub emulator_request_units_per_message: f64,
    pub bank_calls_per_message: f64,
    /// Deliveries that found the message in progress under another attempt's lease
    /// (waited for it, or took it over), as a share of all deliveries.
    pub met_a_lease_share: f64,
    pub lease_waits: f64,
    pub takeovers: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancesReport {
    pub build: String,
    pub cores: usize,
    pub concurrency: usize,
    pub redelivery_share: f64,
    pub runs: Vec<InstancesFigures>,
}

impl InstancesReport {
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "claims-payments-dev bench --instances: {} build, {} cores (unpinned: N serve processes, the cosmos-emulator and the generator share them), \
             closed loop of {} in flight; payout mode against a sandbox bank; {:.0}% of the messages redelivered at once to the next instance (DeliveryCount 2)",
            self.build,
            self.cores,
            self.concurrency,
            self.redelivery_share * 100.0
        );
        let _ = writeln!(
            o,
            "{:>9}{:>9}{:>11}{:>13}{:>8}{:>8}{:>12}{:>11}{:>11}{:>14}",
            "instances",
            "msgs",
            "deliveries",
            "deliveries/s",
            "p50ms",
            "p99ms",
            "trips/msg",
            "emu RU/msg",
            "bank/msg",
            "met a lease"
        );
        for r in &self.runs {
            let _ = writeln!(
                o,
                "{:>9}{:>9}{:>11}{:>13.0}{:>8.2}{:>8.2}{:>12.2}{:>11.2}{:>11.2}{:>13.1}%",
                r.instances,
                r.messages,
                r.deliveries,
                r.deliveries_per_second,
                r.p50_ms,
                r.p99_ms,
                r.round_trips_per_message,
                r.emulator_request_units_per_message,
                r.bank_calls_per_message,
                r.met_a_lease_share * 100.0
            );
            if r.errors + r.unexpected_outcomes > 0 {
                let _ = writeln!(
                    o,
                    "{:>9}  !! {} errors, {} unexpected outcomes",
                    "", r.errors, r.unexpected_outcomes
                );
            }
        }
        let _ = writeln!(
            o,
            "met a lease = deliveries that found the message in progress under another attempt's lease (another instance's when N > 1; \
             with N = 1 the two deliveries meet in one process), over all deliveries (waited for it: {}; took it over: {}); \
             emu RU = the SDK emulator's constant charge, not Azure's (the computed per-case table of `bench` applies)",
            self.runs
                .iter()
                .map(|r| format!("{:.0}", r.lease_waits))
                .collect::<Vec<_>>()
                .join("/"),
            self.runs
                .iter()
                .map(|r| format!("{:.0}", r.takeovers))
                .collect::<Vec<_>>()
                .join("/")
        );
        o
    }
}
