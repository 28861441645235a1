//! What exporting telemetry costs `serve`: the consumer with telemetry off beside the same
//! consumer exporting to a local Application Insights ingestion endpoint (testkit's,
//! running in this process, so its work lands on the generator, not on `serve`).
//!
//! Both processes run the product's `serve` (ledger-only, SQLite), pinned to the same
//! core as the throughput phases, loaded one at a time with the same closed loop; rounds
//! alternate which goes first. Per phase (fresh messages, then the same messages again):
//! CPU per message, throughput and latency, and what reached the endpoint per message.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;

use claims_payments_testkit::ingestion::Ingestion;
use claims_payments_testkit::process::{ServeProcess, ServeSpec};

use super::{envelopes, measured, spec, Accumulated, BenchArgs, PhaseFigures, Pinning};

/// One side: telemetry off, or exported.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySide {
    pub label: String,
    pub fresh: PhaseFigures,
    pub duplicate: PhaseFigures,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TelemetryOverhead {
    pub off: TelemetrySide,
    pub exported: TelemetrySide,
    /// Telemetry items the endpoint received (requests, dependencies, metrics, traces).
    pub items_received: usize,
    /// Uploads the endpoint received.
    pub uploads: usize,
    /// Messages the exporting side handled while measured and warmed up.
    pub messages_exported: usize,
    /// `telemetryDropped` and `telemetryExportFailures` of the exporting process.
    pub dropped: u64,
    pub export_failures: u64,
}

impl TelemetryOverhead {
    /// Extra `serve` CPU per message with telemetry exported: (µs, share of "off").
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
            "\nTelemetry overhead (the consumer, ledger-only SQLite, same pinned core): off vs exported to a local Application Insights endpoint"
        );
        let _ = writeln!(
            o,
            "{:<28}{:>10}{:>9}{:>11}{:>10}{:>9}{:>11}",
            "", "fresh/s", "p50 ms", "CPU µs", "dup/s", "p50 ms", "CPU µs"
        );
        for side in [&self.off, &self.exported] {
            let _ = writeln!(
                o,
                "{:<28}{:>10.0}{:>9.2}{:>11.1}{:>10.0}{:>9.2}{:>11.1}",
                side.label,
                side.fresh.invocations_per_second,
                side.fresh.p50_ms,
                side.fresh.server_cpu_us_per_message,
                side.duplicate.invocations_per_second,
                side.duplicate.p50_ms,
                side.duplicate.server_cpu_us_per_message
            );
            for phase in [&side.fresh, &side.duplicate] {
                if phase.errors + phase.unexpected_outcomes > 0 {
                    let _ = writeln!(
                        o,
                        "{:<28}!! {} errors, {} unexpected outcomes",
                        "", phase.errors, phase.unexpected_outcomes
                    );
                }
            }
        }
        let (fresh_us, fresh_share) = Self::cpu_overhead(&self.off.fresh, &self.exported.fresh);
        let (dup_us, dup_share) = Self::cpu_overhead(&self.off.duplicate, &self.exported.duplicate);
        let _ = writeln!(
            o,
            "telemetry costs {fresh_us:+.1} µs of serve CPU per fresh message ({:+.0}%) and {dup_us:+.1} µs per duplicate ({:+.0}%); \
             the endpoint received {} items in {} uploads ({:.1} items per message); dropped {}, failed uploads {}",
            fresh_share * 100.0,
            dup_share * 100.0,
            self.items_received,
            self.uploads,
            self.items_received as f64 / (self.messages_exported.max(1) as f64),
            self.dropped,
            self.export_failures
        );
    }
}

/// Runs the side-by-side measurement.
pub(super) async fn overhead(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
) -> anyhow::Result<TelemetryOverhead> {
    let ingestion = Ingestion::start().await;
    let pin = |spec: ServeSpec| match pinning.serve_cpu {
        Some(cpu) => spec.on_cpus(vec![cpu]),
        None => spec,
    };
    let specs = [
        pin(spec(exe, dir, "telemetry-off")),
        pin(spec(exe, dir, "telemetry-exported").env(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            ingestion.connection_string(),
        )),
    ];
    let labels = ["telemetry off", "exported (App Insights)"];
    let _pinned = super::GeneratorPin::new(pinning)?;
    let mut processes = Vec::new();
    for spec in &specs {
        processes.push(ServeProcess::start(spec).await?);
    }
    let per_round = (args.requests / args.rounds).max(1);
    let warmup = (per_round / 10).clamp(50, 500);
    for (i, process) in processes.iter().enumerate() {
        let (fresh, again) = envelopes(warmup, &format!("telemetry-warmup-{i}"));
        let url = process.base_url();
        super::load(client, &url, Arc::new(fresh), args.concurrency, "recorded").await;
        super::load(client, &url, Arc::new(again), args.concurrency, "duplicate").await;
    }
    let mut fresh = [Accumulated::default(), Accumulated::default()];
    let mut duplicate = [Accumulated::default(), Accumulated::default()];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let batches: Vec<_> = (0..2)
            .map(|i| envelopes(per_round, &format!("telemetry-{i}-{round}")))
            .collect();
        for phase in 0..2 {
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
                if phase == 0 {
                    fresh[i].add(run, delta);
                } else {
                    duplicate[i].add(run, delta);
                }
            }
        }
    }
    let metrics: serde_json::Value = client
        .get(processes[1].url("/metrics"))
        .send()
        .await?
        .json()
        .await
        .context("the exporting process's /metrics")?;
    // SIGTERM to the exporting process: it flushes what it still holds, and the count
    // of items per message is complete.
    let mut processes = processes;
    let mut exporting = processes.pop().context("the exporting process")?;
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(exporting.pid as i32, libc::SIGTERM);
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), exporting.wait()).await;
    for process in processes {
        process.stop().await;
    }
    let [fresh_off, fresh_on] = fresh;
    let [dup_off, dup_on] = duplicate;
    Ok(TelemetryOverhead {
        off: TelemetrySide {
            label: labels[0].to_owned(),
            fresh: fresh_off.figures(),
            duplicate: dup_off.figures(),
        },
        exported: TelemetrySide {
            label: labels[1].to_owned(),
            fresh: fresh_on.figures(),
            duplicate: dup_on.figures(),
        },
        items_received: ingestion.items().len(),
        uploads: ingestion.posts(),
        messages_exported: 2 * (warmup + per_round * args.rounds),
        dropped: metrics["telemetryDropped"].as_u64().unwrap_or(0),
        export_failures: metrics["telemetryExportFailures"].as_u64().unwrap_or(0),
    })
}
