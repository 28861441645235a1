//! `claims-payments bench`: what the exactly-once guard costs, measured on the full
//! HTTP path against real `serve` processes.
//!
//! Side by side in one run, each variant in its own process with its own SQLite file
//! (WAL with pipelined group commit: no write is answered before its WAL sync):
//! - `consumer`: the product;
//! - `noop` (`PAYMENTS_DEV_HANDLER=noop`): answers 200 without decoding or storing
//!   anything, i.e. the ceiling of this machine, HTTP stack and load generator;
//! - `naive` (`PAYMENTS_DEV_HANDLER=naive`): check-then-insert without the atomic guard.
//!
//! A closed-loop generator with a fixed concurrency sends a fixed number of invocations
//! per phase: *fresh* messages, then the same messages again (*duplicates*, DeliveryCount
//! 2). Phases are interleaved over rounds, with the variant order rotating each round, so
//! drift in a noisy machine's speed spreads over every variant instead of favouring one.
//! Bodies are built before a phase starts, so the generator's timed work is only HTTP.
//!
//! Store round trips, bank calls and Cosmos request units per message come from deltas
//! of the handler's own `GET /metrics` counters around each phase. Start-up time is
//! measured from exec to the first answer on `GET /` (the host's readiness probe), peak
//! memory is `VmHWM` from `/proc/<pid>/status` after the load.
//!
//! Cosmos: if a `cosmos-emulator` binary sits next to this executable, the consumer also
//! runs against it (`PAYMENTS_STORE=cosmos`) and the round trips and request units per
//! message are printed, labelled as the emulator's model, not Azure's charges.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use axum::body::Bytes;
use serde::Serialize;
use tokio::io::AsyncBufReadExt;

use crate::sim::bank::{BankSettings, SandboxBank};
use crate::sim::driver::{self, DataType};
use crate::sim::process::{ServeProcess, ServeSpec, TempDir};
use crate::sim::queue::{Delivery, Message};

/// `claims-payments bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Invocations per variant and phase (fresh, duplicate), split evenly over the rounds.
    #[arg(long, default_value_t = 30_000)]
    pub requests: usize,
    /// Requests in flight at any time (closed loop).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Rounds; each runs every phase of every variant once, in rotating order.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Process starts measured for the start-up time (per configuration).
    #[arg(long, default_value_t = 9)]
    pub starts: usize,
    /// Messages per round-trip measurement (with and without payout, per store).
    #[arg(long, default_value_t = 200)]
    pub sample: usize,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not run the Cosmos part even if the emulator is available.
    #[arg(long)]
    pub skip_cosmos: bool,
    /// The claims-payments executable to measure (default: this one).
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: BenchArgs,
        }
        Wrapper::parse_from(["bench"]).args
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    Consumer,
    Noop,
    Naive,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Consumer, Variant::Noop, Variant::Naive];

    fn handler(&self) -> &'static str {
        match self {
            Variant::Consumer => "consumer",
            Variant::Noop => "noop",
            Variant::Naive => "naive",
        }
    }

    /// The outcome label a phase's answers must carry.
    fn expected(&self, duplicate: bool) -> &'static str {
        match (self, duplicate) {
            (Variant::Noop, _) => "noop",
            (_, false) => "recorded",
            (_, true) => "duplicate",
        }
    }
}

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
}

/// CPU time of the serve process by thread kind, from `/proc/<pid>/task/*`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadCpu {
    /// Tokio workers: HTTP, decoding, the consumer, logs (and blocking reads).
    pub runtime: f64,
    /// The SQLite writer: every write job and commit.
    pub sqlite_writer: f64,
    /// The SQLite syncer: WAL `fdatasync`s and waking the answers.
    pub sqlite_syncer: f64,
    /// Everything else (checkpointer, read pool, main thread).
    pub other: f64,
}

