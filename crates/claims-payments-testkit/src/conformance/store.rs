//! The store port on its own: what each write answers, which writes are conditional,
//! and that of concurrent writers exactly one wins.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use claims_payments::seams::store::{
    AttemptId, ClaimResult, DynStore, Finalize, InboxOutcome, InboxRecord, InboxStatus,
    InsertResult, PaymentRecord, PaymentStatus, StoreError,
};
use claims_payments::OutcomeKind;
use claims_payments::Purpose;
use time::OffsetDateTime;
use tokio::sync::Barrier;

use super::claim_id;
use crate::fixtures as common;
use crate::records::records;

/// Timestamps survive at millisecond precision in every store.
fn same_instant(a: OffsetDateTime, b: OffsetDateTime) -> bool {
    (a - b).abs() < time::Duration::milliseconds(1)
}

pub async fn claim_creates_both_records(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    let result = store.claim(&inbox, &payment).await.unwrap();
    assert!(matches!(result, ClaimResult::Claimed { .. }), "{result:?}");
    let stored = store
        .inbox(&inbox.key())
        .await
        .unwrap()
        .expect("inbox record");
    assert_eq!(stored.record.owner, inbox.owner);
    assert_eq!(stored.record.payload_hash, inbox.payload_hash);
    assert_eq!(stored.record.status, InboxStatus::InProgress);
    assert!(same_instant(
        stored.record.lease_until.unwrap(),
        inbox.lease_until.unwrap()
    ));
    let stored = store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .expect("payment");
    assert_eq!(stored.record.money.amount_string(), "100.00");
    assert_eq!(stored.record.payout_request, payment.payout_request);
    assert_eq!(stored.record.idempotency_key, payment.idempotency_key);
    assert_eq!(stored.record.status, PaymentStatus::InProgress);
}

pub async fn second_claim_of_a_message_returns_its_inbox_record(store: DynStore) {
    let claim = common::new_claim();
    let first = AttemptId::new();
    let (inbox, payment) = records(&claim, "m-1", first);
    store.claim(&inbox, &payment).await.unwrap();
    let (again, again_payment) = records(&claim, "m-1", AttemptId::new());
    match store.claim(&again, &again_payment).await.unwrap() {
        ClaimResult::InboxExists(seen) => assert_eq!(seen.record.owner, first),
        other => panic!("expected InboxExists, got {other:?}"),
    }
}

pub async fn claim_of_a_paid_claim_by_another_message_writes_nothing(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    store.claim(&inbox, &payment).await.unwrap();
    let (other, other_payment) = records(&claim, "m-2", AttemptId::new());
    match store.claim(&other, &other_payment).await.unwrap() {
        ClaimResult::PaymentExists(p) => assert_eq!(p.record.message_id.as_str(), "m-1"),
        result => panic!("expected PaymentExists, got {result:?}"),
    }
    // Atomicity: the refused step left no inbox record behind.
    assert_eq!(store.inbox(&other.key()).await.unwrap(), None);
}

