//! The axum server the Functions host talks to.
//!
//! Listens on 127.0.0.1 only: the host is the sole caller, on the same machine.
//! `GET /` is the host's readiness probe, `POST /ClaimApproved` is one invocation,
//! `GET /metrics` shows the counters for local runs. SIGTERM stops accepting and lets
//! in-flight invocations finish, because an answer lost now is a redelivery later.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;

use crate::bank::BankClient;
use crate::config::{HandlerKind, Settings, StoreKind};
use crate::consumer::{Consumer, Delivery, Outcome, Policy};
use crate::host::{Invocation, InvocationResult, OutcomeSummary};
use crate::message::ClaimApproved;
use crate::payments_api::{Answer, CallerAuth, PaymentsApi};
use crate::reconcile::{self, Reconciler, RunLease};
use crate::store::sqlite::{Access, SqliteStore};
use crate::store::DynStore;
use crate::telemetry;

/// The function folder name in function-app/, which is the route the host calls.
pub const FUNCTION_NAME: &str = "ClaimApproved";
/// Service Bus messages are at most 256 KB (Standard) and base64 adds a third.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// A connection must deliver its request headers within this time. The host sends
/// them at once; a caller that trickles them is cut off instead of holding a socket.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole request body must arrive within this time after the headers.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// After SIGTERM, in-flight invocations get this long to finish. It stays below the
/// platform's shutdown grace so the process exits on its own terms; an invocation cut
/// short is redelivered and resumes from the stored state (a later delivery takes over).
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(25);

pub struct AppState {
    consumer: Consumer,
    api: PaymentsApi,
    handler: HandlerKind,
    crash_after_commit: f64,
    reconcile_min_age: Duration,
}

impl AppState {
    pub fn new(consumer: Consumer, handler: HandlerKind, crash_after_commit: f64) -> Arc<Self> {
        let reconcile_min_age = consumer.policy().lease * 3;
        let api = PaymentsApi::new(
            consumer.clone(),
            CallerAuth::FunctionKey,
            Duration::from_secs(24 * 3600),
        );
        Arc::new(AppState {
            api,
            consumer,
            handler,
            crash_after_commit,
            reconcile_min_age,
        })
    }

    /// The HTTP API's caller authentication and key retention.
    pub fn with_http(mut self: Arc<Self>, auth: CallerAuth, retention: Duration) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.api = PaymentsApi::new(state.consumer.clone(), auth, retention);
        }
        self
    }

    /// The minimum age of an orphaned payout before the timer settles it.
    pub fn with_reconcile_min_age(mut self: Arc<Self>, min_age: Duration) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.reconcile_min_age = min_age;
        }
        self
    }
}

/// The timer function's folder in function-app/ (`POST /Reconcile`).
pub const RECONCILE_FUNCTION: &str = "Reconcile";
/// A timer run stops taking up new payments after this, well inside functionTimeout
/// (3 min); the rest wait for the next run.
pub const RECONCILE_RUN_BUDGET: Duration = Duration::from_secs(90);

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(ready))
        .route("/metrics", get(metrics))
        .route(&format!("/{FUNCTION_NAME}"), post(invoke))
        .route(&format!("/{RECONCILE_FUNCTION}"), post(reconcile_timer))
        // Forwarded unchanged by the host (customHandler.enableForwardingHttpRequest).
        .route("/api/payments", post(post_payment))
        .route("/api/payments/{claim_id}", get(get_payment))
        .fallback(not_found)
        .with_state(state)
}

async fn ready() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ready"}))
}

async fn metrics() -> Json<telemetry::CountersSnapshot> {
    Json(telemetry::counters().snapshot())
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"error": format!("no such function; this handler serves POST /{FUNCTION_NAME}")})),
    )
        .into_response()
}

fn answer(status: StatusCode, summary: OutcomeSummary) -> Response {
    (status, Json(InvocationResult::new(summary))).into_response()
}

