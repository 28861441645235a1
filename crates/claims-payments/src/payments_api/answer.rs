//! Answers as they go on the wire and as key records keep them, and what a client is
//! told for each way a payment can end.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::consumer::Outcome;
use crate::store::PaymentRecord;

/// Where problem types live (`type` of every problem answer).
const PROBLEM_BASE: &str = "https://claims-payments/problems/";

/// An answer as it goes on the wire, and as a key record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub status: u16,
    content_type: String,
    pub body: String,
    /// `Location` of a created payment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) location: Option<String>,
    /// Seconds, for 409 and 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// Set on a replay of a stored answer; never stored.
    #[serde(skip)]
    pub replayed: bool,
}

impl Answer {
    /// An `application/problem+json` answer. `detail` is always written by this
    /// service: never text that came from the bank, the store or the request's headers.
    pub(crate) fn problem(
        status: StatusCode,
        slug: &str,
        title: &str,
        detail: impl Into<String>,
    ) -> Self {
        let body = serde_json::json!({
            "type": format!("{PROBLEM_BASE}{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail.into(),
        });
        Answer {
            status: status.as_u16(),
            content_type: "application/problem+json".into(),
            body: body.to_string(),
            location: None,
            retry_after: None,
            replayed: false,
        }
    }

    pub(crate) fn resource(status: StatusCode, payment: &PaymentRecord) -> Self {
        Answer {
            status: status.as_u16(),
            content_type: "application/json".into(),
            body: serde_json::to_string(&PaymentResource::from(payment))
                .unwrap_or_else(|_| "{}".into()),
            location: Some(format!("/api/payments/{}", payment.claim_id)),
            retry_after: None,
            replayed: false,
        }
    }

    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// The HTTP response: status, headers, body.
    pub(crate) fn into_parts(self) -> (StatusCode, HeaderMap, String) {
        let mut headers = HeaderMap::new();
        let put = |headers: &mut HeaderMap, name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(name, v);
            }
        };
        put(&mut headers, "content-type", &self.content_type);
        if let Some(location) = &self.location {
            put(&mut headers, "location", location);
        }
        if let Some(seconds) = self.retry_after {
            put(&mut headers, "retry-after", &seconds.to_string());
        }
        if self.replayed {
            put(&mut headers, "idempotent-replayed", "true");
        }
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, headers, self.body)
    }
}

/// The payment resource (`GET /api/payments/{claimId}` and the answers that create one).
/// The payment's `statusReason` is not part of it: it may hold the bank's words.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PaymentResource {
    claim_id: String,
    amount: String,
    currency: String,
    status: &'static str,
    bank_payment_id: Option<String>,
    created_at: String,
    updated_at: String,
}

impl From<&PaymentRecord> for PaymentResource {
    fn from(p: &PaymentRecord) -> Self {
        let at = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
        PaymentResource {
            claim_id: p.claim_id.to_string(),
            amount: p.money.amount_string(),
            currency: p.money.currency().code().to_owned(),
            status: p.status.as_str(),
            bank_payment_id: p.bank_payment_id.clone(),
            created_at: at(p.created_at),
            updated_at: at(p.updated_at),
        }
    }
}

pub(crate) fn store_unavailable() -> Answer {
    Answer::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "Temporarily unavailable",
        "the payments store is unavailable; retry with the same Idempotency-Key",
    )
    .retry_after(1)
}

pub(crate) fn store_failure() -> Answer {
    Answer::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "store-failure",
        "The store failed",
        "the payments store failed in a way retrying cannot heal; the operators are alerted",
    )
}

pub(crate) fn claim_already_paid() -> Answer {
    Answer::problem(
        StatusCode::CONFLICT,
        "claim-already-paid",
        "The claim already has a payment",
        "this claim was already paid by another request; a claim is paid once, do not retry",
    )
}

pub(crate) fn payment_not_found() -> Answer {
    Answer::problem(
        StatusCode::NOT_FOUND,
        "payment-not-found",
        "No payment for this claim",
        "there is no payment for this claim that you may read",
    )
}

/// What the client is told for each way a payment can end. An outcome's `reason` is
/// free text that may carry the bank's answer or the store's error (issue 21 item 6:
/// a bank that echoes our `Authorization` header in its error body would hand the
/// client our credential), so every detail here is fixed per outcome kind; the reason
/// goes only to the log line and the operator's records.
pub(crate) fn answer_for(outcome: &Outcome, payment: Option<&PaymentRecord>) -> Answer {
    match (outcome, payment) {
        (Outcome::RetryLater { .. }, _) => Answer::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Temporarily unavailable",
            "the payment could not be finished now (the bank or the store did not answer in time, or another attempt holds this claim); retry with the same Idempotency-Key",
        )
        .retry_after(2),
        (Outcome::StoreFailure { .. }, _) => store_failure(),
        (Outcome::InvalidMessage { .. }, _) => Answer::problem(
            StatusCode::BAD_REQUEST,
            "invalid-body",
            "The request body is invalid",
            "body: cannot be paid as sent (payee: is required when payouts are enabled)",
        ),
        (Outcome::Conflict { .. }, _) => claim_already_paid(),
        (Outcome::BusinessDuplicate { .. }, Some(p)) => Answer::resource(StatusCode::OK, p),
        (Outcome::NeedsReconciliation { .. }, Some(p)) => Answer::resource(StatusCode::ACCEPTED, p),
        (_, Some(p)) => Answer::resource(StatusCode::CREATED, p),
        // The consumer finished but the payment cannot be read back: nothing final to
        // tell; the retry reads it again.
        (_, None) => Answer::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Temporarily unavailable",
            "the payment was handled but could not be read back; retry with the same Idempotency-Key",
        )
        .retry_after(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21 item 6: no outcome's reason reaches the client.
    #[test]
    fn no_outcome_reason_reaches_a_problem_detail() {
        let secret = "Bearer s3cr3t-from-the-bank-echo";
        for outcome in [
            Outcome::RetryLater {
                reason: secret.into(),
            },
            Outcome::StoreFailure {
                reason: secret.into(),
            },
            Outcome::InvalidMessage {
                reason: secret.into(),
            },
            Outcome::Conflict {
                reason: secret.into(),
            },
            Outcome::Rejected {
                reason: secret.into(),
            },
            Outcome::NeedsReconciliation {
                reason: secret.into(),
            },
        ] {
            let a = answer_for(&outcome, None);
            assert!(!a.body.contains("s3cr3t"), "{outcome:?}: {}", a.body);
        }
    }
}
