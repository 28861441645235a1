//! The consumer's decisions, apart from its I/O.
//!
//! Each thing the flow reads from the store (or the bank) has its own function here and
//! its own answer type, listing only what can follow that observation, so the I/O loop
//! in [`super`] matches every answer exhaustively and has no "cannot happen" arm:
//!
//! | observation                                  | decision            | answer          |
//! |----------------------------------------------|---------------------|-----------------|
//! | the message, before anything is written      | [`first_claim`]     | [`FirstClaim`]  |
//! | our claim went through                       | [`after_claim`]     | [`AfterClaim`]  |
//! | this message's inbox record                  | [`on_inbox`]        | [`OnInbox`]     |
//! | the claim's payment (no inbox record)        | [`on_payment`]      | [`OnPayment`]   |
//! | the inbox record of another message's payout | [`on_payout_owner`] | [`OnPayoutOwner`] |
//! | the payment, for our own record              | [`on_resume`]       | [`OnResume`]    |
//! | the bank's answer to our payout              | [`after_payout`]    | [`AfterPayout`] |
//!
//! None of them reads a clock or touches the store or the bank: every rule is a plain
//! function of its inputs and is tested as one (see the tests below). The records a
//! decision writes are built here too, because their fields (owner, lease, retention,
//! status) are part of it; the lease rules themselves are [`lease`]'s: where a record's
//! lease decides, the decision says so and the I/O loop takes it with
//! [`lease::Lease::acquire`], with the bid and the takeover record [`Attempt`] builds.

use time::OffsetDateTime;

use super::{Delivery, Outcome, OutcomeKind, Policy};
use crate::bank::PayoutOutcome;
use crate::domain::{ClaimApproved, PayloadHash, Purpose};
use crate::lease::liveness::GoneOwners;
use crate::lease::{self, Bid};
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, PaymentRecord, PaymentStatus,
    Versioned,
};

/// What one attempt knows about the message it handles.
pub struct Attempt<'a> {
    pub msg: &'a ClaimApproved,
    pub delivery: &'a Delivery,
    pub id: AttemptId,
    pub hash: PayloadHash,
    pub key: InboxKey,
    /// The claim's payment as this attempt last wrote or read it, kept only when the
    /// caller answers with it (the HTTP API), so it need not read it back. `None` on the
    /// message path, which then copies nothing.
    pub payment_seen: Option<std::sync::Mutex<Option<PaymentRecord>>>,
    /// The processes this attempt found ended: their live leases are over.
    pub gone: &'a GoneOwners,
}

impl Attempt<'_> {
    /// Notes the claim's payment as the store now holds it.
    pub fn saw(&self, payment: &PaymentRecord) {
        if let Some(Ok(mut seen)) = self.payment_seen.as_ref().map(|m| m.lock()) {
            *seen = Some(payment.clone());
        }
    }

    /// Forgets the payment noted so far: another attempt wrote it since, so the caller
    /// must read what the store holds (found by the deterministic simulator, seed 126: a
    /// lost finalize answered a retried HTTP request with the payment still `in_progress`
    /// while the store held it `paid`).
    pub fn lost_sight_of_payment(&self) {
        if let Some(Ok(mut seen)) = self.payment_seen.as_ref().map(|m| m.lock()) {
            *seen = None;
        }
    }

    /// The broker's count this attempt judges `record` with: ours for this message's
    /// own record, and 0 (unknown) for another message's, which our count says nothing
    /// about.
    fn delivery_for(&self, record: &InboxRecord) -> u32 {
        if record.message_id == self.delivery.message_id {
            self.delivery.delivery_count
        } else {
            0
        }
    }

    /// This attempt's bid for the lease of `record` ([`lease::holder`] judges it).
    pub fn bid(&self, record: &InboxRecord, now: OffsetDateTime) -> Bid {
        Bid {
            me: self.id,
            delivery: self.delivery_for(record),
            now,
        }
    }

    /// The record that takes `record` over for this attempt, once the takeover rule let
    /// it: built only then, since most records met again are completed duplicates.
    pub fn taking_over(
        &self,
        record: &InboxRecord,
        policy: &Policy,
        now: OffsetDateTime,
    ) -> InboxRecord {
        let delivery = self.delivery_for(record);
        lease::taken_over(record, self.id, delivery, policy.terms(), now)
    }

    /// This message's inbox record, written anew by this attempt: in progress under a
    /// fresh lease when `outcome` is `None`, otherwise completed with it.
    fn new_inbox(
        &self,
        policy: &Policy,
        now: OffsetDateTime,
        outcome: Option<OutcomeKind>,
    ) -> InboxRecord {
        lease::new_record(
            &self.key,
            &self.hash,
            self.id,
            self.delivery.delivery_count,
            policy.terms(),
            now,
            outcome.map(InboxOutcome::Message),
        )
    }

    /// `record`, which we hold, completed with `outcome` by this attempt at `now`: the
    /// latest delivery count kept and the retention counted from this write
    /// ([`lease::touched`]).
    fn completes(
        &self,
        record: &InboxRecord,
        outcome: &Outcome,
        policy: &Policy,
        now: OffsetDateTime,
    ) -> InboxRecord {
        let touched = lease::touched(record, self.delivery.delivery_count, policy.terms(), now);
        lease::completed(&touched, outcome.kind().into(), now)
    }
}

