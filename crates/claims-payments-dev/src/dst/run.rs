//! The run: its timeline and its result.
//!
//! The timeline: a chaos phase (messages, late re-sends, HTTP clients, timers, faults;
//! the bank may go dark past its key window, and faults fire for a while after it is
//! back, while reconcile settles what it left), then a calm one (faults off, dead instances
//! back, the queue drained, the dead letters re-driven by the operator's own tool,
//! reconcile, a second re-drive and the discards of the runbook, then reconcile every 10
//! minutes while a backlog beyond its per-run limit shrinks), then a jump past the bank's
//! key window and the inbox retention (purge, old messages sent again), and the final
//! checks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use claims_payments::seams::reconcile::RunCounts;
use claims_payments::seams::store::DynStore;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::bank::SimBank;
use super::broker::SimBroker;
use super::chaos::Chaos;
use super::check;
use super::check::{Checks, Violation};
use super::faults::{Fault, FaultPlan};
use super::hot;
use super::state::*;
use super::store::FaultyStore;
use super::stores::{self, SettledWatch};
use super::tally::ReconcileTally;
use super::timings::*;
use super::world::{Dice, Trace};
use super::RunOptions;
use crate::sim::scenario::{self, CopyKind, ScenarioSettings};
use crate::trace_event;

/// How long the chaos phase lasts: past the duplicate-detection window, so late
/// re-sends of the producer reach the queue while faults still fire.
const CHAOS_PHASE: Duration = Duration::from_secs(75 * 60);
/// The most payments the end checks list: every payment of a run, and within what each
/// store's listing takes (Cosmos DB's `TOP` is a 32-bit integer).
const LEDGER_LIMIT: usize = i32::MAX as usize;
/// The operator's tool as a process number (its boot), apart from every instance's.
const OPERATOR_PROCESS: u64 = 1_000_000;
/// How many rounds in a row the calm phase's operator may re-drive and reconcile without
/// fewer dead letters waiting before the runbook gives up on them (reconcile settles at
/// most 500 payouts a run, so a large run needs as many rounds as its backlog takes).
const STALLED_ROUNDS: usize = 6;
/// How long faults go on firing after the bank was dark: several reconcile runs.
const AFTER_DARK: Duration = Duration::from_secs(45 * 60);
/// What one timer invocation answered (nothing, when it did not answer).
#[derive(Default)]
pub(super) struct TimerRun {
    /// A `Reconcile` run went through its listing (not skipped for another run's lease).
    reconciled: bool,
    /// It listed as many payments as its per-run limit, or its time budget ended before
    /// it reached them all: more may be left.
    more_left: bool,
    /// Payments a `Reconcile` run settled (paid by lookup, paid now, rejected).
    settled: u64,
}

/// What one run of the operator's tool left.
pub(super) struct OperatorPass {
    /// Dead letters waiting for reconciliation (or an unreadable store).
    waiting: usize,
    /// The run stopped at its limit: more may be left.
    more_left: bool,
}

/// What one run did and found.
pub struct RunResult {
    pub seed: u64,
    pub trace_hash: String,
    pub deliveries: u64,
    /// Deliveries that met another attempt (delivery or HTTP request) on their claim.
    pub deliveries_met: u64,
    pub http_requests: u64,
    pub virtual_time: Duration,
    pub violations: Vec<Violation>,
    pub fired: BTreeMap<Fault, u64>,
    pub plan: String,
    pub instances: usize,
    pub outcomes: BTreeMap<String, u64>,
    pub dead_lettered: u64,
    pub redriven: u64,
    pub payouts: usize,
    /// Transient dead letters of the chaos phase and their bound.
    pub transient: super::invariants::TransientBound,
    /// What the `Reconcile` runs settled, while faults fired and after.
    pub reconcile: ReconcileTally,
    /// Every event, when the run kept them.
    /// The store calls by the adapter path they took, and the SDK's transport faults met.
    pub store_paths: BTreeMap<&'static str, u64>,
    /// Processes started in the run (each ended one is a gone owner to remember).
    pub processes: u64,
    /// The most deliveries one process completed (its completed-message cache holds 20,000).
    pub most_completed_by_one_process: u64,
    trace: Trace,
}

