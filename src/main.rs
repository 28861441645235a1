//! The `claims-payments` binary: the custom handler (`serve`) and the operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use claims_payments::config::Settings;
use claims_payments::reconcile::{self, Reconciler};
use claims_payments::store::sqlite::Access;
use claims_payments::{cli, server, telemetry};

#[derive(Parser)]
#[command(
    name = "claims-payments",
    version,
    about = "Pays each approved insurance claim exactly once."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct ListArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// At most this many rows.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

#[derive(clap::Args)]
struct ReconcileArgs {
    /// One JSON object: the lines and the summary.
    #[arg(long)]
    json: bool,
    /// Ask the bank and report what would be done; write nothing, pay nothing.
    #[arg(long)]
    dry_run: bool,
    /// Only in_progress payments whose lease ran out longer ago than this (30s, 15m, 2h).
    /// Default: RECONCILE_MIN_AGE_MS (three leases).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<std::time::Duration>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the Azure Functions custom handler (the host starts this).
    Serve,
    /// List payments.
    Ledger(ListArgs),
    /// List inbox records (messages seen and how they ended).
    Inbox(ListArgs),
    /// Remove inbox records past INBOX_RETENTION_DAYS now (SQLite; Cosmos expires them itself).
    Purge,
    /// Create (or verify) the Cosmos DB database and container, with COSMOS_KEY (emulator, dev accounts).
    Provision,
    /// Settle payments in needs_reconciliation and orphaned in_progress payouts by asking the bank (exit 1 if any is left unknown).
    Reconcile(ReconcileArgs),
    /// Simulate at-least-once delivery with faults against `serve` and verify that every claim is paid exactly once (exit 1 if not).
    #[cfg(feature = "dev-tools")]
    Simulate(Box<claims_payments::sim::SimulateArgs>),
    /// Measure `serve` on the full HTTP path: throughput, latency, round trips, start-up, memory.
    #[cfg(feature = "dev-tools")]
    Bench(claims_payments::bench::BenchArgs),
    /// Run the sandbox bank alone (payouts, lookups, /_control/fail-next, /_control/payouts) until interrupted.
    #[cfg(feature = "dev-tools")]
    SandboxBank {
        /// Loopback port (0: any free one; the URL is printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("claims-payments: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Runs `simulate` or `bench`. They configure the processes they start themselves, so
/// they run before (and without) the settings from this process's environment.
#[cfg(feature = "dev-tools")]
fn dev_tool(command: Command) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Simulate(args) => claims_payments::sim::main(*args).await,
            Command::Bench(args) => claims_payments::bench::main(args).await,
            Command::SandboxBank { port } => {
                let bank = claims_payments::sim::bank::SandboxBank::start_on(
                    claims_payments::sim::bank::BankSettings::default(),
                    port,
                )
                .await?;
                println!("BANK_API_URL={}", bank.url());
                println!("ready");
                tokio::signal::ctrl_c().await?;
                Ok(ExitCode::SUCCESS)
            }
            _ => unreachable!("only simulate and bench are dev tools"),
        }
    });
    result.unwrap_or_else(|e| {
        eprintln!("claims-payments: {e:#}");
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    // azure_core captures a backtrace for every discarded internal error when
    // RUST_BACKTRACE=1, which slows every Cosmos call; panics keep theirs.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let cli = Cli::parse();
    #[cfg(feature = "dev-tools")]
    if let Command::Simulate(_) | Command::Bench(_) | Command::SandboxBank { .. } = &cli.command {
        return dev_tool(cli.command);
    }
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("claims-payments: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async move {
        let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
        // Not locked for `serve`: the log writer needs stdout from every thread.
        let stdout = || std::io::stdout().lock();
        match cli.command {
            Command::Serve => {
                telemetry::init(settings.log_format);
                done(server::serve(settings).await)
            }
            Command::Ledger(args) => {
                let store = server::open_store(&settings, Access::ReadOnly).await?;
                done(cli::ledger(&store, args.json, args.limit, &mut stdout()).await)
            }
            Command::Inbox(args) => {
                let store = server::open_store(&settings, Access::ReadOnly).await?;
                done(cli::inbox(&store, args.json, args.limit, &mut stdout()).await)
            }
            Command::Provision => {
                let cosmos = claims_payments::store::cosmos::CosmosSettings::from_env()
                    .map_err(|e| anyhow::anyhow!("invalid setting {e}"))?;
                let report = claims_payments::store::cosmos::provision(&cosmos).await?;
                println!("{report}");
                Ok(ExitCode::SUCCESS)
            }
            Command::Purge => {
                let store = server::open_store(&settings, Access::Existing).await?;
                done(cli::purge(&store, &mut stdout()).await)
            }
            Command::Reconcile(args) => {
                let store = server::open_store(&settings, Access::Existing).await?;
                let consumer = server::consumer_for(&settings, store)?;
                let reconciler = Reconciler::new(consumer).ok_or_else(|| {
                    anyhow::anyhow!("BANK_API_URL is not set: there is no bank to reconcile with")
                })?;
                let options = reconcile::Options {
                    min_age: args.older_than.unwrap_or(settings.reconcile_min_age),
                    dry_run: args.dry_run,
                    budget: None,
                };
                let summary = reconciler.run(options).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&summary)?);
                } else {
                    print!("{}", reconcile::render_text(&summary));
                }
                Ok(if summary.all_settled() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                })
            }
            #[cfg(feature = "dev-tools")]
            Command::Simulate(_) | Command::Bench(_) | Command::SandboxBank { .. } => {
                unreachable!("dispatched before the settings are read")
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // Non-zero: the Functions host restarts a handler that exits non-zero, never one that exits 0.
            eprintln!("claims-payments: {e:#}");
            ExitCode::FAILURE
        }
    }
}