/// The store contradicts itself; retrying cannot help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt(pub String);

/// The payee rule, the one place it is written (the consumer and the payments API both
/// apply it): with payouts enabled, a claim without a payee can never be paid.
/// `Some(reason)` refuses the message.
pub fn missing_payee(msg: &ClaimApproved, payouts_enabled: bool) -> Option<&'static str> {
    (payouts_enabled && msg.payee.is_none()).then_some("payee: is missing, and payouts are enabled")
}

/// The two records a first attempt claims in one atomic step.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstClaim {
    pub inbox: InboxRecord,
    pub payment: PaymentRecord,
}

/// The message, before anything is written: refused ([`missing_payee`]), or the records
/// to claim ([`first_records`]).
pub fn first_claim(
    a: &Attempt<'_>,
    policy: &Policy,
    payouts_enabled: bool,
    now: OffsetDateTime,
) -> Result<FirstClaim, Outcome> {
    match missing_payee(a.msg, payouts_enabled) {
        Some(reason) => Err(Outcome::InvalidMessage {
            reason: format!("{reason} (BANK_API_URL is set)"),
        }),
        None => Ok(first_records(a, policy, payouts_enabled, now)),
    }
}

/// The records of a first attempt. With payouts: the inbox record in progress under our
/// lease, the payment in progress with its exact payout request. In ledger-only mode the
/// claim itself records the payment: both are final at once.
pub fn first_records(
    a: &Attempt<'_>,
    policy: &Policy,
    payouts_enabled: bool,
    now: OffsetDateTime,
) -> FirstClaim {
    let ledger_only = !payouts_enabled;
    let inbox = a.new_inbox(policy, now, ledger_only.then_some(OutcomeKind::Recorded));
    let payment = PaymentRecord {
        claim_id: a.msg.claim_id,
        purpose: Purpose::Payout,
        tenant_id: a.msg.tenant.clone(),
        money: a.msg.money,
        payee: a.msg.payee.clone(),
        payload_hash: a.hash.clone(),
        message_id: a.delivery.message_id.clone(),
        idempotency_key: a.msg.idempotency_key(),
        payout_request: payouts_enabled.then(|| a.msg.payout_request_body()),
        status: if ledger_only {
            PaymentStatus::Recorded
        } else {
            PaymentStatus::InProgress
        },
        bank_payment_id: None,
        status_reason: None,
        created_at: now,
        updated_at: now,
    };
    FirstClaim { inbox, payment }
}

/// What follows a claim that went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterClaim {
    /// Ledger-only mode: the claim itself recorded the payment; answer `recorded`.
    Recorded,
    /// We hold the lease and the payout is owed: call the bank, then finalize.
    PayOut,
}

/// Our claim created both records; `inbox` is the one we wrote.
pub fn after_claim(inbox: &InboxRecord) -> AfterClaim {
    match inbox.status {
        InboxStatus::Completed => AfterClaim::Recorded,
        InboxStatus::InProgress => AfterClaim::PayOut,
    }
}

/// What follows reading this message's inbox record.
#[derive(Debug, Clone, PartialEq)]
pub enum OnInbox {
    /// A duplicate or a conflict: answer this; nothing (more) is written.
    Finish(Outcome),
    /// Our own completed write came back (the SDK re-sent it): resume, which answers
    /// from the payment.
    AnswerFromPayment,
    /// Our own in-progress write came back: we hold its lease; resume from the records.
    Resume,
    /// Another attempt's record of this message, in progress: its lease decides. Take it
    /// over ([`Attempt::taking_over`]) if the takeover rule lets us, else wait (bounded)
    /// while it is live, then re-read.
    TakeLease,
}