impl RunResult {
    pub fn summary(&self) -> String {
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "seed {}: ok; trace {}; {} instance(s); {} deliveries ({} met another attempt on their claim), {} HTTP requests, {} payouts, {} dead-lettered ({} re-driven; {} for transient causes while faults fired, bound {}); {:.1} virtual hours; reconcile: {}; faults: {}; outcomes: {}",
            self.seed,
            self.trace_hash,
            self.instances,
            self.deliveries,
            self.deliveries_met,
            self.http_requests,
            self.payouts,
            self.dead_lettered,
            self.redriven,
            self.transient.dead_letters,
            self.transient.bound(),
            self.virtual_time.as_secs_f64() / 3600.0,
            self.reconcile,
            self.plan,
            outcomes.join(", ")
        )
    }

    /// Every event line of the run, when it kept them (`RunOptions::keep_trace`).
    pub fn events(&self) -> Vec<String> {
        self.trace.lines_with("")
    }

    /// The seed, each invariant that failed, and the events of the claim concerned.
    pub fn failure_report(&self) -> String {
        let mut out = format!(
            "seed {} FAILED ({} violation(s)); replay: claims-payments-dev dst --seeds 1 --seed {}\n  faults: {}\n",
            self.seed,
            self.violations.len(),
            self.seed,
            self.plan
        );
        for v in self.violations.iter().take(5) {
            out.push_str(&format!("  invariant: {}: {}\n", v.invariant, v.detail));
            if let Some(claim) = &v.claim {
                if !self.trace.keeps_lines() {
                    out.push_str(
                        "  (a run this large keeps no event lines: replay with --verbose)\n",
                    );
                    continue;
                }
                let lines = self.trace.lines_with(claim);
                out.push_str(&format!("  events of claim {claim} ({}):\n", lines.len()));
                for line in lines.iter().take(60) {
                    out.push_str(&format!("    {line}\n"));
                }
            }
        }
        out
    }
}

impl Sim {
    pub async fn run(seed: u64, plan: FaultPlan, options: RunOptions) -> RunResult {
        let start = Instant::now();
        let trace = Trace::new(start, options.keep_trace);
        let dice = Dice::new(seed);
        let chaos = Chaos::new(plan, dice.fork(), trace.clone());
        let opened = stores::open(options.store, RETENTION)
            .await
            .unwrap_or_else(|e| panic!("the run's {:?} store does not open: {e:#}", options.store));
        let watch = SettledWatch::new(opened.base.clone());
        let faulty = FaultyStore::new(watch.clone(), &opened, chaos.clone(), LEASE);
        let store: DynStore = faulty.clone();
        let bank = SimBank::new(chaos.clone(), start, BANK_TIMEOUT, KEY_WINDOW);
        let instances = match options.instances {
            0 => dice.range(1, 4) as usize,
            n => n,
        };
        let mut scenario = scenario::plan(&scenario_settings(options.messages, seed));
        let hot = hot::heat(&mut scenario, &dice);
        let signed_in = dice.hit(0.5);
        trace_event!(
            trace,
            "run seed {seed} instances {instances} signed-in callers {signed_in} faults {}",
            chaos.plan()
        );
        let sim = Arc::new(Sim {
            seed,
            options,
            start,
            chaos,
            trace,
            dice,
            opened,
            watch,
            faulty,
            store,
            bank,
            plan: scenario,
            hot,
            books: Mutex::new(Books::default()),
            wake: Notify::new(),
            checks: Checks::default(),
            signed_in,
            bank_dark: Default::default(),
            on_call_ends: Notify::new(),
            flights: Default::default(),
        });
        sim.clone().timeline(instances).await;
        sim.result(instances)
    }

