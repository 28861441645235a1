//! The `claims-payments-dev` binary: `simulate`, `bench`, `sandbox-bank`, `serve` with
//! the dev seams (the simulator and the benchmark start this binary's `serve`), and the
//! product's operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use claims_payments_dev::sim::bank::{FakeBank, FakeBankSettings};
use claims_payments_dev::{bench, dev_serve, sim};

#[derive(Parser)]
#[command(
    name = "claims-payments-dev",
    version,
    about = "Developer tools for claims-payments: simulate, bench, sandbox-bank, and serve with baselines and faults."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate at-least-once delivery with faults against `serve` and verify that every claim is paid exactly once (exit 1 if not).
    Simulate(Box<sim::SimulateArgs>),
    /// Deterministic simulation of the service's own code: seeds of crashes, redeliveries and lost answers in virtual time (exit 1 if an invariant fails; --seed S replays).
    Dst(claims_payments_dev::dst::DstArgs),
    /// Measure `serve` on the full HTTP path: throughput, latency, round trips, start-up, memory.
    Bench(bench::BenchArgs),
    /// Run the sandbox bank alone (payouts, lookups, /_control/fail-next, /_control/payouts) until interrupted.
    SandboxBank {
        /// Loopback port (0: any free one; the URL is printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// The product's custom handler, with PAYMENTS_DEV_HANDLER and PAYMENTS_FAULT_* applied.
    Serve,
    /// The product's operator commands (the simulator runs `reconcile` through them).
    #[command(flatten)]
    Operator(claims_payments::seams::cli::OperatorCommand),
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Simulate(args) => sim::main(*args).await,
        Command::Bench(args) => bench::main(args).await,
        // Each seed runs on a current-thread runtime of its own, outside this one.
        Command::Dst(args) => {
            tokio::task::spawn_blocking(move || claims_payments_dev::dst::main(args)).await?
        }
        Command::SandboxBank { port } => {
            let bank = FakeBank::start_on(FakeBankSettings::default(), port).await?;
            println!("BANK_API_URL={}", bank.url());
            println!("ready");
            tokio::signal::ctrl_c().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve => dev_serve::serve().await.map(|()| ExitCode::SUCCESS),
        Command::Operator(command) => {
            claims_payments::seams::cli::run(command, &dev_serve::product_settings()?).await
        }
    }
}

fn main() -> ExitCode {
    claims_payments::seams::telemetry::quiet_library_backtraces();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("claims-payments-dev: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli.command)).unwrap_or_else(|e| {
        // Non-zero, as the product: the host restarts a handler that exits non-zero.
        eprintln!("claims-payments-dev: {e:#}");
        ExitCode::FAILURE
    })
}
