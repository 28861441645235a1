//! The `Payments` and `PaymentsGet` HTTP functions: `POST /api/payments` with an
//! Idempotency-Key and `GET /api/payments/{claimId}`. The host forwards both requests
//! unchanged; the rules live in [`crate::payments_api`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// `function-app/Payments`: route `payments` under the host's `api` prefix.
pub(crate) const ROUTE: &str = "/api/payments";
/// `function-app/PaymentsGet`: route `payments/{claimId}`.
pub(crate) const GET_ROUTE: &str = "/api/payments/{claim_id}";

pub(crate) async fn post(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    state
        .api
        .handle_post(&headers, body)
        .await
        .into_parts()
        .into_response()
}

pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(claim_id): Path<String>,
) -> Response {
    state
        .api
        .get(&headers, &claim_id)
        .await
        .into_parts()
        .into_response()
}