    pub(super) async fn timeline(self: Arc<Self>, instances: usize) {
        let mut background = JoinSet::new();
        for slot in 0..instances {
            self.books().instances.push(Instance {
                process: 0,
                ambient: None,
                router: None,
                registered: None,
                tasks: JoinSet::new(),
                work: None,
                pause: Default::default(),
                in_flight: 0,
                alive: false,
                starting: false,
                crashed_boot: None,
            });
            self.clone().start_instance(slot).await;
        }
        background.spawn(self.clone().dispatcher());
        background.spawn(self.clone().timers());
        background.spawn(self.clone().crashes());
        // The bank dark past its key window, from a moment while messages flow: the
        // payouts whose answers were lost just before outlive the bank's memory of
        // their keys. The chaos phase lasts until the bank is back.
        let dark = self
            .chaos
            .fires(Fault::BankDarkPastKeyWindow, "bank")
            .then(|| tokio::spawn(self.clone().bank_goes_dark()));
        let on_call = tokio::spawn(self.clone().operator());
        let producer = tokio::spawn(self.clone().producer());
        let clients = tokio::spawn(self.clone().http_clients());

        // Chaos.
        tokio::time::sleep(CHAOS_PHASE).await;
        let _ = producer.await;
        let _ = clients.await;
        if let Some(dark) = dark {
            let _ = dark.await;
            // Faults go on firing once the bank is back, so reconcile runs on what the
            // dark bank left unsettled while processes crash and answers are lost.
            tokio::time::sleep(AFTER_DARK).await;
        }
        self.chaos.calm();
        // The on-call operator's run under way ends before the runbook starts: a dead
        // letter locked by one run is invisible to another, so two runs at once would
        // each see part of the queue (the runbook says one run at a time).
        self.on_call_ends.notify_one();
        let _ = on_call.await;
        if let Some(cosmos) = &self.opened.cosmos {
            cosmos.disarm();
        }
        self.books().calm = true;
        trace_event!(self.trace, "calm");
        for slot in 0..instances {
            self.clone().start_instance(slot).await;
        }
        // The runbook (§5): re-drive what is sendable and discard what was settled another
        // way; while some dead letters wait for reconciliation, reconcile (a run may find
        // another one under way, or a lease still live) and go again. A run stops when the
        // locks it keeps would expire (lockDuration): what it removed lets the next run
        // reach further down the queue.
        let (mut fewest, mut fewest_letters, mut stalled) = (usize::MAX, usize::MAX, 0);
        while stalled < STALLED_ROUNDS {
            let pass = self.clone().operator_run(true).await;
            self.drain().await;
            if pass.waiting == 0 && !pass.more_left {
                break;
            }
            // Progress: fewer dead letters wait, or fewer are left than ever before. Not
            // "the run removed some": a re-driven message that fails again comes back,
            // and a runbook that re-drives it round after round makes no progress.
            let letters = {
                let books = self.books();
                books.dlq.len() + books.dlq_held.len()
            };
            if pass.waiting < fewest || letters < fewest_letters {
                fewest = fewest.min(pass.waiting);
                fewest_letters = fewest_letters.min(letters);
                stalled = 0;
            } else {
                stalled += 1;
            }
            if pass.waiting > 0 {
                self.timer("Reconcile").await;
                self.drain().await;
                tokio::time::sleep(RECONCILE_EVERY).await;
            }
        }
        self.drain().await;
        let mut last = self.timer("Reconcile").await;
        self.drain().await;
        // A backlog larger than one reconcile run takes (its per-run limit, its time
        // budget: a large run whose bank was dark) takes as many of its 10-minute runs as
        // it needs, as in production; so does a run that found another one's lease. Until
        // several in a row settle nothing.
        let mut stalled = 0;
        while (last.more_left || !last.reconciled) && stalled < STALLED_ROUNDS {
            tokio::time::sleep(RECONCILE_EVERY).await;
            last = self.timer("Reconcile").await;
            self.drain().await;
            stalled = if last.settled > 0 { 0 } else { stalled + 1 };
        }

        // Past the bank's key window and the inbox retention: stop cleanly, jump, purge,
        // and send a sample of old messages again.
        background.abort_all();
        for slot in 0..instances {
            self.stop_instance(slot).await;
        }
        tokio::time::sleep(RETENTION + Duration::from_secs(24 * 3600)).await;
        for slot in 0..instances {
            self.clone().start_instance(slot).await;
        }
        background.spawn(self.clone().dispatcher());
        self.timer("Purge").await;
        self.resend_old();
        self.drain().await;
        self.timer("Reconcile").await;
        background.abort_all();
        for slot in 0..instances {
            self.stop_instance(slot).await;
        }
        self.final_checks().await;
    }