fn status_for(outcome: &Outcome) -> StatusCode {
    if outcome.completes_message() {
        StatusCode::OK
    } else if let Outcome::StoreFailure { .. } = outcome {
        // Our fault, not the message's: the store needs an operator.
        StatusCode::INTERNAL_SERVER_ERROR
    } else if outcome.is_permanent_failure() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn post_payment(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REQUEST_BYTES),
    );
    let answer = match read.await {
        Ok(Ok(bytes)) => state.api.post(&headers, &bytes).await,
        Ok(Err(_)) => Answer::problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "The request body is too large",
            format!("body: at most {MAX_REQUEST_BYTES} bytes"),
        ),
        Err(_) => Answer::problem(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "The request body did not arrive in time",
            format!(
                "body: not received within {} s",
                BODY_READ_TIMEOUT.as_secs()
            ),
        ),
    };
    answer.into_parts().into_response()
}

async fn get_payment(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(claim_id): axum::extract::Path<String>,
) -> Response {
    state.api.get(&claim_id).await.into_parts().into_response()
}

/// The `Reconcile` timer invocation: settles unknown and orphaned payouts (see
/// [`crate::reconcile`]), one run at a time across instances, and answers the host with
/// the summary. The timer info under `Data.timer` is only logged: a past-due run does
/// the same work as a punctual one.
async fn reconcile_timer(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let past_due = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/Data/timer/IsPastDue").and_then(|d| d.as_bool()))
        .unwrap_or(false);
    let summary_answer = |status: StatusCode, outcome: &str, detail: String| {
        answer(
            status,
            OutcomeSummary {
                outcome: outcome.into(),
                claim_id: None,
                message_id: None,
                delivery_count: None,
                detail: Some(detail),
            },
        )
    };
    let Some(reconciler) = Reconciler::new(state.consumer.clone()) else {
        return summary_answer(
            StatusCode::OK,
            "reconcile-skipped",
            "ledger-only mode: no bank to reconcile with".into(),
        );
    };
    let lease = match RunLease::take(&state.consumer, RECONCILE_RUN_BUDGET * 2).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            tracing::info!(
                trigger = "timer",
                pastDue = past_due,
                "another instance is reconciling; this run is skipped"
            );
            return summary_answer(
                StatusCode::OK,
                "reconcile-skipped",
                "another instance holds the reconcile run lease".into(),
            );
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile could not take its run lease");
            return summary_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "reconcile-failed",
                e.to_string(),
            );
        }
    };
    let options = reconcile::Options {
        min_age: state.reconcile_min_age,
        dry_run: false,
        budget: Some(RECONCILE_RUN_BUDGET),
    };
    let result = reconciler.run(options).await;
    lease.release(&state.consumer).await;
    match result {
        Ok(summary) => {
            reconcile::log_summary(&summary, "timer");
            summary_answer(
                StatusCode::OK,
                "reconciled",
                format!(
                    "examined {}, paid by lookup {}, paid now {}, rejected {}, still unknown {}, mismatches {}",
                    summary.examined, summary.paid_by_lookup, summary.paid_now, summary.rejected, summary.still_unknown, summary.mismatches
                ),
            )
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile failed");
            summary_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "reconcile-failed",
                e.to_string(),
            )
        }
    }
}

/// Refuses an invocation that cannot even be read: permanent, so the host's redeliveries
/// end in the dead-letter queue, with the reason in every log line.
fn refuse(status: StatusCode, invocation_id: &str, reason: String) -> Response {
    tracing::error!(invocationId = %invocation_id, trigger = "servicebus", outcome = "invalid-message", reason = %reason, "invocation finished");
    telemetry::counters().invalid_messages.inc();
    answer(
        status,
        OutcomeSummary {
            outcome: "invalid-message".into(),
            claim_id: None,
            message_id: None,
            delivery_count: None,
            detail: Some(reason),
        },
    )
}

