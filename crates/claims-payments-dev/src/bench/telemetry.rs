//! What telemetry costs `serve`, three ways in one run: telemetry off, exported at the
//! production default (`TELEMETRY_SAMPLE_PERCENT` unset: 5% of plain successes, every
//! failure) and exported at 100%; and a fourth, 0% (every span recorded and held, only
//! failures exported), which separates what recording spans costs from what exporting
//! them costs. Each exporting side exports to its own local Application Insights
//! ingestion endpoint (testkit's, running in this process, so its work lands on
//! the generator, not on `serve`).
//!
//! Every process runs the product's `serve` (ledger-only, SQLite), pinned to the same
//! core as the throughput phases, loaded one at a time with the same closed loop; rounds
//! rotate which goes first. Per phase (fresh messages, then the same messages again):
//! CPU per message, throughput and latency. Then each exporting side gets
//! [`FAILURES`] invalid messages (a non-success outcome), and after a flush the
//! endpoints' items and bytes are split into the plain successes' traces, the failures'
//! traces and metrics, and priced at [`PRICE_PER_GB`].

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::sim::queue::Message;
use claims_payments_testkit::ingestion::{operation_id, property, Ingestion};
use claims_payments_testkit::process::{ServeProcess, ServeSpec};

use super::{envelopes, measured, spec, Accumulated, BenchArgs, PhaseFigures, Pinning};

/// Invalid messages sent to each exporting side: every one must be exported.
const FAILURES: usize = 100;
/// Application Insights (workspace-based: Log Analytics "Analytics Logs") pay-as-you-go
/// ingestion, USD per GB (10^9 bytes); see docs/reference.md §11 for the source, region and date.
pub const PRICE_PER_GB: f64 = 2.30;
/// Outcomes that are a plain success (the sampling's own list).
const PLAIN: [&str; 3] = ["paid", "recorded", "duplicate"];

/// What one exporting side's endpoint received.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exported {
    /// `TELEMETRY_SAMPLE_PERCENT` of the side (None: unset, the default).
    pub sample_percent: Option<f64>,
    /// Plain successful invocations (warm-up and measured, fresh and duplicate).
    pub plain_messages: usize,
    /// Items (requests, dependencies, traces) of plain successes' traces.
    pub plain_items: usize,
    /// Non-success invocations sent, and how many arrived as a request.
    pub failures_sent: usize,
    pub failures_exported: usize,
    /// Items of the failures' traces, and metric items.
    pub failure_items: usize,
    pub metric_items: usize,
    /// Every item, upload, and byte (as sent: gzip; decoded: JSON).
    pub items: usize,
    pub uploads: usize,
    pub bytes_sent: usize,
    pub bytes_decoded: usize,
    /// Whether every exported item carried the sample rate it should.
    pub sample_rates: Vec<f64>,
    pub dropped: u64,
    pub export_failures: u64,
}

impl Exported {
    fn messages(&self) -> f64 {
        (self.plain_messages + self.failures_sent).max(1) as f64
    }

    /// Items per plain successful message.
    pub fn plain_items_per_message(&self) -> f64 {
        self.plain_items as f64 / self.plain_messages.max(1) as f64
    }

    /// Bytes per message, all items included (metrics and the failures too).
    pub fn bytes_per_message(&self) -> (f64, f64) {
        let m = self.messages();
        (self.bytes_sent as f64 / m, self.bytes_decoded as f64 / m)
    }

    /// Ingestion cost per million messages, on the decoded (JSON) bytes: an upper
    /// bound, as Log Analytics bills a record's stored columns, which Microsoft puts at
    /// about 25% below the incoming JSON.
    pub fn cost_per_million(&self) -> f64 {
        self.bytes_per_message().1 * 1e6 / 1e9 * PRICE_PER_GB
    }
}

/// One side: telemetry off, or exported.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySide {
    pub label: String,
    pub fresh: PhaseFigures,
    pub duplicate: PhaseFigures,
    /// The median over rounds of this side's serve CPU per message over "off"'s in the same
    /// round (a share: 0.1 is +10%), fresh and duplicate. Paired by round, it is steadier
    /// than the totals' ratio on a shared machine, where a burst of other work lands on
    /// one side's phase.
    pub median_round_overhead: (f64, f64),
    pub exported: Option<Exported>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TelemetryOverhead {
    /// Off, the production default, 100%, 0%.
    pub sides: Vec<TelemetrySide>,
}

impl TelemetryOverhead {
    /// Extra `serve` CPU per message over "off": (µs, share of "off").
    pub fn cpu_overhead(off: &PhaseFigures, on: &PhaseFigures) -> (f64, f64) {
        let extra = on.server_cpu_us_per_message - off.server_cpu_us_per_message;
        let share = if off.server_cpu_us_per_message > 0.0 {
            extra / off.server_cpu_us_per_message
        } else {
            0.0
        };
        (extra, share)
    }