    /// The operator, while faults fire too: every 10 to 30 minutes, the product's own
    /// `dead-letters resubmit --all` through the broker port; every few hours while the
    /// bank is dark (nothing it re-drives can be paid then, and each run reads every dead
    /// letter's records).
    pub(super) async fn operator(self: Arc<Self>) {
        loop {
            let wait = if self.bank_dark.load(std::sync::atomic::Ordering::Relaxed) {
                self.dice.millis(2 * 3_600_000, 4 * 3_600_000)
            } else {
                self.dice.millis(10 * 60_000, 30 * 60_000)
            };
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wait) => {}
                _ = self.on_call_ends.notified() => return,
            }
            self.clone().operator_run(false).await;
        }
    }

    /// One run of `dead-letters resubmit --all` on the store as the instances see it;
    /// with `discard`, then `dead-letters discard` of each dead letter left `permanent`
    /// whose claim was settled another way (runbook §5, step 5).
    pub(super) async fn operator_run(self: Arc<Self>, discard: bool) -> OperatorPass {
        use claims_payments::seams::dead_letters;
        let broker = SimBroker(self.clone());
        let options = dead_letters::Options {
            consumer: CONSUMER.into(),
            limit: 10_000,
            retention: RETENTION,
            payouts_enabled: true,
            // The operator's machine keeps true time: its records replay with the seed.
            ambient: super::clocks::ambient(
                self.start,
                OPERATOR_PROCESS,
                super::clocks::ClockProfile::default(),
                &self.chaos,
                &self.dice,
            ),
        };
        let all = dead_letters::Selection {
            all: true,
            ..Default::default()
        };
        let (lines, summary) =
            dead_letters::resubmit(&broker, &self.store, &options, &all, false).await;
        for line in &lines {
            trace_event!(
                self.trace,
                "operator resubmit {} claim {} verdict {} payment {} ({}) action {}",
                line.message_id.as_deref().unwrap_or("-"),
                line.claim_id.as_deref().unwrap_or("-"),
                line.verdict.name(),
                line.payment_status.as_deref().unwrap_or("-"),
                line.reason,
                line.action.as_deref().unwrap_or("-")
            );
        }
        let waiting = lines
            .iter()
            .filter(|l| matches!(l.verdict.name(), "needs-reconciliation" | "unknown"))
            .count();
        let pass = OperatorPass {
            waiting,
            more_left: summary.more_may_be_left,
        };
        if !discard {
            return pass;
        }
        // Every `permanent` dead letter goes (runbook §5: "usually discard"): those of a
        // claim settled another way, and those refused for good (invalid, a conflict),
        // which would otherwise fill the head of a large queue and keep each run from
        // reaching past them.
        let settled: std::collections::BTreeSet<String> = lines
            .iter()
            .filter(|l| l.verdict.name() == "permanent")
            .filter_map(|l| l.message_id.clone())
            .collect();
        if settled.is_empty() {
            return pass;
        }
        // The copies just sent are handled first: a discard records its decision under the
        // message's inbox key, which a copy of another payload under the same MessageId (an
        // original beside a conflicting one) would then meet as a conflict.
        self.drain().await;
        match dead_letters::discard_each(
            &broker,
            &self.store,
            &options,
            &settled,
            "settled another way, or refused for good",
        )
        .await
        {
            Ok(lines) => {
                for line in lines {
                    trace_event!(
                        self.trace,
                        "operator discard {}: {}",
                        line.message_id.as_deref().unwrap_or("-"),
                        line.action.as_deref().unwrap_or("-")
                    );
                }
            }
            Err(e) => trace_event!(self.trace, "operator discard: {e}"),
        }
        pass
    }

    /// The bank goes dark inside a payout it booked (its answer lost), from a moment
    /// while messages flow, or at once if no payout comes within a few minutes. Once it is
    /// back, past the key window, late re-sends of originals arrive while their payments
    /// may still be unsettled: a delivery then must not send again under a key the bank
    /// forgot.
    pub(super) async fn bank_goes_dark(self: Arc<Self>) {
        tokio::time::sleep(self.dice.millis(5_000, 60_000)).await;
        let dark = KEY_WINDOW + Duration::from_secs(3600);
        let mid_payout =
            tokio::time::timeout(Duration::from_secs(300), self.bank.go_dark_mid_payout(dark))
                .await;
        if mid_payout.is_err() {
            self.bank.go_dark(dark);
        }
        trace_event!(self.trace, "bank dark for {} s", dark.as_secs());
        self.bank_dark
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(dark).await;
        self.bank_dark
            .store(false, std::sync::atomic::Ordering::Relaxed);
        trace_event!(self.trace, "bank back");
        // Within the faults' while after the bank is back (see `run`).
        let sim = self.clone();
        tokio::spawn(async move { sim.resend_late(AFTER_DARK).await });
    }

    /// Reconcile every 10 minutes (and one purge mid-run), on one live instance.
    pub(super) async fn timers(self: Arc<Self>) {
        let purge_at = self.dice.millis(60_000, CHAOS_PHASE.as_millis() as u64);
        let mut purged = false;
        let mut tick = tokio::time::interval_at(self.start + RECONCILE_EVERY, RECONCILE_EVERY);
        loop {
            tick.tick().await;
            self.timer("Reconcile").await;
            if !purged && self.elapsed() >= purge_at {
                purged = true;
                self.timer("Purge").await;
            }
        }
    }

    /// One timer invocation (`Reconcile`, `Purge`) on the first live instance, as one of
    /// its tasks: a crash of the process ends the run where it waits, and a function
    /// timeout (a fault) restarts the handler, failing everything in flight with it.
    pub(super) async fn timer(self: &Arc<Self>, function: &str) -> TimerRun {
        let request = Request::post(format!("/{function}"))
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"Data":{"timer":{"IsPastDue":false}},"Metadata":{}}"#,
            ))
            .expect("a request");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let slot = {
            let mut books = self.books();
            let Some(slot) = books.instances.iter().position(|i| i.alive) else {
                return TimerRun::default();
            };
            let Some(router) = books.instances[slot].router.clone() else {
                return TimerRun::default();
            };
            books.instances[slot].tasks.spawn(async move {
                let answered = call(router, request).await;
                let _ = tx.send(answered);
            });
            slot
        };
        let chaos = self.chaos.is_on();
        let timeout = if self.chaos.fires(Fault::FunctionTimeout, function) {
            // Anywhere in the run: before, during or after its bank calls.
            self.dice.millis(50, 60_000)
        } else {
            FUNCTION_TIMEOUT
        };
        if function == "Reconcile" && self.chaos.fires(Fault::ReconcileCrash, function) {
            // Somewhere among the run's lookups, payouts and writes.
            let (sim, at) = (self.clone(), self.dice.millis(5, 5_000));
            tokio::spawn(async move {
                tokio::time::sleep(at).await;
                sim.crash(slot, true);
            });
        }
        let answered = tokio::time::timeout(timeout, rx).await;
        let mut run = TimerRun::default();
        let status = match answered {
            Ok(Ok(Some((status, body)))) => {
                if function == "Reconcile" {
                    // A run that did not finish (skipped, failed) answers no counts.
                    let counts = run_counts(&body);
                    run.settled = self.books().reconcile.count(chaos, counts.as_ref());
                    run.reconciled = counts.is_some();
                    run.more_left = counts.is_some_and(|c| c.more_left());
                }
                status.to_string()
            }
            Ok(_) => {
                // The process died under the run.
                self.books().reconcile.cut(chaos);
                "crashed".into()
            }
            Err(_) => {
                self.books().reconcile.cut(chaos);
                trace_event!(self.trace, "function timeout {function} slot {slot}");
                self.crash(slot, true);
                "timeout".into()
            }
        };
        trace_event!(self.trace, "timer {function} {status}");
        run
    }

    pub(super) async fn final_checks(&self) {
        // The books' lock is not held across the store's listing below.
        let (queue, operator_removed) = {
            let books = self.books();
            let transient = books.transient;
            if !transient.holds() {
                self.checks.fail(Violation::new(
                "transient-dead-letters-bounded",
                None,
                format!(
                    "{} messages dead-lettered for transient causes while faults fired; {} failed deliveries met a fault, enough for {}",
                    transient.dead_letters,
                    transient.faulted_deliveries,
                    transient.bound()
                ),
            ));
            }
            #[allow(clippy::type_complexity)]
            let queue: Vec<(
                String,
                Option<String>,
                QueueState,
                String,
                bool,
                CopyKind,
                Vec<u8>,
                Vec<super::invariants::Cause>,
            )> = books
                .queue
                .iter()
                // A re-driven dead letter lives on as its copy, judged on its own.
                .filter(|q| !q.redriven || q.dead_lettered_calm)
                .map(|q| {
                    (
                        q.message_id.clone(),
                        q.claim.clone(),
                        q.state,
                        q.last_outcome.clone(),
                        q.dead_lettered_calm,
                        q.kind,
                        q.body.clone(),
                        q.failures.clone(),
                    )
                })
                .collect();
            let operator_removed: std::collections::BTreeSet<String> = books
                .queue
                .iter()
                .filter(|q| q.redriven || q.discarded)
                .map(|q| q.message_id.clone())
                .collect();
            (queue, operator_removed)
        };
        // What the store holds, read through the store's own listing (any store).
        let ledger = match self.opened.check.list_payments(LEDGER_LIMIT).await {
            Ok(rows) => rows
                .into_iter()
                .filter_map(|row| {
                    row.map_err(|corrupt| {
                        self.checks.fail(Violation::new(
                            "ledger-reads-back",
                            Some(&corrupt.claim_id),
                            format!("a stored payment does not read back: {corrupt}"),
                        ))
                    })
                    .ok()
                })
                .collect(),
            Err(e) => {
                self.checks.fail(Violation::new(
                    "ledger-reads-back",
                    None,
                    format!("the ledger cannot be listed after the run: {e}"),
                ));
                Vec::new()
            }
        };
        for (claim, what) in self.watch.rewrites() {
            self.checks.fail(Violation::new(
                "settled-never-rewritten",
                Some(&claim.to_string()),
                format!("a settled payment was written again with other facts: {what}"),
            ));
        }
        check::at_end(
            &self.checks,
            &ledger,
            &self.bank,
            &self.plan,
            queue
                .into_iter()
                .map(
                    |(id, claim, state, last, calm, kind, body, failures)| check::Ended {
                        operator_removed: operator_removed.contains(&id),
                        message_id: id,
                        claim,
                        completed: state == QueueState::Completed,
                        dead_lettered: state == QueueState::DeadLettered,
                        last_outcome: last,
                        dead_lettered_calm: calm,
                        kind,
                        body,
                        failures,
                    },
                )
                .collect(),
            self.signed_in,
        );
    }

    pub(super) fn result(&self, instances: usize) -> RunResult {
        let books = self.books();
        RunResult {
            seed: self.seed,
            trace_hash: self.trace.hash(),
            deliveries: books.deliveries,
            deliveries_met: self
                .flights
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .deliveries_met,
            http_requests: books.http_requests,
            virtual_time: self.elapsed(),
            violations: self.checks.violations(),
            fired: self.chaos.fired(),
            plan: self.chaos.plan().to_string(),
            instances,
            outcomes: books.outcomes.clone(),
            dead_lettered: books.dead_lettered,
            redriven: books.redriven,
            payouts: self.bank.payouts().len(),
            transient: books.transient,
            reconcile: books.reconcile,
            trace: self.trace.clone(),
            store_paths: self.faulty.paths(),
            processes: books.processes,
            most_completed_by_one_process: books
                .completed_by_process
                .values()
                .copied()
                .max()
                .unwrap_or(0),
        }
    }
}

/// The message mix of one seed: `messages` originals and their copies.
pub(super) fn scenario_settings(messages: usize, seed: u64) -> ScenarioSettings {
    ScenarioSettings {
        messages,
        duplicate_rate: 0.08,
        business_duplicate_rate: 0.06,
        conflict_rate: 0.03,
        invalid_rate: 0.03,
        closed_account_rate: 0.04,
        allow_non_utf8: true,
        race_window: 16,
        seed,
    }
}

/// A finished reconcile run's counts, from its answer's `ReturnValue.reconcile`.
fn run_counts(body: &[u8]) -> Option<RunCounts> {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "ReturnValue")]
        return_value: ReturnValue,
    }
    #[derive(serde::Deserialize)]
    struct ReturnValue {
        reconcile: Option<RunCounts>,
    }
    serde_json::from_slice::<Answer>(body)
        .ok()?
        .return_value
        .reconcile
}