async fn invoke(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    telemetry::counters().invocations.inc();
    let invocation_id = headers
        .get("x-azure-functions-invocationid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REQUEST_BYTES),
    );
    let bytes: Bytes = match read.await {
        Ok(Ok(b)) => b,
        Err(_) => {
            // A caller that trickles its body must not hold a worker; the host retries.
            telemetry::counters().retry_later.inc();
            tracing::warn!(invocationId = %invocation_id, trigger = "servicebus", outcome = "retry-later", "request body not received within {} s", BODY_READ_TIMEOUT.as_secs());
            return (
                StatusCode::REQUEST_TIMEOUT,
                Json(serde_json::json!({"error": format!("request body not received within {} s", BODY_READ_TIMEOUT.as_secs())})),
            )
                .into_response();
        }
        Ok(Err(e)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                &invocation_id,
                format!("request body refused (limit {MAX_REQUEST_BYTES} bytes): {e}"),
            )
        }
    };
    if state.handler == HandlerKind::Noop {
        return answer(
            StatusCode::OK,
            OutcomeSummary {
                outcome: "noop".into(),
                claim_id: None,
                message_id: None,
                delivery_count: None,
                detail: None,
            },
        );
    }

    let invocation = match Invocation::decode(&bytes) {
        Ok(inv) => inv,
        Err(e) => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                &invocation_id,
                format!("undecodable invocation: {e}"),
            )
        }
    };
    if !invocation.shadowed_metadata.is_empty() {
        tracing::warn!(
            messageId = %invocation.message_id,
            fields = ?invocation.shadowed_metadata,
            "body fields may have overwritten Service Bus metadata; set dataType binary in function.json"
        );
    }
    let delivery = Delivery {
        message_id: invocation.message_id.clone(),
        delivery_count: invocation.delivery_count,
    };

    let (claim_id, outcome) = match ClaimApproved::parse(&invocation.body) {
        Err(e) => {
            let outcome = Outcome::InvalidMessage {
                reason: format!("invalid ClaimApproved: {e}"),
            };
            telemetry::counters().invalid_messages.inc();
            (None, outcome)
        }
        Ok(msg) => {
            let outcome = match state.handler {
                #[cfg(feature = "dev-tools")]
                HandlerKind::Naive => {
                    crate::consumer::naive::handle(&state.consumer, &msg, &delivery).await
                }
                _ => state.consumer.handle(&msg, &delivery).await,
            };
            (Some(msg.claim_id.to_string()), outcome)
        }
    };

    if outcome.completes_message() && state.crash_after_commit > 0.0 {
        maybe_crash_before_answer(state.crash_after_commit);
    }

    let status = status_for(&outcome);
    let detail = outcome.detail();
    let fields = (
        claim_id.as_deref().unwrap_or(""),
        delivery.message_id.as_str(),
        delivery.delivery_count,
        outcome.label(),
    );
    if outcome.completes_message() {
        tracing::info!(invocationId = %invocation_id, trigger = "servicebus", claimId = fields.0, messageId = fields.1, deliveryCount = fields.2, outcome = fields.3, detail = detail.as_deref(), "invocation finished");
    } else if outcome.is_permanent_failure() {
        tracing::error!(invocationId = %invocation_id, trigger = "servicebus", claimId = fields.0, messageId = fields.1, deliveryCount = fields.2, outcome = fields.3, detail = detail.as_deref(), "invocation finished");
    } else {
        tracing::warn!(invocationId = %invocation_id, trigger = "servicebus", claimId = fields.0, messageId = fields.1, deliveryCount = fields.2, outcome = fields.3, detail = detail.as_deref(), "invocation finished");
    }
    answer(
        status,
        OutcomeSummary {
            outcome: outcome.label().into(),
            claim_id,
            message_id: Some(delivery.message_id.to_string()),
            delivery_count: Some(delivery.delivery_count),
            detail,
        },
    )
}

