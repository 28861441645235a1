//! `claims-payments-dev simulate`: an at-least-once delivery simulator that proves (or
//! disproves) that each approved claim is paid exactly once.
//!
//! It runs the real handler (`claims-payments-dev serve`, a separate process, on a SQLite
//! file; or `--instances N` of them side by side on one Cosmos DB container served by
//! the `cosmos-emulator` dev binary, or on one PostgreSQL server ([`pg`])), a sandbox bank ([`bank`]) and a fake Functions
//! host with a Service Bus queue ([`driver`], [`queue`]) that invokes the handler over
//! the real custom-handler protocol while injecting the faults of the failure matrix:
//! producer re-sends,
//! business duplicates, conflicting payloads, invalid messages, lock expiry while the
//! handler still works, crashes after the store commit, random kills, a slow store and
//! a flaky bank. After the queue is drained it re-drives the dead-letter queue once and
//! reconciles producer, broker, ledger and bank ([`report`]).
//!
//! The seed decides the messages and every fault the driver and the bank inject (see
//! [`chance`]); process crashes land wherever the scheduler puts them.

pub use claims_payments_testkit::{bank, chance};
pub mod driver;
pub mod http_client;
pub mod pg;
pub mod process;
pub mod queue;
pub mod report;
pub mod scenario;

/// The timings `infra/` deploys (main.bicepparam and host.json; a test keeps them
/// equal). The simulator runs with these unless told otherwise, so a guarantee that
/// only holds with short test leases shows up as a failed verdict.
pub mod deployed {
    pub const LEASE_MS: u64 = 120_000;
    pub const INFLIGHT_WAIT_MS: u64 = 15_000;
    pub const BANK_TIMEOUT_MS: u64 = 5_000;
    pub const RETRY_BUDGET_MS: u64 = 60_000;
    pub const MAX_DELIVERY_COUNT: u32 = 10;
    /// host.json `functionTimeout` (00:03:00).
    pub const FUNCTION_TIMEOUT_MS: u64 = 180_000;
    /// `PAYMENTS_POSTGRES_OUTAGE_WAIT_MS`: not set by `infra/`, so the product's default.
    pub const POSTGRES_OUTAGE_WAIT_MS: u64 = 20_000;
}

/// The handler and host timings of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    pub lease_ms: u64,
    pub inflight_wait_ms: u64,
    pub bank_timeout_ms: u64,
    pub retry_budget_ms: u64,
    pub function_timeout_ms: u64,
    /// How long one PostgreSQL call waits for an unreachable server.
    pub postgres_outage_wait_ms: u64,
}

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use bank::{FakeBank, FakeBankSettings};
use claims_payments::seams::env_setting::names;
use claims_payments::seams::store::{Listed, PaymentRecord, Store};
use claims_payments_testkit::process::{self as spawn, CosmosEmulator, ServeSpec, TempDir};
use driver::{DataType, Host, HostSettings, Instances};
use process::Supervisor;
use queue::Queue;
use report::{LedgerRow, Report};
use scenario::ScenarioSettings;

/// Which consumer the handler runs (`PAYMENTS_DEV_HANDLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandlerKind {
    /// The idempotent consumer (the product).
    Consumer,
    /// Check-then-insert without the atomic guard: the usual hand-written baseline,
    /// here to show that the verifier catches double payments.
    Naive,
}

impl HandlerKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            HandlerKind::Consumer => "consumer",
            HandlerKind::Naive => "naive",
        }
    }
}

