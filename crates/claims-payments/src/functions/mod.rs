//! One module per function of the app, as `function-app/<Name>/function.json` declares
//! them: what the host sends to each route, and what it gets back.
//!
//! - [`claim_approved`]: `POST /ClaimApproved`, the Service Bus trigger;
//! - [`payments`]: `POST /api/payments` and `GET /api/payments/{claimId}`, the HTTP
//!   functions `Payments` and `PaymentsGet` (forwarded unchanged by the host);
//! - [`reconcile`]: `POST /Reconcile`, the timer trigger;
//! - [`purge`]: `POST /Purge`, the retention timer trigger;
//!
//! plus `GET /` (the host's readiness probe) and `GET /metrics` (the counters, for local
//! runs). [`router`] puts them together over the [`AppState`] built at start-up.

pub mod claim_approved;
pub(crate) mod payments;
pub(crate) mod purge;
pub(crate) mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::consumer::Consumer;
use crate::payments_api::{self, CallerAuth, PaymentsApi};
use crate::telemetry;
use claim_approved::ClaimHandler;

/// The routes that open their own server span (the others get one from the telemetry
/// layer): `ClaimApproved` and `Reconcile` parent theirs on what the host sends.
pub(crate) const OWN_SPAN_ROUTES: &[&str] = &["/", "/metrics", "/ClaimApproved", "/Reconcile"];

/// Everything a request needs, built once at start-up.
pub struct AppState {
    consumer: Consumer,
    api: PaymentsApi,
    claim_handler: Arc<dyn ClaimHandler>,
    reconcile_min_age: Duration,
}

impl AppState {
    /// The state the product serves: the consumer answers `ClaimApproved`, HTTP callers
    /// are told apart by function key, keys are kept 24 h, orphans reconciled after three
    /// leases. The `with_` methods change one of these.
    pub fn new(consumer: Consumer) -> Self {
        AppState {
            reconcile_min_age: consumer.policy().lease * 3,
            api: PaymentsApi::new(
                consumer.clone(),
                CallerAuth::FunctionKey,
                Duration::from_secs(24 * 3600),
            ),
            claim_handler: Arc::new(consumer.clone()),
            consumer,
        }
    }

    /// The HTTP API's caller authentication and key retention.
    pub(crate) fn with_http(mut self, auth: CallerAuth, retention: Duration) -> Self {
        self.api = PaymentsApi::new(self.consumer.clone(), auth, retention);
        self
    }

    /// The minimum age of an orphaned payout before the timer settles it.
    pub(crate) fn with_reconcile_min_age(mut self, min_age: Duration) -> Self {
        self.reconcile_min_age = min_age;
        self
    }

    /// What answers a decoded `ClaimApproved` instead of the consumer.
    pub(crate) fn with_claim_handler(mut self, handler: Arc<dyn ClaimHandler>) -> Self {
        self.claim_handler = handler;
        self
    }

    pub(crate) fn consumer(&self) -> &Consumer {
        &self.consumer
    }
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
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

/// A 404 that speaks the language of the caller's route: an HTTP API client (under
/// `/api/`) gets a problem naming the API's routes; anything else is the Functions
/// host's side, whose functions are named.
async fn not_found(uri: Uri) -> Response {
    if uri.path() == "/api" || uri.path().starts_with("/api/") {
        let (status, headers, body) = payments_api::Problem::NoSuchRoute
            .answer(format!(
                "the payments API serves POST {} and GET {}",
                payments::ROUTE,
                payments::GET_ROUTE.replace("{claim_id}", "{claimId}")
            ))
            .into_parts();
        return (status, headers, body).into_response();
    }
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"error": format!(
            "no such function; this handler serves POST /{} and POST /{}",
            claim_approved::FUNCTION_NAME,
            reconcile::FUNCTION_NAME
        )})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_with_their_own_span_are_the_functions_that_open_one() {
        for name in [claim_approved::FUNCTION_NAME, reconcile::FUNCTION_NAME] {
            assert!(
                OWN_SPAN_ROUTES.contains(&format!("/{name}").as_str()),
                "{name}"
            );
        }
    }
}
