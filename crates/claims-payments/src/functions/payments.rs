//! The `Payments` and `PaymentsGet` HTTP functions: `POST /api/payments` with an
//! Idempotency-Key and `GET /api/payments/{claimId}`. The host forwards both requests
//! unchanged; the rules live in [`crate::payments_api`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::limits::{json_request, read_body, BodyError, BODY_READ_TIMEOUT, MAX_REQUEST_BYTES};
use super::AppState;
use crate::payments_api::{Answer, Problem};
use crate::telemetry;

/// `function-app/Payments`: route `payments` under the host's `api` prefix.
pub(crate) const ROUTE: &str = "/api/payments";
/// `function-app/PaymentsGet`: route `payments/{claimId}`.
pub(crate) const GET_ROUTE: &str = "/api/payments/{claim_id}";

/// `POST /api/payments`: who calls and may they pay (401, 403), is the body JSON (415)
/// and within the limits (413, 408), then the payments API with the bytes. Nothing is
/// written for any refusal here.
pub(crate) async fn post(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::counters().http_requests.inc();
    let answer = match state.api.payer(&headers) {
        Err(refused) => refused,
        Ok(caller) => match accepted_body(&headers, body).await {
            Ok(bytes) => state.api.post_as(caller, &headers, bytes).await,
            Err(refused) => refused,
        },
    };
    answer.into_parts().into_response()
}

/// The request body, if it is JSON and arrives within the limits.
async fn accepted_body(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, Answer> {
    if let Err(unsupported) = json_request(headers) {
        return Err(Problem::UnsupportedMediaType.answer(unsupported.to_string()));
    }
    read_body(body).await.map_err(|e| match e {
        BodyError::TooLarge => {
            Problem::BodyTooLarge.answer(format!("body: at most {MAX_REQUEST_BYTES} bytes"))
        }
        BodyError::Timeout => Problem::BodyTimeout.answer(format!(
            "body: not received within {} s",
            BODY_READ_TIMEOUT.as_secs()
        )),
    })
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
