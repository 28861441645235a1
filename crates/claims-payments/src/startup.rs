//! The composition root, in the manner of zero-to-production's `startup.rs`: one
//! [`Application::build`] wires the process from its [`Settings`] (store opened and
//! layered -> services, built once -> application state -> router -> listener), and
//! [`Application::run_until_stopped`] owns the process's lifecycle (what it learns from
//! the process that served on its port before it, its registration, the counters, the
//! store's failure, SIGTERM and the drain). `claims-payments serve` runs [`serve`], which
//! is the two; the tests build it the same way.
//!
//! [`Composition`] is the wiring without the socket and without the lifecycle, on a
//! store the caller opened: what `build` serves, what the operator's `reconcile` runs
//! on, and what the deterministic simulator sends requests to in-process, with its
//! virtual clock and simulated bank given through the [`Seams`] (in [`crate::hooks`],
//! where `claims-payments-dev` changes the composition; production passes
//! `Seams::default()`). [`restarts`] is what a start learns from the process that served
//! on its port before it.

mod restarts;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use crate::ambient::Ambient;
use crate::bank::BankClient;
use crate::configuration::{Settings, StoreSettings};
use crate::functions;
use crate::functions::limits::HEADER_READ_TIMEOUT;
pub use crate::functions::AppState;
use crate::hooks::Seams;
use crate::lease::liveness;
pub use crate::services::Services;
use crate::store::cosmos::CosmosStore;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::{Access, SqliteStore};
use crate::store::DynStore;
use crate::telemetry;

/// After SIGTERM, in-flight invocations get this long to finish. It stays below the
/// platform's shutdown grace so the process exits on its own terms; an invocation cut
/// short is redelivered and resumes from the stored state (a later delivery takes over).
pub(crate) const SHUTDOWN_DRAIN: Duration = Duration::from_secs(25);

/// Opens the configured store. `access` says how this process uses a SQLite file (serve,
/// an operator's write, a read-only listing); Cosmos ignores it, and PostgreSQL always
/// checks that the schema is this build's (`claims-payments provision` creates it).
/// For `serve` on SQLite it also ends the leases the previous `serve` left (see
/// [`SqliteStore::end_leases_of_earlier_processes`]): that happens before the port opens.
pub async fn open_store(settings: &Settings, access: Access) -> anyhow::Result<DynStore> {
    Ok(match &settings.store {
        StoreSettings::Sqlite { path } => {
            let store = SqliteStore::open_as(path, access)
                .context("cannot use the SQLite database set by PAYMENTS_SQLITE_PATH")?;
            if access == Access::Serve {
                let ended = store
                    .end_leases_of_earlier_processes(
                        &[&settings.consumer_name, crate::payments_api::KEY_CONSUMER],
                        Ambient::system().now(),
                    )
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("cannot end the leases of an earlier serve: {e}")
                    })?;
                if ended > 0 {
                    tracing::info!(
                        leases = ended,
                        "ended the leases of attempts by an earlier serve on this file; their next deliveries take over at once"
                    );
                }
            }
            store
        }
        StoreSettings::Cosmos(cosmos) => {
            Arc::new(CosmosStore::connect(cosmos, settings.inbox_retention).await?)
        }
        StoreSettings::Postgres(postgres) => Arc::new(
            PostgresStore::connect(postgres, crate::store::postgres::Access::Checked).await?,
        ),
    })
}

/// One process's parts, wired as the settings describe them, on a store the caller
/// opened: no socket, no lifecycle.
pub struct Composition {
    /// The store every part uses: the seams' layer, then the dependency spans.
    pub store: DynStore,
    /// What the process's parts share, built once.
    pub services: Services,
    /// The product's router (or the seams'), with its server spans.
    pub router: Router,
    /// What answers `ClaimApproved`, for the start-up log line.
    label: &'static str,
}

