//! `claims-payments-dev bench`: what the exactly-once guard costs, measured on the full
//! HTTP path against real `serve` processes, and what a message costs an operator.
//!
//! Side by side in one run, each variant in its own process with its own SQLite file
//! (WAL with pipelined group commit: no write is answered before its WAL sync):
//! - `consumer`: the product;
//! - `noop` (`PAYMENTS_DEV_HANDLER=noop`): answers 200 without decoding or storing
//!   anything, i.e. the ceiling of this machine, HTTP stack and load generator;
//! - `naive` (`PAYMENTS_DEV_HANDLER=naive`): check-then-insert without the atomic guard.
//!
//! Every `serve` process runs on one core and the load generator (this process) on
//! another (CPU affinity, set before exec so the runtime sizes itself to one core), so the
//! generator's work does not land on the handler's core; with fewer than two cores the
//! bench says so and runs unpinned.
//!
//! A closed-loop generator with a fixed concurrency sends a fixed number of invocations
//! per phase: *fresh* messages, then the same messages again (*duplicates*, DeliveryCount
//! 2), answered from the process's memory of completed messages, then, after every
//! process is restarted on its database, the same again (*duplicates at the store*).
//! Phases are interleaved over rounds, with the variant order rotating each round, so
//! drift in a noisy machine's speed spreads over every variant instead of favouring one.
//! Bodies are built before a phase starts, so the generator's timed work is only HTTP.
//!
//! Per phase: `serve`'s CPU per message by thread (`/proc/<pid>/task/*/stat`), and the
//! bytes the SQLite writer thread wrote (its WAL frames) and the checkpointer copied into
//! the database file (`/proc/<pid>/task/*/io`, `wchar`: bytes passed to write calls).
//! Store round trips, bank calls and Cosmos request units per message come from deltas
//! of the handler's own `GET /metrics` counters around each phase. Start-up time is
//! measured from exec to the first answer on `GET /` (the host's readiness probe), peak
//! memory is `VmHWM` from `/proc/<pid>/status` after the load.
//!
//! Cosmos request units: the SDK's in-process emulator charges a constant made-up figure, so the bench
//! computes each case's charge from Microsoft's published request-unit rules for the
//! documents the real consumer writes ([`ru`]), under the deployed indexing policy and the
//! one before issue 17, with the cost per million messages. When `COSMOS_TEST_ENDPOINT`
//! and `COSMOS_TEST_KEY` name a real emulator or account, the charges the service records
//! there are printed too, as measured. If a `cosmos-emulator` binary sits next to this
//! executable, the consumer also runs against it over HTTP (round trips per message).
//!
//! PostgreSQL ([`pg`]): the consumer on a throwaway local server beside SQLite, in the
//! same rounds (fresh, duplicates at the store), side by side with ratios, and its row in
//! the round-trip table.
//!
//! `--instances 1,2,4` runs only the multi-instance measurement: N `serve` processes
//! against one `cosmos-emulator`, as Flex Consumption runs many instances against one
//! container.

mod pg;
mod ru;
mod telemetry;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use axum::body::Bytes;
use serde::Serialize;

use crate::sim::bank::{FakeBank, FakeBankSettings};
use crate::sim::driver::{self, DataType};
use crate::sim::queue::{Message, QueueDelivery};
use claims_payments::config::names;
use claims_payments_testkit::process::{CosmosEmulator, ServeProcess, ServeSpec, TempDir};

/// `claims-payments-dev bench`.
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
    /// Do not run the PostgreSQL part even if PostgreSQL's binaries are installed.
    #[arg(long)]
    pub skip_postgres: bool,
    /// Messages per case for the computed Cosmos request units (in-process emulator).
    #[arg(long, default_value_t = 20)]
    pub ru_messages: usize,
    /// Do not pin `serve` and the load generator to separate cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Run only the multi-instance measurement, for each N given (e.g. `1,2,4`): N `serve`
    /// processes against one `cosmos-emulator`, with a sandbox bank.
    #[arg(long, value_delimiter = ',')]
    pub instances: Vec<usize>,
    /// Messages per multi-instance run.
    #[arg(long, default_value_t = 400)]
    pub instance_messages: usize,
    /// Share of the multi-instance messages delivered a second time, at once, to the next
    /// instance (DeliveryCount 2: a redelivery after a lost lock while the first runs).
    #[arg(long, default_value_t = 0.25)]
    pub redelivery_share: f64,
    /// Run only the telemetry overhead measurement (telemetry off beside exported to a
    /// local Application Insights endpoint).
    #[arg(long)]
    pub telemetry_only: bool,
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
    /// Bytes the SQLite writer thread wrote per invocation: WAL frames (page + 24-byte
    /// header) and WAL headers.
    pub wal_bytes_per_message: f64,
    /// Bytes the checkpointer copied from the WAL into the database file per invocation.
    pub checkpoint_bytes_per_message: f64,
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

/// Bytes written (`wchar` of `/proc/<pid>/task/<tid>/io`) by the SQLite threads that write.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadIo {
    /// The writer: WAL frames of every commit (and WAL headers when the WAL restarts).
    wal_writer: f64,
    /// The checkpointer: pages copied into the database file.
    checkpointer: f64,
}

