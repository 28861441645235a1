//! How a delivery ends: the [`Outcome`] the host answers with, its [`OutcomeKind`] (the
//! one vocabulary of logs, answers, counters and stored inbox records), and the
//! counters it adds to.

use crate::domain::{MessageId, OutcomeKind};
use crate::telemetry;

/// How a delivery ended. The label is what logs, answers and counters use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Ledger-only mode: the payment is recorded.
    Recorded,
    /// The bank made the payout.
    Paid { bank_payment_id: String },
    /// The message was handled before; nothing was done now.
    Duplicate { first_outcome: Option<OutcomeKind> },
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
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Recorded => OutcomeKind::Recorded,
            Outcome::Paid { .. } => OutcomeKind::Paid,
            Outcome::Duplicate { .. } => OutcomeKind::Duplicate,
            Outcome::BusinessDuplicate { .. } => OutcomeKind::BusinessDuplicate,
            Outcome::Rejected { .. } => OutcomeKind::Rejected,
            Outcome::NeedsReconciliation { .. } => OutcomeKind::NeedsReconciliation,
            Outcome::Conflict { .. } => OutcomeKind::Conflict,
            Outcome::InvalidMessage { .. } => OutcomeKind::InvalidMessage,
            Outcome::RetryLater { .. } => OutcomeKind::RetryLater,
            Outcome::StoreFailure { .. } => OutcomeKind::StoreFailure,
        }
    }

    /// The kind's string, for log lines and answers.
    pub fn label(&self) -> &'static str {
        self.kind().as_str()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_the_strings_stored_and_logged_before() {
        let strings: Vec<&str> = OutcomeKind::ALL.iter().map(OutcomeKind::as_str).collect();
        assert_eq!(
            strings,
            [
                "recorded",
                "paid",
                "duplicate",
                "business-duplicate",
                "rejected",
                "needs-reconciliation",
                "conflict",
                "invalid-message",
                "retry-later",
                "store-failure",
                "discarded"
            ]
        );
        for kind in OutcomeKind::ALL {
            // serde and as_str agree, and both read back.
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<OutcomeKind>(&json).unwrap(), kind);
            assert_eq!(OutcomeKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(OutcomeKind::parse("Paid"), None);
        assert!(serde_json::from_str::<OutcomeKind>("\"lost\"").is_err());
    }
}
