//! The `Payments` and `PaymentsGet` HTTP functions: `POST /api/payments` with an
//! Idempotency-Key and `GET /api/payments/{claimId}`. The host forwards both requests
//! unchanged; the rules live in [`crate::payments_api`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::http::{read_body, BodyError, BODY_READ_TIMEOUT, MAX_REQUEST_BYTES};
use crate::payments_api::Answer;
use crate::startup::AppState;

/// `function-app/Payments`: route `payments` under the host's `api` prefix.
pub const ROUTE: &str = "/api/payments";
/// `function-app/PaymentsGet`: route `payments/{claimId}`.
pub const GET_ROUTE: &str = "/api/payments/{claim_id}";

pub async fn post(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let answer = match read_body(body).await {
        Ok(bytes) => state.api.post(&headers, &bytes).await,
        Err(BodyError::TooLarge) => Answer::problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "The request body is too large",
            format!("body: at most {MAX_REQUEST_BYTES} bytes"),
        ),
        Err(BodyError::Timeout) => Answer::problem(
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

pub async fn get(State(state): State<Arc<AppState>>, Path(claim_id): Path<String>) -> Response {
    state.api.get(&claim_id).await.into_parts().into_response()
}
