//! The verdict on one dead letter: a pure function of what the broker says about it,
//! what the consumer's own acceptance rules say of its body, and what the store knows
//! about its claim and message. No I/O and no clock: a re-drive copy has a MessageId of
//! its own (`domain::redrive`), so the broker's duplicate-detection window never applies.
//! Every rule is tested here.

use serde::Serialize;

use crate::domain::{OutcomeKind, PayloadHash};
use crate::store::{InboxOutcome, PaymentStatus};

/// What a dead letter's body turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A valid ClaimApproved; its payload hash.
    ClaimApproved(PayloadHash),
    /// A valid ClaimApproved that the consumer refuses on every delivery, writing nothing
    /// (its acceptance rules, the same function it runs: a missing payee while payouts
    /// are enabled): why.
    Refused(String),
    /// Not a ClaimApproved (not UTF-8, not JSON, a field wrong), too large, or no
    /// MessageId: why, bounded.
    Invalid(String),
    /// The broker's answer for it did not read (its `BrokerProperties`, `Location` or
    /// body): why, in the tool's own words (never the peer's text).
    Unreadable(String),
}

/// One fact the store was asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Known<T> {
    Absent,
    Present(T),
    /// The store could not answer (unreachable, a corrupt record): why.
    Unreadable(String),
}

/// The claim's payment, as far as the verdict needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentFact {
    pub status: PaymentStatus,
    pub payload_hash: PayloadHash,
    pub status_reason: Option<String>,
}

/// Everything the verdict is decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub body: Body,
    pub dead_letter_reason: Option<String>,
    /// The claim's payment (`Absent` when the body is invalid: nothing to look up).
    pub payment: Known<PaymentFact>,
    /// This message's inbox record's outcome (`Present(None)`: in progress).
    pub inbox: Known<Option<InboxOutcome>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    Resubmit,
    AlreadyPaid,
    /// A payout whose outcome is open (in progress, needs reconciliation, mismatched):
    /// settle it first.
    NeedsReconciliation,
    /// Invalid payload or conflicting content: resubmitting cannot help.
    Permanent,
    /// The store could not be read: nothing can be said.
    Unknown,
    /// The broker's answer for this dead letter did not read: it is left where it is.
    Unreadable,
}

impl Verdict {
    /// The short name printed in the table and used by `--verdict`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Resubmit => "resubmit",
            Verdict::AlreadyPaid => "already-paid",
            Verdict::NeedsReconciliation => "needs-reconciliation",
            Verdict::Permanent => "permanent",
            Verdict::Unknown => "unknown",
            Verdict::Unreadable => "unreadable",
        }
    }

    /// Whether `resubmit --all` (or `--verdict` of its name) may send it without it being
    /// named: only what the consumer will pay once or recognise as paid.
    pub fn sendable(&self) -> bool {
        matches!(self, Verdict::Resubmit | Verdict::AlreadyPaid)
    }
}

/// A verdict and why, in words for the operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub verdict: Verdict,
    pub reason: String,
}

fn judged(verdict: Verdict, reason: impl Into<String>) -> Judgement {
    Judgement {
        verdict,
        reason: reason.into(),
    }
}

/// The verdict on one dead letter.
pub fn judge(facts: &Facts) -> Judgement {
    base_verdict(facts)
}

