//! Baselines the benchmark and the simulator compare the guarded consumer with.
//!
//! - [`Naive`]: the usual hand-written consumer: check the inbox, call the bank with a
//!   fresh key, then record. Two deliveries that pass the check together, or a crash
//!   between the bank call and the record, pay twice. Written against the public store
//!   port and bank client, as a team without the guard would write it.
//! - [`noop_router`]: answers every invocation 200 after reading it, without decoding or
//!   storing anything: what the machine and the HTTP path can do at best.

use async_trait::async_trait;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use claims_payments::seams::bank::{BankClient, PayoutOutcome, SendWindow};
use claims_payments::seams::consumer::{Consumer, Delivery, Outcome, Policy};
use claims_payments::seams::functions::claim_approved::{ClaimHandler, FUNCTION_NAME};
use claims_payments::seams::functions::limits::read_body;
use claims_payments::seams::functions::{metrics, ready};
use claims_payments::seams::services::Services;
use claims_payments::seams::store::{
    AttemptId, ClaimResult, DynStore, InboxStatus, PaymentStatus, StoreError,
};
use claims_payments::seams::{CrashHook, Step};
use claims_payments::{ClaimApproved, IdempotencyKey};
use time::OffsetDateTime;

/// Check-then-insert without the atomic guard.
pub struct Naive {
    /// Builds the same records the guarded consumer writes.
    records: Consumer,
    store: DynStore,
    bank: Option<BankClient>,
    policy: Policy,
    crash_hook: Option<CrashHook>,
}

impl Naive {
    /// The naive consumer on the guarded consumer's services: its store, bank and policy.
    pub fn new(services: &Services) -> Self {
        Naive {
            records: services.consumer(),
            store: services.store.clone(),
            bank: services.bank.clone(),
            policy: services.policy.clone(),
            crash_hook: None,
        }
    }

    /// Simulated crashes for tests (only [`Step::AfterBankCall`] exists here).
    pub fn with_crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }

    async fn record_after_paying(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        let now = OffsetDateTime::now_utc();
        let (mut inbox, mut payment) =
            self.records
                .first_records(msg, delivery, AttemptId::new(), now);
        inbox.status = InboxStatus::Completed;
        inbox.lease_until = None;
        let mut outcome = Outcome::Recorded;
        if let Some(bank) = &self.bank {
            // A fresh key per attempt: exactly what makes a retry pay again.
            let fresh_key = IdempotencyKey::from_stored(AttemptId::new().to_string());
            let policy = &self.policy;
            let window = SendWindow::new(policy.retry_budget, now, policy.bank_key_window);
            match bank
                .pay(&fresh_key, &msg.payout_request_body(), window)
                .await
            {
                PayoutOutcome::Paid { payment_id } => {
                    payment.status = PaymentStatus::Paid;
                    payment.bank_payment_id = Some(payment_id.clone());
                    outcome = Outcome::Paid {
                        bank_payment_id: payment_id,
                    };
                }
                other => {
                    return Outcome::RetryLater {
                        reason: format!("bank: {other:?}"),
                    }
                }
            }
            if self
                .crash_hook
                .as_ref()
                .is_some_and(|crash| crash(Step::AfterBankCall))
            {
                return Outcome::RetryLater {
                    reason: "simulated crash AfterBankCall".into(),
                };
            }
        }
        inbox.outcome = Some(outcome.kind().into());
        match self.store.claim(&inbox, &payment).await {
            Ok(ClaimResult::Claimed { .. }) => outcome,
            Ok(ClaimResult::InboxExists(_)) => Outcome::Duplicate {
                first_outcome: None,
            },
            Ok(ClaimResult::PaymentExists(p)) => Outcome::BusinessDuplicate {
                original_message: p.record.message_id,
            },
            Err(e) => retry_later(e),
        }
    }
}

fn retry_later(e: StoreError) -> Outcome {
    Outcome::RetryLater {
        reason: e.to_string(),
    }
}

#[async_trait]
impl ClaimHandler for Naive {
    async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        let key = self.records.inbox_key(msg, delivery);
        let outcome = match self.store.inbox(&key).await {
            Ok(Some(_)) => Outcome::Duplicate {
                first_outcome: None,
            },
            Ok(None) => self.record_after_paying(msg, delivery).await,
            Err(e) => retry_later(e),
        };
        outcome.count();
        outcome
    }
}

/// The do-nothing handler: reads each invocation whole, answers 200 (with the readiness
/// probe and the counters, which the benchmark reads around each phase).
pub fn noop_router() -> Router {
    Router::new()
        .route("/", get(ready))
        .route("/metrics", get(metrics))
        .route(&format!("/{FUNCTION_NAME}"), post(noop))
}

async fn noop(body: Body) -> Response {
    let status = match read_body(body).await {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::BAD_REQUEST,
    };
    // The host's answer shape with an outcome of its own: no product outcome fits a
    // handler that pays nothing.
    let answer = serde_json::json!({
        "Outputs": {},
        "Logs": ["outcome: noop"],
        "ReturnValue": { "outcome": "noop" },
    });
    (status, Json(answer)).into_response()
}

/// Which handler `claims-payments-dev serve` puts behind `POST /ClaimApproved`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// The product's guarded consumer.
    Consumer,
    Naive,
    Noop,
}
