//! The `claims-payments` binary: the custom handler (`serve`) and the operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use claims_payments::seams::Seams;
use claims_payments::{OperatorCommand, Settings};

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

#[derive(Subcommand)]
enum Command {
    /// Run the Azure Functions custom handler (the host starts this).
    Serve,
    #[command(flatten)]
    Operator(OperatorCommand),
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
    claims_payments::quiet_library_backtraces();
    let args = Cli::parse();
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
        match args.command {
            Command::Serve => {
                let telemetry = match settings.start_telemetry() {
                    Ok(guard) => guard,
                    Err(e) => {
                        eprintln!("claims-payments: {e:#}");
                        return Ok(ExitCode::from(2));
                    }
                };
                let result = claims_payments::serve(settings, Seams::default()).await;
                if let Some(guard) = telemetry {
                    guard.shutdown().await;
                }
                result.map(|()| ExitCode::SUCCESS)
            }
            Command::Operator(command) => {
                claims_payments::run_operator_command(command, &settings).await
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
