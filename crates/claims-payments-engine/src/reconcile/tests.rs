//! Reconcile's pure rules: how a lookup is judged, and when a payment is old enough.

use rust_decimal::Decimal;

use std::time::Duration;

use time::OffsetDateTime;

use super::lookup::{judge, payable_request, CannotPayNow, Finding};
use super::orphans::not_orphaned;
use super::MAX_MIN_AGE;
use crate::bank::{BankPayment, BankStatus};
use crate::domain::{ClaimId, Currency, IdempotencyKey, MessageId, Money, PayloadHash, Purpose};
use crate::store::{InboxKey, PaymentRecord, PaymentStatus, Versioned};

fn ledger(amount: i64) -> PaymentRecord {
    let claim_id = ClaimId::random();
    let now = OffsetDateTime::now_utc();
    PaymentRecord {
        claim_id,
        purpose: Purpose::Payout,
        tenant_id: None,
        money: Money::new(Decimal::new(amount, 0), Currency::parse("EUR").unwrap()).unwrap(),
        payee: None,
        payload_hash: PayloadHash::from_stored("h".into()),
        message_id: MessageId::parse("m-1").unwrap(),
        idempotency_key: IdempotencyKey::for_payout(None, claim_id),
        payout_request: None,
        status: PaymentStatus::NeedsReconciliation,
        bank_payment_id: None,
        status_reason: None,
        created_at: now,
        updated_at: now,
    }
}

fn held(id: &str, status: BankStatus, amount: i64) -> BankPayment {
    BankPayment {
        payment_id: id.into(),
        status,
        amount: Decimal::new(amount, 0),
        currency: "EUR".into(),
    }
}

#[test]
fn one_matching_paid_entry_is_paid_and_nothing_is_none_held() {
    let p = ledger(75);
    assert!(matches!(
        judge(&p, &[held("b1", BankStatus::Paid, 75), held("r1", BankStatus::Rejected, 75)]),
        Finding::Paid { payment_id, .. } if payment_id == "b1"
    ));
    assert!(matches!(judge(&p, &[]), Finding::NoneHeld));
    assert!(matches!(
        judge(&p, &[held("r1", BankStatus::Rejected, 75)]),
        Finding::Rejected { .. }
    ));
}

#[test]
fn several_paid_entries_are_a_double_payment_for_a_person() {
    let p = ledger(75);
    let found = judge(
        &p,
        &[
            held("b1", BankStatus::Paid, 75),
            held("b2", BankStatus::Paid, 75),
        ],
    );
    match found {
        Finding::Mismatch {
            evidence,
            double_payment: true,
        } => assert!(
            evidence.contains("b1") && evidence.contains("b2"),
            "{evidence}"
        ),
        _ => panic!("two payouts under one reference must need a person"),
    }
    assert!(matches!(
        judge(&p, &[held("b1", BankStatus::Paid, 57)]),
        Finding::Mismatch {
            double_payment: false,
            ..
        }
    ));
}

#[test]
fn pending_anywhere_is_still_unknown() {
    let p = ledger(75);
    for entries in [
        vec![
            held("r1", BankStatus::Rejected, 75),
            held("q1", BankStatus::Pending, 75),
        ],
        vec![
            held("q1", BankStatus::Pending, 75),
            held("r1", BankStatus::Rejected, 75),
        ],
        vec![
            held("b1", BankStatus::Paid, 75),
            held("q1", BankStatus::Pending, 75),
        ],
    ] {
        assert!(
            matches!(judge(&p, &entries), Finding::Unknown { .. }),
            "{entries:?}"
        );
    }
}

#[test]
fn an_age_past_the_calendar_is_never_reached_and_never_panics() {
    let p = ledger(1);
    let now = OffsetDateTime::now_utc();
    for age in [MAX_MIN_AGE, Duration::from_secs(u64::MAX), Duration::MAX] {
        assert!(not_orphaned(&p, None, false, now, age).is_some(), "{age:?}");
    }
    assert!(not_orphaned(
        &p,
        None,
        false,
        now + Duration::from_secs(1),
        Duration::ZERO
    )
    .is_none());
}

/// The bank's "nothing under this reference" rules out an earlier payout only if that
/// payout carried the reference: a request stored before references existed is left to
/// a person, never sent again.
#[test]
fn only_a_stored_request_with_the_reference_is_sent_again() {
    let mut p = ledger(75);
    assert_eq!(payable_request(&p), Err(CannotPayNow::NoStoredRequest));
    p.payout_request = Some(r#"{"amount":"75","currency":"EUR"}"#.into());
    assert_eq!(payable_request(&p), Err(CannotPayNow::PredatesReferences));
    p.payout_request = Some(r#"{"reference":"someone-else","amount":"75"}"#.into());
    assert_eq!(payable_request(&p), Err(CannotPayNow::PredatesReferences));
    let body = format!(
        r#"{{"reference":"{}","amount":"75","currency":"EUR"}}"#,
        p.idempotency_key.as_str()
    );
    p.payout_request = Some(body.clone());
    assert_eq!(payable_request(&p), Ok(body.as_str()));
}

#[test]
fn a_live_lease_of_a_process_that_ended_does_not_hold_a_payout_back() {
    use crate::lease::{new_record, Terms};
    use crate::store::{AttemptId, Version};
    let p = ledger(1);
    let now = OffsetDateTime::now_utc();
    let key = InboxKey {
        consumer: "payments".into(),
        claim_id: p.claim_id,
        message_id: p.message_id.clone(),
    };
    let terms = Terms {
        lease: Duration::from_secs(120),
        retention: Duration::from_secs(3600),
    };
    let written = now - time::Duration::seconds(10);
    let record = new_record(
        &key,
        &p.payload_hash,
        AttemptId::new(),
        1,
        terms,
        written,
        None,
    );
    let seen = Versioned {
        record,
        version: Version("1".into()),
    };
    assert!(not_orphaned(&p, Some(&seen), false, now, Duration::ZERO).is_some());
    assert!(not_orphaned(&p, Some(&seen), true, now, Duration::ZERO).is_none());
    // The minimum age counts from the dead attempt's last write.
    let age = Duration::from_secs(60);
    assert!(not_orphaned(&p, Some(&seen), true, now, age).is_some());
    assert!(not_orphaned(&p, Some(&seen), true, now + age, age).is_none());
}