impl ThreadCpu {
    fn of(pid: u32) -> Self {
        let mut cpu = ThreadCpu::default();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return cpu;
        };
        for task in tasks.flatten() {
            let path = task.path();
            let (Ok(comm), Some(us)) = (
                std::fs::read_to_string(path.join("comm")),
                stat_cpu_us(&path.join("stat")),
            ) else {
                continue;
            };
            *match comm.trim() {
                "tokio-rt-worker" => &mut cpu.runtime,
                "sqlite-writer" => &mut cpu.sqlite_writer,
                "sqlite-syncer" => &mut cpu.sqlite_syncer,
                _ => &mut cpu.other,
            } += us;
        }
        cpu
    }

    fn combine(self, other: ThreadCpu, f: impl Fn(f64, f64) -> f64) -> ThreadCpu {
        ThreadCpu {
            runtime: f(self.runtime, other.runtime),
            sqlite_writer: f(self.sqlite_writer, other.sqlite_writer),
            sqlite_syncer: f(self.sqlite_syncer, other.sqlite_syncer),
            other: f(self.other, other.other),
        }
    }

    fn per(self, messages: f64) -> ThreadCpu {
        ThreadCpu {
            runtime: per(self.runtime, messages),
            sqlite_writer: per(self.sqlite_writer, messages),
            sqlite_syncer: per(self.sqlite_syncer, messages),
            other: per(self.other, messages),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantFigures {
    pub variant: Variant,
    pub fresh: PhaseFigures,
    pub duplicate: PhaseFigures,
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
    pub fresh: RoundTrips,
    pub duplicate: RoundTrips,
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

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    pub build: String,
    pub cores: usize,
    pub concurrency: usize,
    pub requests_per_phase: usize,
    pub rounds: usize,
    pub variants: Vec<VariantFigures>,
    /// consumer / noop, invocations per second.
    pub fresh_vs_ceiling: f64,
    pub duplicate_vs_ceiling: f64,
    /// consumer / naive, invocations per second.
    pub fresh_vs_naive: f64,
    pub duplicate_vs_naive: f64,
    pub round_trips: Vec<StoreRoundTrips>,
    pub startup: Vec<Startup>,
    /// Why the Cosmos part did not run, if it did not.
    pub cosmos_skipped: Option<String>,
}

fn claim_body(n: u64, run: &str) -> Vec<u8> {
    let claim = uuid::Uuid::new_v4();
    format!(
        r#"{{"claimId":"{claim}","amount":"{}.{:02}","currency":"EUR","tenantId":"acme","payee":"NL91ABNA0417164300","approvedAt":"2026-01-01T00:00:00Z","note":"{run}-{n}"}}"#,
        10 + n % 5000,
        n % 100
    )
    .into_bytes()
}

/// The host envelopes of `count` new messages, for their first and second delivery.
fn envelopes(count: usize, run: &str) -> (Vec<Bytes>, Vec<Bytes>) {
    let mut first = Vec::with_capacity(count);
    let mut second = Vec::with_capacity(count);
    for n in 0..count {
        let message = Message {
            sequence_number: n as u64 + 1,
            copy: n,
            message_id: Arc::from(uuid::Uuid::new_v4().to_string()),
            body: Arc::from(claim_body(n as u64, run)),
            enqueued_at: time::OffsetDateTime::now_utc(),
            redrive: false,
        };
        for (delivery_count, out) in [(1, &mut first), (2, &mut second)] {
            let delivery = Delivery {
                entry: n,
                lock_token: uuid::Uuid::new_v4(),
                delivery_count,
                message: message.clone(),
            };
            let envelope = driver::envelope(&delivery, DataType::Binary, "ClaimApproved");
            out.push(Bytes::from(
                serde_json::to_vec(&envelope).unwrap_or_default(),
            ));
        }
    }
    (first, second)
}

#[derive(Debug, Default)]
struct Run {
    latencies_us: Vec<u64>,
    errors: usize,
    unexpected: usize,
    wall: Duration,
}

/// Sends every body once, `concurrency` at a time, and times each answer.
async fn load(
    client: &reqwest::Client,
    base_url: &str,
    bodies: Arc<Vec<Bytes>>,
    concurrency: usize,
    expected: &'static str,
) -> Run {
    let url: Arc<str> = Arc::from(format!("{base_url}/ClaimApproved"));
    let next = Arc::new(AtomicUsize::new(0));
    let needle: Arc<[u8]> = Arc::from(format!("\"outcome\":\"{expected}\"").into_bytes());
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, next, bodies, needle) = (
            client.clone(),
            url.clone(),
            next.clone(),
            bodies.clone(),
            needle.clone(),
        );
        workers.spawn(async move {
            let mut run = Run::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                let sent = Instant::now();
                let answer = client
                    .post(&*url)
                    .header("content-type", "application/json; charset=utf-8")
                    .header(
                        "x-azure-functions-invocationid",
                        uuid::Uuid::new_v4().to_string(),
                    )
                    .body(body.clone())
                    .send()
                    .await;
                match answer {
                    Ok(response) => {
                        let ok = response.status().is_success();
                        match response.bytes().await {
                            Ok(bytes) if ok => {
                                if !bytes.windows(needle.len()).any(|w| w == &needle[..]) {
                                    run.unexpected += 1;
                                }
                            }
                            _ => run.errors += 1,
                        }
                    }
                    Err(_) => run.errors += 1,
                }
                run.latencies_us.push(sent.elapsed().as_micros() as u64);
            }
            run
        });
    }
    let mut total = Run::default();
    while let Some(joined) = workers.join_next().await {
        if let Ok(run) = joined {
            total.latencies_us.extend(run.latencies_us);
            total.errors += run.errors;
            total.unexpected += run.unexpected;
        }
    }
    total.wall = started.elapsed();
    total
}

