//! `claims-payments-dev bench`: what the exactly-once guard costs, measured on the full
//! HTTP path against real `serve` processes (each variant in its own process, pinned to
//! one core, the load generator on another), and what a message costs an operator:
//! `consumer` beside `noop` (the ceiling) and `naive` (no atomic guard) on SQLite, fresh
//! messages and duplicates from memory and at the store, interleaved over rounds; store
//! round trips, bank calls and Cosmos request units per message from the handler's
//! `GET /metrics` counters; CPU per message from `/proc`; start-up time; PostgreSQL beside
//! SQLite ([`pg`]); Cosmos request units computed from Microsoft's rules ([`ru`]);
//! `--instances` (N `serve` on one `cosmos-emulator`) and `--telemetry-only` on their own.

mod args;
mod load;
mod pg;
mod proc;
mod report;
mod ru;
mod telemetry;

pub use args::*;
use load::*;
pub use proc::*;
pub use report::*;

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
use claims_payments_settings::names;
use claims_payments_testkit::process::{CosmosEmulator, ServeProcess, ServeSpec, TempDir};

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

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Fresh messages and their duplicates to every variant's process before the timed rounds.
async fn warm_up(
    client: &reqwest::Client,
    processes: &[ServeProcess],
    warmup: usize,
    concurrency: usize,
) {
    for (variant, process) in Variant::ALL.iter().zip(processes) {
        let (fresh, again) = envelopes(warmup, "warmup");
        let url = process.base_url();
        load(
            client,
            &url,
            Arc::new(fresh),
            concurrency,
            variant.expected(false),
        )
        .await;
        load(
            client,
            &url,
            Arc::new(again),
            concurrency,
            variant.expected(true),
        )
        .await;
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
    warm_up(client, &processes, warmup, args.concurrency).await;

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
    let settings = claims_payments_cosmos::CosmosSettings::from_lookup(|name| match name {
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
    claims_payments_cosmos::provision_with_client(&cosmos, &database, &container)
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

/// The targets, from this run's figures.
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

/// The Cosmos parts of a run: request units computed from Microsoft's rules, their cost,
/// the consumer on the `cosmos-emulator` over HTTP and charges measured at
/// `COSMOS_TEST_ENDPOINT` (rows added to `round_trip_figures`).
struct CosmosParts {
    computed: Vec<ru::CaseCost>,
    cost: Vec<CostRow>,
    skipped: Option<String>,
    measured_skipped: Option<String>,
}

async fn cosmos_parts(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    round_trip_figures: &mut Vec<StoreRoundTrips>,
) -> anyhow::Result<CosmosParts> {
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
                            spec(exe, dir, &format!("rt-cosmos-{name}")),
                            emulator.setting(names::COSMOS_ENDPOINT).unwrap_or_default(),
                            emulator.setting(names::COSMOS_KEY).unwrap_or_default(),
                            claims_payments_cosmos::container::DEFAULT_DATABASE,
                            claims_payments_cosmos::container::DEFAULT_CONTAINER,
                        )
                    },
                    args.sample,
                    args.concurrency,
                    client,
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
        match measured_at_test_endpoint(args, exe, dir, client).await {
            Ok(figures) => {
                round_trip_figures.push(figures);
                None
            }
            Err(why) => Some(why),
        }
    };

    Ok(CosmosParts {
        computed: cosmos_computed,
        cost: cosmos_cost,
        skipped: cosmos_skipped,
        measured_skipped: cosmos_measured_skipped,
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

    let CosmosParts {
        computed: cosmos_computed,
        cost: cosmos_cost,
        skipped: cosmos_skipped,
        measured_skipped: cosmos_measured_skipped,
    } = cosmos_parts(&args, &exe, dir, &client, &mut round_trip_figures).await?;

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
            claims_payments_cosmos::container::DEFAULT_DATABASE,
            claims_payments_cosmos::container::DEFAULT_CONTAINER,
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