impl Composition {
    /// Wires the process on `store`: the seams' store layer, the dependency spans (only
    /// when telemetry is exported), the bank client, the services (on the seams' ambient,
    /// else the system's), the application state, the handler and the router.
    pub fn new(settings: &Settings, store: DynStore, seams: Seams) -> anyhow::Result<Self> {
        let store = match seams.store_layer {
            Some(layer) => layer(store),
            None => store,
        };
        let store = traced(settings, store);
        let ambient = seams.ambient.unwrap_or_else(Ambient::system);
        let bank = match (&settings.bank, seams.bank_transport) {
            (None, _) => None,
            (Some(bank), None) => Some(crate::bank::https_client(bank)?),
            (Some(bank), Some(transport)) => {
                Some(BankClient::with_transport(bank, transport, ambient.clone()))
            }
        };
        let services = Services::new(store.clone(), bank, settings.policy(), ambient);
        let mut state = AppState::new(settings.functions(), &services);
        if let Some(factory) = seams.claim_handler {
            state = state.with_claim_handler(factory(&services));
        }
        let state = Arc::new(state);
        let router = match seams.router {
            Some(factory) => factory(state),
            None => functions::router(state),
        };
        Ok(Composition {
            store,
            services,
            router: with_telemetry(router),
            label: seams.label.unwrap_or("consumer"),
        })
    }

    /// Serves the router on `listener` until `shutdown` resolves, then drains: the
    /// application in-process, without the process's lifecycle (tests whose store could
    /// not even register a process).
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        serve_router(listener, self.router, shutdown).await
    }
}

/// The custom handler, built and listening: [`run_until_stopped`](Self::run_until_stopped)
/// serves it.
pub struct Application {
    settings: Settings,
    parts: Composition,
    listener: TcpListener,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Application {
    /// Wires the process from `settings`: the store opened for `serve` (see
    /// [`open_store`]), the [`Composition`] on it, and the listener on
    /// `FUNCTIONS_CUSTOMHANDLER_PORT` (0: a free port, see [`port`](Self::port)).
    pub async fn build(settings: Settings, seams: Seams) -> anyhow::Result<Self> {
        // Installed before the port opens: a SIGTERM that arrives right after the host sees
        // us ready must drain, not kill.
        let shutdown = Box::pin(shutdown_signal()?);
        let store = open_store(&settings, Access::Serve).await?;
        let parts = Composition::new(&settings, store, seams)?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, settings.port));
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!("cannot listen on {addr} (FUNCTIONS_CUSTOMHANDLER_PORT): {e}")
        })?;
        Ok(Application {
            settings,
            parts,
            listener,
            shutdown,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map_or(0, |a| a.port())
    }

    /// Runs the custom handler until SIGTERM or SIGINT, or until the store fails for
    /// good; then drains.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application {
            settings,
            parts,
            listener,
            shutdown,
        } = self;
        let Composition {
            store,
            services,
            router: app,
            label,
        } = parts;
        let work = services.work().clone();
        let address = listener.local_addr()?;

        // We hold the port, but the process that served on it before may still be draining
        // (its listener is closed, its in-flight invocations are not): only if it has exited
        // without a clean stop are its leases over now. Then this process registers (its
        // attempts' leases count as live while it renews), and a crash loop holds back
        // before the first answer (the host holds invocations meanwhile at no delivery's
        // cost).
        let state_file = restarts::state_file(
            &settings.consumer_name,
            &settings.store.identity(),
            address.port(),
        );
        let (start, restarts) = restarts::begin(&store, state_file).await;
        let registration_task = liveness::Registered::register(
            store.clone(),
            settings.inbox_retention,
            services.ambient.clone(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot register this process in the store: {e}"))?;
        if !start.hold.is_zero() {
            tracing::warn!(
                recentCrashes = start.recent_crashes,
                holdMs = start.hold.as_millis() as u64,
                "processes on this port crashed repeatedly; holding back before answering"
            );
            tokio::time::sleep(start.hold).await;
        }

        tracing::info!(
            address = %address,
            store = settings.store.name(),
            payouts = settings.bank.is_some(),
            handler = label,
            "claims-payments custom handler listening"
        );
        telemetry::started();

        // No purge here: the `Purge` timer function (`PURGE_SCHEDULE`) is the retention's one
        // owner, so the documented schedule decides when rows are deleted, and one run at a
        // time does it rather than every instance on its own clock.
        let counters_task = tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            tick.tick().await;
            loop {
                tick.tick().await;
                telemetry::log_counters();
            }
        });

        // A store that failed for good (a WAL sync error) stops the server like a SIGTERM,
        // and the process then exits non-zero so the host restarts it.
        let (store_failed_tx, store_failed_rx) = tokio::sync::oneshot::channel();
        let watched = store.clone();
        let failure_task = tokio::spawn(async move {
            let _ = store_failed_tx.send(watched.failed().await);
        });
        let mut store_failed = None;
        let stop = async {
            tokio::select! {
                () = shutdown => {}
                reason = store_failed_rx => store_failed = reason.ok(),
            }
        };
        serve_router(listener, app, stop).await;
        // Work whose connection dropped (the host's timeout) is no connection the drain
        // waited for: it ends here, before the registration does and other processes take
        // its leases over as those of an ended process.
        if tokio::time::timeout(SHUTDOWN_DRAIN, work.drain())
            .await
            .is_err()
        {
            tracing::warn!(
                drainSeconds = SHUTDOWN_DRAIN.as_secs(),
                "work whose caller went away did not finish within the drain; stopping anyway"
            );
            work.abort_all();
        }
        for task in [counters_task, failure_task] {
            task.abort();
        }
        telemetry::log_counters();
        if let Some(reason) = store_failed {
            anyhow::bail!("stopped because the store failed: {reason}");
        }
        // Drained: this process's leases are over, and the next start on this port finds
        // a clean stop.
        registration_task.end().await;
        restarts.stopped_cleanly();
        tracing::info!("drained in-flight invocations; stopping");
        Ok(())
    }
}