fn io_wchar(task: &Path) -> Option<f64> {
    let io = std::fs::read_to_string(task.join("io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU time of one thread in microseconds: `schedstat`'s time on CPU (nanoseconds), or
/// `stat`'s user + system ticks (10 ms) where schedstat is not available.
fn task_cpu_us(task: &Path) -> Option<f64> {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ns| ns / 1000.0)
        .or_else(|| stat_cpu_us(&task.join("stat")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ThreadKind {
    Runtime,
    Writer,
    Syncer,
    Checkpointer,
    Other,
}

#[derive(Debug, Clone, Copy)]
struct TaskSample {
    kind: ThreadKind,
    cpu_us: f64,
    wchar: f64,
}

/// The live threads of a process, each with its CPU time and bytes written so far.
#[derive(Debug, Clone, Default)]
struct Tasks(std::collections::HashMap<u64, TaskSample>);

impl Tasks {
    fn of(pid: u32) -> Self {
        let mut tasks = Tasks::default();
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return tasks;
        };
        for task in entries.flatten() {
            let path = task.path();
            let (Some(tid), Ok(comm), Some(cpu_us)) = (
                task.file_name()
                    .to_str()
                    .and_then(|t| t.parse::<u64>().ok()),
                std::fs::read_to_string(path.join("comm")),
                task_cpu_us(&path),
            ) else {
                continue;
            };
            let kind = match comm.trim() {
                "tokio-rt-worker" => ThreadKind::Runtime,
                "sqlite-writer" => ThreadKind::Writer,
                "sqlite-syncer" => ThreadKind::Syncer,
                // Thread names are cut to 15 bytes.
                "sqlite-checkpoi" | "sqlite-checkpointer" => ThreadKind::Checkpointer,
                _ => ThreadKind::Other,
            };
            let wchar = match kind {
                ThreadKind::Writer | ThreadKind::Checkpointer => io_wchar(&path).unwrap_or(0.0),
                _ => 0.0,
            };
            tasks.0.insert(
                tid,
                TaskSample {
                    kind,
                    cpu_us,
                    wchar,
                },
            );
        }
        tasks
    }

    /// What the threads did since `before`. A thread that exited meanwhile is left out
    /// (only its time within the phase is lost: tokio's blocking threads exit after 10 s
    /// idle), and one that started counts from zero.
    fn since(&self, before: &Tasks) -> (f64, ThreadCpu, ThreadIo) {
        let (mut total, mut cpu, mut io) = (0.0, ThreadCpu::default(), ThreadIo::default());
        for (tid, now) in &self.0 {
            let (cpu_before, wchar_before) = before
                .0
                .get(tid)
                .map_or((0.0, 0.0), |b| (b.cpu_us, b.wchar));
            let (d_cpu, d_wchar) = (now.cpu_us - cpu_before, now.wchar - wchar_before);
            total += d_cpu;
            *match now.kind {
                ThreadKind::Runtime => &mut cpu.runtime,
                ThreadKind::Writer => &mut cpu.sqlite_writer,
                ThreadKind::Syncer => &mut cpu.sqlite_syncer,
                ThreadKind::Checkpointer | ThreadKind::Other => &mut cpu.other,
            } += d_cpu;
            match now.kind {
                ThreadKind::Writer => io.wal_writer += d_wchar,
                ThreadKind::Checkpointer => io.checkpointer += d_wchar,
                _ => {}
            }
        }
        (total, cpu, io)
    }
}

impl ThreadCpu {
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

/// One of the issue's targets, as this run found it.
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
    fn new(
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

    fn verdict(&self) -> String {
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
/// and the one before issue 17.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CostRow {
    pub kind: String,
    pub after: ru::CostPerMillion,
    pub before: ru::CostPerMillion,
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

/// `count` new messages with their own MessageIds and claims.
fn messages(count: usize, run: &str) -> Vec<Message> {
    (0..count)
        .map(|n| Message {
            sequence_number: n as u64 + 1,
            copy: n,
            message_id: Arc::from(uuid::Uuid::new_v4().to_string()),
            body: Arc::from(claim_body(n as u64, run)),
            enqueued_at: time::OffsetDateTime::now_utc(),
            redrive: false,
        })
        .collect()
}

/// The host envelope of one delivery of `message`.
fn envelope_of(n: usize, message: &Message, delivery_count: u32) -> Bytes {
    let delivery = QueueDelivery {
        entry: n,
        lock_token: uuid::Uuid::new_v4(),
        delivery_count,
        message: message.clone(),
    };
    let envelope = driver::envelope(&delivery, DataType::Binary, "ClaimApproved");
    Bytes::from(serde_json::to_vec(&envelope).unwrap_or_default())
}

/// The host envelopes of `count` new messages, for their first and second delivery.
fn envelopes(count: usize, run: &str) -> (Vec<Bytes>, Vec<Bytes>) {
    let messages = messages(count, run);
    (
        messages
            .iter()
            .enumerate()
            .map(|(n, m)| envelope_of(n, m, 1))
            .collect(),
        messages
            .iter()
            .enumerate()
            .map(|(n, m)| envelope_of(n, m, 2))
            .collect(),
    )
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
    let targets: Vec<(usize, Bytes)> = bodies.iter().map(|b| (0, b.clone())).collect();
    load_to(
        client,
        &[base_url.to_owned()],
        Arc::new(targets),
        concurrency,
        &[expected],
    )
    .await
}

/// How one timed request ended.
enum Answered {
    Expected,
    /// A 2xx answer that is not what the phase expects.
    Unexpected,
    /// A transport error or a non-2xx answer.
    Error,
}

/// Sends requests `0..count`, `concurrency` at a time (closed loop), `send(i)` making the
/// i-th, and times each answer.
async fn closed_loop<F, Fut>(count: usize, concurrency: usize, send: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answered> + Send,
{
    let send = Arc::new(send);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (send, next) = (send.clone(), next.clone());
        workers.spawn(async move {
            let mut run = Run::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let sent = Instant::now();
                match send(i).await {
                    Answered::Expected => {}
                    Answered::Unexpected => run.unexpected += 1,
                    Answered::Error => run.errors += 1,
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

/// Sends every `(instance, body)` once to `base_urls[instance]`, `concurrency` at a time
/// in all, and times each answer; an answer whose outcome is not in `accepted` counts as
/// unexpected.
async fn load_to(
    client: &reqwest::Client,
    base_urls: &[String],
    targets: Arc<Vec<(usize, Bytes)>>,
    concurrency: usize,
    accepted: &[&'static str],
) -> Run {
    let urls: Arc<Vec<String>> = Arc::new(
        base_urls
            .iter()
            .map(|u| format!("{u}/ClaimApproved"))
            .collect(),
    );
    let needles: Arc<Vec<Vec<u8>>> = Arc::new(
        accepted
            .iter()
            .map(|e| format!("\"outcome\":\"{e}\"").into_bytes())
            .collect(),
    );
    let client = client.clone();
    closed_loop(targets.len(), concurrency, move |i| {
        let (client, urls, targets, needles) = (
            client.clone(),
            urls.clone(),
            targets.clone(),
            needles.clone(),
        );
        async move {
            let (instance, body) = &targets[i];
            let Some(url) = urls.get(*instance) else {
                return Answered::Error;
            };
            let answer = client
                .post(url)
                .header("content-type", "application/json; charset=utf-8")
                .header(
                    "x-azure-functions-invocationid",
                    uuid::Uuid::new_v4().to_string(),
                )
                .body(body.clone())
                .send()
                .await;
            let Ok(response) = answer else {
                return Answered::Error;
            };
            let ok = response.status().is_success();
            match response.bytes().await {
                Ok(bytes) if ok => {
                    let known = needles
                        .iter()
                        .any(|needle| bytes.windows(needle.len()).any(|w| w == &needle[..]));
                    if known {
                        Answered::Expected
                    } else {
                        Answered::Unexpected
                    }
                }
                _ => Answered::Error,
            }
        }
    })
    .await
}

/// One `POST /api/payments`: its Idempotency-Key and body.
type PaymentRequest = (String, Bytes);

/// `count` payment requests for new claims, each with its own key.
fn payment_requests(count: usize, run: &str) -> Vec<PaymentRequest> {
    (0..count)
        .map(|n| {
            (
                uuid::Uuid::new_v4().to_string(),
                Bytes::from(claim_body(n as u64, run)),
            )
        })
        .collect()
}

/// Sends every payment request once, `concurrency` at a time. A first request must be
/// answered 201; a replay (the same key and body again) 201 with `Idempotent-Replayed: true`.
async fn load_payments(
    client: &reqwest::Client,
    base_url: &str,
    requests: Arc<Vec<PaymentRequest>>,
    concurrency: usize,
    replay: bool,
) -> Run {
    let url = Arc::new(format!("{base_url}/api/payments"));
    let client = client.clone();
    closed_loop(requests.len(), concurrency, move |i| {
        let (client, url, requests) = (client.clone(), url.clone(), requests.clone());
        async move {
            let (key, body) = &requests[i];
            let answer = client
                .post(url.as_str())
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(body.clone())
                .send()
                .await;
            let Ok(response) = answer else {
                return Answered::Error;
            };
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let created = response.status() == reqwest::StatusCode::CREATED;
            match response.bytes().await {
                Ok(_) if created && replayed == replay => Answered::Expected,
                Ok(_) if created => Answered::Unexpected,
                _ => Answered::Error,
            }
        }
    })
    .await
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

/// Deltas of the handler's counters (`GET /metrics`), plus the CPU time of both processes.
#[derive(Debug, Clone, Copy, Default)]
struct PhaseDeltas {
    invocations: f64,
    round_trips: f64,
    bank_calls: f64,
    request_units: f64,
    commits: f64,
    committed_jobs: f64,
    syncs: f64,
    lease_waits: f64,
    takeovers: f64,
    server_cpu_us: f64,
    server_threads: ThreadCpu,
    server_io: ThreadIo,
    generator_cpu_us: f64,
}

/// One reading of the counters and of both processes' threads.
struct Sample {
    metrics: PhaseDeltas,
    server: Tasks,
    generator: Tasks,
}

impl Sample {
    fn since(&self, before: &Sample) -> PhaseDeltas {
        let mut delta = self.metrics.minus(&before.metrics);
        let (server_cpu_us, server_threads, server_io) = self.server.since(&before.server);
        delta.server_cpu_us = server_cpu_us;
        delta.server_threads = server_threads;
        delta.server_io = server_io;
        delta.generator_cpu_us = self.generator.since(&before.generator).0;
        delta
    }
}

async fn counters(client: &reqwest::Client, base_url: &str, pid: u32) -> anyhow::Result<Sample> {
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
    Ok(Sample {
        metrics: PhaseDeltas {
            invocations: f("invocations"),
            round_trips: f("storeRoundTrips"),
            bank_calls: f("bankCalls"),
            request_units: f("cosmosRequestUnits"),
            commits: f("sqliteCommits"),
            committed_jobs: f("sqliteCommittedJobs"),
            syncs: f("sqliteSyncs"),
            lease_waits: f("leaseWaits"),
            takeovers: f("takeovers"),
            ..PhaseDeltas::default()
        },
        server: Tasks::of(pid),
        generator: Tasks::of(std::process::id()),
    })
}

/// CPU time from a thread's `stat` file: user + system in USER_HZ ticks, which Linux
/// fixes at 100 per second.
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
) -> anyhow::Result<(Run, PhaseDeltas)> {
    let base_url = process.base_url();
    let before = counters(client, &base_url, process.pid).await?;
    let run = load(client, &base_url, bodies, concurrency, expected).await;
    let after = counters(client, &base_url, process.pid).await?;
    Ok((run, after.since(&before)))
}

/// One measured phase of `POST /api/payments`. Store round trips are counted per request
/// (the handler's `invocations` counter counts Service Bus invocations only).
async fn measured_payments(
    client: &reqwest::Client,
    process: &ServeProcess,
    requests: Arc<Vec<PaymentRequest>>,
    concurrency: usize,
    replay: bool,
) -> anyhow::Result<(Run, PhaseDeltas)> {
    let base_url = process.base_url();
    let before = counters(client, &base_url, process.pid).await?;
    let run = load_payments(client, &base_url, requests, concurrency, replay).await;
    let after = counters(client, &base_url, process.pid).await?;
    let mut delta = after.since(&before);
    delta.invocations = run.latencies_us.len() as f64;
    Ok((run, delta))
}

impl PhaseDeltas {
    fn minus(&self, before: &PhaseDeltas) -> PhaseDeltas {
        PhaseDeltas {
            invocations: self.invocations - before.invocations,
            round_trips: self.round_trips - before.round_trips,
            bank_calls: self.bank_calls - before.bank_calls,
            request_units: self.request_units - before.request_units,
            commits: self.commits - before.commits,
            committed_jobs: self.committed_jobs - before.committed_jobs,
            syncs: self.syncs - before.syncs,
            lease_waits: self.lease_waits - before.lease_waits,
            takeovers: self.takeovers - before.takeovers,
            server_cpu_us: self.server_cpu_us - before.server_cpu_us,
            server_threads: self
                .server_threads
                .combine(before.server_threads, |a, b| a - b),
            server_io: ThreadIo {
                wal_writer: self.server_io.wal_writer - before.server_io.wal_writer,
                checkpointer: self.server_io.checkpointer - before.server_io.checkpointer,
            },
            generator_cpu_us: self.generator_cpu_us - before.generator_cpu_us,
        }
    }

    fn plus(&self, other: &PhaseDeltas) -> PhaseDeltas {
        let negated = PhaseDeltas::default().minus(other);
        self.minus(&negated)
    }
}

fn round_trips(run: &Run, delta: &PhaseDeltas) -> RoundTrips {
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
        .env(names::PAYMENTS_STORE, "sqlite")
        .env(
            names::PAYMENTS_SQLITE_PATH,
            dir.join(format!("{name}.db")).to_string_lossy(),
        )
        .env(names::LOG_FORMAT, "json")
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
    server_io: ThreadIo,
    generator_cpu_us: f64,
}

impl Accumulated {
    fn add(&mut self, run: Run, delta: PhaseDeltas) {
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
        self.server_io.wal_writer += delta.server_io.wal_writer;
        self.server_io.checkpointer += delta.server_io.checkpointer;
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
            wal_bytes_per_message: per(self.server_io.wal_writer, self.latencies_us.len() as f64),
            checkpoint_bytes_per_message: per(
                self.server_io.checkpointer,
                self.latencies_us.len() as f64,
            ),
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

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Restricts every thread of this process to `cpus` (threads started later inherit the
/// mask of the thread that starts them).
fn pin_this_process(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as in allowed_cpus; sched_setaffinity only reads the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    for task in std::fs::read_dir("/proc/self/task")?.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if unsafe { libc::sched_setaffinity(tid, size, &set) } != 0 {
            let error = std::io::Error::last_os_error();
            // A thread that exited meanwhile is not an error.
            if error.raw_os_error() != Some(libc::ESRCH) {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// One core for `serve`, another for the load generator, if there are two.
fn plan_pinning(disabled: bool) -> Pinning {
    let cpus = allowed_cpus();
    if disabled {
        return Pinning {
            serve_cpu: None,
            generator_cpu: None,
            warning: Some("pinning off (--no-pin): serve and the generator share the cores".into()),
        };
    }
    match cpus.as_slice() {
        [generator, serve, ..] => Pinning {
            serve_cpu: Some(*serve),
            generator_cpu: Some(*generator),
            warning: None,
        },
        _ => Pinning {
            serve_cpu: None,
            generator_cpu: None,
            warning: Some(format!(
                "WARNING: {} core(s) available ({cpus:?}); serve and the load generator cannot be \
                 pinned apart and share them",
                cpus.len()
            )),
        },
    }
}

/// Pins this process (the load generator) for the throughput phases and restores the
/// previous CPUs when dropped.
struct GeneratorPin {
    restore: Vec<usize>,
}

impl GeneratorPin {
    fn new(pinning: &Pinning) -> anyhow::Result<Option<Self>> {
        let Some(cpu) = pinning.generator_cpu else {
            return Ok(None);
        };
        let restore = allowed_cpus();
        pin_this_process(&[cpu]).context("cannot pin the load generator")?;
        Ok(Some(GeneratorPin { restore }))
    }
}

impl Drop for GeneratorPin {
    fn drop(&mut self) {
        let _ = pin_this_process(&self.restore);
    }
}

async fn throughput(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
) -> anyhow::Result<Vec<VariantFigures>> {
    let specs: Vec<ServeSpec> = Variant::ALL
        .iter()
        .map(|variant| {
            let spec = spec(exe, dir, variant.handler())
                .env(names::PAYMENTS_DEV_HANDLER, variant.handler());
            match pinning.serve_cpu {
                Some(cpu) => spec.on_cpus(vec![cpu]),
                None => spec,
            }
        })
        .collect();
    let _pinned = GeneratorPin::new(pinning)?;
    let mut processes = Vec::new();
    for spec in &specs {
        processes.push(ServeProcess::start(spec).await?);
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

    let fresh_acc = || -> Vec<Accumulated> {
        Variant::ALL
            .iter()
            .map(|_| Accumulated::default())
            .collect()
    };
    let (mut fresh, mut duplicate, mut at_store) = (fresh_acc(), fresh_acc(), fresh_acc());
    // The HTTP API is the consumer's alone (the baselines serve only ClaimApproved).
    let consumer = Variant::ALL
        .iter()
        .position(|v| *v == Variant::Consumer)
        .context("the consumer variant is measured")?;
    let (mut http_fresh, mut http_replay) = (Accumulated::default(), Accumulated::default());
    let warm = Arc::new(payment_requests(warmup, "warmup"));
    load_payments(
        client,
        &processes[consumer].base_url(),
        warm.clone(),
        args.concurrency,
        false,
    )
    .await;
    load_payments(
        client,
        &processes[consumer].base_url(),
        warm,
        args.concurrency,
        true,
    )
    .await;
    let mut peak_rss: Vec<Option<u64>> = vec![None; Variant::ALL.len()];
    for round in 0..args.rounds {
        let batches: Vec<(Vec<Bytes>, Vec<Bytes>)> = Variant::ALL
            .iter()
            .map(|v| envelopes(per_round, &format!("{}-{round}", v.handler())))
            .collect();
        let order: Vec<usize> = (0..Variant::ALL.len())
            .map(|i| (i + round) % Variant::ALL.len())
            .collect();
        let mut firsts: Vec<Arc<Vec<Bytes>>> = Vec::new();
        let mut seconds: Vec<Arc<Vec<Bytes>>> = Vec::new();
        for (first, second) in batches {
            firsts.push(Arc::new(first));
            seconds.push(Arc::new(second));
        }
        for phase in 0..3 {
            let bodies = if phase == 0 { &firsts } else { &seconds };
            if phase == 2 {
                // Forget what each process saw: the duplicates now go to the store. The old
                // process must be gone first (it holds the SQLite file's instance lock).
                for (i, process) in std::mem::take(&mut processes).into_iter().enumerate() {
                    peak_rss[i] = peak_rss[i].max(process.peak_rss_kib());
                    process.stop().await;
                    processes.push(ServeProcess::start(&specs[i]).await?);
                }
            }
            let accumulated = match phase {
                0 => &mut fresh,
                1 => &mut duplicate,
                _ => &mut at_store,
            };
            for &i in &order {
                let (run, delta) = measured(
                    client,
                    &processes[i],
                    bodies[i].clone(),
                    args.concurrency,
                    Variant::ALL[i].expected(phase > 0),
                )
                .await?;
                accumulated[i].add(run, delta);
            }
        }
        // Beside the message path, on the same process and store: fresh requests, then
        // the same requests again (retries with the same key).
        let requests = Arc::new(payment_requests(per_round, &format!("http-{round}")));
        for (replay, accumulated) in [(false, &mut http_fresh), (true, &mut http_replay)] {
            let (run, delta) = measured_payments(
                client,
                &processes[consumer],
                requests.clone(),
                args.concurrency,
                replay,
            )
            .await?;
            accumulated.add(run, delta);
        }
    }

    let mut figures = Vec::new();
    for (i, variant) in Variant::ALL.iter().enumerate() {
        figures.push(VariantFigures {
            variant: *variant,
            fresh: std::mem::take(&mut fresh[i]).figures(),
            duplicate: std::mem::take(&mut duplicate[i]).figures(),
            duplicate_at_store: std::mem::take(&mut at_store[i]).figures(),
            http_fresh: (i == consumer).then(|| std::mem::take(&mut http_fresh).figures()),
            http_replay: (i == consumer).then(|| std::mem::take(&mut http_replay).figures()),
            peak_rss_kib: peak_rss[i].max(processes[i].peak_rss_kib()),
        });
    }
    for process in processes {
        process.stop().await;
    }
    Ok(figures)
}

async fn one_phase(
    client: &reqwest::Client,
    process: &ServeProcess,
    bodies: Vec<Bytes>,
    concurrency: usize,
    expected: &'static str,
) -> anyhow::Result<RoundTrips> {
    let (run, delta) = measured(client, process, Arc::new(bodies), concurrency, expected).await?;
    Ok(round_trips(&run, &delta))
}

/// Store work per message for one store, every case: fresh, duplicate from memory,
/// duplicate at the store (a second process, as another instance or a restart would be),
/// business duplicate; and with a payout through a fault-free sandbox bank.
async fn store_round_trips(
    label: &str,
    request_units_are: &str,
    make_spec: impl Fn(&str) -> ServeSpec,
    sample: usize,
    concurrency: usize,
    client: &reqwest::Client,
) -> anyhow::Result<StoreRoundTrips> {
    let bank = FakeBank::start_with(FakeBankSettings::default()).await?;
    let ledger_spec = make_spec("ledger-only");
    let ledger_only = ServeProcess::start(&ledger_spec).await?;
    let sent = messages(sample, "round-trips");
    let first: Vec<Bytes> = sent
        .iter()
        .enumerate()
        .map(|(n, m)| envelope_of(n, m, 1))
        .collect();
    let second: Vec<Bytes> = sent
        .iter()
        .enumerate()
        .map(|(n, m)| envelope_of(n, m, 2))
        .collect();
    // A second message, with its own MessageId, for each of these claims.
    let business: Vec<Bytes> = sent
        .iter()
        .enumerate()
        .map(|(n, m)| {
            let again = Message {
                message_id: Arc::from(uuid::Uuid::new_v4().to_string()),
                ..m.clone()
            };
            envelope_of(n, &again, 1)
        })
        .collect();
    let fresh = one_phase(client, &ledger_only, first.clone(), concurrency, "recorded").await?;
    let duplicate = one_phase(
        client,
        &ledger_only,
        second.clone(),
        concurrency,
        "duplicate",
    )
    .await?;
    ledger_only.stop().await;
    // A process that never saw these messages (SQLite allows one process per file, so the
    // same file after a restart; Cosmos: the same container).
    let other = ServeProcess::start(&ledger_spec).await?;
    let duplicate_at_store =
        one_phase(client, &other, second.clone(), concurrency, "duplicate").await?;
    let business_duplicate = one_phase(
        client,
        &other,
        business.clone(),
        concurrency,
        "business-duplicate",
    )
    .await?;
    other.stop().await;

    let with_bank =
        ServeProcess::start(&make_spec("with-bank").env(names::BANK_API_URL, bank.url())).await?;
    let (first, second) = envelopes(sample, "round-trips-payout");
    let fresh_with_payout =
        one_phase(client, &with_bank, first.clone(), concurrency, "paid").await?;
    let duplicate_with_payout =
        one_phase(client, &with_bank, second.clone(), concurrency, "duplicate").await?;
    with_bank.stop().await;
    Ok(StoreRoundTrips {
        store: label.to_owned(),
        request_units_are: request_units_are.to_owned(),
        fresh,
        duplicate,
        duplicate_at_store,
        business_duplicate,
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
            spec = spec.env(names::BANK_API_URL, url);
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

/// Settings for `serve` processes against a Cosmos endpoint.
fn cosmos_spec(
    base: ServeSpec,
    endpoint: &str,
    key: &str,
    database: &str,
    container: &str,
) -> ServeSpec {
    let mut s = base
        .env(names::PAYMENTS_STORE, "cosmos")
        .env(names::COSMOS_ENDPOINT, endpoint)
        .env(names::COSMOS_KEY, key)
        .env(names::COSMOS_DATABASE, database)
        .env(names::COSMOS_CONTAINER, container);
    s.ready_timeout = Duration::from_secs(60);
    s
}

/// The charges the service records at `COSMOS_TEST_ENDPOINT` (a real emulator or
/// account), in a container of its own that is deleted afterwards.
async fn measured_at_test_endpoint(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
) -> Result<StoreRoundTrips, String> {
    let (Ok(endpoint), Ok(key)) = (
        std::env::var("COSMOS_TEST_ENDPOINT"),
        std::env::var("COSMOS_TEST_KEY"),
    ) else {
        return Err(
            "COSMOS_TEST_ENDPOINT / COSMOS_TEST_KEY not set (a real emulator or account)".into(),
        );
    };
    let database =
        std::env::var("COSMOS_TEST_DATABASE").unwrap_or_else(|_| "claims-payments-test".into());
    let container = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let settings = claims_payments::store::cosmos::CosmosSettings::from_lookup(|name| match name {
        names::COSMOS_ENDPOINT => Some(endpoint.clone()),
        names::COSMOS_KEY => Some(key.clone()),
        names::COSMOS_DATABASE => Some(database.clone()),
        names::COSMOS_CONTAINER => Some(container.clone()),
        _ => None,
    })
    .map_err(|e| format!("COSMOS_TEST_* settings: {e}"))?;
    let cosmos = settings
        .build_client()
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e:#}"))?;
    claims_payments::store::cosmos::provision_with_client(&cosmos, &database, &container)
        .await
        .map_err(|e| format!("cannot provision a bench container at {endpoint}: {e:#}"))?;
    let figures = store_round_trips(
        &format!("cosmos at COSMOS_TEST_ENDPOINT ({endpoint})"),
        "measured: the charges the service recorded there",
        |name| {
            cosmos_spec(
                spec(exe, dir, &format!("rt-measured-{name}")),
                &endpoint,
                &key,
                &database,
                &container,
            )
        },
        args.sample,
        args.concurrency,
        client,
    )
    .await
    .map_err(|e| format!("the measurement at {endpoint} failed: {e:#}"));
    if let Ok(c) = cosmos
        .database_client(database.as_str())
        .container_client(container.as_str(), None)
        .await
    {
        let _ = c.delete(None).await;
    }
    figures
}

/// The issue's targets, from this run's figures.
fn targets(variants: &[VariantFigures], computed: &[ru::CaseCost]) -> Vec<Target> {
    let mut t = Vec::new();
    let get = |v: Variant| variants.iter().find(|f| f.variant == v);
    if let (Some(ours), Some(noop), Some(naive)) = (
        get(Variant::Consumer),
        get(Variant::Noop),
        get(Variant::Naive),
    ) {
        t.push(Target::new(
            "serve CPU per fresh message vs do-nothing",
            "measured",
            ratio(
                ours.fresh.server_cpu_us_per_message,
                noop.fresh.server_cpu_us_per_message,
            ),
            true,
            3.0,
            "x",
        ));
        t.push(Target::new(
            "serve CPU per duplicate from memory vs do-nothing",
            "measured",
            ratio(
                ours.duplicate.server_cpu_us_per_message,
                noop.duplicate.server_cpu_us_per_message,
            ),
            true,
            1.5,
            "x",
        ));
        t.push(Target::new(
            "fresh throughput vs do-nothing",
            "measured",
            ratio(
                ours.fresh.invocations_per_second,
                noop.fresh.invocations_per_second,
            ),
            false,
            0.40,
            "x",
        ));
        t.push(Target::new(
            "duplicate (memory) throughput vs do-nothing",
            "measured",
            ratio(
                ours.duplicate.invocations_per_second,
                noop.duplicate.invocations_per_second,
            ),
            false,
            0.80,
            "x",
        ));
        t.push(Target::new(
            "WAL bytes per fresh ledger-only message",
            "measured",
            ours.fresh.wal_bytes_per_message,
            true,
            4096.0,
            "B",
        ));
        t.push(Target::new(
            "fresh throughput vs naive",
            "measured",
            ratio(
                ours.fresh.invocations_per_second,
                naive.fresh.invocations_per_second,
            ),
            false,
            1.0,
            "x",
        ));
        t.push(Target::new(
            "duplicate (memory) throughput vs naive",
            "measured",
            ratio(
                ours.duplicate.invocations_per_second,
                naive.duplicate.invocations_per_second,
            ),
            false,
            1.5,
            "x",
        ));
    }
    let case = |c: ru::Case| computed.iter().find(|x| x.case == c);
    if let Some(c) = case(ru::Case::FreshLedgerOnly) {
        t.push(Target::new(
            "Cosmos RU per fresh ledger-only message",
            "computed",
            c.request_units,
            true,
            12.0,
            "RU",
        ));
    }
    if let Some(c) = case(ru::Case::FreshWithPayout) {
        t.push(Target::new(
            "Cosmos RU per fresh message with payout",
            "computed",
            c.request_units,
            true,
            33.0,
            "RU",
        ));
    }
    if let Some(c) = case(ru::Case::DuplicateFromMemory) {
        t.push(Target::new(
            "Cosmos round trips per duplicate from memory",
            "measured",
            c.round_trips,
            true,
            0.0,
            "",
        ));
    }
    if let Some(c) = case(ru::Case::DuplicateAtStore) {
        t.push(Target::new(
            "Cosmos round trips per duplicate at the store",
            "measured",
            c.round_trips,
            true,
            2.0,
            "",
        ));
    }
    t
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
        None => {
            std::env::current_exe().context("cannot find the claims-payments-dev executable")?
        }
    };
    let temp = TempDir::new("claims-payments-bench")?;
    let dir = temp.path();
    let client = http_client(args.concurrency)?;
    let pinning = plan_pinning(args.no_pin);

    let variants = throughput(&args, &exe, dir, &client, &pinning).await?;
    let telemetry = Some(telemetry::overhead(&args, &exe, dir, &client, &pinning).await?);
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
            "",
            |name| spec(&exe, dir, &format!("rt-sqlite-{name}")),
            args.sample,
            args.concurrency,
            &client,
        )
        .await?,
    ];
    let (postgres, postgres_skipped) =
        match pg::beside_sqlite(&args, &exe, dir, &client, &pinning).await {
            Ok((comparison, round_trips)) => {
                round_trip_figures.push(round_trips);
                (Some(comparison), None)
            }
            Err(why) => (None, Some(why)),
        };

    let bank = FakeBank::start_with(FakeBankSettings::default()).await?;
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

    let cosmos_computed = if args.skip_cosmos || args.ru_messages == 0 {
        Vec::new()
    } else {
        ru::computed(args.ru_messages)
            .await
            .context("computing the Cosmos request units")?
    };
    let mut cosmos_cost = Vec::new();
    for (kind, case) in [
        ("ledger-only", ru::Case::FreshLedgerOnly),
        ("with payout", ru::Case::FreshWithPayout),
    ] {
        if let Some(c) = cosmos_computed.iter().find(|c| c.case == case) {
            cosmos_cost.push(CostRow {
                kind: format!("{kind}, with the inbox's TTL delete"),
                after: ru::cost_per_million(c.request_units + c.ttl_delete_request_units),
                before: ru::cost_per_million(
                    c.before_request_units + c.before_ttl_delete_request_units,
                ),
            });
            cosmos_cost.push(CostRow {
                kind: format!("{kind}, without it (provisioned: spare RU)"),
                after: ru::cost_per_million(c.request_units),
                before: ru::cost_per_million(c.before_request_units),
            });
        }
    }

    let emulator_path = exe.with_file_name("cosmos-emulator");
    let cosmos_skipped = if args.skip_cosmos {
        Some("--skip-cosmos".to_owned())
    } else if !emulator_path.is_file() {
        Some(format!(
            "no cosmos-emulator next to {} (build it with `cargo build --bins`)",
            exe.display()
        ))
    } else {
        match CosmosEmulator::start(&emulator_path, None).await {
            Err(e) => Some(format!("cosmos-emulator did not start: {e:#}")),
            Ok(emulator) => {
                let figures = store_round_trips(
                    "cosmos (SDK emulator over HTTP)",
                    "the emulator's constant charge, not Azure charges",
                    |name| {
                        cosmos_spec(
                            spec(&exe, dir, &format!("rt-cosmos-{name}")),
                            emulator.setting(names::COSMOS_ENDPOINT).unwrap_or_default(),
                            emulator.setting(names::COSMOS_KEY).unwrap_or_default(),
                            claims_payments::store::cosmos::container::DEFAULT_DATABASE,
                            claims_payments::store::cosmos::container::DEFAULT_CONTAINER,
                        )
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
    let cosmos_measured_skipped = if args.skip_cosmos {
        Some("--skip-cosmos".to_owned())
    } else {
        match measured_at_test_endpoint(&args, &exe, dir, &client).await {
            Ok(figures) => {
                round_trip_figures.push(figures);
                None
            }
            Err(why) => Some(why),
        }
    };

    let targets = targets(&variants, &cosmos_computed);
    Ok(BenchReport {
        build: if cfg!(debug_assertions) {
            "debug".to_owned()
        } else {
            "release".to_owned()
        },
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        pinning,
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
        duplicate_at_store_vs_ceiling: ratio(
            ours.duplicate_at_store.invocations_per_second,
            ceiling.duplicate_at_store.invocations_per_second,
        ),
        fresh_vs_naive: ratio(
            ours.fresh.invocations_per_second,
            naive.fresh.invocations_per_second,
        ),
        duplicate_vs_naive: ratio(
            ours.duplicate.invocations_per_second,
            naive.duplicate.invocations_per_second,
        ),
        duplicate_at_store_vs_naive: ratio(
            ours.duplicate_at_store.invocations_per_second,
            naive.duplicate_at_store.invocations_per_second,
        ),
        variants,
        round_trips: round_trip_figures,
        startup: startup_figures,
        cosmos_skipped,
        cosmos_computed,
        cosmos_cost,
        cosmos_measured_skipped,
        targets,
        telemetry,
        postgres,
        postgres_skipped,
    })
}

fn variant_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Consumer => "consumer",
        Variant::Noop => "noop (ceiling)",
        Variant::Naive => "naive",
    }
}

fn thread_split(t: &ThreadCpu) -> String {
    format!(
        "runtime {:.0}, writer {:.0}, syncer {:.0}, other {:.0}",
        t.runtime, t.sqlite_writer, t.sqlite_syncer, t.other
    )
}

impl BenchReport {
    /// `POST /api/payments` beside the message path, on the consumer's process.
    fn print_http_beside_messages(&self, o: &mut impl std::fmt::Write) {
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
        use std::fmt::Write as _;
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
        self.print_http_beside_messages(&mut o);
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
            comparison.render(&mut o);
        }
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
        for s in &self.startup {
            let _ = writeln!(
                o,
                "start-up ({}): median {:.1} ms (min {:.1}, max {:.1}) over {} starts, exec to first answer on GET /",
                s.configuration, s.median_ms, s.min_ms, s.max_ms, s.starts
            );
        }
        if !self.targets.is_empty() {
            let _ = writeln!(o, "targets (issue 17), this run:");
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

/// N `serve` processes (with a sandbox bank) against one `cosmos-emulator`: each message
/// is delivered once to instance `k mod N`, and a share of them a second time at once to
/// the next instance with DeliveryCount 2, as Service Bus redelivers a message whose lock
/// was lost while the first attempt still runs.
async fn instances_run(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    n: usize,
) -> anyhow::Result<InstancesFigures> {
    let emulator_path = exe.with_file_name("cosmos-emulator");
    ensure!(
        emulator_path.is_file(),
        "no cosmos-emulator next to {} (build it with `cargo build --bins`)",
        exe.display()
    );
    let emulator = CosmosEmulator::start(&emulator_path, None).await?;
    let bank = FakeBank::start_with(FakeBankSettings::default()).await?;
    let mut processes = Vec::new();
    for i in 0..n {
        let s = cosmos_spec(
            spec(exe, dir, &format!("instances-{n}-{i}")),
            emulator.setting(names::COSMOS_ENDPOINT).unwrap_or_default(),
            emulator.setting(names::COSMOS_KEY).unwrap_or_default(),
            claims_payments::store::cosmos::container::DEFAULT_DATABASE,
            claims_payments::store::cosmos::container::DEFAULT_CONTAINER,
        )
        .env(names::BANK_API_URL, bank.url());
        processes.push(ServeProcess::start(&s).await?);
    }
    let urls: Vec<String> = processes.iter().map(ServeProcess::base_url).collect();
    let sent = messages(args.instance_messages, &format!("instances-{n}"));
    let every = if args.redelivery_share > 0.0 {
        (1.0 / args.redelivery_share).round().max(1.0) as usize
    } else {
        usize::MAX
    };
    let mut targets = Vec::new();
    for (k, message) in sent.iter().enumerate() {
        targets.push((k % n, envelope_of(k, message, 1)));
        if k % every == 0 {
            targets.push(((k + 1) % n, envelope_of(k, message, 2)));
        }
    }
    let deliveries = targets.len();
    let mut before = Vec::new();
    for (process, url) in processes.iter().zip(&urls) {
        before.push(counters(client, url, process.pid).await?);
    }
    let run = load_to(
        client,
        &urls,
        Arc::new(targets),
        args.concurrency,
        &["paid", "duplicate"],
    )
    .await;
    let mut total = PhaseDeltas::default();
    for ((process, url), before) in processes.iter().zip(&urls).zip(&before) {
        let after = counters(client, url, process.pid).await?;
        total = total.plus(&after.since(before));
    }
    for process in processes {
        process.stop().await;
    }
    let mut latencies = run.latencies_us.clone();
    latencies.sort_unstable();
    let messages = sent.len().max(1) as f64;
    Ok(InstancesFigures {
        instances: n,
        messages: sent.len(),
        deliveries,
        errors: run.errors,
        unexpected_outcomes: run.unexpected,
        deliveries_per_second: latencies.len() as f64 / run.wall.as_secs_f64().max(1e-9),
        p50_ms: percentile_ms(&latencies, 50),
        p99_ms: percentile_ms(&latencies, 99),
        round_trips_per_message: total.round_trips / messages,
        emulator_request_units_per_message: total.request_units / messages,
        bank_calls_per_message: total.bank_calls / messages,
        met_a_lease_share: per(total.lease_waits + total.takeovers, deliveries as f64),
        lease_waits: total.lease_waits,
        takeovers: total.takeovers,
    })
}

/// `bench --telemetry-only`.
pub async fn run_telemetry_only(args: &BenchArgs) -> anyhow::Result<telemetry::TelemetryOverhead> {
    ensure!(
        args.requests >= 1 && args.rounds >= 1,
        "--requests and --rounds must be at least 1"
    );
    let exe = match &args.exe {
        Some(exe) => exe.clone(),
        None => {
            std::env::current_exe().context("cannot find the claims-payments-dev executable")?
        }
    };
    let temp = TempDir::new("claims-payments-bench")?;
    let client = http_client(args.concurrency)?;
    let pinning = plan_pinning(args.no_pin);
    telemetry::overhead(args, &exe, temp.path(), &client, &pinning).await
}

/// `bench --instances ...`.
pub async fn run_instances(args: &BenchArgs) -> anyhow::Result<InstancesReport> {
    ensure!(
        args.instances.iter().all(|&n| (1..=64).contains(&n)),
        "--instances takes counts between 1 and 64"
    );
    ensure!(
        (0.0..=1.0).contains(&args.redelivery_share),
        "--redelivery-share must be between 0 and 1"
    );
    let exe = match &args.exe {
        Some(exe) => exe.clone(),
        None => {
            std::env::current_exe().context("cannot find the claims-payments-dev executable")?
        }
    };
    let temp = TempDir::new("claims-payments-bench")?;
    let client = http_client(args.concurrency)?;
    let mut runs = Vec::new();
    for &n in &args.instances {
        runs.push(instances_run(args, &exe, temp.path(), &client, n).await?);
    }
    Ok(InstancesReport {
        build: if cfg!(debug_assertions) {
            "debug".to_owned()
        } else {
            "release".to_owned()
        },
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        concurrency: args.concurrency,
        redelivery_share: args.redelivery_share,
        runs,
    })
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

/// The `bench` subcommand: runs and prints the table (or `--json`).
pub async fn main(args: BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let json = args.json;
    if !json && std::io::stderr().is_terminal() {
        eprintln!("benchmarking; this takes a minute or two...");
    }
    if args.telemetry_only {
        let report = tokio::select! {
            report = run_telemetry_only(&args) => report?,
            _ = tokio::signal::ctrl_c() => bail!("interrupted; the serve processes were stopped"),
        };
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            let mut text = String::new();
            report.render_text(&mut text);
            print!("{text}");
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if !args.instances.is_empty() {
        let report = tokio::select! {
            report = run_instances(&args) => report?,
            _ = tokio::signal::ctrl_c() => bail!("interrupted; the serve processes were stopped"),
        };
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render_text());
        }
        return Ok(std::process::ExitCode::SUCCESS);
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