/// This message's inbox record exists (the claim was refused, or we re-read it).
pub fn on_inbox(a: &Attempt<'_>, record: &InboxRecord) -> OnInbox {
    if record.owner == a.id {
        // Our own committed write ([`lease::Holder::Us`]), reported as a conflict (409)
        // or a stale ETag (412) because the SDK re-sent it after an ambiguous timeout.
        match record.status {
            InboxStatus::Completed => OnInbox::AnswerFromPayment,
            InboxStatus::InProgress => OnInbox::Resume,
        }
    } else if record.payload_hash != a.hash {
        OnInbox::Finish(Outcome::Conflict {
            reason: format!(
                "MessageId {} was first received with a different payload for claim {}; this delivery is refused",
                a.delivery.message_id, a.msg.claim_id
            ),
        })
    } else if record.status == InboxStatus::Completed {
        OnInbox::Finish(Outcome::Duplicate {
            first_outcome: record.outcome.as_ref().and_then(InboxOutcome::kind),
        })
    } else {
        OnInbox::TakeLease
    }
}

/// What follows finding the claim's payment while this message has no inbox record.
#[derive(Debug, Clone, PartialEq)]
pub enum OnPayment {
    /// The payment has another payload: answer this conflict; nothing is written.
    Finish(Outcome),
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
}

/// The claim already has a payment and this message has no inbox record: another
/// message paid it (a business duplicate), or this one did and its record expired.
pub fn on_payment(
    a: &Attempt<'_>,
    payment: &PaymentRecord,
    policy: &Policy,
    now: OffsetDateTime,
) -> OnPayment {
    if payment.payload_hash != a.hash {
        return OnPayment::Finish(Outcome::Conflict {
            reason: format!(
                "claim {} already has a payment from message {} with a different amount, currency, tenant or payee",
                a.msg.claim_id, payment.message_id
            ),
        });
    }
    let same_message = payment.message_id == a.delivery.message_id;
    if same_message && !payment.status.is_terminal() {
        // Our payout is owed and nobody holds it: hold it again and resume.
        return OnPayment::ReclaimPayout {
            inbox: a.new_inbox(policy, now, None),
        };
    }
    if !payment.status.is_terminal() {
        return OnPayment::InspectPayoutOwner {
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
    OnPayment::FinishBusinessDuplicate {
        inbox: a.new_inbox(policy, now, Some(outcome.kind())),
        outcome,
    }
}

/// What follows reading the inbox record of the message whose payout is in progress.
// One answer per decision, moved straight into the next step: boxing would only add
// an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum OnPayoutOwner {
    /// That message's record is in progress under another attempt: take its lease over
    /// ([`Attempt::taking_over`]) if its attempt died (lease expired, or its process
    /// ended), and finish its payout under the same key, so it does not wait for a
    /// redelivery that may never come; else wait as for [`Self::WaitForPayout`].
    AdoptIfOrphaned { seen: Versioned<InboxRecord> },
    /// The payout is this attempt's, or its record is gone or final: wait (bounded),
    /// then re-read the payment.
    WaitForPayout,
}

/// The inbox record of the message whose payout is in progress (`None`: expired).
pub fn on_payout_owner(a: &Attempt<'_>, owner: Option<Versioned<InboxRecord>>) -> OnPayoutOwner {
    match owner {
        // Only an in-progress record has a holder whose end makes it adoptable; looking
        // again at once for a completed one would spin without a pause.
        Some(seen)
            if seen.record.status == InboxStatus::InProgress && seen.record.owner != a.id =>
        {
            OnPayoutOwner::AdoptIfOrphaned { seen }
        }
        _ => OnPayoutOwner::WaitForPayout,
    }
}

/// What follows reading the claim's payment for this message's record that we own.
// One answer per decision, moved straight into the next step: boxing would only add
// an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum OnResume {
    /// Our record was completed already: answer with what the payment says.
    Finish(Outcome),
    /// We hold the lease and the payout is owed: call the bank, then finalize.
    PayOut { payment: PaymentRecord },
    /// We hold the lease, but the payment is already final (only a manual repair gets
    /// here): complete the inbox record to match it.
    CompleteInbox {
        inbox: InboxRecord,
        payment: Versioned<PaymentRecord>,
        outcome: Outcome,
    },
}

/// The claim's payment, read to continue from this message's record `inbox`, which is
/// ours: we hold its lease, or our own completed write came back.
pub fn on_resume(
    a: &Attempt<'_>,
    inbox: &InboxRecord,
    payment: Option<Versioned<PaymentRecord>>,
    policy: &Policy,
    now: OffsetDateTime,
) -> Result<OnResume, Corrupt> {
    let payment = match (inbox.status, payment) {
        (InboxStatus::Completed, Some(p)) => return Ok(OnResume::Finish(outcome_of(&p.record))),
        (InboxStatus::Completed, None) => {
            return Err(Corrupt("completed message without a payment".into()))
        }
        (InboxStatus::InProgress, None) => {
            return Err(Corrupt(format!(
                "claim {} has an in-progress inbox record but no payment",
                a.msg.claim_id
            )))
        }
        (InboxStatus::InProgress, Some(p)) => p,
    };
    if payment.record.status == PaymentStatus::InProgress {
        return Ok(OnResume::PayOut {
            payment: payment.record,
        });
    }
    let outcome = outcome_of(&payment.record);
    Ok(OnResume::CompleteInbox {
        inbox: a.completes(inbox, &outcome, policy, now),
        payment,
        outcome,
    })
}

