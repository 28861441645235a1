//! The `claims-payments` binary: the custom handler (`serve`) and the operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use claims_payments::config::{Settings, StoreSettings};
use claims_payments::reconcile::{self, Reconciler};
use claims_payments::startup::{self, Seams};
use claims_payments::store::sqlite::Access;
use claims_payments::{cli, telemetry};

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

fn main() -> ExitCode {
    telemetry::quiet_library_backtraces();
    let cli = Cli::parse();
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
                done(startup::serve(settings, Seams::default()).await)
            }
            Command::Ledger(args) => {
                let store = startup::open_store(&settings, Access::ReadOnly).await?;
                done(cli::ledger(&store, args.json, args.limit, &mut stdout()).await)
            }
            Command::Inbox(args) => {
                let store = startup::open_store(&settings, Access::ReadOnly).await?;
                done(cli::inbox(&store, args.json, args.limit, &mut stdout()).await)
            }
            Command::Provision => {
                let StoreSettings::Cosmos(cosmos) = &settings.store else {
                    anyhow::bail!("provision creates the Cosmos DB container: set PAYMENTS_STORE=cosmos and COSMOS_*");
                };
                let report = claims_payments::store::cosmos::provision(cosmos).await?;
                println!("{report}");
                Ok(ExitCode::SUCCESS)
            }
            Command::Purge => {
                let store = startup::open_store(&settings, Access::Existing).await?;
                done(cli::purge(&store, &mut stdout()).await)
            }
            Command::Reconcile(args) => {
                let store = startup::open_store(&settings, Access::Existing).await?;
                let consumer = startup::consumer_for(&settings, store)?;
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
