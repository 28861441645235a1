//! The answers every function gives the host: the custom-handler JSON with `Outputs`,
//! `Logs` and `ReturnValue`, how an invocation ended, and the one log line that says so.
//!
//! A 2xx completes the message; anything else makes the host abandon it (an empty 200
//! would hang the host).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize, Serializer};

use crate::domain::{MessageId, OutcomeKind};
use crate::reconcile::{RunCounts, Summary};

/// The answer body the host expects.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct InvocationResult {
    #[serde(rename = "Outputs")]
    outputs: serde_json::Map<String, serde_json::Value>,
    #[serde(rename = "Logs")]
    logs: Vec<String>,
    #[serde(rename = "ReturnValue")]
    return_value: serde_json::Value,
}

/// How an invocation ended: what `ReturnValue.outcome` and the answer's first log line
/// name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// A `ClaimApproved` delivery, by its outcome.
    Delivery(OutcomeKind),
    /// A timer run (`Purge`, `Reconcile`).
    Timer(TimerOutcome),
}

/// How a timer run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerOutcome {
    Purged,
    PurgeSkipped,
    PurgeFailed,
    Reconciled,
    ReconcileSkipped,
    ReconcileFailed,
}

impl Ended {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::Delivery(kind) => kind.as_str(),
            Ended::Timer(TimerOutcome::Purged) => "purged",
            Ended::Timer(TimerOutcome::PurgeSkipped) => "purge-skipped",
            Ended::Timer(TimerOutcome::PurgeFailed) => "purge-failed",
            Ended::Timer(TimerOutcome::Reconciled) => "reconciled",
            Ended::Timer(TimerOutcome::ReconcileSkipped) => "reconcile-skipped",
            Ended::Timer(TimerOutcome::ReconcileFailed) => "reconcile-failed",
        }
    }
}

impl Serialize for Ended {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The machine-readable summary carried in `ReturnValue` (the host ignores it without a
/// `$return` binding; tools and tests read it).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OutcomeSummary {
    pub(crate) outcome: Ended,
    pub(crate) claim_id: Option<String>,
    pub(crate) message_id: Option<String>,
    pub(crate) delivery_count: Option<u32>,
    pub(crate) detail: Option<String>,
    /// A reconcile run's counts, beside its `detail` line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reconcile: Option<RunCounts>,
}

impl OutcomeSummary {
    /// A timer invocation's summary: no message, what the run did in `detail`.
    pub(crate) fn of_timer(
        outcome: TimerOutcome,
        detail: String,
        reconcile: Option<RunCounts>,
    ) -> Self {
        OutcomeSummary {
            outcome: Ended::Timer(outcome),
            claim_id: None,
            message_id: None,
            delivery_count: None,
            detail: Some(detail),
            reconcile,
        }
    }
}

impl InvocationResult {
    pub(crate) fn new(summary: OutcomeSummary) -> Self {
        let mut logs = vec![format!("outcome: {}", summary.outcome.as_str())];
        let mut facts = Vec::new();
        if let Some(c) = &summary.claim_id {
            facts.push(format!("claimId={c}"));
        }
        if let Some(m) = &summary.message_id {
            facts.push(format!("messageId={m}"));
        }
        if let Some(d) = summary.delivery_count {
            facts.push(format!("deliveryCount={d}"));
        }
        if !facts.is_empty() {
            logs.push(facts.join(" "));
        }
        if let Some(detail) = &summary.detail {
            logs.push(detail.clone());
        }
        InvocationResult {
            outputs: serde_json::Map::new(),
            logs,
            return_value: serde_json::to_value(summary).unwrap_or(serde_json::Value::Null),
        }
    }
}

/// The custom-handler answer to an invocation: `status` and the outcome as JSON.
pub(crate) fn invocation_answer(status: StatusCode, summary: OutcomeSummary) -> Response {
    (status, Json(InvocationResult::new(summary))).into_response()
}

/// How a timer run ended: the status, the outcome and what the run did. The function
/// records it on its span, then answers with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimerEnd {
    pub(crate) status: StatusCode,
    pub(crate) outcome: TimerOutcome,
    pub(crate) detail: String,
    pub(crate) reconcile: Option<RunCounts>,
}

impl TimerEnd {
    pub(crate) fn new(
        status: StatusCode,
        outcome: TimerOutcome,
        detail: impl Into<String>,
    ) -> Self {
        TimerEnd {
            status,
            outcome,
            detail: detail.into(),
            reconcile: None,
        }
    }

    /// A reconcile run that finished: its counts on one line, and as numbers.
    pub(crate) fn reconciled(summary: &Summary) -> Self {
        TimerEnd {
            reconcile: Some(summary.run_counts()),
            ..TimerEnd::new(StatusCode::OK, TimerOutcome::Reconciled, summary.counts())
        }
    }

    /// The label the span and `ReturnValue.outcome` carry.
    pub(crate) fn label(&self) -> &'static str {
        Ended::Timer(self.outcome).as_str()
    }

    pub(crate) fn answer(self) -> Response {
        invocation_answer(
            self.status,
            OutcomeSummary::of_timer(self.outcome, self.detail, self.reconcile),
        )
    }
}

/// How loud a delivery's end is logged: a completed message is news, an abandoned one a
/// warning, one bound for the dead-letter queue an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    Info,
    Warn,
    Error,
}

/// What the line that ends a `ClaimApproved` invocation names.
pub(crate) struct DeliveryEnd<'a> {
    pub(crate) invocation_id: &'a str,
    pub(crate) claim_id: &'a str,
    pub(crate) message_id: &'a MessageId,
    pub(crate) delivery_count: u32,
    pub(crate) outcome: &'static str,
    pub(crate) detail: Option<&'a str>,
}

impl DeliveryEnd<'_> {
    /// Writes `invocation finished` with the delivery's facts, at `severity`.
    pub(crate) fn log(&self, severity: Severity) {
        // One field list for the three levels (a tracing level is part of the call site).
        macro_rules! finished {
            ($level:ident) => {
                tracing::$level!(invocationId = %self.invocation_id, trigger = "servicebus", claimId = self.claim_id, messageId = self.message_id.as_str(), deliveryCount = self.delivery_count, outcome = self.outcome, detail = self.detail, "invocation finished")
            };
        }
        match severity {
            Severity::Info => finished!(info),
            Severity::Warn => finished!(warn),
            Severity::Error => finished!(error),
        }
    }
}