/// Dev fault: die like a killed process after the work is committed, before answering.
#[cfg(feature = "dev-tools")]
fn maybe_crash_before_answer(probability: f64) {
    use rand::RngExt;
    if rand::rng().random_bool(probability) {
        tracing::warn!("fault injection: SIGKILL after commit, before answering");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(not(feature = "dev-tools"))]
fn maybe_crash_before_answer(_probability: f64) {}

/// Opens the configured store. `access` says how this process uses a SQLite file (serve,
/// an operator's write, a read-only listing); Cosmos ignores it.
pub async fn open_store(settings: &Settings, access: Access) -> anyhow::Result<DynStore> {
    let store: DynStore = match settings.store {
        StoreKind::Sqlite => SqliteStore::open_as(&settings.sqlite_path, access)
            .context("cannot use the SQLite database set by PAYMENTS_SQLITE_PATH")?,
        StoreKind::Cosmos => {
            let cosmos = settings
                .cosmos
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("PAYMENTS_STORE=cosmos without Cosmos settings"))?;
            Arc::new(
                crate::store::cosmos::CosmosStore::connect(cosmos, settings.inbox_retention)
                    .await?,
            )
        }
    };
    #[cfg(feature = "dev-tools")]
    if !settings.dev.store_delay.is_zero() {
        return Ok(Arc::new(crate::store::SlowStore::new(
            store,
            settings.dev.store_delay,
        )));
    }
    Ok(store)
}

/// Builds the consumer the settings describe.
pub fn consumer_for(settings: &Settings, store: DynStore) -> anyhow::Result<Consumer> {
    let bank = settings.bank.as_ref().map(BankClient::new).transpose()?;
    Ok(Consumer::new(
        store,
        bank,
        Policy {
            consumer_name: settings.consumer_name.clone(),
            inbox_retention: settings.inbox_retention,
            lease: settings.lease,
            inflight_wait: settings.inflight_wait,
            retry_budget: settings.retry_budget,
            bank_key_window: settings
                .bank
                .as_ref()
                .map_or(Duration::from_secs(24 * 3600), |b| b.key_window),
        },
    ))
}

/// Runs the custom handler until SIGTERM or SIGINT.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    // Installed before the port opens: a SIGTERM that arrives right after the host sees
    // us ready must drain, not kill.
    let shutdown = shutdown_signal()?;
    let store = open_store(&settings, Access::Serve).await?;
    let consumer = consumer_for(&settings, store.clone())?;
    let state = AppState::new(
        consumer,
        settings.dev.handler,
        settings.dev.crash_after_commit,
    )
    .with_reconcile_min_age(settings.reconcile_min_age)
    .with_http(settings.http_auth, settings.key_retention);

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, settings.port));
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {addr} (FUNCTIONS_CUSTOMHANDLER_PORT): {e}")
    })?;
    tracing::info!(
        address = %listener.local_addr()?,
        store = ?settings.store,
        payouts = settings.bank.is_some(),
        handler = ?settings.dev.handler,
        "claims-payments custom handler listening"
    );

    let retention_task = tokio::spawn(purge_periodically(store));
    let counters_task = tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.tick().await;
        loop {
            tick.tick().await;
            telemetry::log_counters();
        }
    });

    run(listener, router(state), shutdown).await;
    retention_task.abort();
    counters_task.abort();
    telemetry::log_counters();
    tracing::info!("drained in-flight invocations; stopping");
    Ok(())
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains for at most
/// [`SHUTDOWN_DRAIN`]. Unlike `axum::serve`, every connection has a header read timeout,
/// so neither a slow client nor a shutdown waits on one for ever.
pub async fn run(
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

/// SQLite has no TTL: apply the inbox retention hourly, in small batches.
async fn purge_periodically(store: DynStore) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tick.tick().await;
        match store
            .purge_expired(time::OffsetDateTime::now_utc(), 500)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "purged expired inbox records"),
            Err(e) => tracing::warn!(error = %e, "inbox purge failed; will retry next hour"),
        }
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
