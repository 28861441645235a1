//! Answers as they go on the wire and as key records keep them, and what a client is
//! told for each way a payment can end.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::consumer::Outcome;
use crate::domain::OutcomeKind;
use crate::store::PaymentRecord;

/// Where problem types live (`type` of every problem answer).
const PROBLEM_BASE: &str = "https://claims-payments/problems/";

/// Every problem this API answers with. Its status, `type` and `title` are fixed here, so
/// a client can branch on `type`; only the `detail` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    Unavailable,
    StoreFailure,
    ClaimAlreadyPaid,
    PaymentNotFound,
    InvalidBody,
    KeyInvalid,
    KeyMissing,
    KeyReused,
    RequestInFlight,
    UnsupportedMediaType,
    BodyTooLarge,
    BodyTimeout,
    InternalError,
    InvalidClaimId,
    CallerUnknown,
    Forbidden,
    NoSuchRoute,
}

impl Problem {
    #[cfg(test)]
    const ALL: [Problem; 17] = [
        Problem::Unavailable,
        Problem::StoreFailure,
        Problem::ClaimAlreadyPaid,
        Problem::PaymentNotFound,
        Problem::InvalidBody,
        Problem::KeyInvalid,
        Problem::KeyMissing,
        Problem::KeyReused,
        Problem::RequestInFlight,
        Problem::UnsupportedMediaType,
        Problem::BodyTooLarge,
        Problem::BodyTimeout,
        Problem::InternalError,
        Problem::InvalidClaimId,
        Problem::CallerUnknown,
        Problem::Forbidden,
        Problem::NoSuchRoute,
    ];

    /// Status, `type` (after [`PROBLEM_BASE`]) and `title`.
    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Problem::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Temporarily unavailable",
            ),
            Problem::StoreFailure => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "store-failure",
                "The store failed",
            ),
            Problem::ClaimAlreadyPaid => (
                StatusCode::CONFLICT,
                "claim-already-paid",
                "The claim already has a payment",
            ),
            Problem::PaymentNotFound => (
                StatusCode::NOT_FOUND,
                "payment-not-found",
                "No payment for this claim",
            ),
            Problem::InvalidBody => (
                StatusCode::BAD_REQUEST,
                "invalid-body",
                "The request body is invalid",
            ),
            Problem::KeyInvalid => (
                StatusCode::BAD_REQUEST,
                "idempotency-key-invalid",
                "Idempotency-Key is invalid",
            ),
            Problem::KeyMissing => (
                StatusCode::BAD_REQUEST,
                "idempotency-key-missing",
                "Idempotency-Key is missing",
            ),
            Problem::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key is already used",
            ),
            Problem::RequestInFlight => (
                StatusCode::CONFLICT,
                "request-in-flight",
                "A request with this Idempotency-Key is in progress",
            ),
            Problem::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "The request body's media type is not supported",
            ),
            Problem::BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "The request body is too large",
            ),
            Problem::BodyTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "The request body did not arrive in time",
            ),
            Problem::InternalError => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal-error",
                "The payment failed unexpectedly",
            ),
            Problem::InvalidClaimId => (
                StatusCode::BAD_REQUEST,
                "invalid-claim-id",
                "The claim id is invalid",
            ),
            Problem::CallerUnknown => (
                StatusCode::UNAUTHORIZED,
                "caller-unknown",
                "The caller is not authenticated",
            ),
            Problem::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "The caller may not do this",
            ),
            Problem::NoSuchRoute => (StatusCode::NOT_FOUND, "no-such-route", "No such route"),
        }
    }

    /// The `application/problem+json` answer. `detail` is always written by this
    /// service: never text that came from the bank, the store or the request's headers.
    pub(crate) fn answer(self, detail: impl Into<String>) -> Answer {
        let (status, slug, title) = self.parts();
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
}

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
    Problem::Unavailable
        .answer("the payments store is unavailable; retry with the same Idempotency-Key")
        .retry_after(1)
}

pub(crate) fn store_failure() -> Answer {
    Problem::StoreFailure.answer(
        "the payments store failed in a way retrying cannot heal; the operators are alerted",
    )
}

pub(crate) fn claim_already_paid() -> Answer {
    Problem::ClaimAlreadyPaid.answer(
        "this claim was already paid by another request; a claim is paid once, do not retry",
    )
}