/// What follows the bank's answer to our payout.
// One answer per decision, moved straight into the next step: boxing would only add
// an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum AfterPayout {
    /// A verdict on the payment: store both records final in one step, answer `outcome`.
    Finalize {
        inbox: InboxRecord,
        payment: PaymentRecord,
        outcome: Outcome,
    },
    /// No verdict, nothing to store: give our lease back so the next delivery takes
    /// over at once instead of waiting it out, and retry later for `reason`.
    Release { reason: String },
}

/// The bank answered our payout of `payment` (whose lease `inbox` we hold): the payment's
/// final status and the final inbox record, or a lease to give back.
pub fn after_payout(
    a: &Attempt<'_>,
    inbox: &InboxRecord,
    payment: PaymentRecord,
    answer: PayoutOutcome,
    policy: &Policy,
    now: OffsetDateTime,
) -> AfterPayout {
    let (status, bank_payment_id, status_reason, outcome) = match answer {
        PayoutOutcome::Paid { payment_id } => (
            PaymentStatus::Paid,
            Some(payment_id.clone()),
            None,
            Outcome::Paid {
                bank_payment_id: payment_id,
            },
        ),
        PayoutOutcome::Rejected { reason, .. } => (
            PaymentStatus::Rejected,
            None,
            Some(reason.clone()),
            Outcome::Rejected { reason },
        ),
        PayoutOutcome::KeyMismatch { reason } => (
            PaymentStatus::NeedsReconciliation,
            None,
            Some(reason.clone()),
            Outcome::NeedsReconciliation { reason },
        ),
        PayoutOutcome::KeyWindowClosed {
            attempts,
            last_error,
        } => {
            // Resending now could pay twice: the bank may have forgotten the key.
            let reason = format!(
                "payout first requested at {}, and the bank's Idempotency-Key window ({}h) closes before another request could leave ({attempts} sent now{}); check the bank before paying",
                payment.created_at,
                policy.bank_key_window.as_secs() / 3600,
                if last_error.is_empty() { String::new() } else { format!(", last: {last_error}") },
            );
            (
                PaymentStatus::NeedsReconciliation,
                None,
                Some(reason.clone()),
                Outcome::NeedsReconciliation { reason },
            )
        }
        // Our own fault (credential, URL): not a verdict on the payment. Keep the
        // message on the queue and let the next delivery go at once.
        PayoutOutcome::ServiceFault { status, reason } => {
            return AfterPayout::Release {
                reason: format!("bank refused the service's request ({status}): {reason}"),
            }
        }
        PayoutOutcome::GaveUp {
            attempts,
            last_error,
        } => {
            return AfterPayout::Release {
                reason: format!("bank unavailable after {attempts} attempts: {last_error}"),
            }
        }
        // This instance's clock, not the payment: another instance (or this one, once its
        // clock is right) sends the next request.
        PayoutOutcome::ClockUntrusted { reason, .. } => return AfterPayout::Release { reason },
    };
    AfterPayout::Finalize {
        inbox: a.completes(inbox, &outcome, policy, now),
        payment: PaymentRecord {
            status,
            bank_payment_id,
            status_reason,
            updated_at: now,
            ..payment
        },
        outcome,
    }
}

