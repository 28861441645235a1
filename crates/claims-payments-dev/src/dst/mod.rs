//! `claims-payments-dev dst`: a deterministic simulation of the real service.
//!
//! One thread, virtual time (tokio's current-thread runtime with paused time), every
//! choice drawn from one seed. The product's own code runs: the router and its
//! `/ClaimApproved`, `/api/payments`, `/Reconcile` and `/Purge` functions, the consumer,
//! leases and takeovers, liveness, reconciliation, purge, and the bank client above its
//! transport. Only the edges are simulated, each in its own module:
//! - [`world`]: the seeded generator, the true wall clock, the trace; [`clocks`]: each
//!   instance's wall clock, skewed and faulted;
//! - [`faults`] and [`chaos`]: which fault kinds a run injects, and how often;
//! - [`hot`]: the claims that bursts of messages and HTTP payments share;
//! - [`stores`]: the store a run uses (`--store`: the in-memory model `crate::memory_store`,
//!   or the production SQLite or Cosmos DB adapter; what replays for each is said there),
//!   and [`store`]: the store's faults above it;
//! - [`bank`]: the bank behind the product's `BankTransport`, holding the ground truth;
//! - [`state`]: what the simulated world shares; [`run`]: the run's timeline and result; [`broker`]: Service Bus and the Functions
//!   host (peek-lock, DeliveryCount, dead-lettering, duplicate detection); [`instances`]:
//!   processes that crash and restart; [`clients`]: the HTTP clients;
//! - [`check`]: the invariants, during and at the end of every run; [`invariants`]: the
//!   strict ones at the end (payloads, refusals, dead-letter reasons, HTTP answers) and the
//!   bound on transient dead letters.
//!
//! A run prints its seed, and `--seed S` replays it: same build, same seed, same trace
//! hash (a test checks it).

pub mod bank;
mod broker;
pub mod chaos;
pub mod check;
mod clients;
pub mod clocks;
pub mod faults;
mod hot;
mod instances;
pub mod invariants;
mod run;
mod state;
pub mod store;
pub mod stores;
pub mod tally;
pub mod world;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant as WallInstant};

use clap::Args;

use faults::FaultPlan;
pub use run::RunResult;

/// The fixed seeds `cargo test` runs on every change.
pub const CI_SEEDS: std::ops::Range<u64> = 1..16;
/// Seeds that once found a defect, run on every change too (see docs/service.md).
pub const FOUND_SEEDS: &[u64] = &[126, 361, 421, 542, 839];

#[derive(Debug, Clone, Args)]
pub struct DstArgs {
    /// How many seeds to run, from --seed on (or from a random one).
    #[arg(long, default_value_t = 100)]
    pub seeds: u64,
    /// The first seed (replays it with --seeds 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Messages of the producer's scenario per run (hot claims add their bursts of
    /// business duplicates on top).
    #[arg(long, default_value_t = 200)]
    pub messages: usize,
    /// HTTP payment intents per run.
    #[arg(long, default_value_t = 20)]
    pub http_intents: usize,
    /// Instances on the store (0: drawn from the seed, 1 to 4).
    #[arg(long, default_value_t = 0)]
    pub instances: usize,
    /// Every fault kind at its highest rate, instead of a drawn subset.
    #[arg(long)]
    pub all_faults: bool,
    /// Print every event of the run (with --seed).
    #[arg(long)]
    pub verbose: bool,
    /// Run every seed, past failing ones (by default the run stops at the first).
    #[arg(long)]
    pub keep_going: bool,
    /// The store under the simulator: the in-memory model, or a production adapter.
    #[arg(long, value_enum, default_value_t = StoreKind::Model)]
    pub store: StoreKind,
}

/// Which store a run uses (see [`stores`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// The in-memory model (`crate::memory_store`).
    Model,
    /// The production SQLite adapter on a file of its own per run.
    Sqlite,
    /// The production Cosmos DB adapter through the SDK over its in-memory emulator.
    Cosmos,
}

/// The largest scenario whose event lines a run keeps for its failure report.
pub const KEEP_TRACE_UP_TO: usize = 50_000;

/// What one run does.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub messages: usize,
    pub http_intents: usize,
    pub instances: usize,
    pub all_faults: bool,
    /// Keep every event line (for a failure's report), not only the hash.
    pub keep_trace: bool,
    /// Print the product's own log lines as the run goes (a replay's detail).
    pub product_logs: bool,
    pub store: StoreKind,
    /// These fault kinds at their highest rates, instead of a drawn plan (a test's aim).
    pub only_faults: Option<Vec<faults::Fault>>,
}

