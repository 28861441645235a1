//! The store port's contract with whole-record assertions: what a store returns is
//! exactly what was written (timestamps at the millisecond, which every store keeps),
//! with the versions the writes returned. These ran only against Cosmos before; here they
//! run against every store.

use claims_payments::seams::store::{
    AttemptId, ClaimResult, DynStore, Finalize, InboxRecord, InsertResult, PaymentRecord,
    StoreError,
};
use claims_payments::Purpose;
use time::OffsetDateTime;

use super::claim_id;
use crate::fixtures as common;
use crate::records::{claimed_version, completed, now_ms, paid, records_for};

/// [`records`](crate::records::records) stamped `at` (millisecond precision), so whole
/// records compare.
fn exact_records(
    claim: &str,
    message_id: &str,
    at: OffsetDateTime,
) -> (InboxRecord, PaymentRecord) {
    records_for(
        &common::message(claim, "100.00"),
        message_id,
        AttemptId::new(),
        at,
    )
}

pub async fn a_claim_and_its_finalize_read_back_whole(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, payment) = exact_records(&claim, "m-whole", now_ms());
    let version = claimed_version(store.claim(&inbox, &payment).await.unwrap());

    let read = store
        .inbox(&inbox.key())
        .await
        .unwrap()
        .expect("inbox record");
    assert_eq!(read.record, inbox);
    assert_eq!(
        read.version, version,
        "the claim returns the inbox record's version"
    );
    let read = store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .expect("payment record");
    assert_eq!(read.record, payment);

    let (final_inbox, final_payment) = (completed(&inbox), paid(&payment));
    store
        .finalize(Finalize {
            inbox: &final_inbox,
            inbox_version: &version,
            payment: &final_payment,
            payment_version: None,
        })
        .await
        .unwrap();
    assert_eq!(
        store.inbox(&inbox.key()).await.unwrap().unwrap().record,
        final_inbox
    );
    assert_eq!(
        store
            .payment(claim_id(&claim), Purpose::Payout)
            .await
            .unwrap()
            .unwrap()
            .record,
        final_payment
    );
    // The claim's version is spent: the same finalize again is refused.
    let again = store
        .finalize(Finalize {
            inbox: &final_inbox,
            inbox_version: &version,
            payment: &final_payment,
            payment_version: None,
        })
        .await;
    assert!(
        matches!(again, Err(StoreError::PreconditionFailed)),
        "{again:?}"
    );
}

pub async fn a_duplicate_claim_returns_the_stored_record_and_writes_nothing(store: DynStore) {
    let claim = common::new_claim();
    let (first, payment) = exact_records(&claim, "m-dup", now_ms());
    let version = claimed_version(store.claim(&first, &payment).await.unwrap());
    let redelivery = InboxRecord {
        owner: AttemptId::new(),
        last_delivery_count: 2,
        ..first.clone()
    };
    match store.claim(&redelivery, &payment).await.unwrap() {
        ClaimResult::InboxExists(existing) => {
            assert_eq!(
                existing.record, first,
                "the stored record, not the redelivery's"
            );
            assert_eq!(existing.version, version, "nothing was written");
        }
        other => panic!("expected InboxExists, got {other:?}"),
    }
}

pub async fn a_business_duplicate_returns_the_stored_payment_then_records_the_message(
    store: DynStore,
) {
    let claim = common::new_claim();
    let (inbox, payment) = exact_records(&claim, "m-first", now_ms());
    claimed_version(store.claim(&inbox, &payment).await.unwrap());

    let (second, second_payment) = exact_records(&claim, "m-second", now_ms());
    match store.claim(&second, &second_payment).await.unwrap() {
        ClaimResult::PaymentExists(existing) => assert_eq!(existing.record, payment),
        other => panic!("expected PaymentExists, got {other:?}"),
    }
    assert_eq!(store.inbox(&second.key()).await.unwrap(), None);

    // The consumer then records the second message as handled, once.
    let handled = completed(&second);
    assert!(matches!(
        store.record_handled(&handled).await.unwrap(),
        InsertResult::Inserted(_)
    ));
    match store.record_handled(&handled).await.unwrap() {
        InsertResult::AlreadyExists(existing) => assert_eq!(existing.record, handled),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}

pub async fn listings_are_oldest_first_bounded_and_whole(store: DynStore) {
    let base = now_ms() - time::Duration::hours(1);
    let mut expected = Vec::new();
    // Written newest first, across several claims (partitions, on Cosmos).
    for age in [3, 1, 2] {
        let at = base + time::Duration::seconds(age);
        let (inbox, payment) = exact_records(&common::new_claim(), &format!("m-list-{age}"), at);
        claimed_version(store.claim(&inbox, &payment).await.unwrap());
        expected.push((at, inbox, payment));
    }
    expected.sort_by_key(|(at, _, _)| *at);
    let payments = store.list_payments(2).await.unwrap();
    assert_eq!(
        payments,
        vec![Ok(expected[0].2.clone()), Ok(expected[1].2.clone())]
    );
    let inbox = store.list_inbox(10).await.unwrap();
    assert_eq!(
        inbox,
        expected
            .iter()
            .map(|(_, i, _)| Ok(i.clone()))
            .collect::<Vec<_>>()
    );
    assert!(store.list_payments(0).await.unwrap().is_empty());
    // No limit at all (an operator's `--limit` of any size) is every record, not an error.
    let every: Vec<_> = expected.iter().map(|(_, _, p)| Ok(p.clone())).collect();
    assert_eq!(store.list_payments(usize::MAX).await.unwrap(), every);
    assert_eq!(store.list_inbox(usize::MAX).await.unwrap(), inbox);
}

pub async fn replace_inbox_needs_the_current_version_of_an_existing_record(store: DynStore) {
    let claim = common::new_claim();
    let (inbox, _) = exact_records(&claim, "m-handled", now_ms());
    let version = match store.record_handled(&inbox).await.unwrap() {
        InsertResult::Inserted(version) => version,
        other => panic!("expected Inserted, got {other:?}"),
    };
    let released = InboxRecord {
        lease_until: None,
        updated_at: now_ms(),
        ..inbox.clone()
    };
    let new_version = store.replace_inbox(&released, &version).await.unwrap();
    assert_ne!(new_version, version);
    assert_eq!(
        store.inbox(&inbox.key()).await.unwrap().unwrap().record,
        released
    );
    let stale = store.replace_inbox(&inbox, &version).await;
    assert!(
        matches!(stale, Err(StoreError::PreconditionFailed)),
        "{stale:?}"
    );
    let (missing, _) = exact_records(&claim, "m-never-stored", now_ms());
    let outcome = store.replace_inbox(&missing, &version).await;
    assert!(
        matches!(outcome, Err(StoreError::PreconditionFailed)),
        "{outcome:?}"
    );
}