    pub fn render_text(&self, o: &mut impl std::fmt::Write) {
        let _ = writeln!(
            o,
            "\nTelemetry cost (the consumer, ledger-only SQLite, same pinned core): off, the production default, 100% and 0% of plain successes exported to local Application Insights endpoints"
        );
        let _ = writeln!(
            o,
            "{:<32}{:>9}{:>8}{:>9}{:>8}{:>9}{:>8}{:>9}{:>8}{:>10}{:>10}{:>11}{:>10}",
            "",
            "fresh/s",
            "p50 ms",
            "CPU µs",
            "vs off",
            "dup/s",
            "p50 ms",
            "CPU µs",
            "vs off",
            "items/ok",
            "B/msg gz",
            "B/msg json",
            "$/million"
        );
        let Some(off) = self.sides.first() else {
            return;
        };
        for side in &self.sides {
            let (_, fresh_share) = Self::cpu_overhead(&off.fresh, &side.fresh);
            let (_, dup_share) = Self::cpu_overhead(&off.duplicate, &side.duplicate);
            let export = match &side.exported {
                Some(e) => {
                    let (gz, json) = e.bytes_per_message();
                    format!(
                        "{:>10.3}{:>10.0}{:>11.0}{:>10.2}",
                        e.plain_items_per_message(),
                        gz,
                        json,
                        e.cost_per_million()
                    )
                }
                None => format!("{:>10}{:>10}{:>11}{:>10}", "-", "-", "-", "-"),
            };
            let _ = writeln!(
                o,
                "{:<32}{:>9.0}{:>8.2}{:>9.1}{:>+7.0}%{:>9.0}{:>8.2}{:>9.1}{:>+7.0}%{export}",
                side.label,
                side.fresh.invocations_per_second,
                side.fresh.p50_ms,
                side.fresh.server_cpu_us_per_message,
                fresh_share * 100.0,
                side.duplicate.invocations_per_second,
                side.duplicate.p50_ms,
                side.duplicate.server_cpu_us_per_message,
                dup_share * 100.0,
            );
            for phase in [&side.fresh, &side.duplicate] {
                if phase.errors + phase.unexpected_outcomes > 0 {
                    let _ = writeln!(
                        o,
                        "{:<32}!! {} errors, {} unexpected outcomes",
                        "", phase.errors, phase.unexpected_outcomes
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            "vs off, median over rounds of each round's pair (fresh, duplicate): {}",
            self.sides[1..]
                .iter()
                .map(|s| format!(
                    "{} {:+.1}%, {:+.1}%",
                    s.label,
                    s.median_round_overhead.0 * 100.0,
                    s.median_round_overhead.1 * 100.0
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        for side in &self.sides {
            let Some(e) = &side.exported else { continue };
            let rates: Vec<String> = e.sample_rates.iter().map(|r| format!("{r}")).collect();
            let _ = writeln!(
                o,
                "{}: {} items in {} uploads ({} of plain successes for {} messages, {} of {} failures' traces, {} metric); \
                 non-success exported {}/{}; sample rates seen [{}]; dropped {}, failed uploads {}",
                side.label,
                e.items,
                e.uploads,
                e.plain_items,
                e.plain_messages,
                e.failure_items,
                e.failures_sent,
                e.metric_items,
                e.failures_exported,
                e.failures_sent,
                rates.join(", "),
                e.dropped,
                e.export_failures
            );
        }
        let _ = writeln!(
            o,
            "(B/msg: every item received over every message sent, metrics and failures included; \
             $/million: the JSON bytes at ${PRICE_PER_GB:.2}/GB, an upper bound of the billed size)"
        );
    }
}

/// Runs the three-way measurement.
pub(super) async fn overhead(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
) -> anyhow::Result<TelemetryOverhead> {
    let endpoints = [
        Ingestion::start().await,
        Ingestion::start().await,
        Ingestion::start().await,
    ];
    let pin = |spec: ServeSpec| match pinning.serve_cpu {
        Some(cpu) => spec.on_cpus(vec![cpu]),
        None => spec,
    };
    let specs = [
        pin(spec(exe, dir, "telemetry-off")),
        pin(spec(exe, dir, "telemetry-default").env(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            endpoints[0].connection_string(),
        )),
        pin(spec(exe, dir, "telemetry-all")
            .env(
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                endpoints[1].connection_string(),
            )
            .env("TELEMETRY_SAMPLE_PERCENT", "100")),
        pin(spec(exe, dir, "telemetry-none")
            .env(
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                endpoints[2].connection_string(),
            )
            .env("TELEMETRY_SAMPLE_PERCENT", "0")),
    ];
    let labels = [
        "telemetry off",
        "default (5% of successes)",
        "100%",
        "0% (spans recorded, failures only)",
    ];
    let percents = [None, None, Some(100.0), Some(0.0)];
    let _pinned = super::GeneratorPin::new(pinning)?;
    let mut processes = Vec::new();
    for spec in &specs {
        processes.push(ServeProcess::start(spec).await?);
    }
    let n = processes.len();
    let per_round = (args.requests / args.rounds).max(1);
    let warmup = (per_round / 10).clamp(50, 500);
    for (i, process) in processes.iter().enumerate() {
        let (fresh, again) = envelopes(warmup, &format!("telemetry-warmup-{i}"));
        let url = process.base_url();
        super::load(client, &url, Arc::new(fresh), args.concurrency, "recorded").await;
        super::load(client, &url, Arc::new(again), args.concurrency, "duplicate").await;
    }
    let mut fresh: Vec<Accumulated> = (0..n).map(|_| Accumulated::default()).collect();
    let mut duplicate: Vec<Accumulated> = (0..n).map(|_| Accumulated::default()).collect();
    // Per phase, per side: serve CPU per message in each round.
    let mut cpu_by_round: [Vec<Vec<f64>>; 2] = [vec![Vec::new(); n], vec![Vec::new(); n]];
    for round in 0..args.rounds {
        let order: Vec<usize> = (0..n).map(|k| (k + round) % n).collect();
        let batches: Vec<_> = (0..n)
            .map(|i| envelopes(per_round, &format!("telemetry-{i}-{round}")))
            .collect();
        for (phase, cpu_of_phase) in cpu_by_round.iter_mut().enumerate() {
            for &i in &order {
                let (first, second) = &batches[i];
                let bodies = if phase == 0 { first } else { second };
                let (run, delta) = measured(
                    client,
                    &processes[i],
                    Arc::new(bodies.clone()),
                    args.concurrency,
                    if phase == 0 { "recorded" } else { "duplicate" },
                )
                .await?;
                let cpu = delta.server_cpu_us / (run.latencies_us.len().max(1) as f64);
                cpu_of_phase[i].push(cpu);
                if phase == 0 {
                    fresh[i].add(run, delta);
                } else {
                    duplicate[i].add(run, delta);
                }
            }
        }
    }
    // The failures: invalid messages, outside the measured phases.
    for process in &processes[1..] {
        for k in 0..FAILURES {
            let invalid = Message {
                sequence_number: k as u64 + 1,
                copy: k,
                message_id: Arc::from(format!("bench-invalid-{k}")),
                body: Arc::from(b"not a claim".to_vec()),
                enqueued_at: time::OffsetDateTime::now_utc(),
                redrive: false,
            };
            let _ = client
                .post(process.url("/ClaimApproved"))
                .header("Content-Type", "application/json")
                .body(super::envelope_of(k, &invalid, 1))
                .send()
                .await;
        }
    }
    let mut counters = Vec::new();
    for process in &processes {
        let metrics: Value = client
            .get(process.url("/metrics"))
            .send()
            .await?
            .json()
            .await
            .context("a serve process's /metrics")?;
        counters.push(metrics);
    }
    // SIGTERM: each process flushes what it still holds, so the counts are complete.
    for mut process in processes {
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(process.pid as i32, libc::SIGTERM);
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(20), process.wait()).await;
    }
    let plain_messages = 2 * (warmup + per_round * args.rounds);
    let mut sides = Vec::new();
    for (i, (f, d)) in fresh.into_iter().zip(duplicate).enumerate() {
        let exported = (i > 0).then(|| {
            let mut e = tally(&endpoints[i - 1]);
            e.sample_percent = percents[i];
            e.plain_messages = plain_messages;
            e.failures_sent = FAILURES;
            e.dropped = counters[i]["telemetryDropped"].as_u64().unwrap_or(0);
            e.export_failures = counters[i]["telemetryExportFailures"].as_u64().unwrap_or(0);
            e
        });
        let median_over_off = |phase: usize| {
            let paired = cpu_by_round[phase][i]
                .iter()
                .zip(&cpu_by_round[phase][0])
                .map(|(on, off)| on / off - 1.0);
            median(paired.collect())
        };
        sides.push(TelemetrySide {
            label: labels[i].to_owned(),
            fresh: f.figures(),
            duplicate: d.figures(),
            median_round_overhead: (median_over_off(0), median_over_off(1)),
            exported,
        });
    }
    Ok(TelemetryOverhead { sides })
}

/// The median of `values` (0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Splits what an endpoint received by the trace it belongs to.
fn tally(endpoint: &Ingestion) -> Exported {
    let items = endpoint.items();
    let mut failure_traces = HashSet::new();
    let mut failures_exported = 0;
    for item in &items {
        if item["data"]["baseType"] != "RequestData" {
            continue;
        }
        let outcome = property(item, "outcome").as_str().unwrap_or("");
        if !PLAIN.contains(&outcome) {
            failure_traces.insert(operation_id(item).to_owned());
            if outcome == "invalid-message" {
                failures_exported += 1;
            }
        }
    }
    let mut e = Exported {
        failures_exported,
        items: items.len(),
        uploads: endpoint.posts(),
        ..Exported::default()
    };
    (e.bytes_sent, e.bytes_decoded) = endpoint.bytes();
    for item in &items {
        if item["data"]["baseType"] == "MetricData" {
            e.metric_items += 1;
            continue;
        }
        if failure_traces.contains(operation_id(item)) {
            e.failure_items += 1;
        } else {
            e.plain_items += 1;
        }
        if let Some(rate) = item["sampleRate"].as_f64() {
            if !e.sample_rates.contains(&rate) {
                e.sample_rates.push(rate);
            }
        }
    }
    e
}
