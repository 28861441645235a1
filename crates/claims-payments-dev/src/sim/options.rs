//! The simulator's options: one type, [`SimulateArgs`], that is both the `simulate`
//! command line (clap) and what library callers (tests) pass to [`super::run`], starting
//! from `SimulateArgs::default()`, which holds the command line's defaults. Also what the
//! run derives from them: the timings, the store, the faults and the producer's settings.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{ensure, Context};

use super::driver::DataType;
use super::scenario::ScenarioSettings;

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

    pub(super) fn validate(&self) -> anyhow::Result<()> {
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

    pub(super) fn faults(&self) -> BTreeMap<String, String> {
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

    /// The report's one-line description of the store and the bank.
    pub(super) fn mode(&self) -> String {
        let (store, with_bank, instances) = (self.store_kind(), !self.ledger_only, self.instances);
        let store_name = match store {
            SimStore::Sqlite => "SQLite ledger",
            SimStore::Cosmos => "Cosmos DB ledger (cosmos-emulator)",
            SimStore::Postgres if self.postgres_url.is_some() => {
                "PostgreSQL ledger (--postgres-url)"
            }
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
    pub(super) fn scenario_settings(&self, seed: u64) -> ScenarioSettings {
        let with_bank = !self.ledger_only;
        ScenarioSettings {
            messages: self.messages,
            duplicate_rate: self.duplicate_rate,
            business_duplicate_rate: self.business_duplicate_rate,
            conflict_rate: self.conflict_rate,
            invalid_rate: self.invalid_rate,
            closed_account_rate: if with_bank {
                self.bank_reject_rate
            } else {
                0.0
            },
            allow_non_utf8: self.data_type == DataType::Binary,
            race_window: self.concurrency * self.instances,
            seed,
        }
    }

    /// The executable the handler instances and `reconcile` run.
    pub(super) fn handler_exe(&self) -> anyhow::Result<PathBuf> {
        match &self.exe {
            Some(exe) => Ok(exe.clone()),
            None => {
                std::env::current_exe().context("cannot find the claims-payments-dev executable")
            }
        }
    }
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
