//! The consumer's decisions, apart from its I/O.
//!
//! [`decide`] looks at what the store returned ([`Observed`]), this attempt, the policy
//! and `now`, and says what to do next ([`NextAction`]). It reads no clock and touches
//! no store, so every rule of the state machine is a plain function of its inputs and
//! is tested as one (see the tests below). The records an action writes are built here
//! too, because their fields (owner, lease, retention) are part of the decision.

use time::OffsetDateTime;

use super::{Delivery, Outcome, OutcomeKind, Policy};
use crate::domain::{ClaimApproved, PayloadHash, Purpose};
use crate::lease::liveness::GoneOwners;
use crate::lease::{self, Holder};
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, PaymentRecord, PaymentStatus,
};

/// What one attempt knows about the message it handles.
pub(crate) struct Attempt<'a> {
    pub(crate) msg: &'a ClaimApproved,
    pub(crate) delivery: &'a Delivery,
    pub(crate) id: AttemptId,
    pub(crate) hash: PayloadHash,
    pub(crate) key: InboxKey,
    /// The claim's payment as this attempt last wrote or read it, kept only when the
    /// caller answers with it (the HTTP API), so it need not read it back. `None` on the
    /// message path, which then copies nothing.
    pub(crate) payment_seen: Option<std::sync::Mutex<Option<PaymentRecord>>>,
    /// The processes known to have ended: their live leases are over.
    pub(crate) gone: &'a GoneOwners,
}

impl Attempt<'_> {
    /// Notes the claim's payment as the store now holds it.
    pub(crate) fn saw(&self, payment: &PaymentRecord) {
        if let Some(Ok(mut seen)) = self.payment_seen.as_ref().map(|m| m.lock()) {
            *seen = Some(payment.clone());
        }
    }

    /// Forgets the payment noted so far: another attempt wrote it since, so the caller
    /// must read what the store holds (found by the deterministic simulator, seed 126: a
    /// lost finalize answered a retried HTTP request with the payment still `in_progress`
    /// while the store held it `paid`).
    pub(crate) fn lost_sight_of_payment(&self) {
        if let Some(Ok(mut seen)) = self.payment_seen.as_ref().map(|m| m.lock()) {
            *seen = None;
        }
    }

    /// Who holds `record`, as this attempt sees it (the takeover rule:
    /// [`lease::holder`]).
    pub(crate) fn sees(&self, record: &InboxRecord, now: OffsetDateTime) -> Holder {
        lease::holder(
            record,
            self.id,
            self.delivery.delivery_count,
            self.gone.contains(record.owner),
            now,
        )
    }
}

/// What the store returned, at the point of the flow where it was read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Observed<'r> {
    /// Our claim created both records; `inbox` is the one we wrote.
    Claimed { inbox: &'r InboxRecord },
    /// This message's inbox record, as stored.
    Inbox(&'r InboxRecord),
    /// The claim's payment, read because our own completed record came back.
    OwnCompleted(Option<&'r PaymentRecord>),
    /// The claim's payment, found while this message has no inbox record.
    Payment(&'r PaymentRecord),
    /// The inbox record of the message whose payout is in progress (`None`: expired).
    PayoutOwner(Option<&'r InboxRecord>),
    /// The claim's payment, read while we hold `inbox`'s lease.
    Held {
        inbox: &'r InboxRecord,
        payment: Option<&'r PaymentRecord>,
    },
}

/// Why a lease changes hands; logged with the takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeOverReason {
    /// The holder's lease ran out.
    LeaseExpired,
    /// The holder's lease is still running, but a later delivery proves it is over.
    LaterDelivery,
    /// The holder's lease is still running, but its process has ended.
    OwnerGone,
}

impl TakeOverReason {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            TakeOverReason::LeaseExpired => "lease-expired",
            TakeOverReason::LaterDelivery => "later-delivery",
            TakeOverReason::OwnerGone => "owner-gone",
        }
    }
}

/// What the consumer does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NextAction {
    /// Answer with this outcome; nothing (more) is written.
    Finish(Outcome),
    /// Our own completed write came back (the SDK re-sent it): answer from the payment.
    AnswerFromPayment,
    /// Our own in-progress write came back: we hold its lease; resume from the records.
    Resume,
    /// Another attempt holds a live lease on this message: wait (bounded), then re-read.
    WaitForLiveAttempt { lease_until: Option<OffsetDateTime> },
    /// Take the message's lease over: write `record` if the version read still holds.
    TakeOver {
        record: InboxRecord,
        reason: TakeOverReason,
    },
    /// We hold the lease and the payout is owed: call the bank, then finalize.
    PayOut,
    /// The payment is already final (only a manual repair gets here): complete the
    /// inbox record to match it.
    CompleteInbox {
        inbox: InboxRecord,
        outcome: Outcome,
    },
    /// The claim's payment is final: record this message as handled, answer `outcome`.
    FinishBusinessDuplicate {
        inbox: InboxRecord,
        outcome: Outcome,
    },
    /// Our own message's payout is owed and nobody holds it (its inbox record expired):
    /// hold it again with `inbox`, then resume.
    ReclaimPayout { inbox: InboxRecord },
    /// Another message's payout is in progress: read that message's inbox record.
    InspectPayoutOwner { owner: InboxKey },
    /// That message's attempt died (lease expired): take its lease over with `record`
    /// and finish its payout under the same key, so it does not wait for a redelivery
    /// that may never come.
    AdoptOrphanedPayout { record: InboxRecord },
    /// Another message's payout is in progress under a live attempt: wait (bounded),
    /// then re-read the payment.
    WaitForPayout,
    /// The store contradicts itself; retrying cannot help.
    Corrupt(String),
}