impl RunOptions {
    pub fn from_args(args: &DstArgs) -> Self {
        RunOptions {
            messages: args.messages,
            http_intents: args.http_intents,
            instances: args.instances,
            all_faults: args.all_faults,
            // Past this size the lines would not fit in memory (a million messages make
            // about 30 million); a failure's report then names the seed to replay smaller
            // or with --verbose.
            keep_trace: args.verbose || args.messages <= KEEP_TRACE_UP_TO,
            product_logs: args.verbose,
            store: args.store,
            only_faults: None,
        }
    }
}

/// Runs seed `seed` on a runtime of its own: one thread, paused time.
pub fn run_seed(seed: u64, options: &RunOptions) -> RunResult {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    let plan_dice = world::Dice::new(seed ^ 0x5eed_fa17);
    let plan = if let Some(only) = &options.only_faults {
        FaultPlan::only(only)
    } else if options.all_faults {
        FaultPlan::all()
    } else {
        FaultPlan::draw(&plan_dice)
    };
    let run = || runtime.block_on(state::Sim::run(seed, plan, options.clone()));
    if options.product_logs {
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("claims_payments=debug")
            .with_timer(VirtualTime(tokio::time::Instant::now()))
            .with_ansi(false)
            .with_target(false)
            .finish();
        tracing::subscriber::with_default(subscriber, run)
    } else {
        run()
    }
}

/// Product log lines stamped with the run's virtual milliseconds, as the trace is.
struct VirtualTime(tokio::time::Instant);

