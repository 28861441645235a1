//! `claims-payments-dev simulate`: an at-least-once delivery simulator that proves (or
//! disproves) that each approved claim is paid exactly once.
//!
//! It runs the real handler (`claims-payments-dev serve`, a separate process, on a SQLite
//! file; or `--instances N` of them side by side on one Cosmos DB container served by
//! the `cosmos-emulator` dev binary, or on one PostgreSQL server ([`pg`])), a sandbox
//! bank ([`bank`]) and a fake Functions host with a Service Bus queue ([`driver`],
//! [`queue`]) that invokes the handler over the real custom-handler protocol while
//! injecting the faults of the failure matrix: producer re-sends, business duplicates,
//! conflicting payloads, invalid messages, lock expiry while the handler still works,
//! crashes after the store commit, random kills, a slow store and a flaky bank. After
//! the queue is drained it re-drives the dead-letter queue once and reconciles
//! producer, broker, ledger and bank ([`report`]).
//!
//! The seed decides the messages and every fault the driver and the bank inject (see
//! [`chance`]); process crashes land wherever the scheduler puts them.
//!
//! This module is the run itself, from the options to the report. Its parts: the options
//! ([`SimulateArgs`], in `options`), the handler instances (`instances`), the ledger the
//! verdict reads (`ledger`) and the operator's commands (`operator`).

pub use claims_payments_testkit::{bank, chance};
pub mod driver;
pub mod http_client;
mod instances;
mod ledger;
mod operator;
mod options;
pub mod pg;
pub mod process;
pub mod queue;
pub mod report;
pub mod scenario;

pub use ledger::{ledger_rows, read_sqlite_ledger};
pub use options::{deployed, HandlerKind, SimStore, SimulateArgs, Timings};

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use bank::{FakeBank, FakeBankSettings};
use claims_payments_testkit::process::TempDir;
use driver::{DataType, Host, HostSettings, Instances};
use instances::{process_summaries, serve_spec, start_instances, wire_mid_payout};
use ledger::{open_store, SimLedger};
use operator::{redrive_and_stop, spawn_reconcile_during, Operator};
use process::Supervisor;
use queue::Queue;
use report::Report;