fn percentile_ms(sorted_us: &[u64], p: usize) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = (sorted_us.len() * p)
        .div_ceil(100)
        .clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

/// The handler's counters (`GET /metrics`), plus the CPU time of both processes.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    invocations: f64,
    round_trips: f64,
    bank_calls: f64,
    request_units: f64,
    commits: f64,
    committed_jobs: f64,
    syncs: f64,
    server_cpu_us: f64,
    server_threads: ThreadCpu,
    generator_cpu_us: f64,
}

async fn counters(client: &reqwest::Client, base_url: &str, pid: u32) -> anyhow::Result<Counters> {
    let value: serde_json::Value = client
        .get(format!("{base_url}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let f = |k: &str| {
        value
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    Ok(Counters {
        invocations: f("invocations"),
        round_trips: f("storeRoundTrips"),
        bank_calls: f("bankCalls"),
        request_units: f("cosmosRequestUnits"),
        commits: f("sqliteCommits"),
        committed_jobs: f("sqliteCommittedJobs"),
        syncs: f("sqliteSyncs"),
        server_cpu_us: cpu_us(pid).unwrap_or(0.0),
        server_threads: ThreadCpu::of(pid),
        generator_cpu_us: cpu_us(std::process::id()).unwrap_or(0.0),
    })
}

/// CPU time (user + system, all threads) of a process so far, in microseconds, from
/// `/proc/<pid>/stat`. The kernel reports it in USER_HZ ticks, which Linux fixes at 100
/// per second; phases last long enough that the 10 ms granularity stays small.
fn cpu_us(pid: u32) -> Option<f64> {
    stat_cpu_us(Path::new(&format!("/proc/{pid}/stat")))
}

/// CPU time from a process's or thread's `stat` file.
fn stat_cpu_us(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces; fields are counted after its closing ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 10_000.0)
}

fn per(numerator: f64, messages: f64) -> f64 {
    if messages > 0.0 {
        numerator / messages
    } else {
        0.0
    }
}

/// One measured phase: load plus the counter deltas around it.
async fn measured(
    client: &reqwest::Client,
    process: &ServeProcess,
    bodies: Arc<Vec<Bytes>>,
    concurrency: usize,
    expected: &'static str,
) -> anyhow::Result<(Run, Counters)> {
    let base_url = process.base_url();
    let before = counters(client, &base_url, process.pid).await?;
    let run = load(client, &base_url, bodies, concurrency, expected).await;
    let after = counters(client, &base_url, process.pid).await?;
    let delta = Counters {
        invocations: after.invocations - before.invocations,
        round_trips: after.round_trips - before.round_trips,
        bank_calls: after.bank_calls - before.bank_calls,
        request_units: after.request_units - before.request_units,
        commits: after.commits - before.commits,
        committed_jobs: after.committed_jobs - before.committed_jobs,
        syncs: after.syncs - before.syncs,
        server_cpu_us: after.server_cpu_us - before.server_cpu_us,
        server_threads: after
            .server_threads
            .combine(before.server_threads, |a, b| a - b),
        generator_cpu_us: after.generator_cpu_us - before.generator_cpu_us,
    };
    Ok((run, delta))
}

fn round_trips(run: &Run, delta: &Counters) -> RoundTrips {
    RoundTrips {
        messages: run.latencies_us.len(),
        errors: run.errors + run.unexpected,
        store_round_trips_per_message: per(delta.round_trips, delta.invocations),
        bank_calls_per_message: per(delta.bank_calls, delta.invocations),
        request_units_per_message: per(delta.request_units, delta.invocations),
        jobs_per_commit: (delta.commits > 0.0).then(|| delta.committed_jobs / delta.commits),
        jobs_per_sync: (delta.syncs > 0.0).then(|| delta.committed_jobs / delta.syncs),
        invocations_per_second: run.latencies_us.len() as f64 / run.wall.as_secs_f64().max(1e-9),
    }
}

fn spec(exe: &Path, dir: &Path, name: &str) -> ServeSpec {
    let mut spec = ServeSpec::new(exe.to_path_buf())
        .env("PAYMENTS_STORE", "sqlite")
        .env(
            "PAYMENTS_SQLITE_PATH",
            dir.join(format!("{name}.db")).to_string_lossy(),
        )
        .env("LOG_FORMAT", "json")
        .env("RUST_LIB_BACKTRACE", "0");
    spec.log = Some(dir.join(format!("{name}.log")));
    spec
}

#[derive(Default)]
struct Accumulated {
    latencies_us: Vec<u64>,
    wall: Duration,
    errors: usize,
    unexpected: usize,
    round_trips: f64,
    invocations: f64,
    server_cpu_us: f64,
    server_threads: ThreadCpu,
    generator_cpu_us: f64,
}

impl Accumulated {
    fn add(&mut self, run: Run, delta: Counters) {
        self.latencies_us.extend(run.latencies_us);
        self.wall += run.wall;
        self.errors += run.errors;
        self.unexpected += run.unexpected;
        self.round_trips += delta.round_trips;
        self.invocations += delta.invocations;
        self.server_cpu_us += delta.server_cpu_us;
        self.server_threads = self
            .server_threads
            .combine(delta.server_threads, |a, b| a + b);
        self.generator_cpu_us += delta.generator_cpu_us;
    }

    fn figures(mut self) -> PhaseFigures {
        self.latencies_us.sort_unstable();
        PhaseFigures {
            requests: self.latencies_us.len(),
            errors: self.errors,
            unexpected_outcomes: self.unexpected,
            invocations_per_second: self.latencies_us.len() as f64
                / self.wall.as_secs_f64().max(1e-9),
            p50_ms: percentile_ms(&self.latencies_us, 50),
            p99_ms: percentile_ms(&self.latencies_us, 99),
            store_round_trips_per_message: per(self.round_trips, self.invocations),
            server_cpu_us_per_message: per(self.server_cpu_us, self.latencies_us.len() as f64),
            generator_cpu_us_per_message: per(
                self.generator_cpu_us,
                self.latencies_us.len() as f64,
            ),
            server_cpu_us_by_thread: self.server_threads.per(self.latencies_us.len() as f64),
        }
    }
}

fn http_client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .pool_max_idle_per_host(concurrency.max(1))
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the load generator's HTTP client")
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

async fn throughput(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<VariantFigures>> {
    let mut processes = Vec::new();
    for variant in Variant::ALL {
        let spec = spec(exe, dir, variant.handler()).env("PAYMENTS_DEV_HANDLER", variant.handler());
        processes.push(ServeProcess::start(&spec).await?);
    }
    let per_round = (args.requests / args.rounds).max(1);
    let warmup = (per_round / 10).clamp(50, 500);
    for (variant, process) in Variant::ALL.iter().zip(&processes) {
        let (fresh, again) = envelopes(warmup, "warmup");
        let url = process.base_url();
        load(
            client,
            &url,
            Arc::new(fresh),
            args.concurrency,
            variant.expected(false),
        )
        .await;
        load(
            client,
            &url,
            Arc::new(again),
            args.concurrency,
            variant.expected(true),
        )
        .await;
    }

    let mut fresh: Vec<Accumulated> = Variant::ALL
        .iter()
        .map(|_| Accumulated::default())
        .collect();
    let mut duplicate: Vec<Accumulated> = Variant::ALL
        .iter()
        .map(|_| Accumulated::default())
        .collect();
    for round in 0..args.rounds {
        let batches: Vec<(Vec<Bytes>, Vec<Bytes>)> = Variant::ALL
            .iter()
            .map(|v| envelopes(per_round, &format!("{}-{round}", v.handler())))
            .collect();
        let mut seconds = Vec::new();
        let order: Vec<usize> = (0..Variant::ALL.len())
            .map(|i| (i + round) % Variant::ALL.len())
            .collect();
        let mut firsts: Vec<Option<Vec<Bytes>>> = Vec::new();
        for (first, second) in batches {
            firsts.push(Some(first));
            seconds.push(Some(second));
        }
        for &i in &order {
            let bodies = Arc::new(firsts[i].take().unwrap_or_default());
            let (run, delta) = measured(
                client,
                &processes[i],
                bodies,
                args.concurrency,
                Variant::ALL[i].expected(false),
            )
            .await?;
            fresh[i].add(run, delta);
        }
        for &i in &order {
            let bodies = Arc::new(seconds[i].take().unwrap_or_default());
            let (run, delta) = measured(
                client,
                &processes[i],
                bodies,
                args.concurrency,
                Variant::ALL[i].expected(true),
            )
            .await?;
            duplicate[i].add(run, delta);
        }
    }

    let mut figures = Vec::new();
    for (i, variant) in Variant::ALL.iter().enumerate() {
        figures.push(VariantFigures {
            variant: *variant,
            fresh: std::mem::take(&mut fresh[i]).figures(),
            duplicate: std::mem::take(&mut duplicate[i]).figures(),
            peak_rss_kib: processes[i].peak_rss_kib(),
        });
    }
    for process in processes {
        process.stop().await;
    }
    Ok(figures)
}

/// `sample` new messages, then the same again as duplicates.
async fn fresh_then_duplicate(
    client: &reqwest::Client,
    process: &ServeProcess,
    sample: usize,
    concurrency: usize,
    expected_fresh: &'static str,
) -> anyhow::Result<(RoundTrips, RoundTrips)> {
    let (first, second) = envelopes(sample, "round-trips");
    let (run, delta) = measured(
        client,
        process,
        Arc::new(first),
        concurrency,
        expected_fresh,
    )
    .await?;
    let fresh = round_trips(&run, &delta);
    let (run, delta) =
        measured(client, process, Arc::new(second), concurrency, "duplicate").await?;
    Ok((fresh, round_trips(&run, &delta)))
}

/// Round trips per message for one store: fresh and duplicate, ledger-only and with a
/// payout through a fault-free sandbox bank.
async fn store_round_trips(
    label: &str,
    make_spec: impl Fn(&str) -> ServeSpec,
    sample: usize,
    concurrency: usize,
    client: &reqwest::Client,
) -> anyhow::Result<StoreRoundTrips> {
    let bank = SandboxBank::start(BankSettings::default()).await?;
    let ledger_only = ServeProcess::start(&make_spec("ledger-only")).await?;
    let with_bank =
        ServeProcess::start(&make_spec("with-bank").env("BANK_API_URL", bank.url())).await?;

    let (fresh, duplicate) =
        fresh_then_duplicate(client, &ledger_only, sample, concurrency, "recorded").await?;
    let (fresh_with_payout, duplicate_with_payout) =
        fresh_then_duplicate(client, &with_bank, sample, concurrency, "paid").await?;
    ledger_only.stop().await;
    with_bank.stop().await;
    Ok(StoreRoundTrips {
        store: label.to_owned(),
        fresh,
        duplicate,
        fresh_with_payout,
        duplicate_with_payout,
    })
}

async fn startup(
    exe: &Path,
    dir: &Path,
    starts: usize,
    configuration: &str,
    bank_url: Option<&str>,
) -> anyhow::Result<Startup> {
    let mut samples = Vec::new();
    for i in 0..starts.max(1) {
        let mut spec = spec(exe, dir, &format!("startup-{configuration}-{i}"));
        if let Some(url) = bank_url {
            spec = spec.env("BANK_API_URL", url);
        }
        let process = ServeProcess::start(&spec).await?;
        samples.push(process.startup.as_secs_f64() * 1000.0);
        process.stop().await;
    }
    samples.sort_by(f64::total_cmp);
    Ok(Startup {
        configuration: configuration.to_owned(),
        starts: samples.len(),
        median_ms: samples[samples.len() / 2],
        min_ms: samples[0],
        max_ms: samples[samples.len() - 1],
    })
}

/// A running `cosmos-emulator` and the settings it printed. Killed on drop.
struct Emulator {
    _child: tokio::process::Child,
    endpoint: String,
    key: String,
}

async fn start_emulator(path: &Path) -> anyhow::Result<Emulator> {
    let mut child = tokio::process::Command::new(path)
        .args(["--port", "0", "--provision"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", path.display()))?;
    let stdout = child
        .stdout
        .take()
        .context("no stdout from cosmos-emulator")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let (mut endpoint, mut key) = (None, None);
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if let Some(v) = line.strip_prefix("COSMOS_ENDPOINT=") {
                endpoint = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("COSMOS_KEY=") {
                key = Some(v.trim().to_owned());
            } else if line.trim() == "ready" {
                return anyhow::Ok(true);
            }
        }
        anyhow::Ok(false)
    };
    let ready = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .context("cosmos-emulator did not print `ready` within 60 s")??;
    ensure!(ready, "cosmos-emulator exited before it was ready");
    // Keep draining stdout so a chatty emulator can never block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Emulator {
        _child: child,
        endpoint: endpoint.context("cosmos-emulator printed no COSMOS_ENDPOINT")?,
        key: key.context("cosmos-emulator printed no COSMOS_KEY")?,
    })
}

/// Runs the benchmark.
pub async fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    ensure!(
        args.requests >= 1 && args.rounds >= 1,
        "--requests and --rounds must be at least 1"
    );
    ensure!(
        (1..=1024).contains(&args.concurrency),
        "--concurrency must be between 1 and 1024"
    );
    let exe = match &args.exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe().context("cannot find the claims-payments executable")?,
    };
    let temp = TempDir::new("claims-payments-bench")?;
    let dir = temp.path();
    let client = http_client(args.concurrency)?;

    let variants = throughput(&args, &exe, dir, &client).await?;
    let get = |v: Variant| variants.iter().find(|f| f.variant == v);
    let (ours, ceiling, naive) = match (
        get(Variant::Consumer),
        get(Variant::Noop),
        get(Variant::Naive),
    ) {
        (Some(a), Some(b), Some(c)) => (a.clone(), b.clone(), c.clone()),
        _ => bail!("a variant is missing from the results"),
    };

    let mut round_trip_figures = vec![
        store_round_trips(
            "sqlite",
            |name| spec(&exe, dir, &format!("rt-sqlite-{name}")),
            args.sample,
            args.concurrency,
            &client,
        )
        .await?,
    ];

    let bank = SandboxBank::start(BankSettings::default()).await?;
    let startup_figures = vec![
        startup(&exe, dir, args.starts, "sqlite, ledger-only", None).await?,
        startup(
            &exe,
            dir,
            args.starts,
            "sqlite, bank configured",
            Some(&bank.url()),
        )
        .await?,
    ];

    let emulator_path = exe.with_file_name("cosmos-emulator");
    let cosmos_skipped = if args.skip_cosmos {
        Some("--skip-cosmos".to_owned())
    } else if !emulator_path.is_file() {
        Some(format!(
            "no cosmos-emulator next to {} (build it with `cargo build --bins`)",
            exe.display()
        ))
    } else {
        match start_emulator(&emulator_path).await {
            Err(e) => Some(format!("cosmos-emulator did not start: {e:#}")),
            Ok(emulator) => {
                let figures = store_round_trips(
                    "cosmos (emulator model, not Azure charges)",
                    |name| {
                        let mut s = spec(&exe, dir, &format!("rt-cosmos-{name}"))
                            .env("PAYMENTS_STORE", "cosmos")
                            .env("COSMOS_ENDPOINT", emulator.endpoint.clone())
                            .env("COSMOS_KEY", emulator.key.clone());
                        s.ready_timeout = Duration::from_secs(60);
                        s
                    },
                    args.sample,
                    args.concurrency,
                    &client,
                )
                .await;
                match figures {
                    Ok(f) => {
                        round_trip_figures.push(f);
                        None
                    }
                    Err(e) => Some(format!("the Cosmos measurement failed: {e:#}")),
                }
            }
        }
    };

    Ok(BenchReport {
        build: if cfg!(debug_assertions) {
            "debug".to_owned()
        } else {
            "release".to_owned()
        },
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        concurrency: args.concurrency,
        requests_per_phase: (args.requests / args.rounds).max(1) * args.rounds,
        rounds: args.rounds,
        fresh_vs_ceiling: ratio(
            ours.fresh.invocations_per_second,
            ceiling.fresh.invocations_per_second,
        ),
        duplicate_vs_ceiling: ratio(
            ours.duplicate.invocations_per_second,
            ceiling.duplicate.invocations_per_second,
        ),
        fresh_vs_naive: ratio(
            ours.fresh.invocations_per_second,
            naive.fresh.invocations_per_second,
        ),
        duplicate_vs_naive: ratio(
            ours.duplicate.invocations_per_second,
            naive.duplicate.invocations_per_second,
        ),
        variants,
        round_trips: round_trip_figures,
        startup: startup_figures,
        cosmos_skipped,
    })
}

