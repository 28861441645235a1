//! `cosmos-emulator`: the Cosmos DB SDK's in-process emulator served on a loopback HTTP
//! port, for local runs and tests of the service without Docker or an Azure account.
//!
//! ```text
//! cosmos-emulator [--port 8081] [--provision] [--database payments] [--container payments]
//! ```
//!
//! On start it prints, one per line on stdout, `COSMOS_ENDPOINT=http://127.0.0.1:<port>/`,
//! `COSMOS_KEY=<key>` and `ready`, so a script or test can read its settings. Data lives in
//! memory and is gone when the process stops (SIGTERM or SIGINT). Inbox documents do not
//! expire here: the emulator has no TTL.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::Context;
use azure_core::http::Url;
use claims_payments_cosmos::container::{DEFAULT_CONTAINER, DEFAULT_DATABASE};
use claims_payments_dev::emulator::{serve, InProcessEmulator, EMULATOR_KEY};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "cosmos-emulator",
    about = "Serves an in-memory Cosmos DB account over HTTP"
)]
struct Args {
    /// TCP port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8081)]
    port: u16,
    /// Address to bind. Use 0.0.0.0 with --advertise-host in docker-compose.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Host name clients use to reach this emulator, if not the bind address. A client
    /// reaching it by a non-loopback name needs AZURE_COSMOS_EMULATOR_HOST=<name> to use http.
    #[arg(long)]
    advertise_host: Option<String>,
    /// Create the database and the container (the service's definition) before `ready`.
    #[arg(long)]
    provision: bool,
    #[arg(long, default_value = DEFAULT_DATABASE)]
    database: String,
    #[arg(long, default_value = DEFAULT_CONTAINER)]
    container: String,
}

fn main() -> ExitCode {
    claims_payments::seams::telemetry::quiet_library_backtraces();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cosmos-emulator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cosmos-emulator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.bind, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.bind, args.port))?;
    let port = listener.local_addr()?.port();
    let host = match (&args.advertise_host, args.bind) {
        (Some(host), _) => host.clone(),
        (None, bind) if bind.is_unspecified() => "127.0.0.1".to_owned(),
        (None, IpAddr::V6(v6)) => format!("[{v6}]"),
        (None, IpAddr::V4(v4)) => v4.to_string(),
    };
    let endpoint = Url::parse(&format!("http://{host}:{port}/"))
        .with_context(|| format!("bad host {host:?}"))?;
    let emulator = InProcessEmulator::at(endpoint.clone())?;
    if args.provision {
        let report = emulator
            .provision(&args.database, &args.container)
            .await
            .context("provisioning failed")?;
        eprintln!("cosmos-emulator: {report}");
    }
    let server = tokio::spawn(serve(emulator, listener));

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "COSMOS_ENDPOINT={endpoint}")?;
    writeln!(stdout, "COSMOS_KEY={EMULATOR_KEY}")?;
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    drop(stdout);

    tokio::select! {
        outcome = server => match outcome {
            Ok(Ok(())) => anyhow::bail!("the HTTP server stopped unexpectedly"),
            Ok(Err(e)) => Err(anyhow::Error::new(e).context("the HTTP server failed")),
            Err(e) => Err(anyhow::Error::new(e).context("the HTTP server task failed")),
        },
        signal = shutdown_signal() => {
            let name = signal?;
            eprintln!("cosmos-emulator: {name} received, stopping");
            Ok(())
        }
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C elsewhere), naming the signal.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
        tokio::select! {
            _ = term.recv() => Ok("SIGTERM"),
            _ = int.recv() => Ok("SIGINT"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .context("cannot watch Ctrl-C")?;
        Ok("Ctrl-C")
    }
}