/// The single place where the state machine decides. Pure: `now` is a parameter.
pub(crate) fn decide(
    a: &Attempt<'_>,
    seen: Observed<'_>,
    policy: &Policy,
    now: OffsetDateTime,
) -> NextAction {
    match seen {
        Observed::Claimed { inbox } => match inbox.status {
            // Ledger-only mode: the claim itself recorded the payment.
            InboxStatus::Completed => NextAction::Finish(Outcome::Recorded),
            InboxStatus::InProgress => NextAction::PayOut,
        },
        Observed::Inbox(record) => on_inbox(a, record, policy, now),
        Observed::OwnCompleted(payment) => match payment {
            Some(p) => NextAction::Finish(outcome_of(p)),
            None => NextAction::Corrupt("completed message without a payment".into()),
        },
        Observed::Payment(payment) => on_payment(a, payment, policy, now),
        Observed::PayoutOwner(owner) => match owner {
            // Another message's record: our delivery count says nothing about it.
            Some(o)
                if o.status == InboxStatus::InProgress
                    && matches!(
                        lease::holder(o, a.id, 0, a.gone.contains(o.owner), now),
                        Holder::Nobody | Holder::OwnerGone
                    ) =>
            {
                NextAction::AdoptOrphanedPayout {
                    record: lease::taken_over(o, a.id, 0, policy.terms(), now),
                }
            }
            _ => NextAction::WaitForPayout,
        },
        Observed::Held { inbox, payment } => match payment {
            None => NextAction::Corrupt(format!(
                "claim {} has an in-progress inbox record but no payment",
                a.msg.claim_id
            )),
            Some(p) if p.status == PaymentStatus::InProgress => NextAction::PayOut,
            Some(p) => {
                let outcome = outcome_of(p);
                NextAction::CompleteInbox {
                    inbox: lease::completed(
                        &touched(a, inbox, policy, now),
                        outcome.kind().into(),
                        now,
                    ),
                    outcome,
                }
            }
        },
    }
}