/// The outcome a final payment stands for.
pub fn outcome_of(payment: &PaymentRecord) -> Outcome {
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
    use crate::lease::Holder;
    use crate::store::{Boot, Version};

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

    fn without_payee() -> ClaimApproved {
        ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":"10.00","currency":"EUR"}}"#
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

    fn versioned<T>(record: T) -> Versioned<T> {
        Versioned {
            record,
            version: Version("v1".into()),
        }
    }

    /// The record another attempt of the same message left: in progress under a lease
    /// ending at `lease_until`, after delivery `count`.
    fn held_by_other(a: &Attempt<'_>, lease_until: OffsetDateTime, count: u32) -> InboxRecord {
        InboxRecord {
            owner: AttemptId::new(),
            first_delivery_count: count,
            last_delivery_count: count,
            lease_until: Some(lease_until),
            ..a.new_inbox(&policy(), now() - secs(10), None)
        }
    }

    fn completed_by_other(a: &Attempt<'_>, outcome: OutcomeKind) -> InboxRecord {
        InboxRecord {
            owner: AttemptId::new(),
            ..a.new_inbox(&policy(), now() - secs(10), Some(outcome))
        }
    }

    /// The claim's payment, created by message `by` with the payload of `of`.
    fn payment(of: &ClaimApproved, by: &str, status: PaymentStatus) -> PaymentRecord {
        let d = delivery(by, 1);
        let a = attempt(of, &d);
        PaymentRecord {
            status,
            bank_payment_id: (status == PaymentStatus::Paid).then(|| "bank-1".into()),
            ..first_records(&a, &policy(), true, now() - secs(100)).payment
        }
    }

    fn on(a: &Attempt<'_>, record: &InboxRecord) -> OnInbox {
        on_inbox(a, record)
    }

    /// Who holds `record` for `a`, by the takeover rule ([`Lease::acquire`] applies it),
    /// with its process known to have ended or not.
    fn judged(a: &Attempt<'_>, record: &InboxRecord, owner_gone: bool) -> Holder {
        a.bid(record, now()).judge(record, owner_gone)
    }

    /// `a` finds `record` held by a live attempt, and waits for it.
    fn waits_for_live(a: &Attempt<'_>, record: &InboxRecord) {
        assert_eq!(on(a, record), OnInbox::TakeLease);
        assert!(matches!(judged(a, record, false), Holder::Live(_)));
    }

    #[test]
    fn the_payee_rule_refuses_a_missing_payee_only_when_payouts_are_enabled() {
        let (none, some) = (without_payee(), msg("10.00"));
        assert_eq!(
            missing_payee(&none, true),
            Some("payee: is missing, and payouts are enabled")
        );
        assert_eq!(missing_payee(&none, false), None);
        assert_eq!(missing_payee(&some, true), None);
        // The consumer answers it as an invalid message, before anything is written.
        let d = delivery("evt-1", 1);
        assert_eq!(
            first_claim(&attempt(&none, &d), &policy(), true, now()),
            Err(Outcome::InvalidMessage {
                reason: "payee: is missing, and payouts are enabled (BANK_API_URL is set)".into()
            })
        );
        assert!(first_claim(&attempt(&none, &d), &policy(), false, now()).is_ok());
    }

    #[test]
    fn a_first_claim_holds_the_payout_or_records_it_at_once_in_ledger_only_mode() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 3));
        let a = attempt(&m, &d);
        let FirstClaim { inbox, payment } = first_claim(&a, &policy(), true, now()).unwrap();
        assert_eq!(inbox.key(), a.key);
        assert_eq!(inbox.owner, a.id);
        assert_eq!(inbox.payload_hash, a.hash);
        assert_eq!(inbox.status, InboxStatus::InProgress);
        assert_eq!(inbox.lease_until, Some(now() + secs(60)));
        assert_eq!(inbox.outcome, None);
        assert_eq!(
            (inbox.first_delivery_count, inbox.last_delivery_count),
            (3, 3)
        );
        assert_eq!(inbox.expires_at, now() + secs(86_400));
        assert_eq!(payment.status, PaymentStatus::InProgress);
        assert_eq!(payment.message_id, d.message_id);
        assert_eq!(payment.payload_hash, a.hash);
        assert_eq!(payment.idempotency_key, m.idempotency_key());
        assert_eq!(payment.payout_request, Some(m.payout_request_body()));
        assert_eq!(after_claim(&inbox), AfterClaim::PayOut);

        let FirstClaim { inbox, payment } = first_claim(&a, &policy(), false, now()).unwrap();
        assert_eq!(inbox.status, InboxStatus::Completed);
        assert_eq!(inbox.lease_until, None);
        assert_eq!(inbox.outcome, Some(OutcomeKind::Recorded.into()));
        assert_eq!(payment.status, PaymentStatus::Recorded);
        assert_eq!(payment.payout_request, None);
        assert_eq!(after_claim(&inbox), AfterClaim::Recorded);
    }

    #[test]
    fn completed_record_with_the_same_payload_is_a_duplicate_with_the_first_outcome() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let seen = completed_by_other(&a, OutcomeKind::Paid);
        assert_eq!(
            on(&a, &seen),
            OnInbox::Finish(Outcome::Duplicate {
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
            matches!(on(&a, &stored), OnInbox::Finish(Outcome::Conflict { reason }) if reason.contains("different payload")),
        );
        // Also while another attempt still holds it: the payload is judged first.
        let live = held_by_other(&attempt(&first, &d), now() + secs(30), 1);
        assert!(matches!(
            on(&a, &live),
            OnInbox::Finish(Outcome::Conflict { .. })
        ));
    }

    #[test]
    fn a_live_lease_is_waited_for() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        let until = now() + secs(30);
        let seen = held_by_other(&a, until, 1);
        assert_eq!(on(&a, &seen), OnInbox::TakeLease);
        assert_eq!(judged(&a, &seen, false), Holder::Live(until));
    }

    #[test]
    fn an_expired_lease_is_taken_over_with_our_owner_and_a_new_lease() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let seen = held_by_other(&a, now() - secs(1), 1);
        assert_eq!(on(&a, &seen), OnInbox::TakeLease);
        assert_eq!(judged(&a, &seen, false), Holder::Nobody);
        let record = a.taking_over(&seen, &policy(), now());
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
        assert_eq!(judged(&a, &seen, false), Holder::Superseded);
        assert_eq!(Holder::Superseded.as_str(), "later-delivery");
        let record = a.taking_over(&seen, &policy(), now());
        assert_eq!(record.owner, a.id);
        assert_eq!(record.last_delivery_count, 3);
        // The same or a lower count is not later: wait.
        for count in [2, 1] {
            let d = delivery("evt-1", count);
            let a = attempt(&m, &d);
            waits_for_live(&a, &seen);
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
        assert_eq!(on(&a, &seen), OnInbox::TakeLease);
        assert!(matches!(judged(&a, &seen, false), Holder::Live(_)));
        assert_eq!(judged(&a, &seen, true), Holder::OwnerGone);
        assert_eq!(Holder::OwnerGone.as_str(), "owner-gone");
        // Another message's payout held so is adopted the same way.
        assert_eq!(
            on_payout_owner(&a, Some(versioned(seen.clone()))),
            OnPayoutOwner::AdoptIfOrphaned {
                seen: versioned(seen.clone())
            }
        );
        // What the attempt found stays found for it; another process's end says
        // nothing about this one's own attempts.
        a.gone.insert(dead);
        assert!(a.gone.contains(seen.owner));
        let ours = held_by_other(&a, now() + secs(30), 2);
        assert!(!a.gone.contains(ours.owner));
    }

    #[test]
    fn delivery_count_zero_leaves_it_to_the_lease() {
        let m = msg("10.00");
        // The host did not say (count 0) for this delivery: a live lease is waited for.
        let d0 = delivery("evt-1", 0);
        let a0 = attempt(&m, &d0);
        let live = held_by_other(&a0, now() + secs(30), 1);
        waits_for_live(&a0, &live);
        // The holder's count is unknown (0): a later count proves nothing; wait.
        let d5 = delivery("evt-1", 5);
        let a5 = attempt(&m, &d5);
        let unknown = held_by_other(&a5, now() + secs(30), 0);
        waits_for_live(&a5, &unknown);
        // Once the lease ran out, it is taken over.
        let expired = held_by_other(&a0, now() - secs(1), 0);
        assert_eq!(judged(&a0, &expired, false), Holder::Nobody);
        assert_eq!(Holder::Nobody.as_str(), "lease-expired");
    }

    #[test]
    fn our_own_write_coming_back_is_resumed_or_answered_from_the_payment() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        let own_live = a.new_inbox(&policy(), now(), None);
        assert_eq!(on(&a, &own_live), OnInbox::Resume);
        let own_done = a.new_inbox(&policy(), now(), Some(OutcomeKind::Paid));
        assert_eq!(on(&a, &own_done), OnInbox::AnswerFromPayment);
        // Resuming our completed record answers from the payment, writing nothing.
        let paid = payment(&m, "evt-1", PaymentStatus::Paid);
        assert_eq!(
            on_resume(&a, &own_done, Some(versioned(paid)), &policy(), now()),
            Ok(OnResume::Finish(Outcome::Paid {
                bank_payment_id: "bank-1".into()
            }))
        );
        assert_eq!(
            on_resume(&a, &own_done, None, &policy(), now()),
            Err(Corrupt("completed message without a payment".into()))
        );
    }

    #[test]
    fn held_lease_pays_out_or_completes_the_inbox_from_a_final_payment() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 2));
        let a = attempt(&m, &d);
        let held = a.new_inbox(&policy(), now() - secs(10), None);
        let owed = payment(&m, "evt-1", PaymentStatus::InProgress);
        assert_eq!(
            on_resume(&a, &held, Some(versioned(owed.clone())), &policy(), now()),
            Ok(OnResume::PayOut { payment: owed })
        );
        let rejected = PaymentRecord {
            status_reason: Some("closed account".into()),
            ..payment(&m, "evt-1", PaymentStatus::Rejected)
        };
        let Ok(OnResume::CompleteInbox {
            inbox,
            payment,
            outcome,
        }) = on_resume(
            &a,
            &held,
            Some(versioned(rejected.clone())),
            &policy(),
            now(),
        )
        else {
            panic!("expected the inbox to be completed");
        };
        assert_eq!(
            outcome,
            Outcome::Rejected {
                reason: "closed account".into()
            }
        );
        // The payment is final already: it is written back as read, under its version.
        assert_eq!(payment, versioned(rejected));
        assert_eq!(inbox.status, InboxStatus::Completed);
        assert_eq!(inbox.outcome, Some(OutcomeKind::Rejected.into()));
        assert_eq!(inbox.lease_until, None);
        assert_eq!(inbox.updated_at, now());
        assert_eq!(inbox.expires_at, now() + secs(86_400));
        assert!(on_resume(&a, &held, None, &policy(), now()).is_err());
    }

    /// The final records of a payout the bank answered with `answer`.
    fn paid_out(answer: PayoutOutcome) -> AfterPayout {
        let (m, d) = (msg("10.00"), delivery("evt-1", 4));
        let a = attempt(&m, &d);
        let FirstClaim { inbox, payment } = first_records(&a, &policy(), true, now() - secs(100));
        after_payout(&a, &inbox, payment, answer, &policy(), now())
    }

    #[test]
    fn a_bank_verdict_finalizes_the_payment_and_completes_the_inbox_record() {
        let cases = [
            (
                PayoutOutcome::Paid {
                    payment_id: "bank-7".into(),
                },
                PaymentStatus::Paid,
                Some("bank-7"),
                None,
                Outcome::Paid {
                    bank_payment_id: "bank-7".into(),
                },
            ),
            (
                PayoutOutcome::Rejected {
                    status: 402,
                    reason: "closed account".into(),
                },
                PaymentStatus::Rejected,
                None,
                Some("closed account"),
                Outcome::Rejected {
                    reason: "closed account".into(),
                },
            ),
            (
                PayoutOutcome::KeyMismatch {
                    reason: "key reused".into(),
                },
                PaymentStatus::NeedsReconciliation,
                None,
                Some("key reused"),
                Outcome::NeedsReconciliation {
                    reason: "key reused".into(),
                },
            ),
        ];
        for (answer, status, bank_id, reason, expected) in cases {
            let AfterPayout::Finalize {
                inbox,
                payment,
                outcome,
            } = paid_out(answer)
            else {
                panic!("expected a verdict to be stored");
            };
            assert_eq!(outcome, expected);
            assert_eq!(payment.status, status);
            assert_eq!(payment.bank_payment_id.as_deref(), bank_id);
            assert_eq!(payment.status_reason.as_deref(), reason);
            assert_eq!(payment.updated_at, now());
            assert_eq!(payment.created_at, now() - secs(100));
            assert_eq!(inbox.status, InboxStatus::Completed);
            assert_eq!(inbox.outcome, Some(expected.kind().into()));
            assert_eq!(inbox.lease_until, None);
            assert_eq!(inbox.last_delivery_count, 4);
            assert_eq!(inbox.updated_at, now());
            assert_eq!(inbox.expires_at, now() + secs(86_400));
        }
    }

    #[test]
    fn a_closed_key_window_needs_reconciliation_and_says_why() {
        let AfterPayout::Finalize {
            payment, outcome, ..
        } = paid_out(PayoutOutcome::KeyWindowClosed {
            attempts: 2,
            last_error: "503".into(),
        })
        else {
            panic!("expected a verdict to be stored");
        };
        assert_eq!(payment.status, PaymentStatus::NeedsReconciliation);
        let Outcome::NeedsReconciliation { reason } = outcome else {
            panic!("expected needs-reconciliation");
        };
        assert!(reason.contains("Idempotency-Key window (24h)"), "{reason}");
        assert!(reason.contains("(2 sent now, last: 503)"), "{reason}");
        assert_eq!(payment.status_reason, Some(reason));
    }

    #[test]
    fn no_verdict_from_the_bank_gives_the_lease_back() {
        assert_eq!(
            paid_out(PayoutOutcome::ServiceFault {
                status: 401,
                reason: "bad credential".into()
            }),
            AfterPayout::Release {
                reason: "bank refused the service's request (401): bad credential".into()
            }
        );
        assert_eq!(
            paid_out(PayoutOutcome::GaveUp {
                attempts: 5,
                last_error: "timed out".into()
            }),
            AfterPayout::Release {
                reason: "bank unavailable after 5 attempts: timed out".into()
            }
        );
    }

    #[test]
    fn a_final_payment_met_again_is_recorded_as_handled() {
        // Another message for the claim is a business duplicate; our own message back
        // after its inbox record expired is a plain duplicate.
        for (message, outcome, kind) in [
            (
                "evt-2",
                Outcome::BusinessDuplicate {
                    original_message: MessageId::parse("evt-1").unwrap(),
                },
                OutcomeKind::BusinessDuplicate,
            ),
            (
                "evt-1",
                Outcome::Duplicate {
                    first_outcome: Some(OutcomeKind::Paid),
                },
                OutcomeKind::Duplicate,
            ),
        ] {
            let (m, d) = (msg("10.00"), delivery(message, 1));
            let a = attempt(&m, &d);
            let paid = payment(&m, "evt-1", PaymentStatus::Paid);
            let OnPayment::FinishBusinessDuplicate {
                inbox,
                outcome: answered,
            } = on_payment(&a, &paid, &policy(), now())
            else {
                panic!("{message}: expected a duplicate");
            };
            assert_eq!(answered, outcome, "{message}");
            assert_eq!(inbox.status, InboxStatus::Completed, "{message}");
            assert_eq!(inbox.outcome, Some(kind.into()), "{message}");
            assert_eq!(inbox.message_id.as_str(), message);
            assert_eq!(inbox.owner, a.id, "{message}");
            assert_eq!(inbox.lease_until, None, "{message}");
        }
    }

    #[test]
    fn business_duplicate_with_another_payload_is_a_conflict() {
        let paid = payment(&msg("10.00"), "evt-1", PaymentStatus::Paid);
        let (m, d) = (msg("12.00"), delivery("evt-2", 1));
        let a = attempt(&m, &d);
        assert!(matches!(
            on_payment(&a, &paid, &policy(), now()),
            OnPayment::Finish(Outcome::Conflict { reason }) if reason.contains("different amount")
        ));
    }

    #[test]
    fn our_own_message_back_after_its_inbox_expired_reclaims_its_owed_payout() {
        let (m, d) = (msg("10.00"), delivery("evt-1", 1));
        let a = attempt(&m, &d);
        // Its payout still owed: hold it again and resume.
        let owed = payment(&m, "evt-1", PaymentStatus::InProgress);
        let OnPayment::ReclaimPayout { inbox } = on_payment(&a, &owed, &policy(), now()) else {
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
        let OnPayment::InspectPayoutOwner { owner } = on_payment(&a, &owed, &policy(), now())
        else {
            panic!("expected to look at the payout's owner");
        };
        assert_eq!(owner.message_id.as_str(), "evt-1");
        assert_eq!(owner.claim_id, m.claim_id);
        assert_eq!(owner.consumer, "payments");

        let on_owner =
            |record: Option<&InboxRecord>| on_payout_owner(&a, record.cloned().map(versioned));
        let d1 = delivery("evt-1", 1);
        let owner_attempt = attempt(&m, &d1);
        // In progress under another attempt: its lease decides, live or not.
        let live = held_by_other(&owner_attempt, now() + secs(30), 1);
        assert_eq!(
            on_owner(Some(&live)),
            OnPayoutOwner::AdoptIfOrphaned {
                seen: versioned(live.clone())
            }
        );
        assert!(matches!(judged(&a, &live, false), Holder::Live(_)));
        assert_eq!(on_owner(None), OnPayoutOwner::WaitForPayout);
        // A completed record has no holder whose end would make it adoptable, even when
        // its process ended: naming one made the consumer look again at once, forever.
        let finished = completed_by_other(&owner_attempt, OutcomeKind::Paid);
        assert_eq!(on_owner(Some(&finished)), OnPayoutOwner::WaitForPayout);
        // Our own attempt's record is never adopted again.
        let ours = InboxRecord {
            owner: a.id,
            ..live.clone()
        };
        assert_eq!(on_owner(Some(&ours)), OnPayoutOwner::WaitForPayout);
        let dead = held_by_other(&owner_attempt, now() - secs(1), 1);
        assert_eq!(
            on_owner(Some(&dead)),
            OnPayoutOwner::AdoptIfOrphaned {
                seen: versioned(dead.clone())
            }
        );
        // Judged with our count unknown (another message's record), ours otherwise.
        assert_eq!(a.bid(&dead, now()).delivery, 0);
        assert_eq!(judged(&a, &dead, false), Holder::Nobody);
        let record = a.taking_over(&dead, &policy(), now());
        // Held by us, but still the other message's record (its delivery count too).
        assert_eq!(record.owner, a.id);
        assert_eq!(record.message_id.as_str(), "evt-1");
        assert_eq!(record.last_delivery_count, 1);
        assert_eq!(record.lease_until, Some(now() + secs(60)));
        assert_eq!(record.status, InboxStatus::InProgress);
    }
}
