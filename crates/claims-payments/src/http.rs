//! The HTTP surface the Functions host talks to: routing and what every route shares.
//!
//! Listens on 127.0.0.1 only: the host is the sole caller, on the same machine. One
//! module per function under [`crate::functions`] answers its route, mirroring
//! `function-app/<Name>/function.json`; `GET /` is the host's readiness probe and
//! `GET /metrics` shows the counters for local runs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::functions::{claim_approved, payments, purge, reconcile};
use crate::host::{InvocationResult, OutcomeSummary};
use crate::startup::AppState;
use crate::telemetry;

/// Service Bus messages are at most 256 KB (Standard) and base64 adds a third.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// A connection must deliver its request headers within this time. The host sends
/// them at once; a caller that trickles them is cut off instead of holding a socket.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole request body must arrive within this time after the headers.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(ready))
        .route("/metrics", get(metrics))
        .route(
            &format!("/{}", claim_approved::FUNCTION_NAME),
            post(claim_approved::invoke),
        )
        .route(
            &format!("/{}", reconcile::FUNCTION_NAME),
            post(reconcile::invoke),
        )
        .route(&format!("/{}", purge::FUNCTION_NAME), post(purge::invoke))
        // Forwarded unchanged by the host (customHandler.enableForwardingHttpRequest).
        .route(payments::ROUTE, post(payments::post))
        .route(payments::GET_ROUTE, get(payments::get))
        .fallback(not_found)
        .with_state(state)
}

/// The readiness probe: the host sends work once this answers.
pub async fn ready() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ready"}))
}

/// The counters, for local runs and the benchmark.
pub async fn metrics() -> Json<telemetry::CountersSnapshot> {
    Json(telemetry::counters().snapshot())
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"error": format!("no such function; this handler serves POST /{}", claim_approved::FUNCTION_NAME)})),
    )
        .into_response()
}

/// Why a request body could not be read.
pub enum BodyError {
    TooLarge,
    Timeout,
}

/// Reads a whole request body, at most [`MAX_REQUEST_BYTES`], within [`BODY_READ_TIMEOUT`]:
/// a caller that trickles its body must not hold a worker.
pub async fn read_body(body: Body) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REQUEST_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// The custom-handler answer to an invocation: `status` and the outcome as JSON.
pub fn invocation_answer(status: StatusCode, summary: OutcomeSummary) -> Response {
    (status, Json(InvocationResult::new(summary))).into_response()
}
