//! The wire edge: one module per function of the app, as `function-app/<Name>/function.json`
//! declares them, and what they share: the invocation envelope the host sends
//! ([`envelope`]), the answers it gets back ([`answer`]) and the limits every request
//! keeps to ([`limits`]).
//!
//! - [`claim_approved`]: `POST /ClaimApproved`, the Service Bus trigger;
//! - [`payments`]: `POST /api/payments` and `GET /api/payments/{claimId}`, the HTTP
//!   functions `Payments` and `PaymentsGet` (forwarded unchanged by the host);
//! - [`reconcile`]: `POST /Reconcile`, the timer trigger;
//! - [`purge`]: `POST /Purge`, the retention timer trigger;
//!
//! plus `GET /` (the host's readiness probe) and `GET /metrics` (the counters, for local
//! runs). [`router`] puts them together over the [`AppState`] built at start-up.

pub(crate) mod answer;
pub mod claim_approved;
pub mod envelope;
pub mod limits;
pub(crate) mod payments;
pub(crate) mod purge;
pub(crate) mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::payments_api::{self, CallerAuth, PaymentsApi};
use crate::services::Services;
use crate::telemetry;
use answer::{TimerEnd, TimerOutcome};
use claim_approved::ClaimHandler;
use envelope::TimerInvocation;
use limits::BodyError;

/// The routes that open their own server span (the others get one from the telemetry
/// layer): `ClaimApproved` and `Reconcile` parent theirs on what the host sends.
pub(crate) const OWN_SPAN_ROUTES: &[&str] = &["/", "/metrics", "/ClaimApproved", "/Reconcile"];

/// What the functions read from the settings (`configuration` composes it from the environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionSettings {
    /// Who an HTTP caller is (`HTTP_AUTH`).
    pub http_auth: CallerAuth,
    /// How long an HTTP Idempotency-Key is remembered.
    pub key_retention: Duration,
    /// The minimum age of an orphaned payout before the `Reconcile` timer settles it.
    pub reconcile_min_age: Duration,
}

/// Everything a request needs, built once at start-up.
pub struct AppState {
    claim_handler: Arc<dyn ClaimHandler>,
    api: PaymentsApi,
    /// What `Purge` reads (the store, the clock) and `Reconcile` builds each run's
    /// reconciler from.
    services: Services,
    reconcile_min_age: Duration,
}

impl AppState {
    /// The state the product serves, as `settings` describe it, on `services`: the
    /// consumer answers `ClaimApproved` and pays for the HTTP API.
    pub fn new(settings: FunctionSettings, services: &Services) -> Self {
        let consumer = services.consumer();
        AppState {
            api: PaymentsApi::new(
                consumer.clone(),
                services,
                settings.http_auth,
                settings.key_retention,
            ),
            claim_handler: Arc::new(consumer),
            services: services.clone(),
            reconcile_min_age: settings.reconcile_min_age,
        }
    }

    /// What answers a decoded `ClaimApproved` instead of the consumer.
    pub(crate) fn with_claim_handler(mut self, handler: Arc<dyn ClaimHandler>) -> Self {
        self.claim_handler = handler;
        self
    }
}

/// A timer's invocation, read within the limits every function keeps to. A body that
/// does not arrive within them ends the run as `failed`; the next schedule runs again.
async fn timer_invocation(body: Body, failed: TimerOutcome) -> Result<TimerInvocation, TimerEnd> {
    match limits::read_body(body).await {
        Ok(bytes) => Ok(TimerInvocation::decode(&bytes)),
        Err(BodyError::TooLarge) => Err(TimerEnd::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            failed,
            format!(
                "request body refused (limit {} bytes)",
                limits::MAX_REQUEST_BYTES
            ),
        )),
        Err(BodyError::Timeout) => Err(TimerEnd::new(
            StatusCode::REQUEST_TIMEOUT,
            failed,
            format!(
                "request body not received within {} s",
                limits::BODY_READ_TIMEOUT.as_secs()
            ),
        )),
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
    use axum::extract::State;
    use axum::http::HeaderMap;

    /// The state of a ledger-only process on a throwaway SQLite file, as the settings'
    /// defaults describe it.
    fn ledger_state(dir: &tempfile::TempDir) -> Arc<AppState> {
        let store = crate::store::sqlite::SqliteStore::open(dir.path().join("p.db")).unwrap();
        let settings = crate::configuration::Settings::from_lookup(|_| None).unwrap();
        let services = Services::new(
            store,
            None,
            settings.policy(),
            crate::ambient::Ambient::system(),
        );
        Arc::new(AppState::new(settings.functions(), &services))
    }

    async fn answer_of(response: Response) -> (StatusCode, serde_json::Value) {
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn timers_read_their_envelope_within_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        let state = ledger_state(&dir);
        let past_due = serde_json::json!({"Data": {"timer": {"IsPastDue": true}}, "Metadata": {}});
        let (status, answer) = answer_of(
            reconcile::invoke(
                State(state.clone()),
                HeaderMap::new(),
                Body::from(past_due.to_string()),
            )
            .await,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            answer["ReturnValue"]["outcome"], "reconcile-skipped",
            "{answer}"
        );

        let (status, answer) =
            answer_of(purge::invoke(State(state.clone()), Body::from(past_due.to_string())).await)
                .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["ReturnValue"]["outcome"], "purged", "{answer}");

        let oversized = vec![b' '; limits::MAX_REQUEST_BYTES + 1];
        let (status, answer) =
            answer_of(purge::invoke(State(state), Body::from(oversized)).await).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(answer["ReturnValue"]["outcome"], "purge-failed", "{answer}");
        assert_eq!(
            answer["Logs"][1],
            format!(
                "request body refused (limit {} bytes)",
                limits::MAX_REQUEST_BYTES
            )
        );
    }

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
