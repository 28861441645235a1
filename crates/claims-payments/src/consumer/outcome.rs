//! How a delivery ends: the [`Outcome`] the host answers with, and the counters it adds to.

use crate::message::MessageId;
use crate::telemetry;

/// How a delivery ended. The label is what logs, answers and counters use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Ledger-only mode: the payment is recorded.
    Recorded,
    /// The bank made the payout.
    Paid { bank_payment_id: String },
    /// The message was handled before; nothing was done now.
    Duplicate { first_outcome: Option<String> },
    /// The claim already has a payment from another message with the same payload.
    BusinessDuplicate { original_message: MessageId },
    /// The bank refused the payout for good; recorded for a person to handle.
    Rejected { reason: String },
    /// The payout's fate cannot be known; recorded for an operator to reconcile.
    NeedsReconciliation { reason: String },
    /// Same MessageId (or same claim) with a different payload. Never accepted.
    Conflict { reason: String },
    /// The message can never be valid.
    InvalidMessage { reason: String },
    /// Transient: the broker should deliver again later.
    RetryLater { reason: String },
    /// The store failed in a way retrying cannot heal (read-only or corrupt database, bad
    /// credentials, missing container): an operator must repair it. Never completed, so
    /// the message is kept (dead-lettered after its deliveries) for a re-drive.
    StoreFailure { reason: String },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Recorded => "recorded",
            Outcome::Paid { .. } => "paid",
            Outcome::Duplicate { .. } => "duplicate",
            Outcome::BusinessDuplicate { .. } => "business-duplicate",
            Outcome::Rejected { .. } => "rejected",
            Outcome::NeedsReconciliation { .. } => "needs-reconciliation",
            Outcome::Conflict { .. } => "conflict",
            Outcome::InvalidMessage { .. } => "invalid-message",
            Outcome::RetryLater { .. } => "retry-later",
            Outcome::StoreFailure { .. } => "store-failure",
        }
    }

    /// Whether the host should complete the message (answer 2xx).
    pub fn completes_message(&self) -> bool {
        !matches!(
            self,
            Outcome::Conflict { .. }
                | Outcome::InvalidMessage { .. }
                | Outcome::RetryLater { .. }
                | Outcome::StoreFailure { .. }
        )
    }

    /// Whether redelivery can never change the answer (the message belongs in the DLQ).
    pub fn is_permanent_failure(&self) -> bool {
        matches!(
            self,
            Outcome::Conflict { .. }
                | Outcome::InvalidMessage { .. }
                | Outcome::StoreFailure { .. }
        )
    }

    pub fn detail(&self) -> Option<String> {
        match self {
            Outcome::Recorded => None,
            Outcome::Paid { bank_payment_id } => Some(format!("bank payment {bank_payment_id}")),
            Outcome::Duplicate { first_outcome } => first_outcome
                .as_ref()
                .map(|o| format!("first outcome: {o}")),
            Outcome::BusinessDuplicate { original_message } => {
                Some(format!("claim already paid by message {original_message}"))
            }
            Outcome::Rejected { reason }
            | Outcome::NeedsReconciliation { reason }
            | Outcome::Conflict { reason }
            | Outcome::InvalidMessage { reason }
            | Outcome::RetryLater { reason }
            | Outcome::StoreFailure { reason } => Some(reason.clone()),
        }
    }

    /// Adds this outcome to the process's counters (`/metrics` and the periodic log line).
    pub fn count(&self) {
        let c = telemetry::counters();
        match self {
            Outcome::Recorded => c.recorded.inc(),
            Outcome::Paid { .. } => c.paid.inc(),
            Outcome::Duplicate { .. } => c.duplicates_skipped.inc(),
            Outcome::BusinessDuplicate { .. } => c.business_duplicates.inc(),
            Outcome::Rejected { .. } => c.rejected.inc(),
            Outcome::NeedsReconciliation { .. } => c.needs_reconciliation.inc(),
            Outcome::Conflict { .. } => c.conflicts.inc(),
            Outcome::InvalidMessage { .. } => c.invalid_messages.inc(),
            Outcome::RetryLater { .. } => c.retry_later.inc(),
            Outcome::StoreFailure { .. } => c.store_failures.inc(),
        }
    }
}