/// This message's inbox record exists (the claim was refused, or we re-read it).
fn on_inbox(
    a: &Attempt<'_>,
    record: &InboxRecord,
    policy: &Policy,
    now: OffsetDateTime,
) -> NextAction {
    let holder = a.sees(record, now);
    if holder == Holder::Us {
        // Our own committed write, reported as a conflict (409) or a stale ETag (412)
        // because the SDK re-sent it after an ambiguous timeout.
        return match record.status {
            InboxStatus::Completed => NextAction::AnswerFromPayment,
            InboxStatus::InProgress => NextAction::Resume,
        };
    }
    if record.payload_hash != a.hash {
        return NextAction::Finish(Outcome::Conflict {
            reason: format!(
                "MessageId {} was first received with a different payload for claim {}; this delivery is refused",
                a.delivery.message_id, a.msg.claim_id
            ),
        });
    }
    match (record.status, holder) {
        (InboxStatus::Completed, _) => NextAction::Finish(Outcome::Duplicate {
            first_outcome: record.outcome.as_ref().and_then(InboxOutcome::kind),
        }),
        (InboxStatus::InProgress, Holder::Live(until)) => NextAction::WaitForLiveAttempt {
            lease_until: Some(until),
        },
        (InboxStatus::InProgress, _) => NextAction::TakeOver {
            record: lease::taken_over(record, a.id, a.delivery.delivery_count, policy.terms(), now),
            reason: match holder {
                Holder::Superseded => TakeOverReason::LaterDelivery,
                Holder::OwnerGone => TakeOverReason::OwnerGone,
                _ => TakeOverReason::LeaseExpired,
            },
        },
    }
}

/// The claim already has a payment and this message has no inbox record: another
/// message paid it (a business duplicate), or this one did and its record expired.
fn on_payment(
    a: &Attempt<'_>,
    payment: &PaymentRecord,
    policy: &Policy,
    now: OffsetDateTime,
) -> NextAction {
    if payment.payload_hash != a.hash {
        return NextAction::Finish(Outcome::Conflict {
            reason: format!(
                "claim {} already has a payment from message {} with a different amount, currency, tenant or payee",
                a.msg.claim_id, payment.message_id
            ),
        });
    }
    let same_message = payment.message_id == a.delivery.message_id;
    if same_message && !payment.status.is_terminal() {
        // Our payout is owed and nobody holds it: hold it again and resume.
        return NextAction::ReclaimPayout {
            inbox: inbox_record(a, policy, now, Some(now + policy.lease), None),
        };
    }
    if !payment.status.is_terminal() {
        return NextAction::InspectPayoutOwner {
            owner: InboxKey {
                message_id: payment.message_id.clone(),
                ..a.key.clone()
            },
        };
    }
    let outcome = if same_message {
        // Our own message, back after its inbox record expired.
        Outcome::Duplicate {
            first_outcome: Some(outcome_of(payment).kind()),
        }
    } else {
        Outcome::BusinessDuplicate {
            original_message: payment.message_id.clone(),
        }
    };
    NextAction::FinishBusinessDuplicate {
        inbox: inbox_record(a, policy, now, None, Some(outcome.kind())),
        outcome,
    }
}

/// An inbox record of this attempt: in progress under `lease_until`, or completed with
/// `outcome` when there is no lease.
pub(crate) fn inbox_record(
    a: &Attempt<'_>,
    policy: &Policy,
    now: OffsetDateTime,
    lease_until: Option<OffsetDateTime>,
    outcome: Option<OutcomeKind>,
) -> InboxRecord {
    let record = lease::new_record(
        &a.key,
        &a.hash,
        a.id,
        a.delivery.delivery_count,
        policy.terms(),
        now,
        None,
    );
    InboxRecord {
        status: if lease_until.is_some() {
            InboxStatus::InProgress
        } else {
            InboxStatus::Completed
        },
        outcome: outcome.map(InboxOutcome::Message),
        lease_until,
        ..record
    }
}

/// The payment a first attempt claims: in progress with its exact payout request, or
/// already recorded in ledger-only mode.
pub(crate) fn payment_record(
    a: &Attempt<'_>,
    ledger_only: bool,
    now: OffsetDateTime,
) -> PaymentRecord {
    PaymentRecord {
        claim_id: a.msg.claim_id,
        purpose: Purpose::Payout,
        tenant_id: a.msg.tenant.clone(),
        money: a.msg.money,
        payee: a.msg.payee.clone(),
        payload_hash: a.hash.clone(),
        message_id: a.delivery.message_id.clone(),
        idempotency_key: a.msg.idempotency_key(),
        payout_request: (!ledger_only).then(|| a.msg.payout_request_body()),
        status: if ledger_only {
            PaymentStatus::Recorded
        } else {
            PaymentStatus::InProgress
        },
        bank_payment_id: None,
        status_reason: None,
        created_at: now,
        updated_at: now,
    }
}

