//! How a delivery ended, by name: the strings stored in inbox records.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The name of how a delivery ended, without its details. These strings are stored in
/// inbox records and appear in logs and HTTP answers: never rename one, or data written
/// before would no longer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutcomeKind {
    Recorded,
    Paid,
    Duplicate,
    BusinessDuplicate,
    Rejected,
    NeedsReconciliation,
    Conflict,
    InvalidMessage,
    RetryLater,
    StoreFailure,
    /// Written by `dead-letters discard`, never by the consumer: a person dropped this
    /// message's dead letter, so a re-send of it completes as a duplicate, unpaid.
    Discarded,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 11] = [
        OutcomeKind::Recorded,
        OutcomeKind::Paid,
        OutcomeKind::Duplicate,
        OutcomeKind::BusinessDuplicate,
        OutcomeKind::Rejected,
        OutcomeKind::NeedsReconciliation,
        OutcomeKind::Conflict,
        OutcomeKind::InvalidMessage,
        OutcomeKind::RetryLater,
        OutcomeKind::StoreFailure,
        OutcomeKind::Discarded,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Recorded => "recorded",
            OutcomeKind::Paid => "paid",
            OutcomeKind::Duplicate => "duplicate",
            OutcomeKind::BusinessDuplicate => "business-duplicate",
            OutcomeKind::Rejected => "rejected",
            OutcomeKind::NeedsReconciliation => "needs-reconciliation",
            OutcomeKind::Conflict => "conflict",
            OutcomeKind::InvalidMessage => "invalid-message",
            OutcomeKind::RetryLater => "retry-later",
            OutcomeKind::StoreFailure => "store-failure",
            OutcomeKind::Discarded => "discarded",
        }
    }

    /// The kind a stored or logged string names; `None` for any other string.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