fn progress_bar(length: u64, visible: bool) -> ProgressBar {
    let target = if visible {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(length), target);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} messages settled {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Runs one simulation and reconciles it. Errors mean the run could not be carried
/// out (the handler does not start, the queue does not drain in time); a run that
/// completes returns a report whose verdict may be yes or no.
pub async fn run(opts: SimulateArgs) -> anyhow::Result<Report> {
    run_with_progress(opts, false).await
}

/// The sandbox bank with the run's faults (none in ledger-only mode).
async fn start_bank(
    opts: &SimulateArgs,
    seed: u64,
    timings: Timings,
) -> anyhow::Result<Option<FakeBank>> {
    let with_bank = !opts.ledger_only;
    let bank = if with_bank {
        Some(
            FakeBank::start_with(FakeBankSettings {
                seed,
                error_5xx_rate: opts.bank_5xx_rate,
                rate_429: opts.bank_429_rate,
                lost_answer_rate: opts.bank_lost_answer_rate,
                latency_min_ms: 0,
                latency_max_ms: opts.bank_latency_ms,
                client_timeout_ms: timings.bank_timeout_ms,
                retry_after_secs: 1,
                kill_mid_payout_rate: opts.kill_mid_payout_rate,
                key_window_ms: (opts.bank_key_window_ms > 0).then_some(opts.bank_key_window_ms),
                lookup_5xx_rate: opts.bank_lookup_5xx_rate,
            })
            .await?,
        )
    } else {
        None
    };

    Ok(bank)
}

/// The simulated Functions host over the queue and the instances.
fn start_host(
    opts: &SimulateArgs,
    queue: &Arc<Queue>,
    supervisors: &[Arc<Supervisor>],
    timings: Timings,
    seed: u64,
    progress: &ProgressBar,
) -> anyhow::Result<Arc<Host>> {
    let handler = Arc::new(Instances(supervisors.to_vec()));
    Host::new(
        queue.clone(),
        handler,
        HostSettings {
            function_name: "ClaimApproved".to_owned(),
            concurrency: opts.concurrency,
            data_type: opts.data_type,
            function_timeout: Duration::from_millis(timings.function_timeout_ms),
            lock_expiry_rate: opts.lock_expiry_rate,
            lock_expiry_max_ms: 5,
            kill_rate: opts.kill_rate,
            kill_max_delay_ms: 20,
            seed,
        },
        progress.clone(),
    )
}

/// `POST /api/payments` clients mixed with the deliveries.
fn spawn_http_clients(
    opts: &SimulateArgs,
    supervisors: &[Arc<Supervisor>],
    plan: &scenario::Plan,
    seed: u64,
) -> tokio::task::JoinHandle<http_client::HttpStats> {
    let (supervisors, plan) = (supervisors.to_vec(), plan.clone());
    let (share, concurrency) = (opts.http_share, (opts.concurrency / 4).max(1));
    tokio::spawn(
        async move { http_client::run(supervisors, &plan, share, seed, concurrency).await },
    )
}

/// Waits for the HTTP clients, at most until the run's deadline.
async fn join_http_clients(
    http: tokio::task::JoinHandle<http_client::HttpStats>,
    deadline: Instant,
    timeout_secs: u64,
) -> anyhow::Result<http_client::HttpStats> {
    match tokio::time::timeout_at(deadline.into(), http).await {
        Ok(joined) => Ok(joined.unwrap_or_default()),
        Err(_) => anyhow::bail!(
            "the HTTP clients did not finish before the deadline (--timeout-secs {timeout_secs}; the messages had settled): raise it or lower --http-share"
        ),
    }
}

async fn run_with_progress(opts: SimulateArgs, show_progress: bool) -> anyhow::Result<Report> {
    opts.validate()?;
    let started = Instant::now();
    let seed = opts.seed.unwrap_or_else(rand::random);
    let timings = opts.timings();
    let with_bank = !opts.ledger_only;
    let store = opts.store_kind();
    let instances = opts.instances;

    let plan = scenario::plan(&opts.scenario_settings(seed));

    let temp = TempDir::new("claims-payments-sim").context("cannot create a temp dir")?;
    let exe = opts.handler_exe()?;

    // The store every instance and every `reconcile` run share.
    let SimLedger {
        env: store_env,
        ledger,
        emulator,
        postgres,
    } = open_store(&opts, store, &temp, &exe).await?;

    let bank = start_bank(&opts, seed, timings).await?;

    let spec = serve_spec(&opts, &exe, &store_env, timings, bank.as_ref(), store);
    // An operator's reconcile runs with the same store and bank, as its own client.
    let reconcile_env = spec.env.clone();

    // Crashes are bounded by the fault rates; this cap only stops a crash loop.
    let max_restarts = 50 + (opts.messages as u64) * 2;
    let serve_log = opts
        .serve_log
        .clone()
        .unwrap_or_else(|| temp.path().join("serve.log"));
    let (supervisors, logs) = start_instances(
        &spec,
        bank.as_ref(),
        store,
        instances,
        &serve_log,
        max_restarts,
    )
    .await?;
    let queue = Arc::new(Queue::new(opts.max_delivery_count));
    wire_mid_payout(bank.as_ref(), &supervisors, &queue, opts.orphan_rate, seed);

    for &i in &plan.send_order {
        let copy = &plan.copies[i];
        queue.send(i, &copy.message_id, &copy.body, false);
    }
    let progress = progress_bar(plan.copies.len() as u64, show_progress);
    let host = start_host(&opts, &queue, &supervisors, timings, seed, &progress)?;

    let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
    let operator = Operator {
        exe: exe.clone(),
        env: reconcile_env,
    };
    // An operator's reconcile, as a separate process, while deliveries continue.
    let reconciler = with_bank.then_some(&operator);
    let (stop_during, stopped) = tokio::sync::watch::channel(false);
    let during = spawn_reconcile_during(reconciler, opts.reconcile_every_secs, stopped);
    let http = spawn_http_clients(&opts, &supervisors, &plan, seed);
    let (stop_restarts, restarts_stopped) = tokio::sync::watch::channel(false);
    let restarts = postgres.as_ref().map(|pg| {
        pg.restarts(
            &opts.restart_store_at,
            progress.clone(),
            plan.copies.len() as u64,
            started,
            restarts_stopped,
        )
    });
    host.run_until_settled(deadline).await?;
    let _ = stop_restarts.send(true);
    let store_restarts = match restarts {
        Some(task) => task.await.context("the store restarts")??,
        None => Vec::new(),
    };
    let http = join_http_clients(http, deadline, opts.timeout_secs).await?;
    let tool =
        redrive_and_stop(&host, &queue, &progress, &supervisors, &operator, deadline).await?;
    let _ = stop_during.send(true);
    let runs_during = match during {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let entries = queue.entries();
    let limit = entries.len() * 2 + 1_000;
    let reconcile = match reconciler {
        Some(r) => Some(
            r.settle_at_end(&ledger, limit, runs_during, timings.lease_ms, deadline)
                .await?,
        ),
        None => None,
    };

    let claim_ids: Vec<String> = plan.claims.iter().map(|c| c.claim_id.clone()).collect();
    let (ledger_rows, ledger_unlisted) = ledger.all_rows(limit, &claim_ids).await?;
    drop(ledger);
    drop(postgres);
    if let Some(emulator) = emulator {
        emulator.stop().await;
    }
    let bank_ledger = bank.as_ref().map(FakeBank::ledger);
    let verification = report::verify(&report::Evidence {
        plan: &plan,
        entries: &entries,
        ledger: &ledger_rows,
        bank: bank_ledger.as_ref(),
    });

    let host_stats = host.stats();
    let (processes, per_instance) = process_summaries(&supervisors, &host_stats, &logs);
    let elapsed = started.elapsed();
    let mode = opts.mode();
    Ok(Report {
        exactly_once: verification.exactly_once
            && reconcile
                .as_ref()
                .is_none_or(report::ReconcileReport::settled)
            && http.violations.is_empty()
            && http.succeeded == http.intents,
        http,
        seed,
        handler: opts.handler.as_str().to_owned(),
        mode,
        data_type: match opts.data_type {
            DataType::Binary => "binary".to_owned(),
            DataType::String => "string".to_owned(),
        },
        concurrency: opts.concurrency,
        timings,
        faults: opts.faults(),
        producer: report::producer_summary(&plan),
        broker: report::broker_summary(&entries, opts.max_delivery_count),
        dead_letter_tool: tool.map(|t| report::dead_letter_tool(&t, &entries)),
        payments: ledger_rows.len(),
        ledger_unlisted,
        bank: bank_ledger.as_ref().map(report::bank_summary),
        processes,
        store: store.as_str().to_owned(),
        store_restarts,
        instances: per_instance,
        deliveries_per_second: host_stats.deliveries as f64 / elapsed.as_secs_f64().max(1e-9),
        host: host_stats,
        verification,
        reconcile,
        duration_ms: elapsed.as_millis() as u64,
    })
}

/// The `simulate` subcommand: runs, prints the report (text or `--json`) and returns
/// exit code 0 when the verdict is "exactly once: yes", 1 otherwise.
pub async fn main(args: SimulateArgs) -> anyhow::Result<std::process::ExitCode> {
    let json = args.json;
    let show_progress = !json && std::io::stderr().is_terminal();
    let report = tokio::select! {
        report = run_with_progress(args, show_progress) => report?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; the handler process was stopped"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(if report.exactly_once {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}