impl BenchReport {
    /// The compact table.
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "claims-payments bench: {} build, {} cores, closed loop of {} concurrent invocations, {} per phase in {} rounds",
            self.build, self.cores, self.concurrency, self.requests_per_phase, self.rounds
        );
        let _ = writeln!(
            o,
            "full HTTP path to `serve`; SQLite WAL, every answer after its WAL sync (pipelined group commit); ledger-only; info logs"
        );
        let _ = writeln!(
            o,
            "{:<16}{:>9}{:>8}{:>8}{:>8}  {:>9}{:>8}{:>8}{:>8}  {:>9}",
            "",
            "fresh/s",
            "p50 ms",
            "p99 ms",
            "cpu us",
            "dup/s",
            "p50 ms",
            "p99 ms",
            "cpu us",
            "peak RSS"
        );
        for v in &self.variants {
            let name = match v.variant {
                Variant::Consumer => "consumer",
                Variant::Noop => "noop (ceiling)",
                Variant::Naive => "naive",
            };
            let rss = v.peak_rss_kib.map_or("n/a".to_owned(), |k| {
                format!("{:.1} MiB", k as f64 / 1024.0)
            });
            let _ = writeln!(
                o,
                "{:<16}{:>9.0}{:>8.2}{:>8.2}{:>8.0}  {:>9.0}{:>8.2}{:>8.2}{:>8.0}  {:>9}",
                name,
                v.fresh.invocations_per_second,
                v.fresh.p50_ms,
                v.fresh.p99_ms,
                v.fresh.server_cpu_us_per_message,
                v.duplicate.invocations_per_second,
                v.duplicate.p50_ms,
                v.duplicate.p99_ms,
                v.duplicate.server_cpu_us_per_message,
                rss
            );
            let problems = v.fresh.errors
                + v.fresh.unexpected_outcomes
                + v.duplicate.errors
                + v.duplicate.unexpected_outcomes;
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
                    "{:.0}/{:.0}",
                    v.fresh.generator_cpu_us_per_message, v.duplicate.generator_cpu_us_per_message
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "cpu us = serve CPU (user+system) per invocation; the load generator shares the cores and spent {} us per request (fresh/dup, same order)",
            generator.join(", ")
        );
        if let Some(consumer) = self
            .variants
            .iter()
            .find(|v| v.variant == Variant::Consumer)
        {
            let split = |t: &ThreadCpu| {
                format!(
                    "runtime {:.0}, sqlite-writer {:.0}, sqlite-syncer {:.0}, other {:.0}",
                    t.runtime, t.sqlite_writer, t.sqlite_syncer, t.other
                )
            };
            let _ = writeln!(
                o,
                "consumer cpu us by thread: fresh {}; duplicate {}",
                split(&consumer.fresh.server_cpu_us_by_thread),
                split(&consumer.duplicate.server_cpu_us_by_thread)
            );
        }
        let _ = writeln!(
            o,
            "ours/ceiling    fresh {:.0}%, duplicate {:.0}%",
            self.fresh_vs_ceiling * 100.0,
            self.duplicate_vs_ceiling * 100.0
        );
        let _ = writeln!(
            o,
            "ours/naive      fresh {:.2}x, duplicate {:.2}x",
            self.fresh_vs_naive, self.duplicate_vs_naive
        );
        let _ = writeln!(
            o,
            "store round trips per message (from GET /metrics deltas):"
        );
        for rt in &self.round_trips {
            let cosmos = rt.store.starts_with("cosmos");
            let line = |label: &str, r: &RoundTrips| {
                let mut s = format!(
                    "  {label:<22} {:>5.2} round trips",
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
            let _ = writeln!(o, " {}", rt.store);
            let _ = writeln!(o, "{}", line("fresh", &rt.fresh));
            let _ = writeln!(o, "{}", line("duplicate", &rt.duplicate));
            let _ = writeln!(o, "{}", line("fresh with payout", &rt.fresh_with_payout));
            let _ = writeln!(
                o,
                "{}",
                line("duplicate with payout", &rt.duplicate_with_payout)
            );
        }
        if let Some(why) = &self.cosmos_skipped {
            let _ = writeln!(o, " cosmos: skipped ({why})");
        }
        for s in &self.startup {
            let _ = writeln!(
                o,
                "start-up ({}): median {:.1} ms (min {:.1}, max {:.1}) over {} starts, exec to first answer on GET /",
                s.configuration, s.median_ms, s.min_ms, s.max_ms, s.starts
            );
        }
        o
    }
}

/// The `bench` subcommand: runs and prints the table (or `--json`).
pub async fn main(args: BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let json = args.json;
    if !json && std::io::stderr().is_terminal() {
        eprintln!("benchmarking; this takes a minute or two...");
    }
    let report = tokio::select! {
        report = run(args) => report?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; the serve processes were stopped"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(std::process::ExitCode::SUCCESS)
}