/// Runs the custom handler until SIGTERM or SIGINT, or until the store fails for good:
/// what `claims-payments serve` runs.
pub async fn serve(settings: Settings, seams: Seams) -> anyhow::Result<()> {
    Application::build(settings, seams)
        .await?
        .run_until_stopped()
        .await
}

/// The router with its server spans and HTTP answer counts (see [`telemetry::trace`]).
fn with_telemetry(app: Router) -> Router {
    if telemetry::enabled() {
        app.layer(axum::middleware::from_fn_with_state(
            functions::OWN_SPAN_ROUTES,
            telemetry::trace::layer_http,
        ))
    } else {
        app
    }
}

/// The store as dependencies named after the database system.
fn traced(settings: &Settings, store: DynStore) -> DynStore {
    let (system, namespace) = match &settings.store {
        StoreSettings::Sqlite { .. } => ("sqlite", "payments".to_owned()),
        StoreSettings::Cosmos(cosmos) => ("cosmosdb", cosmos.database.clone()),
        StoreSettings::Postgres(postgres) => (
            "postgresql",
            postgres
                .config
                .get_dbname()
                .unwrap_or("postgres")
                .to_owned(),
        ),
    };
    crate::store::traced::TracedStore::wrap(store, system, namespace)
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains for at most
/// [`SHUTDOWN_DRAIN`]. Unlike `axum::serve`, every connection has a header read timeout,
/// so neither a slow client nor a shutdown waits on one for ever.
pub(crate) async fn serve_router(
    listener: TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    // The port is released before the drain: a start on it meanwhile (the host
    // restarting the handler) serves new invocations at once instead of failing to bind
    // (each failed start counts towards the host's limit of restarts), and knows from
    // this process's lock file that it still drains (`restarts`).
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drainSeconds = SHUTDOWN_DRAIN.as_secs(),
            "in-flight work did not finish within the drain; stopping anyway (it will be redelivered)"
        );
    }
}

fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::info!("shutdown requested; draining in-flight invocations");
    })
}