/// `claims-payments-dev simulate`: every option has a default that makes a chaotic run
/// finish in well under a minute.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Distinct MessageIds the producer sends (re-sends and conflicting copies come on top).
    #[arg(long, default_value_t = 500)]
    pub messages: usize,
    /// Concurrent invocations, like the host's maxConcurrentCalls.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Share of messages the producer sends twice (same MessageId, same bytes).
    #[arg(long, default_value_t = 0.10)]
    pub duplicate_rate: f64,
    /// Share of MessageIds that repeat an earlier claim (same payment, new MessageId).
    #[arg(long, default_value_t = 0.02)]
    pub business_duplicate_rate: f64,
    /// Share of messages re-sent under the same MessageId with a different amount.
    #[arg(long, default_value_t = 0.01)]
    pub conflict_rate: f64,
    /// Share of MessageIds whose body breaks the ClaimApproved contract.
    #[arg(long, default_value_t = 0.01)]
    pub invalid_rate: f64,
    /// Probability that the handler SIGKILLs itself after a store commit, before answering.
    #[arg(long, default_value_t = 0.01)]
    pub crash_rate: f64,
    /// Probability per delivery that the driver SIGKILLs the handler mid-flight.
    #[arg(long, default_value_t = 0.005)]
    pub kill_rate: f64,
    /// Probability per delivery that its lock expires while the handler still works.
    #[arg(long, default_value_t = 0.02)]
    pub lock_expiry_rate: f64,
    /// Probability per bank request of a 503.
    #[arg(long = "bank-5xx-rate", default_value_t = 0.05)]
    pub bank_5xx_rate: f64,
    /// Probability per bank request of a 429 with Retry-After.
    #[arg(long = "bank-429-rate", default_value_t = 0.02)]
    pub bank_429_rate: f64,
    /// Probability per new payout that the bank pays but the answer is lost.
    #[arg(long, default_value_t = 0.03)]
    pub bank_lost_answer_rate: f64,
    /// Share of claims whose payee account is closed (the bank refuses them for good).
    #[arg(long, default_value_t = 0.01)]
    pub bank_reject_rate: f64,
    /// Bank processing time per new payout, uniform 0..=N ms.
    #[arg(long, default_value_t = 3)]
    pub bank_latency_ms: u64,
    /// Extra delay per store operation in the handler (PAYMENTS_FAULT_STORE_DELAY_MS).
    #[arg(long, default_value_t = 0)]
    pub slow_store_ms: u64,
    /// The queue's MaxDeliveryCount (default: the deployed value).
    #[arg(long, default_value_t = deployed::MAX_DELIVERY_COUNT)]
    pub max_delivery_count: u32,
    /// Probability per new payout that the handler is killed while the bank holds the
    /// request (after the bank paid): a plain crash mid-payout.
    #[arg(long, default_value_t = 0.01)]
    pub kill_mid_payout_rate: f64,
    /// Share of the messages killed mid-payout that are dead-lettered at once and never
    /// re-driven: orphaned payouts that only `reconcile` settles.
    #[arg(long, default_value_t = 0.5)]
    pub orphan_rate: f64,
    /// The bank forgets an Idempotency-Key this long after first seeing it, and the
    /// handler is told so (BANK_KEY_WINDOW_MS): payouts still unfinished then become
    /// `needs_reconciliation`. 0: the bank never forgets (24 h window for the handler).
    #[arg(long, default_value_t = 30_000)]
    pub bank_key_window_ms: u64,
    /// Probability per lookup (`GET /payments?reference=`) of a 503.
    #[arg(long = "bank-lookup-5xx-rate", default_value_t = 0.2)]
    pub bank_lookup_5xx_rate: f64,
    /// Share of claims (with one payload) that an HTTP client also pays through
    /// `POST /api/payments` while their messages are delivered: retries, double submits,
    /// replays, key reuse with another body, the same key from another tenant.
    #[arg(long, default_value_t = 0.1)]
    pub http_share: f64,
    /// How often `claims-payments reconcile` runs while deliveries continue (it also
    /// runs at the end until nothing is left unknown); 0: only at the end.
    #[arg(long, default_value_t = 5)]
    pub reconcile_every_secs: u64,
    /// Seed for the messages and the injected faults (random if not given; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// No bank: the handler only records payments in the ledger.
    #[arg(long)]
    pub ledger_only: bool,
    /// The consumer under test.
    #[arg(long, value_enum, default_value_t = HandlerKind::Consumer)]
    pub handler: HandlerKind,
    /// SQLite file for the ledger (must not exist yet); default: a temporary file.
    #[arg(long)]
    pub sqlite_path: Option<PathBuf>,
    /// How the trigger passes the body (function.json dataType).
    #[arg(long, value_enum, default_value_t = DataType::Binary)]
    pub data_type: DataType,
    /// Keep the handler's stdout/stderr in this file (default: a temporary file).
    #[arg(long)]
    pub serve_log: Option<PathBuf>,
    /// Run with short test timings (lease 3 s, in-flight wait 1 s, bank timeout 300 ms,
    /// retry budget 1.5 s, function timeout 30 s) instead of the deployed ones.
    #[arg(long)]
    pub short_timings: bool,
    /// The handler's LEASE_MS (default: the deployed value, see [`deployed`]).
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// The handler's INFLIGHT_WAIT_MS (default: deployed).
    #[arg(long)]
    pub inflight_wait_ms: Option<u64>,
    /// The handler's BANK_TIMEOUT_MS (default: deployed).
    #[arg(long)]
    pub bank_timeout_ms: Option<u64>,
    /// The handler's RETRY_BUDGET_MS (default: deployed).
    #[arg(long)]
    pub retry_budget_ms: Option<u64>,
    /// The host's functionTimeout; a longer invocation fails and the handler is
    /// restarted (default: host.json's).
    #[arg(long)]
    pub function_timeout_ms: Option<u64>,
    /// Give up (error, exit 1) if the queue is not drained within this time.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    /// Handler instances (`serve` processes side by side on one store) competing for
    /// the queue's messages, each restarted on its own. More than one needs the Cosmos
    /// or the PostgreSQL store: SQLite is one instance's local file.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// The ledger's store (default: sqlite with one instance, cosmos with more).
    /// cosmos runs the `cosmos-emulator` dev binary that sits next to this executable;
    /// postgres a throwaway PostgreSQL server (or the database --postgres-url names).
    #[arg(long, value_enum)]
    pub store: Option<SimStore>,
    /// With --store postgres: an empty database to use instead of a throwaway server.
    #[arg(long, env = "PAYMENTS_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// With --store postgres: restart the server (`pg_ctl restart -m immediate`, as a
    /// Flexible Server failover) once this share of the messages has settled (0 < f < 1;
    /// repeat the option for more restarts). Needs the throwaway server.
    #[arg(long, value_name = "FRACTION")]
    pub restart_store_at: Vec<f64>,
    /// The claims-payments executable to run as the handler (default: this one).
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
    /// The cosmos-emulator executable (default: the one next to the handler's).
    #[arg(long, hide = true)]
    pub cosmos_emulator: Option<PathBuf>,
}

/// Where the simulated handlers keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimStore {
    /// A SQLite file (one instance only).
    Sqlite,
    /// A Cosmos DB container served by the `cosmos-emulator` dev binary over HTTP.
    Cosmos,
    /// A PostgreSQL database (a throwaway server, or `--postgres-url`).
    Postgres,
}

impl SimStore {
    pub fn as_str(&self) -> &'static str {
        match self {
            SimStore::Sqlite => "sqlite",
            SimStore::Cosmos => "cosmos",
            SimStore::Postgres => "postgres",
        }
    }
}

impl Default for SimulateArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: SimulateArgs,
        }
        Wrapper::parse_from(["simulate"]).args
    }
}

/// The simulator's options are its CLI arguments; library callers (tests) start from
/// `SimulateArgs::default()`, which holds the same defaults as the command line.
pub type SimulateOptions = SimulateArgs;

fn rate(name: &str, value: f64) -> anyhow::Result<()> {
    ensure!(
        (0.0..=1.0).contains(&value),
        "--{name} must be between 0 and 1, got {value}"
    );
    Ok(())
}