impl tracing_subscriber::fmt::time::FormatTime for VirtualTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let ms = tokio::time::Instant::now()
            .saturating_duration_since(self.0)
            .as_millis();
        write!(w, "{ms:>12}")
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The command: runs the seeds, prints a line per failure and the totals; exit 1 when
/// any seed failed.
pub fn main(args: DstArgs) -> anyhow::Result<ExitCode> {
    let first = args
        .seed
        .unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let options = RunOptions::from_args(&args);
    let (wall, cpu) = (WallInstant::now(), cpu_seconds());
    let (mut deliveries, mut virtual_secs, mut failed) = (0u64, 0f64, 0u64);
    // Deliveries that met another attempt on their claim; the least share of one seed.
    let (mut met, mut least, mut none) = (0u64, f64::INFINITY, 0u64);
    // Transient dead letters of the chaos phases, their bound, the most in one seed.
    let (mut transient, mut bound, mut most) = (0u64, 0u64, 0u64);
    let mut fired: BTreeMap<faults::Fault, u64> = BTreeMap::new();
    let mut paths: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut processes, mut most_completed) = (0u64, 0u64);
    let mut reconcile = tally::ReconcileTally::default();
    println!(
        "dst: seeds {first}..{} ({} messages, {} HTTP intents each)",
        first + args.seeds,
        args.messages,
        args.http_intents
    );
    for seed in first..first + args.seeds {
        let result = run_seed(seed, &options);
        deliveries += result.deliveries;
        met += result.deliveries_met;
        least = least.min(share(result.deliveries_met, result.deliveries));
        none += u64::from(result.deliveries_met == 0);
        virtual_secs += result.virtual_time.as_secs_f64();
        transient += result.transient.dead_letters;
        bound += result.transient.bound();
        most = most.max(result.transient.dead_letters);
        for (fault, n) in &result.fired {
            *fired.entry(*fault).or_default() += n;
        }
        for (path, n) in &result.store_paths {
            *paths.entry(path).or_default() += n;
        }
        processes = processes.max(result.processes);
        most_completed = most_completed.max(result.most_completed_by_one_process);
        reconcile.add(&result.reconcile);
        if args.seeds > 1 {
            println!(
                "seed {seed}: reconcile pay-now while faults fire {} (calm {}); {}",
                result.reconcile.chaos.paid_now, result.reconcile.calm.paid_now, result.reconcile
            );
        }
        if args.verbose {
            for line in result.events() {
                println!("{line}");
            }
        }
        if !result.violations.is_empty() {
            failed += 1;
            println!("{}", result.failure_report());
            if !args.keep_going {
                break;
            }
        } else if args.seeds == 1 {
            println!("{}", result.summary());
        }
    }
    let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    println!(
        "dst: {failed} failing seed(s); {deliveries} deliveries in {cpu:.1} CPU-s ({:.0} deliveries per CPU-second), {:.1} virtual hours in {wall:.1} s ({:.0} virtual hours per second)",
        deliveries as f64 / cpu.max(1e-9),
        virtual_secs / 3600.0,
        virtual_secs / 3600.0 / wall.max(1e-9)
    );
    println!(
        "dst: {:.1}% of deliveries met another attempt on their claim ({met} of {deliveries}; least in one seed {:.1}%, seeds with none {none})",
        share(met, deliveries),
        if least.is_finite() { least } else { 0.0 }
    );
    println!(
        "dst: {transient} messages dead-lettered for transient causes while faults fired (most in one seed {most}); bound {bound} (failed deliveries that met a fault / {MAX_DELIVERY_COUNT})",
        MAX_DELIVERY_COUNT = timings::MAX_DELIVERY_COUNT
    );
    println!(
        "dst: reconcile pay-now decisions while faults fire {} (calm {}); reconcile {reconcile}",
        reconcile.chaos.paid_now, reconcile.calm.paid_now
    );
    let coverage: Vec<String> = fired.iter().map(|(f, n)| format!("{f} {n}")).collect();
    println!("dst: faults fired: {}", coverage.join(", "));
    let paths: Vec<String> = paths.iter().map(|(p, n)| format!("{p} {n}")).collect();
    println!(
        "dst: {:?} store paths taken: {}",
        args.store,
        paths.join(", ")
    );
    let batch_full = paths_full(&paths);
    println!(
        "dst: bounds reached: reconcile's {}-per-run limit {}; completed-message cache ({} entries) {} (most completions in one process {most_completed}); gone-owner memory ({} processes) {} (most processes in one run {processes})",
        claims_payments::seams::reconcile::MAX_PER_RUN,
        if batch_full { "yes" } else { "no" },
        COMPLETED_CACHE_ENTRIES,
        if most_completed > COMPLETED_CACHE_ENTRIES { "yes" } else { "no" },
        GONE_OWNERS_REMEMBERED,
        if processes > GONE_OWNERS_REMEMBERED { "yes" } else { "no" },
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The product's completed-message cache (COMPLETED_CACHE_ENTRIES in the consumer).
const COMPLETED_CACHE_ENTRIES: u64 = 20_000;
/// The ended processes the liveness module remembers before it starts over (REMEMBERED).
const GONE_OWNERS_REMEMBERED: u64 = 4_096;

/// Whether a reconcile listing came back full (at its per-run limit).
fn paths_full(paths: &[String]) -> bool {
    paths
        .iter()
        .any(|p| p.starts_with(store::RECONCILE_FULL) && !p.ends_with(" 0"))
}

/// `part` of `whole` in percent.
fn share(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// The production timings the simulator runs with, as `infra/` deploys them.
pub mod timings {
    use super::Duration;
    /// LEASE_MS.
    pub const LEASE: Duration = Duration::from_secs(120);
    /// INFLIGHT_WAIT_MS.
    pub const INFLIGHT_WAIT: Duration = Duration::from_secs(15);
    /// RETRY_BUDGET_MS.
    pub const RETRY_BUDGET: Duration = Duration::from_secs(60);
    /// BANK_TIMEOUT_MS.
    pub const BANK_TIMEOUT: Duration = Duration::from_secs(5);
    /// BANK_KEY_WINDOW_HOURS.
    pub const KEY_WINDOW: Duration = Duration::from_secs(24 * 3600);
    /// INBOX_RETENTION_DAYS.
    pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
    /// The queue's lockDuration.
    pub const LOCK: Duration = Duration::from_secs(60);
    /// host.json's maxAutoLockRenewalDuration.
    pub const LOCK_RENEWAL: Duration = Duration::from_secs(300);
    /// The queue's maxDeliveryCount.
    pub const MAX_DELIVERY_COUNT: u32 = 10;
    /// host.json's functionTimeout.
    pub const FUNCTION_TIMEOUT: Duration = Duration::from_secs(180);
    /// host.json's maxConcurrentCalls.
    pub const MAX_CONCURRENT_CALLS: usize = 16;
    /// RECONCILE_SCHEDULE: every 10 minutes.
    pub const RECONCILE_EVERY: Duration = Duration::from_secs(600);
    /// The queue's duplicateDetectionHistoryTimeWindow.
    pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);
    /// How far instances' clocks may differ.
    pub const MAX_SKEW_MS: i64 = 2_000;
}