fn base_verdict(facts: &Facts) -> Judgement {
    let hash = match &facts.body {
        Body::Invalid(why) => {
            return judged(
                Verdict::Permanent,
                format!("permanent: invalid payload ({why}); resubmitting cannot help"),
            )
        }
        Body::Refused(why) => {
            return judged(
                Verdict::Permanent,
                format!("permanent: the consumer refuses this message on every delivery ({why}); resubmitting cannot help: the producer must publish a corrected message"),
            )
        }
        Body::Unreadable(why) => {
            return judged(
                Verdict::Unreadable,
                format!("unreadable: the broker's answer for this dead letter does not read ({why}); nothing is done with it: look at it in the portal"),
            )
        }
        Body::ClaimApproved(hash) => hash,
    };
    let inbox = match &facts.inbox {
        Known::Unreadable(why) => {
            return judged(
                Verdict::Unknown,
                format!("the store could not be read: {why}"),
            )
        }
        Known::Present(outcome) => outcome.as_ref().and_then(InboxOutcome::kind),
        Known::Absent => None,
    };
    if inbox == Some(OutcomeKind::Discarded) {
        return judged(
            Verdict::Permanent,
            "permanent: a person discarded this message (dead-letters discard); a copy completes as a duplicate and is not paid",
        );
    }
    if let Some(kind @ (OutcomeKind::Conflict | OutcomeKind::InvalidMessage)) = inbox {
        return judged(
            Verdict::Permanent,
            format!("permanent: the consumer answered {kind} for this message; resubmitting cannot help"),
        );
    }
    let payment = match &facts.payment {
        Known::Unreadable(why) => {
            return judged(
                Verdict::Unknown,
                format!("the store could not be read: {why}"),
            )
        }
        Known::Absent => {
            let cause = facts
                .dead_letter_reason
                .as_deref()
                .unwrap_or("no DeadLetterReason");
            return judged(
                Verdict::Resubmit,
                format!("resubmit: nothing was paid for the claim and the cause was transient ({cause})"),
            );
        }
        Known::Present(payment) => payment,
    };
    if &payment.payload_hash != hash {
        return judged(
            Verdict::Permanent,
            "permanent: conflicting content, the claim's payment was made for another amount, currency, tenant or payee; resubmitting cannot help",
        );
    }
    let why = payment
        .status_reason
        .as_deref()
        .map(|r| format!(": {}", crate::servicebus::bounded(r, 160)))
        .unwrap_or_default();
    let status = payment.status.as_str();
    match payment.status {
        PaymentStatus::Paid | PaymentStatus::Recorded => judged(
            Verdict::AlreadyPaid,
            format!("already {status}: resubmitting completes as a duplicate"),
        ),
        PaymentStatus::Rejected => judged(
            Verdict::Permanent,
            format!("permanent: the bank rejected the payout for good{why}"),
        ),
        PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation => judged(
            Verdict::NeedsReconciliation,
            format!(
                "needs reconciliation first: the payout is {status}{why}; run `claims-payments reconcile`"
            ),
        ),
        PaymentStatus::Mismatched => judged(
            Verdict::NeedsReconciliation,
            format!("needs a person first: the bank's record contradicts the ledger (mismatched){why}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(s: &str) -> PayloadHash {
        PayloadHash::from_stored(format!("sha256:{s}"))
    }

    fn facts(payment: Known<PaymentFact>, inbox: Known<Option<InboxOutcome>>) -> Facts {
        Facts {
            body: Body::ClaimApproved(hash("a")),
            dead_letter_reason: Some("MaxDeliveryCountExceeded".into()),
            payment,
            inbox,
        }
    }

    fn judged(payment: Known<PaymentFact>, inbox: Known<Option<InboxOutcome>>) -> Judgement {
        judge(&facts(payment, inbox))
    }

    /// The judgement of a dead letter with this body and nothing in the store.
    fn judged_body(body: Body) -> Judgement {
        judge(&Facts {
            body,
            ..facts(Known::Absent, Known::Absent)
        })
    }

    fn paid(status: PaymentStatus, h: &str) -> Known<PaymentFact> {
        Known::Present(PaymentFact {
            status,
            payload_hash: hash(h),
            status_reason: Some("why".into()),
        })
    }

    #[test]
    fn nothing_paid_is_resubmit_with_the_broker_reason() {
        let j = judged(Known::Absent, Known::Absent);
        assert_eq!(j.verdict, Verdict::Resubmit);
        assert!(
            j.reason.contains("MaxDeliveryCountExceeded"),
            "{}",
            j.reason
        );
    }

    #[test]
    fn a_paid_or_recorded_claim_is_already_paid() {
        for status in [PaymentStatus::Paid, PaymentStatus::Recorded] {
            let j = judged(paid(status, "a"), Known::Absent);
            assert_eq!(j.verdict, Verdict::AlreadyPaid, "{status:?}");
        }
    }

    #[test]
    fn open_payouts_need_reconciliation_first() {
        for status in [
            PaymentStatus::InProgress,
            PaymentStatus::NeedsReconciliation,
            PaymentStatus::Mismatched,
        ] {
            let j = judged(paid(status, "a"), Known::Absent);
            assert_eq!(j.verdict, Verdict::NeedsReconciliation, "{status:?}");
        }
    }

    #[test]
    fn invalid_bodies_conflicts_and_rejections_are_permanent() {
        let j = judged_body(Body::Invalid("amount: is missing".into()));
        assert_eq!(j.verdict, Verdict::Permanent);
        assert!(j.reason.contains("amount: is missing"));

        let other_content = judged(paid(PaymentStatus::Paid, "b"), Known::Absent);
        assert_eq!(other_content.verdict, Verdict::Permanent);
        assert!(other_content.reason.contains("conflicting content"));

        let rejected = judged(paid(PaymentStatus::Rejected, "a"), Known::Absent);
        assert_eq!(rejected.verdict, Verdict::Permanent);

        for kind in [OutcomeKind::Conflict, OutcomeKind::InvalidMessage] {
            let j = judged(Known::Absent, Known::Present(Some(kind.into())));
            assert_eq!(j.verdict, Verdict::Permanent, "{kind}");
        }
    }

    /// A message a person discarded stays dropped: its store record says so and `--all`
    /// does not send it, even though nothing was paid.
    #[test]
    fn a_discarded_message_is_permanent_though_nothing_was_paid() {
        let j = judged(
            Known::Absent,
            Known::Present(Some(OutcomeKind::Discarded.into())),
        );
        assert_eq!(j.verdict, Verdict::Permanent);
        assert!(j.reason.contains("discarded"), "{}", j.reason);
    }

    #[test]
    fn an_unreadable_broker_answer_is_its_own_verdict_never_sent() {
        let j = judged_body(Body::Unreadable("BrokerProperties has no LockToken".into()));
        assert_eq!(j.verdict, Verdict::Unreadable);
        assert!(!j.verdict.sendable());
        assert!(j.reason.contains("no LockToken"), "{}", j.reason);
    }

    #[test]
    fn an_unreadable_store_is_unknown() {
        for f in [
            facts(Known::Unreadable("down".into()), Known::Absent),
            facts(Known::Absent, Known::Unreadable("down".into())),
        ] {
            let j = judge(&f);
            assert_eq!(j.verdict, Verdict::Unknown);
            assert!(j.reason.contains("down"));
        }
    }

    /// A message the consumer refuses on every delivery (its own rule, not a copy) is
    /// permanent, though nothing was paid and the broker's reason looks transient.
    #[test]
    fn a_message_the_consumer_refuses_is_permanent() {
        let j = judged_body(Body::Refused(
            "payee: is missing, and payouts are enabled".into(),
        ));
        assert_eq!(j.verdict, Verdict::Permanent);
        assert!(j.reason.contains("payee"), "{}", j.reason);
    }
}
