//! The operator: the product's own commands, run as a person would, each a separate
//! process with the run's store and bank settings: `reconcile` while deliveries continue
//! and until nothing is left unknown, and `dead-letters` to re-drive the dead-letter
//! queue once through a Service Bus stand-in.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use claims_payments::seams::reconcile::Summary;
use claims_payments_settings::names;
use claims_payments_testkit::process as spawn;
use indicatif::ProgressBar;

use super::driver::Host;
use super::ledger::Ledger;
use super::process::Supervisor;
use super::queue::{self, Queue};
use super::report::{self, LedgerRow};

/// How the operator's commands run: the executable and the run's store and bank
/// environment, the same as every instance's `serve` (an operator's `reconcile` is its
/// own client at the bank).
#[derive(Debug, Clone)]
pub(super) struct Operator {
    pub(super) exe: PathBuf,
    pub(super) env: Vec<(String, String)>,
}

impl Operator {
    /// `claims-payments <args>`, with the run's environment and none of the shell's
    /// settings that the spawned processes control.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(args);
        for name in spawn::controlled_env() {
            cmd.env_remove(name);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `claims-payments reconcile --json`: a separate process on the same ledger, while
    /// `serve` runs and after it stopped.
    async fn reconcile(&self, older_than: Option<&str>) -> anyhow::Result<Summary> {
        let mut cmd = self.command(&["reconcile", "--json"]);
        if let Some(age) = older_than {
            cmd.args(["--older-than", age]);
        }
        cmd.env(names::LOG_FORMAT, "text")
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        let out = cmd
            .output()
            .await
            .context("cannot run claims-payments reconcile")?;
        // Exit 1 only says that something is still unknown; the JSON says what.
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "reconcile exited {} without a JSON report: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Runs with the default minimum age every `every` until `stop` turns true;
    /// returns the runs.
    async fn reconcile_repeatedly(
        self,
        every: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<Summary> {
        let mut runs = Vec::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => return runs,
            }
            match self.reconcile(None).await {
                Ok(summary) => runs.push(summary),
                Err(e) => tracing::warn!(error = %e, "reconcile during deliveries failed"),
            }
        }
    }

    /// After the queue settled: reconciles until nothing is left unknown (orphaned
    /// payouts wait for their lease to run out; a lookup may fail), within a bound.
    pub(super) async fn settle_at_end(
        &self,
        ledger: &Ledger,
        limit: usize,
        runs_during: Vec<Summary>,
        lease_ms: u64,
        deadline: Instant,
    ) -> anyhow::Result<report::ReconcileReport> {
        let unsettled = |rows: &[LedgerRow]| {
            let count = |s: &str| rows.iter().filter(|r| r.status == s).count();
            (count("needs_reconciliation"), count("in_progress"))
        };
        let before = unsettled(&ledger.rows(limit).await?);
        let give_up = (Instant::now() + Duration::from_millis(lease_ms) + Duration::from_secs(60))
            .min(deadline.max(Instant::now() + Duration::from_secs(30)));
        let mut runs_at_end = Vec::new();
        let mut after = before;
        while after != (0, 0) && Instant::now() < give_up {
            runs_at_end.push(self.reconcile(Some("0s")).await?);
            after = unsettled(&ledger.rows(limit).await?);
            if after != (0, 0) {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        Ok(report::ReconcileReport::new(
            before,
            after,
            &runs_during,
            &runs_at_end,
        ))
    }

    /// Puts `dead` into a Service Bus stand-in's dead-letter queue, runs `dead-letters
    /// resubmit --all --json` (a separate process, with the run's store) against it,
    /// and sends what reached the stand-in's queue to the simulated queue.
    async fn resubmit_dead_letters(
        &self,
        queue: &Queue,
        dead: &[(usize, queue::Message, u32, queue::Failure)],
    ) -> anyhow::Result<report::ToolVerdicts> {
        use claims_payments_testkit::servicebus::ServiceBus;
        let bus = ServiceBus::start(SIM_QUEUE, SIM_DUPLICATE_WINDOW, Duration::from_secs(60)).await;
        for (_, m, delivery_count, last) in dead {
            bus.dead_letter(
                &m.message_id,
                &m.body,
                *delivery_count,
                "MaxDeliveryCountExceeded",
                &last.kind,
                m.enqueued_at,
                &[],
            );
        }
        let run = |args: &[&str]| {
            let mut cmd = self.command(&["dead-letters"]);
            cmd.args(args)
                .env(names::SERVICEBUS_ENDPOINT, bus.endpoint())
                .env(names::CLAIM_APPROVED_QUEUE, SIM_QUEUE)
                .env(names::LOG_FORMAT, "json")
                .env("RUST_LOG", "warn")
                .kill_on_drop(true);
            let what = format!("dead-letters {}", args.join(" "));
            async move {
                let out = cmd
                    .output()
                    .await
                    .with_context(|| format!("cannot run claims-payments {what}"))?;
                // Exit 3 says that something is left for a person; the JSON lines say what.
                if !matches!(out.status.code(), Some(0 | 3)) {
                    bail!(
                        "{what} exited {}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                Ok::<_, anyhow::Error>(out)
            }
        };
        let out = run(&["resubmit", "--all", "--json"]).await?;
        let mut verdicts = report::ToolVerdicts::default();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let value: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("dead-letters resubmit printed {line:?}"))?;
            if value.get("summary").is_some() {
                continue;
            }
            let verdict = value["verdict"].as_str().unwrap_or("?").to_owned();
            let action = value["action"].as_str().unwrap_or("").to_owned();
            *verdicts.by_verdict.entry(verdict.clone()).or_default() += 1;
            if !action.starts_with("sent") {
                *verdicts.not_sent.entry(verdict).or_default() += 1;
            } else if let Some(id) = value["messageId"].as_str() {
                verdicts.verdict_of.insert(id.to_owned(), verdict);
            }
        }
        // What the command sent, in the order the stand-in accepted it, goes to the queue
        // the host delivers from: each to the dead letter it copies (the original MessageId
        // the copy names, which the consumer keys its inbox by, and the body).
        let mut unsent: Vec<&(usize, queue::Message, u32, queue::Failure)> = dead.iter().collect();
        for m in bus.take_active() {
            let original = m
                .property(claims_payments::redrive::ORIGINAL_MESSAGE_ID)
                .map(claims_payments::seams::servicebus::unquote);
            if let Some(at) = unsent.iter().position(|(_, d, _, _)| {
                original.as_deref() == Some(&*d.message_id) && *d.body == *m.body
            }) {
                let (entry, ..) = unsent.remove(at);
                queue.resend_dead_letter(*entry, &m.body);
                verdicts.resent.push(*entry);
            }
        }
        // A person drops one permanent dead letter (the producer's correction stands in for
        // it): discard writes its warning line, then removes it; list shows what is left.
        let permanent = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["verdict"] == "permanent")
            .and_then(|v| v["messageId"].as_str().map(str::to_owned));
        if let Some(id) = permanent {
            let out = run(&[
                "discard",
                "--message-id",
                &id,
                "--reason",
                "simulate: a person dropped a permanent dead letter",
            ])
            .await?;
            let audited = String::from_utf8_lossy(&out.stderr).contains("dead letter discarded");
            if out.status.success() && audited {
                verdicts.discarded = 1;
            }
        }
        let listed = run(&["list", "--json"]).await?;
        verdicts.left_in_dlq = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter(|l| !l.starts_with("{\"summary\""))
            .count();
        Ok(verdicts)
    }
}

/// `reconcile` every `every_secs` while deliveries continue (none for 0).
pub(super) fn spawn_reconcile_during(
    reconciler: Option<&Operator>,
    every_secs: u64,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<Vec<Summary>>> {
    match (reconciler, every_secs) {
        (Some(r), secs) if secs > 0 => Some(tokio::spawn(
            r.clone()
                .reconcile_repeatedly(Duration::from_secs(secs), stopped),
        )),
        _ => None,
    }
}

/// The operator re-drives the dead-letter queue once, through `dead-letters resubmit
/// --all` against the testkit's Service Bus stand-in holding the run's dead
/// letters; then the host and every instance stop. Returns the command's verdicts (the
/// outcomes after the re-drive are read from the queue afterwards, see
/// [`report::dead_letter_tool`]).
pub(super) async fn redrive_and_stop(
    host: &Arc<Host>,
    queue: &Queue,
    progress: &ProgressBar,
    supervisors: &[Arc<Supervisor>],
    operator: &Operator,
    deadline: Instant,
) -> anyhow::Result<Option<report::ToolVerdicts>> {
    let dead = queue.dead_letters();
    let verdicts = if dead.is_empty() {
        None
    } else {
        progress.set_message("(dead-letter re-drive through dead-letters resubmit)");
        let verdicts = operator.resubmit_dead_letters(queue, &dead).await?;
        let resent = verdicts.resent.len();
        if resent > 0 {
            progress.inc_length(resent as u64);
            host.run_until_settled(deadline).await?;
        }
        Some(verdicts)
    };
    host.stop();
    progress.finish_and_clear();
    for supervisor in supervisors {
        supervisor.stop().await;
    }
    Ok(verdicts)
}

/// The queue's duplicate-detection window in the simulation. The tool's copies have
/// MessageIds of their own, so none is dropped by it, however recent the dead letter.
const SIM_DUPLICATE_WINDOW: Duration = Duration::from_millis(200);
const SIM_QUEUE: &str = "claim-approved";