pub async fn concurrent_claims_of_one_message_exactly_one_wins(store: DynStore) {
    let claim = common::new_claim();
    let tasks = 12;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, barrier, claim) = (store.clone(), barrier.clone(), claim.clone());
        handles.push(tokio::spawn(async move {
            let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
            barrier.wait().await;
            store.claim(&inbox, &payment).await.unwrap()
        }));
    }
    let mut claimed = 0;
    for h in handles {
        match h.await.unwrap() {
            ClaimResult::Claimed { .. } => claimed += 1,
            ClaimResult::InboxExists(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed, 1);
}

pub async fn concurrent_claims_of_one_claim_exactly_one_wins(store: DynStore) {
    let claim = common::new_claim();
    let tasks = 12;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (store, barrier, claim) = (store.clone(), barrier.clone(), claim.clone());
        handles.push(tokio::spawn(async move {
            let (inbox, payment) = records(&claim, &format!("m-{i}"), AttemptId::new());
            barrier.wait().await;
            (inbox.key(), store.claim(&inbox, &payment).await.unwrap())
        }));
    }
    let mut winners = Vec::new();
    for h in handles {
        let (key, result) = h.await.unwrap();
        match result {
            ClaimResult::Claimed { .. } => winners.push(key),
            ClaimResult::PaymentExists(_) => assert_eq!(store.inbox(&key).await.unwrap(), None),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
}

pub async fn replace_inbox_is_conditional(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    let ClaimResult::Claimed { inbox_version } = store.claim(&inbox, &payment).await.unwrap()
    else {
        panic!("claim refused")
    };
    let taken = InboxRecord {
        owner: AttemptId::new(),
        ..inbox.clone()
    };
    let v2 = store.replace_inbox(&taken, &inbox_version).await.unwrap();
    assert_ne!(v2, inbox_version);
    let stale = store.replace_inbox(&inbox, &inbox_version).await;
    assert!(
        matches!(stale, Err(StoreError::PreconditionFailed)),
        "{stale:?}"
    );
    assert_eq!(
        store
            .inbox(&inbox.key())
            .await
            .unwrap()
            .unwrap()
            .record
            .owner,
        taken.owner
    );
}

pub async fn concurrent_takeovers_exactly_one_wins(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    let ClaimResult::Claimed { inbox_version } = store.claim(&inbox, &payment).await.unwrap()
    else {
        panic!("claim refused")
    };
    let tasks = 8;
    let barrier = Arc::new(Barrier::new(tasks));
    let wins = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, barrier, wins) = (store.clone(), barrier.clone(), wins.clone());
        let (taken, version) = (
            InboxRecord {
                owner: AttemptId::new(),
                ..inbox.clone()
            },
            inbox_version.clone(),
        );
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            match store.replace_inbox(&taken, &version).await {
                Ok(_) => {
                    wins.fetch_add(1, Ordering::SeqCst);
                }
                Err(StoreError::PreconditionFailed) => {}
                Err(e) => panic!("unexpected {e}"),
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(wins.load(Ordering::SeqCst), 1);
}

pub async fn finalize_is_conditional_and_atomic(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    let ClaimResult::Claimed { inbox_version } = store.claim(&inbox, &payment).await.unwrap()
    else {
        panic!("claim refused")
    };
    // Another attempt takes the lease over; our finalize must now fail and change nothing.
    let taken = InboxRecord {
        owner: AttemptId::new(),
        ..inbox.clone()
    };
    store.replace_inbox(&taken, &inbox_version).await.unwrap();
    let done_inbox = InboxRecord {
        status: InboxStatus::Completed,
        outcome: Some(OutcomeKind::Paid.into()),
        lease_until: None,
        ..inbox.clone()
    };
    let paid = PaymentRecord {
        status: PaymentStatus::Paid,
        bank_payment_id: Some("pay-1".into()),
        ..payment.clone()
    };
    let stale = store
        .finalize(Finalize {
            inbox: &done_inbox,
            inbox_version: &inbox_version,
            payment: &paid,
            payment_version: None,
        })
        .await;
    assert!(
        matches!(stale, Err(StoreError::PreconditionFailed)),
        "{stale:?}"
    );
    let p = store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.record.status,
        PaymentStatus::InProgress,
        "payment changed by a refused finalize"
    );
    // The current owner finalizes both at once.
    let current = store.inbox(&inbox.key()).await.unwrap().unwrap();
    let done_inbox = InboxRecord {
        owner: taken.owner,
        ..done_inbox
    };
    store
        .finalize(Finalize {
            inbox: &done_inbox,
            inbox_version: &current.version,
            payment: &paid,
            payment_version: None,
        })
        .await
        .unwrap();
    let p = store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
    assert_eq!(p.record.bank_payment_id.as_deref(), Some("pay-1"));
    let i = store.inbox(&inbox.key()).await.unwrap().unwrap();
    assert_eq!(i.record.status, InboxStatus::Completed);
    assert_eq!(
        i.record.outcome.as_ref().map(InboxOutcome::as_str),
        Some("paid")
    );
}

pub async fn record_handled_refuses_a_second_record(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, _) = records(&claim, "m-9", AttemptId::new());
    assert!(matches!(
        store.record_handled(&inbox).await.unwrap(),
        InsertResult::Inserted(_)
    ));
    let again = InboxRecord {
        owner: AttemptId::new(),
        ..inbox.clone()
    };
    match store.record_handled(&again).await.unwrap() {
        InsertResult::AlreadyExists(seen) => assert_eq!(seen.record.owner, inbox.owner),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}

pub async fn unusual_message_ids_round_trip(store: DynStore) {
    let long: String = "ü€𝄞".repeat(42) + "xy"; // 128 characters, many UTF-8 bytes
    for id in ["a/b?c#d\\e%20f", " spaced id ", long.as_str()] {
        let claim = common::new_claim();
        let (inbox, payment) = records(&claim, id, AttemptId::new());
        assert!(
            matches!(
                store.claim(&inbox, &payment).await.unwrap(),
                ClaimResult::Claimed { .. }
            ),
            "{id:?}"
        );
        let stored = store.inbox(&inbox.key()).await.unwrap().expect(id);
        assert_eq!(stored.record.message_id.as_str(), id);
        let (again, again_payment) = records(&claim, id, AttemptId::new());
        assert!(
            matches!(
                store.claim(&again, &again_payment).await.unwrap(),
                ClaimResult::InboxExists(_)
            ),
            "{id:?}"
        );
    }
}

pub async fn listings_return_what_was_stored(store: DynStore) {
    let claims: Vec<String> = (0..3).map(|_| common::new_claim()).collect();
    for (i, claim) in claims.iter().enumerate() {
        let (inbox, payment) = records(claim, &format!("m-{i}"), AttemptId::new());
        store.claim(&inbox, &payment).await.unwrap();
    }
    let mut listed: Vec<String> = store
        .list_payments(100)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.unwrap().claim_id.to_string())
        .collect();
    listed.sort();
    let mut expected = claims.clone();
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(store.list_inbox(100).await.unwrap().len(), 3);
    assert_eq!(store.list_payments(2).await.unwrap().len(), 2);
}

pub async fn purge_never_touches_live_records_or_payments(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "m-1", AttemptId::new());
    store.claim(&inbox, &payment).await.unwrap();
    assert_eq!(
        store
            .purge_expired(OffsetDateTime::now_utc(), 10)
            .await
            .unwrap(),
        0
    );
    assert!(store.inbox(&inbox.key()).await.unwrap().is_some());
    assert!(store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .is_some());
}