impl SimulateArgs {
    /// The deployed timings, or the short ones, with any explicit option on top.
    pub fn timings(&self) -> Timings {
        let base = if self.short_timings {
            Timings {
                lease_ms: 3_000,
                inflight_wait_ms: 1_000,
                bank_timeout_ms: 300,
                retry_budget_ms: 1_500,
                function_timeout_ms: 30_000,
                // Within the lease after the bank's budget (the handler checks it).
                postgres_outage_wait_ms: 1_000,
            }
        } else {
            Timings {
                lease_ms: deployed::LEASE_MS,
                inflight_wait_ms: deployed::INFLIGHT_WAIT_MS,
                bank_timeout_ms: deployed::BANK_TIMEOUT_MS,
                retry_budget_ms: deployed::RETRY_BUDGET_MS,
                function_timeout_ms: deployed::FUNCTION_TIMEOUT_MS,
                postgres_outage_wait_ms: deployed::POSTGRES_OUTAGE_WAIT_MS,
            }
        };
        Timings {
            lease_ms: self.lease_ms.unwrap_or(base.lease_ms),
            inflight_wait_ms: self.inflight_wait_ms.unwrap_or(base.inflight_wait_ms),
            bank_timeout_ms: self.bank_timeout_ms.unwrap_or(base.bank_timeout_ms),
            retry_budget_ms: self.retry_budget_ms.unwrap_or(base.retry_budget_ms),
            function_timeout_ms: self.function_timeout_ms.unwrap_or(base.function_timeout_ms),
            postgres_outage_wait_ms: base.postgres_outage_wait_ms,
        }
    }

    /// The store the run uses: `--store`, or SQLite for one instance and Cosmos for more.
    pub fn store_kind(&self) -> SimStore {
        self.store.unwrap_or(if self.instances > 1 {
            SimStore::Cosmos
        } else {
            SimStore::Sqlite
        })
    }

    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.messages >= 1, "--messages must be at least 1");
        ensure!(
            (1..=16).contains(&self.instances),
            "--instances must be between 1 and 16"
        );
        ensure!(
            self.instances == 1 || self.store_kind() != SimStore::Sqlite,
            "--instances {} needs --store cosmos or --store postgres: a SQLite ledger is one instance's local file (and serve holds an exclusive lock on it)",
            self.instances
        );
        ensure!(
            self.sqlite_path.is_none() || self.store_kind() == SimStore::Sqlite,
            "--sqlite-path is for the SQLite store; the Cosmos store lives in the emulator, the PostgreSQL one in its server"
        );
        if !self.restart_store_at.is_empty() {
            ensure!(
                self.store_kind() == SimStore::Postgres,
                "--restart-store-at restarts a PostgreSQL server: it needs --store postgres"
            );
            ensure!(
                self.postgres_url.is_none(),
                "--restart-store-at restarts the simulator's own throwaway server, not the one --postgres-url / PAYMENTS_POSTGRES_URL names (unset it)"
            );
            for &at in &self.restart_store_at {
                ensure!(
                    at > 0.0 && at < 1.0,
                    "--restart-store-at must be between 0 and 1 (exclusive), got {at}"
                );
            }
        }
        ensure!(
            (1..=512).contains(&self.concurrency),
            "--concurrency must be between 1 and 512"
        );
        ensure!(
            self.max_delivery_count >= 1,
            "--max-delivery-count must be at least 1"
        );
        for (name, value) in [
            ("duplicate-rate", self.duplicate_rate),
            ("business-duplicate-rate", self.business_duplicate_rate),
            ("conflict-rate", self.conflict_rate),
            ("invalid-rate", self.invalid_rate),
            ("crash-rate", self.crash_rate),
            ("kill-rate", self.kill_rate),
            ("lock-expiry-rate", self.lock_expiry_rate),
            ("kill-mid-payout-rate", self.kill_mid_payout_rate),
            ("orphan-rate", self.orphan_rate),
            ("http-share", self.http_share),
            ("bank-lookup-5xx-rate", self.bank_lookup_5xx_rate),
            ("bank-5xx-rate", self.bank_5xx_rate),
            ("bank-429-rate", self.bank_429_rate),
            ("bank-lost-answer-rate", self.bank_lost_answer_rate),
            ("bank-reject-rate", self.bank_reject_rate),
        ] {
            rate(name, value)?;
        }
        ensure!(
            self.invalid_rate + self.business_duplicate_rate <= 1.0,
            "--invalid-rate plus --business-duplicate-rate must not exceed 1"
        );
        Ok(())
    }

    fn faults(&self) -> BTreeMap<String, String> {
        let mut f = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            f.insert(k.to_owned(), v);
        };
        put("duplicate", self.duplicate_rate.to_string());
        put(
            "business-duplicate",
            self.business_duplicate_rate.to_string(),
        );
        put("conflict", self.conflict_rate.to_string());
        put("invalid", self.invalid_rate.to_string());
        put("crash", self.crash_rate.to_string());
        put("kill", self.kill_rate.to_string());
        if !self.ledger_only {
            put("kill-mid-payout", self.kill_mid_payout_rate.to_string());
            put("orphan", self.orphan_rate.to_string());
            put("bank-key-window-ms", self.bank_key_window_ms.to_string());
            put("bank-lookup-5xx", self.bank_lookup_5xx_rate.to_string());
        }
        put("lock-expiry", self.lock_expiry_rate.to_string());
        put("http-share", self.http_share.to_string());
        put("slow-store-ms", self.slow_store_ms.to_string());
        if !self.restart_store_at.is_empty() {
            let at: Vec<String> = self.restart_store_at.iter().map(f64::to_string).collect();
            put("restart-store-at", at.join(" "));
        }
        if !self.ledger_only {
            put("bank-5xx", self.bank_5xx_rate.to_string());
            put("bank-429", self.bank_429_rate.to_string());
            put("bank-lost-answer", self.bank_lost_answer_rate.to_string());
            put("bank-reject", self.bank_reject_rate.to_string());
        }
        f
    }
}

/// How the operator's commands run: the executable and the run's store environment.
struct OperatorEnv {
    exe: PathBuf,
    env: Vec<(String, String)>,
}

/// `claims-payments reconcile --json`, run as an operator would: a separate process on
/// the same ledger, while `serve` runs and after it stopped.
#[derive(Debug, Clone)]
struct ReconcileCommand {
    exe: PathBuf,
    env: Vec<(String, String)>,
}