/// `record` written again by this attempt at `now` (see [`lease::touched`]).
pub(crate) fn touched(
    a: &Attempt<'_>,
    record: &InboxRecord,
    policy: &Policy,
    now: OffsetDateTime,
) -> InboxRecord {
    lease::touched(record, a.delivery.delivery_count, policy.terms(), now)
}

/// The outcome a final payment stands for.
pub(crate) fn outcome_of(payment: &PaymentRecord) -> Outcome {
    let reason = payment.status_reason.clone().unwrap_or_default();
    match payment.status {
        PaymentStatus::Recorded => Outcome::Recorded,
        PaymentStatus::Paid => Outcome::Paid {
            bank_payment_id: payment.bank_payment_id.clone().unwrap_or_default(),
        },
        PaymentStatus::Rejected => Outcome::Rejected { reason },
        PaymentStatus::NeedsReconciliation
        | PaymentStatus::Mismatched
        | PaymentStatus::InProgress => Outcome::NeedsReconciliation { reason },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{ClaimId, MessageId};
    use crate::store::Boot;

    const CLAIM: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn policy() -> Policy {
        Policy {
            consumer_name: "payments".into(),
            inbox_retention: Duration::from_secs(86_400),
            lease: Duration::from_secs(60),
            inflight_wait: Duration::from_secs(5),
            retry_budget: Duration::from_secs(30),
            bank_key_window: Duration::from_secs(86_400),
        }
    }

    fn msg(amount: &str) -> ClaimApproved {
        ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":"{amount}","currency":"EUR","payee":"NL91ABNA0417164300"}}"#
        ))
        .unwrap()
    }

    fn delivery(id: &str, count: u32) -> Delivery {
        Delivery {
            message_id: MessageId::parse(id).unwrap(),
            delivery_count: count,
        }
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn secs(n: i64) -> time::Duration {
        time::Duration::seconds(n)
    }

    fn attempt<'a>(msg: &'a ClaimApproved, delivery: &'a Delivery) -> Attempt<'a> {
        Attempt {
            msg,
            delivery,
            id: AttemptId::new(),
            hash: msg.payload_hash(),
            key: InboxKey {
                consumer: "payments".into(),
                claim_id: ClaimId::parse(CLAIM).unwrap(),
                message_id: delivery.message_id.clone(),
            },
            payment_seen: None,
            gone: Box::leak(Box::default()),
        }
    }

    /// The record another attempt of the same message left: in progress under a lease
    /// ending at `lease_until`, after delivery `count`.
    fn held_by_other(a: &Attempt<'_>, lease_until: OffsetDateTime, count: u32) -> InboxRecord {
        InboxRecord {
            owner: AttemptId::new(),
            first_delivery_count: count,
            last_delivery_count: count,
            ..inbox_record(a, &policy(), now() - secs(10), Some(lease_until), None)
        }
    }

    fn completed_by_other(a: &Attempt<'_>, outcome: OutcomeKind) -> InboxRecord {
        InboxRecord {
            owner: AttemptId::new(),
            ..inbox_record(a, &policy(), now() - secs(10), None, Some(outcome))
        }
    }

    /// The claim's payment, created by message `by` with the payload of `of`.
    fn payment(of: &ClaimApproved, by: &str, status: PaymentStatus) -> PaymentRecord {
        let d = delivery(by, 1);
        let a = attempt(of, &d);
        PaymentRecord {
            status,
            bank_payment_id: (status == PaymentStatus::Paid).then(|| "bank-1".into()),
            ..payment_record(&a, false, now() - secs(100))
        }
    }

    fn on(a: &Attempt<'_>, seen: Observed<'_>) -> NextAction {
        decide(a, seen, &policy(), now())
    }

    #[test]
    fn a_fresh_claim_pays_out_or_is_recorded_in_ledger_only_mode() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        let held = inbox_record(&a, &policy(), now(), Some(now() + secs(60)), None);
        assert_eq!(
            on(&a, Observed::Claimed { inbox: &held }),
            NextAction::PayOut
        );
        let done = inbox_record(&a, &policy(), now(), None, Some(OutcomeKind::Recorded));
        assert_eq!(
            on(&a, Observed::Claimed { inbox: &done }),
            NextAction::Finish(Outcome::Recorded)
        );
    }

    #[test]
    fn completed_record_with_the_same_payload_is_a_duplicate_with_the_first_outcome() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let seen = completed_by_other(&a, OutcomeKind::Paid);
        assert_eq!(
            on(&a, Observed::Inbox(&seen)),
            NextAction::Finish(Outcome::Duplicate {
                first_outcome: Some(OutcomeKind::Paid)
            })
        );
    }

    #[test]
    fn a_different_payload_under_the_same_message_id_is_a_conflict() {
        let (first, d) = (msg("10.00"), delivery("evt-1", 1));
        let stored = completed_by_other(&attempt(&first, &d), OutcomeKind::Paid);
        let other = msg("11.00");
        let a = attempt(&other, &d);
        assert!(
            matches!(on(&a, Observed::Inbox(&stored)), NextAction::Finish(Outcome::Conflict { reason }) if reason.contains("different payload")),
        );
        // Also while another attempt still holds it: the payload is judged first.
        let live = held_by_other(&attempt(&first, &d), now() + secs(30), 1);
        assert!(matches!(
            on(&a, Observed::Inbox(&live)),
            NextAction::Finish(Outcome::Conflict { .. })
        ));
    }

    #[test]
    fn a_live_lease_is_waited_for() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        let until = now() + secs(30);
        let seen = held_by_other(&a, until, 1);
        assert_eq!(
            on(&a, Observed::Inbox(&seen)),
            NextAction::WaitForLiveAttempt {
                lease_until: Some(until)
            }
        );
    }

    #[test]
    fn an_expired_lease_is_taken_over_with_our_owner_and_a_new_lease() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let seen = held_by_other(&a, now() - secs(1), 1);
        let NextAction::TakeOver { record, reason } = on(&a, Observed::Inbox(&seen)) else {
            panic!("expected a takeover");
        };
        assert_eq!(reason, TakeOverReason::LeaseExpired);
        assert_eq!(record.owner, a.id);
        assert_eq!(record.status, InboxStatus::InProgress);
        assert_eq!(record.lease_until, Some(now() + secs(60)));
        assert_eq!(record.last_delivery_count, 2);
        assert_eq!(record.first_delivery_count, 1);
        assert_eq!(record.created_at, seen.created_at);
        assert_eq!(record.expires_at, now() + secs(86_400));
    }

    #[test]
    fn a_higher_delivery_count_than_the_holder_takes_over_at_once() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 3));
        let a = attempt(&m, &d);
        let seen = held_by_other(&a, now() + secs(30), 2);
        assert_eq!(a.sees(&seen, now()), Holder::Superseded);
        let NextAction::TakeOver { record, reason } = on(&a, Observed::Inbox(&seen)) else {
            panic!("expected a takeover");
        };
        assert_eq!(reason, TakeOverReason::LaterDelivery);
        assert_eq!(record.owner, a.id);
        assert_eq!(record.last_delivery_count, 3);
        // The same or a lower count is not later: wait.
        for count in [2, 1] {
            let d = delivery("evt-1", count);
            let a = attempt(&m, &d);
            assert!(matches!(a.sees(&seen, now()), Holder::Live(_)));
            assert!(matches!(
                on(&a, Observed::Inbox(&seen)),
                NextAction::WaitForLiveAttempt { .. }
            ));
        }
    }

    #[test]
    fn a_live_lease_of_a_process_that_ended_is_taken_over_at_once() {
        let m = msg("10.00");
        let d = delivery("evt-1", 1);
        let a = attempt(&m, &d);
        let dead = Boot::random();
        let seen = InboxRecord {
            owner: AttemptId::of(dead),
            ..held_by_other(&a, now() + secs(30), 2)
        };
        // Until its process is known to have ended, a live lease is waited for.
        assert!(matches!(
            on(&a, Observed::Inbox(&seen)),
            NextAction::WaitForLiveAttempt { .. }
        ));
        assert!(matches!(
            on(&a, Observed::PayoutOwner(Some(&seen))),
            NextAction::WaitForPayout
        ));
        a.gone.insert(dead);
        let NextAction::TakeOver { record, reason } = on(&a, Observed::Inbox(&seen)) else {
            panic!("expected a takeover");
        };
        assert_eq!(reason, TakeOverReason::OwnerGone);
        assert_eq!(record.owner, a.id);
        assert!(matches!(
            on(&a, Observed::PayoutOwner(Some(&seen))),
            NextAction::AdoptOrphanedPayout { .. }
        ));
        // Another process's end says nothing about this one's own attempts.
        let ours = held_by_other(&a, now() + secs(30), 2);
        assert!(matches!(
            on(&a, Observed::Inbox(&ours)),
            NextAction::WaitForLiveAttempt { .. }
        ));
    }

    #[test]
    fn delivery_count_zero_leaves_it_to_the_lease() {
        let m = msg("10.00");
        // The host did not say (count 0) for this delivery: a live lease is waited for.
        let d0 = delivery("evt-1", 0);
        let a0 = attempt(&m, &d0);
        let live = held_by_other(&a0, now() + secs(30), 1);
        assert!(matches!(a0.sees(&live, now()), Holder::Live(_)));
        assert!(matches!(
            on(&a0, Observed::Inbox(&live)),
            NextAction::WaitForLiveAttempt { .. }
        ));
        // The holder's count is unknown (0): a later count proves nothing; wait.
        let d5 = delivery("evt-1", 5);
        let a5 = attempt(&m, &d5);
        let unknown = held_by_other(&a5, now() + secs(30), 0);
        assert!(matches!(a5.sees(&unknown, now()), Holder::Live(_)));
        assert!(matches!(
            on(&a5, Observed::Inbox(&unknown)),
            NextAction::WaitForLiveAttempt { .. }
        ));
        // Once the lease ran out, it is taken over.
        let expired = held_by_other(&a0, now() - secs(1), 0);
        assert!(matches!(
            on(&a0, Observed::Inbox(&expired)),
            NextAction::TakeOver {
                reason: TakeOverReason::LeaseExpired,
                ..
            }
        ));
    }

    #[test]
    fn our_own_write_coming_back_is_resumed_or_answered_from_the_payment() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        let own_live = inbox_record(&a, &policy(), now(), Some(now() + secs(60)), None);
        assert_eq!(on(&a, Observed::Inbox(&own_live)), NextAction::Resume);
        let own_done = inbox_record(&a, &policy(), now(), None, Some(OutcomeKind::Paid));
        assert_eq!(
            on(&a, Observed::Inbox(&own_done)),
            NextAction::AnswerFromPayment
        );
        let paid = payment(&m, "evt-1", PaymentStatus::Paid);
        assert_eq!(
            on(&a, Observed::OwnCompleted(Some(&paid))),
            NextAction::Finish(Outcome::Paid {
                bank_payment_id: "bank-1".into()
            })
        );
        assert!(matches!(
            on(&a, Observed::OwnCompleted(None)),
            NextAction::Corrupt(_)
        ));
    }

    #[test]
    fn held_lease_pays_out_or_completes_the_inbox_from_a_final_payment() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let held = inbox_record(&a, &policy(), now(), Some(now() + secs(60)), None);
        let owed = payment(&m, "evt-1", PaymentStatus::InProgress);
        let seen = Observed::Held {
            inbox: &held,
            payment: Some(&owed),
        };
        assert_eq!(on(&a, seen), NextAction::PayOut);
        let rejected = PaymentRecord {
            status_reason: Some("closed account".into()),
            ..payment(&m, "evt-1", PaymentStatus::Rejected)
        };
        let seen = Observed::Held {
            inbox: &held,
            payment: Some(&rejected),
        };
        let NextAction::CompleteInbox { inbox, outcome } = on(&a, seen) else {
            panic!("expected the inbox to be completed");
        };
        assert_eq!(
            outcome,
            Outcome::Rejected {
                reason: "closed account".into()
            }
        );
        assert_eq!(inbox.status, InboxStatus::Completed);
        assert_eq!(inbox.outcome, Some(OutcomeKind::Rejected.into()));
        assert_eq!(inbox.lease_until, None);
        let seen = Observed::Held {
            inbox: &held,
            payment: None,
        };
        assert!(matches!(on(&a, seen), NextAction::Corrupt(_)));
    }

    #[test]
    fn business_duplicate_of_a_final_payment_is_recorded_as_handled() {
        let m = msg("10.00");
        let (d, paid) = (
            delivery("evt-2", 1),
            payment(&m, "evt-1", PaymentStatus::Paid),
        );
        let a = attempt(&m, &d);
        let NextAction::FinishBusinessDuplicate { inbox, outcome } =
            on(&a, Observed::Payment(&paid))
        else {
            panic!("expected a business duplicate");
        };
        assert_eq!(
            outcome,
            Outcome::BusinessDuplicate {
                original_message: MessageId::parse("evt-1").unwrap()
            }
        );
        assert_eq!(inbox.status, InboxStatus::Completed);
        assert_eq!(inbox.outcome, Some(OutcomeKind::BusinessDuplicate.into()));
        assert_eq!(inbox.message_id.as_str(), "evt-2");
        assert_eq!(inbox.owner, a.id);
        assert_eq!(inbox.lease_until, None);
    }

    #[test]
    fn business_duplicate_with_another_payload_is_a_conflict() {
        let paid = payment(&msg("10.00"), "evt-1", PaymentStatus::Paid);
        let (m, d) = (msg("12.00"), delivery("evt-2", 1));
        let a = attempt(&m, &d);
        assert!(matches!(
            on(&a, Observed::Payment(&paid)),
            NextAction::Finish(Outcome::Conflict { reason }) if reason.contains("different amount")
        ));
    }

    #[test]
    fn our_own_message_back_after_its_inbox_expired() {
        let m = msg("10.00");
        let (d, paid) = (
            delivery("evt-1", 1),
            payment(&m, "evt-1", PaymentStatus::Paid),
        );
        let a = attempt(&m, &d);
        let NextAction::FinishBusinessDuplicate { inbox, outcome } =
            on(&a, Observed::Payment(&paid))
        else {
            panic!("expected a duplicate");
        };
        assert_eq!(
            outcome,
            Outcome::Duplicate {
                first_outcome: Some(OutcomeKind::Paid)
            }
        );
        assert_eq!(inbox.outcome, Some(OutcomeKind::Duplicate.into()));
        // Its payout still owed: hold it again and resume.
        let owed = payment(&m, "evt-1", PaymentStatus::InProgress);
        let NextAction::ReclaimPayout { inbox } = on(&a, Observed::Payment(&owed)) else {
            panic!("expected the payout to be reclaimed");
        };
        assert_eq!(inbox.status, InboxStatus::InProgress);
        assert_eq!(inbox.owner, a.id);
        assert_eq!(inbox.lease_until, Some(now() + secs(60)));
        assert_eq!(inbox.outcome, None);
    }

    #[test]
    fn another_messages_payout_in_progress_is_waited_for_or_adopted_when_orphaned() {
        let m = msg("10.00");
        let owed = payment(&m, "evt-1", PaymentStatus::InProgress);
        let d = delivery("evt-2", 1);
        let a = attempt(&m, &d);
        let NextAction::InspectPayoutOwner { owner } = on(&a, Observed::Payment(&owed)) else {
            panic!("expected to look at the payout's owner");
        };
        assert_eq!(owner.message_id.as_str(), "evt-1");
        assert_eq!(owner.claim_id, m.claim_id);
        assert_eq!(owner.consumer, "payments");

        let d1 = delivery("evt-1", 1);
        let owner_attempt = attempt(&m, &d1);
        let live = held_by_other(&owner_attempt, now() + secs(30), 1);
        assert_eq!(
            on(&a, Observed::PayoutOwner(Some(&live))),
            NextAction::WaitForPayout
        );
        assert_eq!(
            on(&a, Observed::PayoutOwner(None)),
            NextAction::WaitForPayout
        );
        let finished = completed_by_other(&owner_attempt, OutcomeKind::Paid);
        assert_eq!(
            on(&a, Observed::PayoutOwner(Some(&finished))),
            NextAction::WaitForPayout
        );
        let dead = held_by_other(&owner_attempt, now() - secs(1), 1);
        let NextAction::AdoptOrphanedPayout { record } = on(&a, Observed::PayoutOwner(Some(&dead)))
        else {
            panic!("expected the orphaned payout to be adopted");
        };
        // Held by us, but still the other message's record (its delivery count too).
        assert_eq!(record.owner, a.id);
        assert_eq!(record.message_id.as_str(), "evt-1");
        assert_eq!(record.last_delivery_count, 1);
        assert_eq!(record.lease_until, Some(now() + secs(60)));
        assert_eq!(record.status, InboxStatus::InProgress);
    }
}
