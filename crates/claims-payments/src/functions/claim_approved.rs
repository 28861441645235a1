//! The `ClaimApproved` function: one Service Bus delivery, as the host's invocation
//! envelope, answered 2xx (complete the message) or not (abandon it: redelivery, then
//! the dead-letter queue after MaxDeliveryCount).

use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::answer::{invocation_answer, DeliveryEnd, Ended, OutcomeSummary, Severity};
use super::envelope::Invocation;
use super::limits::{read_body, BodyError, BODY_READ_TIMEOUT, MAX_REQUEST_BYTES};
use super::AppState;
use crate::consumer::{Consumer, Delivery, Outcome};
use crate::domain::{ClaimApproved, OutcomeKind};
use crate::telemetry;

/// The function's folder in function-app/, which is the route the host calls.
pub const FUNCTION_NAME: &str = "ClaimApproved";

/// What handles a decoded `ClaimApproved` delivery. The product's is the guarded
/// [`Consumer`]; `claims-payments-dev` plugs in its baselines and faults here.
#[async_trait]
pub trait ClaimHandler: Send + Sync {
    async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome;
}

#[async_trait]
impl ClaimHandler for Consumer {
    async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        Consumer::handle(self, msg, delivery).await
    }
}

/// 2xx completes the message; anything else abandons it.
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

/// Refuses an invocation that cannot even be read: permanent, so the host's redeliveries
/// end in the dead-letter queue, with the reason in every log line.
fn refuse(
    status: StatusCode,
    headers: &HeaderMap,
    invocation_id: &str,
    reason: String,
) -> Response {
    let invocation = telemetry::trace::invocation_span(FUNCTION_NAME, headers, None, "", 0);
    invocation.run_sync(|| {
        tracing::error!(invocationId = %invocation_id, trigger = "servicebus", outcome = "invalid-message", reason = %reason, "invocation finished");
        telemetry::counters().invalid_messages.inc();
        telemetry::metrics::dead_letter_bound("invalid-message");
        telemetry::trace::record_invocation_outcome(None, "invalid-message", status.as_u16());
    });
    invocation_answer(
        status,
        OutcomeSummary {
            outcome: Ended::Delivery(OutcomeKind::InvalidMessage),
            claim_id: None,
            message_id: None,
            delivery_count: None,
            detail: Some(reason),
            reconcile: None,
        },
    )
}

pub(crate) async fn invoke(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::counters().invocations.inc();
    let invocation_id = headers
        .get("x-azure-functions-invocationid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(BodyError::Timeout) => {
            // The host retries; the message is not at fault.
            telemetry::counters().retry_later.inc();
            tracing::warn!(invocationId = %invocation_id, trigger = "servicebus", outcome = "retry-later", "request body not received within {} s", BODY_READ_TIMEOUT.as_secs());
            return (
                StatusCode::REQUEST_TIMEOUT,
                Json(serde_json::json!({"error": format!("request body not received within {} s", BODY_READ_TIMEOUT.as_secs())})),
            )
                .into_response();
        }
        Err(BodyError::TooLarge) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                &headers,
                &invocation_id,
                format!("request body refused (limit {MAX_REQUEST_BYTES} bytes)"),
            )
        }
    };

    let invocation = match Invocation::decode(&bytes) {
        Ok(inv) => inv,
        Err(e) => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                &headers,
                &invocation_id,
                format!("undecodable invocation: {e}"),
            )
        }
    };
    // The invocation's server span: its parent is the host's traceparent, else the
    // producer's Diagnostic-Id, so the send and this processing are one operation.
    let span = telemetry::trace::invocation_span(
        FUNCTION_NAME,
        &headers,
        invocation.diagnostic_id.as_deref(),
        invocation.message_id.as_str(),
        invocation.delivery_count,
    );
    // The work runs on a task of its own: when the host drops the connection (its
    // timeout, a restart) the request future is dropped, and a payout cut there would
    // leave no outcome, no log line, no count and a root span without an outcome that
    // the sampling would take for a success. The task finishes and records all of it;
    // the redelivery then finds the stored outcome.
    // The task is the process's (`Services::work`): it ends with the process.
    let work =
        state
            .services
            .work
            .run(span.run(handle(state.clone(), invocation_id.clone(), invocation)));
    match work.await {
        Some(response) => response,
        None => {
            // A panic in the consumer, or the process is ending: the lease runs out and
            // a redelivery takes over.
            telemetry::counters().retry_later.inc();
            tracing::error!(invocationId = %invocation_id, trigger = "servicebus", outcome = "retry-later", "the invocation task ended without an answer");
            invocation_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                OutcomeSummary {
                    outcome: Ended::Delivery(OutcomeKind::RetryLater),
                    claim_id: None,
                    message_id: None,
                    delivery_count: None,
                    detail: Some(
                        "the invocation task failed; the redelivery takes over".to_owned(),
                    ),
                    reconcile: None,
                },
            )
        }
    }
}

/// The decoded invocation, inside its span.
async fn handle(state: Arc<AppState>, invocation_id: String, invocation: Invocation) -> Response {
    if !invocation.shadowed_metadata.is_empty() {
        tracing::warn!(
            messageId = %invocation.message_id,
            fields = ?invocation.shadowed_metadata,
            "body fields may have overwritten Service Bus metadata; set dataType binary in function.json"
        );
    }
    if let Some(copy) = &invocation.delivered_as {
        // Its own MessageId is the copy's; the inbox and every later line use the original.
        tracing::info!(
            messageId = %invocation.message_id,
            redriveMessageId = %copy,
            "a dead-letter re-drive copy, handled as the message it names"
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
            let outcome = state.claim_handler.handle(&msg, &delivery).await;
            (Some(msg.claim_id.to_string()), outcome)
        }
    };

    let status = status_for(&outcome);
    telemetry::trace::record_invocation_outcome(
        claim_id.as_deref(),
        outcome.label(),
        status.as_u16(),
    );
    if !status.is_success() && !matches!(outcome, Outcome::RetryLater { .. }) {
        // Failed on every delivery: the message ends in the dead-letter queue.
        telemetry::metrics::dead_letter_bound(outcome.label());
    }
    let detail = outcome.detail();
    let severity = if outcome.completes_message() {
        Severity::Info
    } else if outcome.is_permanent_failure() {
        Severity::Error
    } else {
        Severity::Warn
    };
    DeliveryEnd {
        invocation_id: &invocation_id,
        claim_id: claim_id.as_deref().unwrap_or(""),
        message_id: &delivery.message_id,
        delivery_count: delivery.delivery_count,
        outcome: outcome.label(),
        detail: detail.as_deref(),
    }
    .log(severity);
    invocation_answer(
        status,
        OutcomeSummary {
            outcome: Ended::Delivery(outcome.kind()),
            claim_id,
            message_id: Some(delivery.message_id.to_string()),
            delivery_count: Some(delivery.delivery_count),
            detail,
            reconcile: None,
        },
    )
}