impl ReconcileCommand {
    async fn run(
        &self,
        older_than: Option<&str>,
    ) -> anyhow::Result<claims_payments::seams::reconcile::Summary> {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.arg("reconcile").arg("--json");
        if let Some(age) = older_than {
            cmd.args(["--older-than", age]);
        }
        for name in spawn::controlled_env() {
            cmd.env_remove(name);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(names::LOG_FORMAT, "text")
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
    async fn repeat(
        self,
        every: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<claims_payments::seams::reconcile::Summary> {
        let mut runs = Vec::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => return runs,
            }
            match self.run(None).await {
                Ok(summary) => runs.push(summary),
                Err(e) => tracing::warn!(error = %e, "reconcile during deliveries failed"),
            }
        }
    }

    /// After the queue settled: reconciles until nothing is left unknown (orphaned
    /// payouts wait for their lease to run out; a lookup may fail), within a bound.
    async fn settle_at_end(
        &self,
        ledger: &Ledger,
        limit: usize,
        runs_during: Vec<claims_payments::seams::reconcile::Summary>,
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
            runs_at_end.push(self.run(Some("0s")).await?);
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
}

/// Converts the store's payment records into the verifier's rows.
/// The listed payments as the verifier reads them; a row that does not read fails the
/// verification, naming it.
pub fn ledger_rows(records: &[Listed<PaymentRecord>]) -> anyhow::Result<Vec<LedgerRow>> {
    records
        .iter()
        .map(|r| {
            let r = r
                .as_ref()
                .map_err(|corrupt| anyhow::anyhow!("a payment does not read: {corrupt}"))?;
            Ok(LedgerRow {
                claim_id: r.claim_id.to_string(),
                // The stored string (scale included), as the verifier always read it.
                amount: r.money.amount_string().parse().with_context(|| {
                    format!(
                        "ledger amount {:?} is not a decimal",
                        r.money.amount_string()
                    )
                })?,
                currency: r.money.currency().code().to_owned(),
                status: r.status.as_str().to_owned(),
                message_id: r.message_id.to_string(),
                bank_payment_id: r.bank_payment_id.clone(),
            })
        })
        .collect()
}

/// The store the handlers share, read for the verdict.
enum Ledger {
    Sqlite(PathBuf),
    Cosmos(Box<claims_payments::seams::store::cosmos::CosmosStore>),
    Postgres(Box<claims_payments::seams::store::postgres::PostgresStore>),
}

impl Ledger {
    /// Connects to the Cosmos container that `env` (the emulator's lines) names.
    async fn cosmos(env: &[(String, String)]) -> anyhow::Result<Ledger> {
        let settings = claims_payments::seams::store::cosmos::CosmosSettings::from_lookup(|name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map_err(|e| anyhow::anyhow!("invalid Cosmos setting {e}"))?;
        let store = claims_payments::seams::store::cosmos::CosmosStore::connect(
            &settings,
            Duration::from_secs(30 * 86_400),
        )
        .await
        .context("cannot connect to the emulator's Cosmos container")?;
        Ok(Ledger::Cosmos(Box::new(store)))
    }

    /// Every payment, as the verifier reads them: the listing, and for Cosmos a point
    /// read of each of `claims` the listing did not return (a cross-partition query is
    /// the emulator's model; a point read is the store's own path). Returns the rows
    /// and how many only the point reads found.
    async fn all_rows(
        &self,
        limit: usize,
        claims: &[String],
    ) -> anyhow::Result<(Vec<LedgerRow>, usize)> {
        let mut rows = self.rows(limit).await?;
        let Ledger::Cosmos(store) = self else {
            return Ok((rows, 0));
        };
        let listed: std::collections::HashSet<String> = rows
            .iter()
            .filter_map(|r| claims_payments::ClaimId::parse(&r.claim_id).ok())
            .map(|c| c.to_string())
            .collect();
        let mut found = Vec::new();
        for claim in claims {
            let Ok(id) = claims_payments::ClaimId::parse(claim) else {
                continue;
            };
            if listed.contains(&id.to_string()) {
                continue;
            }
            let read = store
                .payment(id, claims_payments::Purpose::Payout)
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the payment of claim {id}: {e}"))?;
            if let Some(payment) = read {
                found.push(Ok(payment.record));
            }
        }
        let missed = found.len();
        rows.extend(ledger_rows(&found)?);
        Ok((rows, missed))
    }

    /// At most `limit` payments, as the verifier reads them.
    async fn rows(&self, limit: usize) -> anyhow::Result<Vec<LedgerRow>> {
        match self {
            Ledger::Sqlite(path) => read_sqlite_ledger(path, limit).await,
            Ledger::Cosmos(store) => {
                let records = store
                    .list_payments(limit)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot list payments in Cosmos: {e}"))?;
                ledger_rows(&records)
            }
            Ledger::Postgres(store) => {
                // A restart of the server may have cut the pool's connections.
                let mut tries = 0;
                loop {
                    tries += 1;
                    match store.list_payments(limit).await {
                        Ok(records) => return ledger_rows(&records),
                        Err(e) if tries < 10 => {
                            tracing::debug!(error = %e, "listing payments in PostgreSQL; trying again");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Err(e) => bail!("cannot list payments in PostgreSQL: {e}"),
                    }
                }
            }
        }
    }
}

/// Reads every payment from a SQLite ledger file.
pub async fn read_sqlite_ledger(
    path: &std::path::Path,
    limit: usize,
) -> anyhow::Result<Vec<LedgerRow>> {
    let store = claims_payments::seams::store::sqlite::SqliteStore::open(path)
        .with_context(|| format!("cannot open the ledger {}", path.display()))?;
    let records = store
        .list_payments(limit)
        .await
        .map_err(|e| anyhow::anyhow!("cannot list payments: {e}"))?;
    ledger_rows(&records)
}

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

fn median_ms(micros: &[u64]) -> f64 {
    if micros.is_empty() {
        return 0.0;
    }
    let mut v = micros.to_vec();
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

/// Runs one simulation and reconciles it. Errors mean the run could not be carried
/// out (the handler does not start, the queue does not drain in time); a run that
/// completes returns a report whose verdict may be yes or no.
pub async fn run(opts: SimulateOptions) -> anyhow::Result<Report> {
    run_with_progress(opts, false).await
}

/// The store every instance and every `reconcile` run share: its settings for `serve`,
/// the ledger the verdict reads, and the emulator or server that must outlive the run.
struct SimLedger {
    env: Vec<(String, String)>,
    ledger: Ledger,
    emulator: Option<CosmosEmulator>,
    postgres: Option<pg::SimPostgres>,
}

async fn open_store(
    opts: &SimulateOptions,
    store: SimStore,
    temp: &TempDir,
    exe: &std::path::Path,
) -> anyhow::Result<SimLedger> {
    let mut store_env: Vec<(String, String)> = Vec::new();
    let mut emulator = None;
    let mut postgres = None;
    let ledger = match store {
        SimStore::Sqlite => {
            let db = match &opts.sqlite_path {
                Some(path) => {
                    ensure!(
                        !path.exists(),
                        "{} exists; the simulator needs a new ledger to reconcile against",
                        path.display()
                    );
                    path.clone()
                }
                None => temp.path().join("payments.db"),
            };
            store_env.push((names::PAYMENTS_STORE.to_owned(), "sqlite".to_owned()));
            store_env.push((
                names::PAYMENTS_SQLITE_PATH.to_owned(),
                db.to_string_lossy().into_owned(),
            ));
            Ledger::Sqlite(db)
        }
        SimStore::Cosmos => {
            let path = opts
                .cosmos_emulator
                .clone()
                .unwrap_or_else(|| exe.with_file_name("cosmos-emulator"));
            let started =
                CosmosEmulator::start(&path, Some(&temp.path().join("cosmos-emulator.log")))
                    .await?;
            store_env.extend(started.env.iter().cloned());
            let ledger = Ledger::cosmos(&store_env).await?;
            emulator = Some(started);
            ledger
        }
        SimStore::Postgres => {
            let pg = pg::SimPostgres::start(opts.postgres_url.as_deref()).await?;
            ensure!(
                opts.restart_store_at.is_empty() || pg.throwaway(),
                "--restart-store-at needs the simulator's own server"
            );
            store_env.extend(pg.env());
            let ledger = Ledger::Postgres(Box::new(pg.ledger().await?));
            postgres = Some(pg);
            ledger
        }
    };

    Ok(SimLedger {
        env: store_env,
        ledger,
        emulator,
        postgres,
    })
}

/// The sandbox bank with the run's faults (none in ledger-only mode).
async fn start_bank(
    opts: &SimulateOptions,
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

/// How every instance's `serve` starts: the store, the timings, the faults, the bank.
fn serve_spec(
    opts: &SimulateOptions,
    exe: &std::path::Path,
    store_env: &[(String, String)],
    timings: Timings,
    bank: Option<&FakeBank>,
    store: SimStore,
) -> ServeSpec {
    let mut spec = ServeSpec::new(exe);
    for (key, value) in store_env {
        spec = spec.env(key, value.clone());
    }
    spec = spec
        .env(names::BANK_TIMEOUT_MS, timings.bank_timeout_ms.to_string())
        .env(names::RETRY_BUDGET_MS, timings.retry_budget_ms.to_string())
        .env(names::LEASE_MS, timings.lease_ms.to_string())
        .env(
            names::PAYMENTS_POSTGRES_OUTAGE_WAIT_MS,
            timings.postgres_outage_wait_ms.to_string(),
        )
        .env(
            names::INFLIGHT_WAIT_MS,
            timings.inflight_wait_ms.to_string(),
        )
        .env(
            names::MAX_DELIVERY_COUNT,
            opts.max_delivery_count.to_string(),
        )
        .env(names::LOG_FORMAT, "json")
        // The per-instance takeover count reads the consumer's info lines.
        .env("RUST_LOG", serve_log_filter(std::env::var("RUST_LOG").ok()))
        .env("RUST_LIB_BACKTRACE", "0")
        .env(names::PAYMENTS_DEV_HANDLER, opts.handler.as_str())
        .env(
            names::PAYMENTS_FAULT_CRASH_AFTER_COMMIT,
            opts.crash_rate.to_string(),
        )
        .env(
            names::PAYMENTS_FAULT_STORE_DELAY_MS,
            opts.slow_store_ms.to_string(),
        );
    if let Some(bank) = bank {
        spec = spec.env(names::BANK_API_URL, bank.url());
        if opts.bank_key_window_ms > 0 {
            spec = spec.env(
                names::BANK_KEY_WINDOW_MS,
                opts.bank_key_window_ms.to_string(),
            );
        }
    }
    if store != SimStore::Sqlite {
        // Connecting checks the container or the schema first; slower than a file.
        spec.ready_timeout = Duration::from_secs(60);
    }
    spec
}

/// One supervisor per instance, each with its own bank client name and log file (and
/// where its log started, for the takeover count).
async fn start_instances(
    spec: &ServeSpec,
    bank: Option<&FakeBank>,
    store: SimStore,
    instances: usize,
    serve_log: &std::path::Path,
    max_restarts: u64,
) -> anyhow::Result<(Vec<Arc<Supervisor>>, Vec<(PathBuf, u64)>)> {
    let mut supervisors = Vec::with_capacity(instances);
    let mut logs = Vec::with_capacity(instances);
    for i in 0..instances {
        let mut spec = spec.clone();
        if let Some(bank) = bank {
            // The bank knows each process by its URL, so a mid-payout fault can kill
            // exactly the process that sent the request (see `mid_payout_client`).
            spec.env.retain(|(k, _)| k != names::BANK_API_URL);
            spec = spec.env(
                names::BANK_API_URL,
                bank.client_url(&format!(
                    "instance-{}-gen-{}",
                    i + 1,
                    process::GENERATION_TOKEN
                )),
            );
        }
        if store != SimStore::Sqlite {
            // What Azure sets on each instance (and the guard against a SQLite store).
            spec = spec.env(
                names::WEBSITE_INSTANCE_ID,
                format!("sim-instance-{}", i + 1),
            );
        }
        let log = instance_log(serve_log, i, instances);
        let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        spec.log = Some(log.clone());
        logs.push((log, log_from));
        let supervisor = Supervisor::start(spec, max_restarts)
            .await
            .with_context(|| format!("instance {} did not start", i + 1))?;
        supervisors.push(Arc::new(supervisor));
    }
    Ok((supervisors, logs))
}

/// The bank's mid-payout fault: the process that sent the request dies while the bank
/// holds it, and some of those messages are orphaned (dead-lettered, never re-driven).
fn wire_mid_payout(
    bank: Option<&FakeBank>,
    supervisors: &[Arc<Supervisor>],
    queue: &Arc<Queue>,
    orphan_rate: f64,
    seed: u64,
) {
    if let Some(bank) = bank {
        let supervisors: Vec<_> = supervisors.iter().map(Arc::downgrade).collect();
        let queue = queue.clone();
        bank.on_mid_payout(Arc::new(move |key: &str, client: Option<&str>| {
            if chance::hit(orphan_rate, seed, "orphan", key.as_bytes(), 0) {
                if let Some((_, claim)) = key.rsplit_once("claim-payment-") {
                    queue.orphan_claim(claim);
                }
            }
            // The process that sent the request dies while the bank holds it. A
            // request from `reconcile` (no client name) kills nobody.
            if let Some((instance, generation)) = client.and_then(mid_payout_client) {
                if let Some(supervisor) = supervisors.get(instance).and_then(|s| s.upgrade()) {
                    supervisor.kill(generation, process::KillReason::MidPayout);
                }
            }
        }));
    }
}

/// How the handler processes fared, in all and per instance.
fn process_summaries(
    supervisors: &[Arc<Supervisor>],
    host_stats: &driver::HostStats,
    logs: &[(PathBuf, u64)],
) -> (report::ProcessSummary, Vec<report::InstanceSummary>) {
    let instances = supervisors.len();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut processes = report::ProcessSummary::default();
    let mut startups = Vec::new();
    let mut per_instance = Vec::with_capacity(instances);
    for (i, supervisor) in supervisors.iter().enumerate() {
        let stats = &supervisor.stats;
        let seen = host_stats.instances.get(i).cloned().unwrap_or_default();
        let summary = report::InstanceSummary {
            instance: i + 1,
            starts: load(&stats.starts),
            deliveries: seen.deliveries,
            completed: seen.completed,
            failed: seen.failed,
            cross_instance_redeliveries: seen.cross_instance_redeliveries,
            lock_expiries: seen.lock_expiries,
            takeovers: count_takeovers(&logs[i].0, logs[i].1),
            crash_after_commit: load(&stats.self_kills),
            chaos_kills: load(&stats.chaos_kills),
            mid_payout_kills: load(&stats.mid_payout_kills),
            timeout_restarts: load(&stats.timeout_kills),
            unexpected_exits: load(&stats.unexpected_exits),
            outcomes: seen.outcomes,
        };
        processes.starts += summary.starts;
        processes.crash_after_commit += summary.crash_after_commit;
        processes.chaos_kills += summary.chaos_kills;
        processes.mid_payout_kills += summary.mid_payout_kills;
        processes.timeout_restarts += summary.timeout_restarts;
        processes.unexpected_exits += summary.unexpected_exits;
        processes.host_stops += load(&stats.host_stops);
        processes.failed_starts += load(&stats.failed_starts);
        if let Ok(v) = stats.unexpected_exit_statuses.lock() {
            processes
                .unexpected_exit_statuses
                .extend(v.iter().map(|status| match instances {
                    1 => status.clone(),
                    _ => format!("instance {}: {status}", i + 1),
                }));
        }
        if let Ok(v) = stats.startup_micros.lock() {
            startups.extend(v.iter().copied());
        }
        per_instance.push(summary);
    }
    processes.startup_median_ms = median_ms(&startups);
    (processes, per_instance)
}

/// The report's one-line description of the store and the bank.
fn mode(opts: &SimulateOptions, store: SimStore, with_bank: bool, instances: usize) -> String {
    let store_name = match store {
        SimStore::Sqlite => "SQLite ledger",
        SimStore::Cosmos => "Cosmos DB ledger (cosmos-emulator)",
        SimStore::Postgres if opts.postgres_url.is_some() => "PostgreSQL ledger (--postgres-url)",
        SimStore::Postgres => "PostgreSQL ledger (throwaway server)",
    };
    let mut mode = if with_bank {
        format!("{store_name} + sandbox bank")
    } else {
        format!("{store_name} only (no bank)")
    };
    if instances > 1 {
        mode.push_str(&format!(", {instances} instances"));
    }
    mode
}

/// What the producer sends, from the options.
fn scenario_settings(opts: &SimulateOptions, seed: u64) -> ScenarioSettings {
    let with_bank = !opts.ledger_only;
    ScenarioSettings {
        messages: opts.messages,
        duplicate_rate: opts.duplicate_rate,
        business_duplicate_rate: opts.business_duplicate_rate,
        conflict_rate: opts.conflict_rate,
        invalid_rate: opts.invalid_rate,
        closed_account_rate: if with_bank {
            opts.bank_reject_rate
        } else {
            0.0
        },
        allow_non_utf8: opts.data_type == DataType::Binary,
        race_window: opts.concurrency * opts.instances,
        seed,
    }
}

/// The simulated Functions host over the queue and the instances.
fn start_host(
    opts: &SimulateOptions,
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

/// The operator re-drives the dead-letter queue once, through `dead-letters resubmit
/// --all --wait` against the testkit's Service Bus stand-in holding the run's dead
/// letters; then the host and every instance stop. Returns the command's verdicts (the
/// outcomes after the re-drive are read from the queue afterwards, see
/// [`report::dead_letter_tool`]).
async fn redrive_and_stop(
    host: &Arc<Host>,
    queue: &Queue,
    progress: &ProgressBar,
    supervisors: &[Arc<Supervisor>],
    command: &OperatorEnv,
    deadline: Instant,
) -> anyhow::Result<Option<report::ToolVerdicts>> {
    let dead = queue.dead_letters();
    let verdicts = if dead.is_empty() {
        None
    } else {
        progress.set_message("(dead-letter re-drive through dead-letters resubmit)");
        let verdicts = resubmit_through_the_command(queue, &dead, command).await?;
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

/// The queue's duplicate-detection window in the simulation: the run's dead letters are
/// older than it, except a producer's re-sends of one MessageId, which `--wait` sends
/// one window apart.
const SIM_DUPLICATE_WINDOW: Duration = Duration::from_millis(200);
const SIM_QUEUE: &str = "claim-approved";

/// Puts `dead` into a Service Bus stand-in's dead-letter queue, runs `dead-letters
/// resubmit --all --wait --json` (a separate process, with the run's store) against it,
/// and sends what reached the stand-in's queue to the simulated queue.
async fn resubmit_through_the_command(
    queue: &Queue,
    dead: &[(usize, queue::Message, u32, queue::Failure)],
    command: &OperatorEnv,
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
        let mut cmd = tokio::process::Command::new(&command.exe);
        cmd.arg("dead-letters").args(args);
        for name in spawn::controlled_env() {
            cmd.env_remove(name);
        }
        cmd.envs(command.env.iter().map(|(k, v)| (k, v)))
            .env(names::SERVICEBUS_ENDPOINT, bus.endpoint())
            .env(names::CLAIM_APPROVED_QUEUE, SIM_QUEUE)
            .env(
                names::SERVICEBUS_DUPLICATE_WINDOW_MS,
                SIM_DUPLICATE_WINDOW.as_millis().to_string(),
            )
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
    let out = run(&["resubmit", "--all", "--wait", "--json"]).await?;
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
    // the host delivers from: each to the dead letter it copies (MessageId and body).
    let mut unsent: Vec<&(usize, queue::Message, u32, queue::Failure)> = dead.iter().collect();
    for m in bus.take_active() {
        if let Some(at) = unsent
            .iter()
            .position(|(_, d, _, _)| *d.message_id == *m.message_id && *d.body == *m.body)
        {
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

/// The executable the handler instances and `reconcile` run.
fn handler_exe(opts: &SimulateOptions) -> anyhow::Result<PathBuf> {
    match &opts.exe {
        Some(exe) => Ok(exe.clone()),
        None => std::env::current_exe().context("cannot find the claims-payments-dev executable"),
    }
}

/// `POST /api/payments` clients mixed with the deliveries.
fn spawn_http_clients(
    opts: &SimulateOptions,
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

/// `reconcile` every `every_secs` while deliveries continue (none for 0).
fn spawn_reconcile_during(
    reconciler: Option<&ReconcileCommand>,
    every_secs: u64,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<Vec<claims_payments::seams::reconcile::Summary>>> {
    match (reconciler, every_secs) {
        (Some(r), secs) if secs > 0 => Some(tokio::spawn(
            r.clone().repeat(Duration::from_secs(secs), stopped),
        )),
        _ => None,
    }
}

async fn run_with_progress(opts: SimulateOptions, show_progress: bool) -> anyhow::Result<Report> {
    opts.validate()?;
    let started = Instant::now();
    let seed = opts.seed.unwrap_or_else(rand::random);
    let timings = opts.timings();
    let with_bank = !opts.ledger_only;
    let store = opts.store_kind();
    let instances = opts.instances;

    let plan = scenario::plan(&scenario_settings(&opts, seed));

    let temp = TempDir::new("claims-payments-sim").context("cannot create a temp dir")?;
    let exe = handler_exe(&opts)?;

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
    // An operator's reconcile, as a separate process, while deliveries continue.
    let reconciler = with_bank.then(|| ReconcileCommand {
        exe: exe.clone(),
        env: reconcile_env.clone(),
    });
    let (stop_during, stopped) = tokio::sync::watch::channel(false);
    let during = spawn_reconcile_during(reconciler.as_ref(), opts.reconcile_every_secs, stopped);
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
    let operator = OperatorEnv {
        exe: exe.clone(),
        env: reconcile_env.clone(),
    };
    let tool =
        redrive_and_stop(&host, &queue, &progress, &supervisors, &operator, deadline).await?;
    let _ = stop_during.send(true);
    let runs_during = match during {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let entries = queue.entries();
    let limit = entries.len() * 2 + 1_000;
    let reconcile = match &reconciler {
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
    let mode = mode(&opts, store, with_bank, instances);
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

/// The client name an instance's process uses at the sandbox bank
/// (`instance-<n>-gen-<generation>`, see the `BANK_API_URL` each instance gets), as
/// (0-based instance, generation).
fn mid_payout_client(client: &str) -> Option<(usize, u64)> {
    let (instance, generation) = client.strip_prefix("instance-")?.split_once("-gen-")?;
    let instance: usize = instance.parse().ok()?;
    Some((instance.checked_sub(1)?, generation.parse().ok()?))
}

/// The log file of instance `i`: `path` itself for a single instance, else
/// `<stem>.<n>.<extension>` next to it.
fn instance_log(path: &std::path::Path, i: usize, instances: usize) -> PathBuf {
    if instances == 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "serve".to_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{}.{}", i + 1, ext.to_string_lossy()),
        None => format!("{stem}.{}", i + 1),
    };
    path.with_file_name(name)
}

/// The leases of earlier attempts an instance took over, from its log (which every
/// start of the instance appends to, so a restart loses no count the way the
/// process's own `/metrics` counters would), from byte `from` on.
fn count_takeovers(log: &std::path::Path, from: u64) -> u64 {
    use std::io::{BufRead, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(log) else {
        return 0;
    };
    if file.seek(SeekFrom::Start(from)).is_err() {
        return 0;
    }
    std::io::BufReader::new(file)
        .split(b'\n')
        .map_while(Result::ok)
        .filter(|line| {
            line.windows(TAKEOVER_LINE.len())
                .any(|w| w == TAKEOVER_LINE.as_bytes())
        })
        .count() as u64
}

/// `serve`'s log filter: the shell's `RUST_LOG` (default `info`), with the consumer's
/// info events kept whatever it says.
fn serve_log_filter(shell: Option<String>) -> String {
    match shell.as_deref().map(str::trim) {
        None | Some("") => "info".to_owned(),
        Some(filter) => format!("{filter},claims_payments::seams::consumer=info"),
    }
}

/// The message `serve` logs (at info) when it takes over the lease of an earlier
/// attempt (claims-payments src/consumer/); the same event counts `takeovers` in `/metrics`.
const TAKEOVER_LINE: &str = "took over the lease of an earlier attempt";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_command_line() {
        let args = SimulateArgs::default();
        args.validate().unwrap();
        assert_eq!(args.messages, 500);
        assert_eq!(args.max_delivery_count, 10);
        assert_eq!(args.handler, HandlerKind::Consumer);
        assert!(!args.ledger_only && !args.json);
        // Every fault kind is on by default.
        for rate in [
            args.duplicate_rate,
            args.business_duplicate_rate,
            args.conflict_rate,
            args.invalid_rate,
            args.crash_rate,
            args.kill_rate,
            args.lock_expiry_rate,
            args.kill_mid_payout_rate,
            args.bank_5xx_rate,
            args.bank_429_rate,
            args.bank_lost_answer_rate,
            args.bank_reject_rate,
        ] {
            assert!(rate > 0.0);
        }
    }

    #[test]
    fn the_default_timings_are_the_deployed_ones() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let params = std::fs::read_to_string(root.join("infra/main.bicepparam")).unwrap();
        let param = |name: &str| -> u64 {
            let prefix = format!("param {name} = ");
            params
                .lines()
                .find_map(|l| l.trim().strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("infra/main.bicepparam has no {name}"))
                .trim()
                .parse()
                .unwrap()
        };
        let host: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join("host.json")).unwrap())
                .unwrap();
        let timeout = host["functionTimeout"].as_str().unwrap();
        let hms: Vec<u64> = timeout.split(':').map(|p| p.parse().unwrap()).collect();
        let function_timeout_ms = ((hms[0] * 60 + hms[1]) * 60 + hms[2]) * 1000;

        let t = SimulateArgs::default().timings();
        assert_eq!(
            t,
            Timings {
                lease_ms: param("leaseMs"),
                inflight_wait_ms: param("inflightWaitMs"),
                bank_timeout_ms: param("bankTimeoutMs"),
                retry_budget_ms: param("retryBudgetMs"),
                function_timeout_ms,
                postgres_outage_wait_ms: deployed::POSTGRES_OUTAGE_WAIT_MS,
            }
        );
        assert_eq!(
            u64::from(SimulateArgs::default().max_delivery_count),
            param("maxDeliveryCount")
        );
    }

    #[test]
    fn out_of_range_options_are_refused_with_their_flag() {
        let bad = SimulateArgs {
            crash_rate: 1.5,
            ..SimulateArgs::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--crash-rate"));
        let bad = SimulateArgs {
            concurrency: 0,
            ..SimulateArgs::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn several_instances_need_the_cosmos_store() {
        let one = SimulateArgs::default();
        assert_eq!((one.instances, one.store_kind()), (1, SimStore::Sqlite));
        let four = SimulateArgs {
            instances: 4,
            ..SimulateArgs::default()
        };
        assert_eq!(four.store_kind(), SimStore::Cosmos);
        four.validate().unwrap();
        let on_sqlite = SimulateArgs {
            store: Some(SimStore::Sqlite),
            ..four.clone()
        };
        let refusal = on_sqlite.validate().unwrap_err().to_string();
        assert!(refusal.contains("--store cosmos"), "{refusal}");
        let with_file = SimulateArgs {
            sqlite_path: Some("/tmp/x.db".into()),
            ..four
        };
        assert!(with_file.validate().is_err());
        let none = SimulateArgs {
            instances: 0,
            ..SimulateArgs::default()
        };
        assert!(none.validate().is_err());
    }

    #[test]
    fn a_bank_client_name_is_an_instance_and_a_generation() {
        let url_part = format!("instance-3-gen-{}", process::GENERATION_TOKEN);
        let spec = ServeSpec::new("x").env("BANK_API_URL", format!("http://b/clients/{url_part}"));
        let started = process::for_generation(&spec, 12);
        assert_eq!(started.env[0].1, "http://b/clients/instance-3-gen-12");
        assert_eq!(mid_payout_client("instance-3-gen-12"), Some((2, 12)));
        assert_eq!(mid_payout_client("instance-0-gen-1"), None);
        assert_eq!(mid_payout_client("reconcile"), None);
        assert_eq!(mid_payout_client("instance-x-gen-1"), None);
    }

    #[test]
    fn instance_logs_sit_next_to_the_given_one() {
        let p = std::path::Path::new("/tmp/run/serve.log");
        assert_eq!(instance_log(p, 0, 1), p);
        assert_eq!(
            instance_log(p, 1, 3),
            std::path::Path::new("/tmp/run/serve.2.log")
        );
        assert_eq!(
            instance_log(std::path::Path::new("out"), 0, 2),
            std::path::Path::new("out.1")
        );
    }

    #[test]
    fn takeovers_are_counted_from_the_log_across_restarts() {
        let dir = TempDir::new("sim-takeovers").unwrap();
        let log = dir.path().join("serve.log");
        let line = |n: u32| {
            format!(
                "{{\"level\":\"INFO\",\"message\":\"{TAKEOVER_LINE}\",\"deliveryCount\":{n}}}\n"
            )
        };
        std::fs::write(&log, line(1)).unwrap();
        let from = std::fs::metadata(&log).unwrap().len();
        let mut more = String::new();
        more.push_str(&line(2));
        more.push_str("{\"message\":\"listening\"}\n");
        more.push_str(&line(3));
        // A process killed mid-line leaves a torn last line; it is not counted.
        more.push_str("{\"message\":\"took over the le");
        std::fs::write(&log, format!("{}{more}", line(1))).unwrap();
        assert_eq!(count_takeovers(&log, 0), 3);
        assert_eq!(count_takeovers(&log, from), 2);
        assert_eq!(count_takeovers(&dir.path().join("missing"), 0), 0);
        assert_eq!(serve_log_filter(None), "info");
        assert_eq!(
            serve_log_filter(Some("warn".into())),
            "warn,claims_payments::seams::consumer=info"
        );
    }

    #[test]
    fn the_clap_definitions_are_consistent() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(clap::Subcommand)]
        #[allow(clippy::large_enum_variant)] // parsed once, in a test
        enum Sub {
            Simulate(SimulateArgs),
            Bench(crate::bench::BenchArgs),
        }
        Cli::command().debug_assert();
        let bench = crate::bench::BenchArgs::default();
        assert_eq!((bench.concurrency, bench.rounds), (32, 3));
    }
}