pub(crate) fn payment_not_found() -> Answer {
    Problem::PaymentNotFound.answer("there is no payment for this claim that you may read")
}

/// What the client is told for each way a payment can end. An outcome's `reason` is
/// free text that may carry the bank's answer or the store's error (a bank that echoes
/// our `Authorization` header in its error body would hand the client our credential), so every detail here is fixed per outcome kind; the reason
/// goes only to the log line and the operator's records.
pub(crate) fn answer_for(outcome: &Outcome, payment: Option<&PaymentRecord>) -> Answer {
    // A request that meets its own key's finished work (a retry whose first answer could
    // not be stored under the key) answers as the first one did: by the first outcome, so
    // a key never gets 200 once and 201 later.
    let first = match outcome {
        Outcome::Duplicate {
            first_outcome: Some(first),
        } => Some(*first),
        _ => None,
    };
    match (outcome, payment) {
        (Outcome::RetryLater { .. }, _) => Problem::Unavailable.answer(
                        "the payment could not be finished now (the bank or the store did not answer in time, or another attempt holds this claim); retry with the same Idempotency-Key",
        )
        .retry_after(2),
        (Outcome::StoreFailure { .. }, _) => store_failure(),
        (Outcome::InvalidMessage { .. }, _) => Problem::InvalidBody.answer(
                        "body: cannot be paid as sent (payee: is required when payouts are enabled)",
        ),
        (Outcome::Conflict { .. }, _) => claim_already_paid(),
        (_, _) if first == Some(OutcomeKind::Conflict) => claim_already_paid(),
        (Outcome::BusinessDuplicate { .. }, Some(p)) => Answer::resource(StatusCode::OK, p),
        (_, Some(p)) if first == Some(OutcomeKind::BusinessDuplicate) => {
            Answer::resource(StatusCode::OK, p)
        }
        (Outcome::NeedsReconciliation { .. }, Some(p)) => Answer::resource(StatusCode::ACCEPTED, p),
        (_, Some(p)) => Answer::resource(StatusCode::CREATED, p),
        // The consumer finished but the payment cannot be read back: nothing final to
        // tell; the retry reads it again.
        (_, None) => Problem::Unavailable.answer(
                        "the payment was handled but could not be read back; retry with the same Idempotency-Key",
        )
        .retry_after(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client branches on `type`: no two problems may share one.
    #[test]
    fn every_problem_has_its_own_type() {
        let mut types: Vec<&str> = Problem::ALL.iter().map(|p| p.parts().1).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), Problem::ALL.len());
    }

    /// A retry that meets its key's finished work answers as the first request did: a
    /// business duplicate stays 200 (a seed of the simulator's hot claims found 200 and
    /// then 201 under one key when the first answer could not be stored).
    #[test]
    fn a_duplicate_answers_as_its_first_outcome_did() {
        let claim_id = crate::domain::ClaimId::random();
        let now = time::OffsetDateTime::now_utc();
        let p = PaymentRecord {
            claim_id,
            purpose: crate::domain::Purpose::Payout,
            tenant_id: None,
            money: crate::domain::Money::new(
                rust_decimal::Decimal::new(10, 0),
                crate::domain::Currency::parse("EUR").unwrap(),
            )
            .unwrap(),
            payee: None,
            payload_hash: crate::domain::PayloadHash::from_stored("h".into()),
            message_id: crate::domain::MessageId::parse("m-1").unwrap(),
            idempotency_key: crate::domain::IdempotencyKey::for_payout(None, claim_id),
            payout_request: None,
            status: crate::store::PaymentStatus::Paid,
            bank_payment_id: None,
            status_reason: None,
            created_at: now,
            updated_at: now,
        };
        let first = |kind| Outcome::Duplicate {
            first_outcome: Some(kind),
        };
        let business = Outcome::BusinessDuplicate {
            original_message: crate::domain::MessageId::parse("m-0").unwrap(),
        };
        assert_eq!(answer_for(&business, Some(&p)).status, 200);
        assert_eq!(
            answer_for(&first(OutcomeKind::BusinessDuplicate), Some(&p)).status,
            200
        );
        assert_eq!(answer_for(&first(OutcomeKind::Paid), Some(&p)).status, 201);
        assert_eq!(
            answer_for(&first(OutcomeKind::Conflict), Some(&p)).status,
            409
        );
    }

    /// No outcome's reason reaches the client.
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
