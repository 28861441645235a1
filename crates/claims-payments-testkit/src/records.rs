//! Store records as the consumer writes them, for tests of the store port: one set of
//! builders for the conformance suite and the Cosmos adapter's own tests.

use std::time::Duration;

use claims_payments::seams::store::{
    AttemptId, ClaimResult, InboxRecord, InboxStatus, PaymentRecord, PaymentStatus, Version,
};
use claims_payments::OutcomeKind;
use claims_payments::{ClaimApproved, MessageId, Purpose};
use time::OffsetDateTime;

use crate::fixtures::message;

/// The consumer name the default policy uses.
pub const CONSUMER: &str = "ClaimApprovedHandler";

/// Now, at the precision every store keeps (milliseconds), so whole records compare.
pub fn now_ms() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1_000_000 * 1_000_000)
        .unwrap_or(now)
}

/// The records a first attempt (`owner`) of `message_id` claims for `msg`, stamped `at`:
/// an in-progress inbox record with a one-minute lease and the in-progress payment.
pub fn records_for(
    msg: &ClaimApproved,
    message_id: &str,
    owner: AttemptId,
    at: OffsetDateTime,
) -> (InboxRecord, PaymentRecord) {
    let message_id = MessageId::parse(message_id).expect("a valid MessageId");
    let inbox = InboxRecord {
        consumer: CONSUMER.into(),
        claim_id: msg.claim_id,
        message_id: message_id.clone(),
        payload_hash: msg.payload_hash(),
        status: InboxStatus::InProgress,
        outcome: None,
        owner,
        lease_until: Some(at + Duration::from_secs(60)),
        first_delivery_count: 1,
        last_delivery_count: 1,
        created_at: at,
        updated_at: at,
        expires_at: at + Duration::from_secs(30 * 86_400),
    };
    let payment = PaymentRecord {
        claim_id: msg.claim_id,
        purpose: Purpose::Payout,
        tenant_id: msg.tenant.clone(),
        money: msg.money,
        payee: msg.payee.clone(),
        payload_hash: msg.payload_hash(),
        message_id,
        idempotency_key: msg.idempotency_key(),
        payout_request: Some(msg.payout_request_body()),
        status: PaymentStatus::InProgress,
        bank_payment_id: None,
        status_reason: None,
        created_at: at,
        updated_at: at,
    };
    (inbox, payment)
}

/// [`records_for`] a message of 100.00 EUR for `claim`, stamped now.
pub fn records(claim: &str, message_id: &str, owner: AttemptId) -> (InboxRecord, PaymentRecord) {
    records_for(
        &message(claim, "100.00"),
        message_id,
        owner,
        OffsetDateTime::now_utc(),
    )
}

/// The inbox record completed as paid, now.
pub fn completed(inbox: &InboxRecord) -> InboxRecord {
    InboxRecord {
        status: InboxStatus::Completed,
        outcome: Some(OutcomeKind::Paid.into()),
        lease_until: None,
        updated_at: now_ms(),
        ..inbox.clone()
    }
}

/// The payment paid by the bank as `bank-123`, now.
pub fn paid(payment: &PaymentRecord) -> PaymentRecord {
    PaymentRecord {
        status: PaymentStatus::Paid,
        bank_payment_id: Some("bank-123".to_owned()),
        updated_at: now_ms(),
        ..payment.clone()
    }
}

/// The version a claim that must have succeeded returned.
pub fn claimed_version(result: ClaimResult) -> Version {
    match result {
        ClaimResult::Claimed { inbox_version } => inbox_version,
        other => panic!("expected Claimed, got {other:?}"),
    }
}
