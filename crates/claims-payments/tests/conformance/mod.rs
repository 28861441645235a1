//! The store conformance suite: the same scenarios, with the same expected answers,
//! for every store adapter. Store-level scenarios pin the port's contract; consumer-
//! level scenarios run the real state machine on top of it with a fake bank.
//!
//! A test file instantiates it with `store_conformance!(make_store);` where
//! `async fn make_store() -> (DynStore, Keep)` builds a fresh, empty store, or with
//! `store_conformance!(make_store, if ready);` where `fn ready() -> bool` says whether the
//! store can run here at all (a test returns at once when it is false: the store's own
//! gate prints why, and fails instead under CI).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use claims_payments::consumer::Outcome;

use claims_payments::message::OutcomeKind;
use claims_payments::message::{ClaimId, MessageId, Purpose};
use claims_payments::seams::Step;
use claims_payments::store::{
    AttemptId, ClaimResult, DynStore, InboxKey, InboxOutcome, InboxRecord, InboxStatus,
    InsertResult, PaymentRecord, PaymentStatus, StoreError,
};
use time::OffsetDateTime;
use tokio::sync::Barrier;

use claims_payments_testkit::bank::{BankFault, FakeBank};
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::wait::wait_until;

mod contract;
pub use contract::*;

/// Whatever must stay alive as long as the store (a temp dir, an emulator).
pub type Keep = Box<dyn std::any::Any + Send>;

#[macro_export]
macro_rules! store_conformance {
    ($make:path) => {
        $crate::store_conformance!($make, if (|| true));
    };
    ($make:path, if $ready:expr) => {
        $crate::store_conformance!(@tests $make, $ready;
            claim_creates_both_records,
            second_claim_of_a_message_returns_its_inbox_record,
            claim_of_a_paid_claim_by_another_message_writes_nothing,
            concurrent_claims_of_one_message_exactly_one_wins,
            concurrent_claims_of_one_claim_exactly_one_wins,
            replace_inbox_is_conditional,
            concurrent_takeovers_exactly_one_wins,
            finalize_is_conditional_and_atomic,
            record_handled_refuses_a_second_record,
            unusual_message_ids_round_trip,
            listings_return_what_was_stored,
            purge_never_touches_live_records_or_payments,
            five_deliveries_make_one_payment,
            crash_after_commit_then_redelivery_is_a_duplicate,
            concurrent_deliveries_pay_exactly_once,
            same_message_id_with_another_payload_is_a_conflict,
            same_claim_under_a_new_message_is_a_business_duplicate,
            same_claim_with_another_amount_is_a_conflict,
            crash_after_claim_then_takeover_pays_once,
            crash_after_bank_call_then_takeover_pays_once,
            lost_bank_answer_is_retried_under_the_same_key,
            transient_bank_failures_are_retried,
            bank_rejection_is_recorded_and_final,
            bank_outage_releases_the_lease_for_the_next_delivery,
            live_lease_makes_a_duplicate_wait_for_the_result,
            takeover_while_the_first_worker_is_alive_pays_once,
            business_duplicate_finishes_an_orphaned_payout,
            a_later_delivery_takes_over_a_dead_attempt_at_once,
            a_bank_fault_of_our_own_never_rejects_the_payment,
            no_payout_request_leaves_after_the_key_window,
            reconcile_marks_paid_what_the_bank_holds,
            reconcile_pays_now_only_when_the_bank_holds_none,
            reconcile_never_pays_a_mismatch,
            reconcile_records_a_refusal_as_rejected,
            reconcile_leaves_a_payment_unknown_when_the_lookup_fails,
            reconcile_settles_an_orphaned_payout_and_leaves_live_ones_alone,
            reconcile_racing_a_live_redelivery_pays_once,
            two_reconcile_runs_racing_settle_once,
            a_mismatch_is_never_paid_later_nor_examined_again,
            lookup_references_differing_in_case_are_ours_and_missing_ones_are_unusable,
            a_double_payment_at_the_bank_needs_a_person,
            a_pending_entry_beside_a_refusal_stays_unknown,
            a_stalled_run_never_overwrites_what_another_run_settled,
            mismatches_do_not_starve_newer_payments,
            a_failed_lookup_leaves_an_orphaned_payout_visible_to_the_next_run,
            a_claim_and_its_finalize_read_back_whole,
            a_duplicate_claim_returns_the_stored_record_and_writes_nothing,
            a_business_duplicate_returns_the_stored_payment_then_records_the_message,
            listings_are_oldest_first_bounded_and_whole,
            replace_inbox_needs_the_current_version_of_an_existing_record,
            api_first_request_replay_and_mismatch,
            api_request_cut_mid_payout_resumes_under_the_same_key,
        );
    };
    (@tests $make:path, $ready:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if !($ready)() {
                    return;
                }
                let (store, _keep) = $make().await;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}

fn claim_id(s: &str) -> ClaimId {
    ClaimId::parse(s).unwrap()
}

pub use claims_payments_testkit::records::records;

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
        .finalize(&done_inbox, &inbox_version, &paid, None)
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
        .finalize(&done_inbox, &current.version, &paid, None)
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
        .iter()
        .map(|p| p.claim_id.to_string())
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

// ---- the consumer on top of the store ----

pub async fn five_deliveries_make_one_payment(store: DynStore) {
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "250.10");
    let mut labels = Vec::new();
    for n in 1..=5 {
        labels.push(common::deliver(&consumer, &msg, "evt-1", n).await);
    }
    assert_eq!(
        labels,
        ["paid", "duplicate", "duplicate", "duplicate", "duplicate"]
    );
    assert_eq!(bank.effective_payouts(), 1);
    assert_eq!(
        bank.requests().len(),
        1,
        "duplicates must not call the bank"
    );
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
    assert_eq!(p.record.money.amount_string(), "250.10");
}

pub async fn crash_after_commit_then_redelivery_is_a_duplicate(store: DynStore) {
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank)
        .with_crash_hook(common::crash_once_at(Step::AfterFinalize));
    let msg = common::message(&common::new_claim(), "10.00");
    let first = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    assert_eq!(first.label(), "retry-later", "the host never got an answer");
    let second = consumer.handle(&msg, &common::delivery("evt-1", 2)).await;
    assert_eq!(second.label(), "duplicate");
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn concurrent_deliveries_pay_exactly_once(store: DynStore) {
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "99.99");
    let tasks = 10;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for n in 0..tasks {
        let (consumer, msg, barrier) = (consumer.clone(), msg.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            consumer
                .handle(&msg, &common::delivery("evt-1", n as u32 + 1))
                .await
        }));
    }
    let mut paid = 0;
    for h in handles {
        match h.await.unwrap() {
            Outcome::Paid { .. } => paid += 1,
            Outcome::Duplicate { .. } | Outcome::RetryLater { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(paid, 1);
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn same_message_id_with_another_payload_is_a_conflict(store: DynStore) {
    let consumer = common::ledger_consumer(store.clone());
    let claim = common::new_claim();
    assert_eq!(
        common::deliver(&consumer, &common::message(&claim, "10.00"), "evt-1", 1).await,
        "recorded"
    );
    let outcome = consumer
        .handle(
            &common::message(&claim, "10.01"),
            &common::delivery("evt-1", 2),
        )
        .await;
    assert_eq!(outcome.label(), "conflict", "{outcome:?}");
    let p = store
        .payment(claim_id(&claim), Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.money.amount_string(), "10.00");
}

pub async fn same_claim_under_a_new_message_is_a_business_duplicate(store: DynStore) {
    let consumer = common::ledger_consumer(store.clone());
    let claim = common::new_claim();
    let msg = common::message(&claim, "10.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "recorded"
    );
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-2", 1).await,
        "business-duplicate"
    );
    // The new message is now recorded as handled, so its own redelivery is a plain duplicate.
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-2", 2).await,
        "duplicate"
    );
    assert_eq!(store.list_payments(10).await.unwrap().len(), 1);
}

pub async fn same_claim_with_another_amount_is_a_conflict(store: DynStore) {
    let consumer = common::ledger_consumer(store.clone());
    let claim = common::new_claim();
    consumer
        .handle(
            &common::message(&claim, "10.00"),
            &common::delivery("evt-1", 1),
        )
        .await;
    let outcome = consumer
        .handle(
            &common::message(&claim, "20.00"),
            &common::delivery("evt-2", 1),
        )
        .await;
    assert_eq!(outcome.label(), "conflict", "{outcome:?}");
}

async fn crash_once_at(store: DynStore, step: Step) -> (FakeBank, Vec<&'static str>) {
    let bank = FakeBank::start().await;
    let consumer =
        common::bank_consumer(store.clone(), &bank).with_crash_hook(common::crash_once_at(step));
    let msg = common::message(&common::new_claim(), "42.00");
    let mut labels = Vec::new();
    for n in 1..=3 {
        labels.push(common::deliver(&consumer, &msg, "evt-1", n).await);
    }
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
    (bank, labels)
}

pub async fn crash_after_claim_then_takeover_pays_once(store: DynStore) {
    // The redelivery (a higher DeliveryCount) takes the dead attempt's lease over.
    let (bank, labels) = crash_once_at(store, Step::AfterClaim).await;
    assert_eq!(labels, ["retry-later", "paid", "duplicate"]);
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn crash_after_bank_call_then_takeover_pays_once(store: DynStore) {
    let (bank, labels) = crash_once_at(store, Step::AfterBankCall).await;
    assert_eq!(labels, ["retry-later", "paid", "duplicate"]);
    assert_eq!(bank.effective_payouts(), 1);
    let requests = bank.requests();
    assert_eq!(requests.len(), 2, "the takeover asks the bank again");
    assert_eq!(requests[0], requests[1], "same key, same bytes");
}

pub async fn lost_bank_answer_is_retried_under_the_same_key(store: DynStore) {
    let bank = FakeBank::start().await;
    bank.script([BankFault::LoseAnswer]);
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "13.37");
    let outcome = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    assert_eq!(outcome.label(), "paid", "{outcome:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let requests = bank.requests();
    assert!(requests.len() >= 2);
    assert!(requests.iter().all(|r| r == &requests[0]));
}

pub async fn transient_bank_failures_are_retried(store: DynStore) {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Unavailable, BankFault::Throttled]);
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "1.00");
    assert_eq!(common::deliver(&consumer, &msg, "evt-1", 1).await, "paid");
    assert_eq!(bank.requests().len(), 3);
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn bank_rejection_is_recorded_and_final(store: DynStore) {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Reject]);
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "1.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "rejected"
    );
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 2).await,
        "duplicate"
    );
    assert_eq!(bank.requests().len(), 1);
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Rejected);
    assert!(p.record.status_reason.unwrap().contains("400"));
}

pub async fn bank_outage_releases_the_lease_for_the_next_delivery(store: DynStore) {
    let bank = FakeBank::start().await;
    bank.always(Some(BankFault::Unavailable));
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "5.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "retry-later"
    );
    let inbox = store
        .inbox(&InboxKey {
            consumer: "ClaimApprovedHandler".into(),
            claim_id: msg.claim_id,
            message_id: MessageId::parse("evt-1").unwrap(),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(
        !inbox.record.lease_alive(OffsetDateTime::now_utc()),
        "lease was not released"
    );
    bank.always(None);
    assert_eq!(common::deliver(&consumer, &msg, "evt-1", 2).await, "paid");
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn live_lease_makes_a_duplicate_wait_for_the_result(store: DynStore) {
    let bank = FakeBank::start().await;
    // Slow, but inside the client's timeout: the first attempt holds the lease meanwhile.
    bank.script([BankFault::Slow(Duration::from_millis(40))]);
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "7.00");
    let first = {
        let (consumer, msg) = (consumer.clone(), msg.clone());
        tokio::spawn(async move { consumer.handle(&msg, &common::delivery("evt-1", 1)).await })
    };
    // The first attempt holds the lease once its payout request is at the bank.
    wait_until(Duration::from_secs(10), "the first payout request", || {
        !bank.requests().is_empty()
    })
    .await;
    // A producer's re-send of the same MessageId: its own first delivery, so not
    // later than the holder's (see the takeover by DeliveryCount below).
    let second = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    let first = first.await.unwrap();
    let mut labels = [first.label(), second.label()];
    labels.sort();
    assert_eq!(labels, ["duplicate", "paid"]);
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn takeover_while_the_first_worker_is_alive_pays_once(store: DynStore) {
    // The first worker stalls at the bank past its lease (a GC pause, a slow network):
    // a second delivery takes over and pays under the same key; the first worker's
    // finalize is refused and it defers to the new owner.
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_millis(400))]);
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_millis(100),
        retry_budget: Duration::from_secs(3),
        ..common::policy()
    };
    let consumer = common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_secs(2));
    let msg = common::message(&common::new_claim(), "64.00");
    let first = {
        let (consumer, msg) = (consumer.clone(), msg.clone());
        tokio::spawn(async move { consumer.handle(&msg, &common::delivery("evt-1", 1)).await })
    };
    wait_until(Duration::from_secs(10), "the first payout request", || {
        !bank.requests().is_empty()
    })
    .await;
    // The scenario: the first worker's lease (100 ms) expires while it stalls.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = consumer.handle(&msg, &common::delivery("evt-1", 2)).await;
    let first = first.await.unwrap();
    assert_eq!(second.label(), "paid", "{second:?}");
    assert_eq!(first.label(), "duplicate", "{first:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let requests = bank.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0], requests[1], "same key, same bytes");
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
}

pub async fn business_duplicate_finishes_an_orphaned_payout(store: DynStore) {
    // evt-1 dies after its claim; before Service Bus brings it back, evt-2 for the same
    // claim arrives. It must not wait on a message that may be dead-lettered: it takes
    // the expired lease over and pays under the same key.
    let bank = FakeBank::start().await;
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_millis(100),
        ..common::policy()
    };
    let consumer =
        common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_millis(200));
    let msg = common::message(&common::new_claim(), "81.00");
    let dying = consumer
        .clone()
        .with_crash_hook(Arc::new(|s| s == Step::AfterClaim));
    assert_eq!(
        common::deliver(&dying, &msg, "evt-1", 1).await,
        "retry-later"
    );
    // The scenario: the dead worker's lease (100 ms) expires.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-2", 1).await,
        "business-duplicate"
    );
    assert_eq!(bank.effective_payouts(), 1);
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 2).await,
        "duplicate"
    );
    assert_eq!(bank.requests().len(), 1);
}

pub async fn a_later_delivery_takes_over_a_dead_attempt_at_once(store: DynStore) {
    // The deployed timings (infra/main.bicepparam): a 120 s lease and a 15 s in-flight
    // wait. The handler dies mid-payout, leaving a live lease; the host redelivers at
    // once with DeliveryCount + 1. Waiting on the dead lease would answer 503 to every
    // delivery until the message is dead-lettered; a later delivery takes over instead.
    let bank = FakeBank::start().await;
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_secs(120),
        inflight_wait: Duration::from_secs(15),
        retry_budget: Duration::from_secs(60),
        ..common::policy()
    };
    let consumer = common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_secs(5));
    let msg = common::message(&common::new_claim(), "120.00");
    let dying = consumer
        .clone()
        .with_crash_hook(common::crash_once_at(Step::AfterBankCall));
    assert_eq!(
        common::deliver(&dying, &msg, "evt-1", 1).await,
        "retry-later"
    );
    assert_eq!(common::deliver(&consumer, &msg, "evt-1", 2).await, "paid");
    assert_eq!(bank.effective_payouts(), 1);
    let requests = bank.requests();
    assert_eq!(requests.len(), 2, "the takeover asks the bank again");
    assert_eq!(requests[0], requests[1], "same key, same bytes");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 3).await,
        "duplicate"
    );
}

pub async fn a_bank_fault_of_our_own_never_rejects_the_payment(store: DynStore) {
    // An expired credential (401), a wrong URL (404), a proxy redirect: the service's
    // fault, not a verdict on the payment. The message stays on the queue.
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "9.00");
    for (count, status) in [(1, 401), (2, 403), (3, 404), (4, 405), (5, 302)] {
        bank.script([BankFault::Status(status)]);
        assert_eq!(
            common::deliver(&consumer, &msg, "evt-1", count).await,
            "retry-later",
            "{status}"
        );
        let p = store
            .payment(msg.claim_id, Purpose::Payout)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(p.record.status, PaymentStatus::InProgress, "{status}");
    }
    assert_eq!(
        bank.requests().len(),
        5,
        "a fault of our own is not retried in place"
    );
    // Once the credential is fixed, the next delivery pays at once (the lease was released).
    assert_eq!(common::deliver(&consumer, &msg, "evt-1", 6).await, "paid");
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn no_payout_request_leaves_after_the_key_window(store: DynStore) {
    // The bank is down while the key window runs out (here a 3 s window; 24 h deployed).
    // Retries stop before the window ends, and the payment needs reconciliation: a
    // request after the window could pay a second time.
    let bank = FakeBank::start().await;
    bank.always(Some(BankFault::Unavailable));
    let window = Duration::from_secs(3);
    let policy = claims_payments::consumer::Policy {
        retry_budget: Duration::from_secs(20),
        lease: Duration::from_secs(30),
        bank_key_window: window,
        ..common::policy()
    };
    let consumer = common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_secs(1));
    let msg = common::message(&common::new_claim(), "3.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "needs-reconciliation"
    );
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::NeedsReconciliation);
    let window_end = p.record.created_at + window;
    let arrivals = bank.arrivals();
    assert!(
        arrivals.len() >= 2,
        "the bank was retried inside the window"
    );
    assert!(
        arrivals.iter().all(|t| *t < window_end),
        "a request left after the key window ended at {window_end}: {arrivals:?}"
    );
    // A redelivery does not ask the bank again either.
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 2).await,
        "duplicate"
    );
    assert_eq!(bank.arrivals().len(), arrivals.len());
}

// ---- reconcile -------------------------------------------------------------------

fn reconcile_options(min_age: Duration) -> claims_payments::reconcile::Options {
    claims_payments::reconcile::Options {
        min_age,
        dry_run: false,
        budget: None,
    }
}

/// A payment left in `needs_reconciliation` by a real delivery: the bank stayed down
/// until the (short) key window closed. Returns the consumer, the message and its key.
async fn needs_reconciliation(
    store: &DynStore,
    bank: &FakeBank,
) -> (
    claims_payments::consumer::Consumer,
    claims_payments::message::ClaimApproved,
    String,
) {
    bank.always(Some(BankFault::Unavailable));
    let policy = claims_payments::consumer::Policy {
        retry_budget: Duration::from_secs(5),
        lease: Duration::from_secs(10),
        bank_key_window: Duration::from_millis(600),
        ..common::policy()
    };
    let consumer =
        common::bank_consumer_with(store.clone(), bank, policy, Duration::from_millis(200));
    let msg = common::message(&common::new_claim(), "75.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "needs-reconciliation"
    );
    bank.always(None);
    let key = msg.idempotency_key().as_str().to_owned();
    (consumer, msg, key)
}

async fn payment_of(store: &DynStore, claim: ClaimId) -> PaymentRecord {
    store
        .payment(claim, Purpose::Payout)
        .await
        .unwrap()
        .unwrap()
        .record
}

fn reconciler(
    consumer: &claims_payments::consumer::Consumer,
) -> claims_payments::reconcile::Reconciler {
    claims_payments::reconcile::Reconciler::new(consumer.clone()).expect("a bank is configured")
}

pub async fn reconcile_marks_paid_what_the_bank_holds(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-77", "paid", "75.00", "EUR");
    let sent_before = bank.requests().len();
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (summary.examined, summary.paid_by_lookup),
        (1, 1),
        "{summary:?}"
    );
    assert_eq!(summary.needs_reconciliation_before, 1);
    assert!(summary.all_settled());
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.status, PaymentStatus::Paid);
    assert_eq!(p.bank_payment_id.as_deref(), Some("bank-77"));
    assert!(p.status_reason.unwrap().contains("paid by lookup"));
    assert_eq!(bank.requests().len(), sent_before, "nothing was paid again");
    // A redelivery now meets a completed message.
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 2).await,
        "duplicate"
    );
}

pub async fn reconcile_pays_now_only_when_the_bank_holds_none(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    assert_eq!(bank.effective_payouts(), 0);
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.paid_now, 1, "{summary:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let (body, _) = bank.payout_for(&key).expect("paid under the same key");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["reference"], key.as_str());
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
    // A second run finds nothing to do, and never pays again.
    let again = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(again.examined, 0, "{again:?}");
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn reconcile_never_pays_a_mismatch(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-9", "paid", "57.00", "EUR");
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.mismatches, 1, "{summary:?}");
    assert!(!summary.all_settled());
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.status, PaymentStatus::Mismatched);
    let reason = p.status_reason.unwrap();
    assert!(
        reason.contains("bank-9") && reason.contains("57.00"),
        "{reason}"
    );
    assert_eq!(bank.effective_payouts(), 0, "a mismatch is never paid");
}

pub async fn reconcile_records_a_refusal_as_rejected(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-r", "rejected", "75.00", "EUR");
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.rejected, 1, "{summary:?}");
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Rejected
    );
    assert_eq!(bank.effective_payouts(), 0);
}

pub async fn reconcile_leaves_a_payment_unknown_when_the_lookup_fails(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, _key) = needs_reconciliation(&store, &bank).await;
    bank.fail_lookups(1);
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.still_unknown, 1, "{summary:?}");
    assert!(!summary.all_settled());
    assert_eq!(
        bank.effective_payouts(),
        0,
        "an unknown answer is never 'not paid'"
    );
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::NeedsReconciliation
    );
    // The lease was given back: the next run settles it.
    let next = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(next.paid_now, 1, "{next:?}");
}

pub async fn reconcile_settles_an_orphaned_payout_and_leaves_live_ones_alone(store: DynStore) {
    // Its handler died mid-payout and the message was dead-lettered, never re-driven.
    let bank = FakeBank::start().await;
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_millis(200),
        ..common::policy()
    };
    let consumer =
        common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_millis(500));
    let msg = common::message(&common::new_claim(), "31.00");
    let dying = consumer
        .clone()
        .with_crash_hook(common::crash_once_at(Step::AfterBankCall));
    assert_eq!(
        common::deliver(&dying, &msg, "evt-1", 10).await,
        "retry-later"
    );
    assert_eq!(
        bank.effective_payouts(),
        1,
        "the bank paid before the crash"
    );

    // Not old enough yet: left alone.
    let early = reconciler(&consumer)
        .run(reconcile_options(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(
        (early.examined, early.orphaned_in_progress_before),
        (0, 0),
        "{early:?}"
    );
    // ...but reported as open: exit 0 never means "all settled" when it is not.
    assert_eq!(early.waiting, 1, "{early:?}");
    assert!(!early.all_settled());

    // The scenario: the lease (200 ms, on the store's wall clock) expires.
    let lease_gone = OffsetDateTime::now_utc() + Duration::from_millis(250);
    while OffsetDateTime::now_utc() < lease_gone {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.orphaned_in_progress_before, 1, "{summary:?}");
    assert_eq!(summary.paid_by_lookup, 1, "the bank held it: {summary:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.status, PaymentStatus::Paid);
}

pub async fn reconcile_racing_a_live_redelivery_pays_once(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, _key) = needs_reconciliation(&store, &bank).await;
    // Both go to the bank at about the same time, under the same key.
    bank.script([BankFault::Slow(Duration::from_millis(300))]);
    let run = {
        let consumer = consumer.clone();
        tokio::spawn(async move {
            reconciler(&consumer)
                .run(reconcile_options(Duration::ZERO))
                .await
        })
    };
    let redelivery = common::deliver(&consumer, &msg, "evt-1", 2).await;
    let summary = run.await.unwrap().unwrap();
    assert!(
        ["duplicate", "needs-reconciliation", "retry-later"].contains(&redelivery),
        "{redelivery}"
    );
    assert!(bank.effective_payouts() <= 1);
    // Whoever lost, one more run leaves it paid, once.
    reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(bank.effective_payouts(), 1, "{summary:?}");
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
}

pub async fn two_reconcile_runs_racing_settle_once(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, _key) = needs_reconciliation(&store, &bank).await;
    bank.script([BankFault::Slow(Duration::from_millis(200))]);
    let (first, second) = (reconciler(&consumer), reconciler(&consumer));
    let (a, b) = tokio::join!(
        first.run(reconcile_options(Duration::ZERO)),
        second.run(reconcile_options(Duration::ZERO)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.paid_now + b.paid_now, 1, "{a:?} {b:?}");
    assert_eq!(
        a.skipped + b.skipped,
        1,
        "the loser left it alone: {a:?} {b:?}"
    );
    assert_eq!(bank.effective_payouts(), 1);
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
}

/// Item 1 of the failure review: once the bank showed another amount, the payment is
/// `mismatched` for good; a later "nothing held" must not pay it.
pub async fn a_mismatch_is_never_paid_later_nor_examined_again(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-9", "paid", "57.00", "EUR");
    let first = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (first.mismatches, first.needs_a_person),
        (1, 1),
        "{first:?}"
    );
    let evidence = payment_of(&store, msg.claim_id).await.status_reason;
    // The bank's listing now says nothing at all under the reference.
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        consumer.policy().clone(),
        Duration::from_millis(200),
    );
    let later = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        bank.effective_payouts(),
        0,
        "a mismatch was paid: {later:?}"
    );
    assert_eq!(bank.lookups(), 0, "a mismatch is not examined again");
    assert_eq!((later.examined, later.needs_a_person), (0, 1), "{later:?}");
    assert!(
        !later.all_settled(),
        "a mismatch stays open until a person settles it"
    );
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.status, PaymentStatus::Mismatched);
    assert_eq!(p.status_reason, evidence, "the evidence is kept as it was");
    // A redelivery of the message writes nothing and pays nothing either.
    common::deliver(&consumer, &msg, "evt-1", 3).await;
    assert_eq!(bank.effective_payouts(), 0);
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Mismatched
    );
}

/// Item 2: the bank may normalise the reference's letter case (DESIGN §8): still ours,
/// so no second payout. An entry without a reference is no answer at all.
pub async fn lookup_references_differing_in_case_are_ours_and_missing_ones_are_unusable(
    store: DynStore,
) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold_entry(
        &key,
        serde_json::json!({"paymentId": "other-claims-payment", "status": "paid",
            "amount": "75.00", "currency": "EUR"}),
    );
    let unusable = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(unusable.still_unknown, 1, "{unusable:?}");
    assert!(
        unusable.lines[0].detail.contains("no reference"),
        "{unusable:?}"
    );
    assert_eq!(
        bank.effective_payouts(),
        0,
        "an unusable answer is not 'nothing held'"
    );
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(
        (p.status, p.bank_payment_id),
        (PaymentStatus::NeedsReconciliation, None)
    );

    let bank = FakeBank::start().await;
    bank.hold_entry(
        &key,
        serde_json::json!({"paymentId": "bank-77", "status": "PAID", "amount": "75.0",
            "currency": "EUR", "reference": key.to_uppercase()}),
    );
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        consumer.policy().clone(),
        Duration::from_millis(200),
    );
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(summary.paid_by_lookup, 1, "{summary:?}");
    assert_eq!(
        bank.effective_payouts(),
        0,
        "paid again although the bank held it"
    );
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.bank_payment_id.as_deref(), Some("bank-77"));
}

/// Item 3: two payouts under one reference are a double payment: a mismatch for a
/// person, counted, never "paid by lookup".
pub async fn a_double_payment_at_the_bank_needs_a_person(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-1", "paid", "75.00", "EUR");
    bank.hold(&key, "bank-2", "paid", "75.00", "EUR");
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (
            summary.paid_by_lookup,
            summary.mismatches,
            summary.double_payments
        ),
        (0, 1, 1),
        "{summary:?}"
    );
    assert!(!summary.all_settled());
    let p = payment_of(&store, msg.claim_id).await;
    assert_eq!(p.status, PaymentStatus::Mismatched);
    let reason = p.status_reason.unwrap();
    assert!(
        reason.contains("bank-1") && reason.contains("bank-2"),
        "{reason}"
    );
}

/// Item 3: a pending entry may still pay, whatever else is listed beside it.
pub async fn a_pending_entry_beside_a_refusal_stays_unknown(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-r", "rejected", "75.00", "EUR");
    bank.hold(&key, "bank-p", "pending", "75.00", "EUR");
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (summary.rejected, summary.still_unknown),
        (0, 1),
        "{summary:?}"
    );
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::NeedsReconciliation
    );
}

/// Item 4: a run stalled on one payment must not settle the next one from the list it
/// read at its start, after another run settled it meanwhile.
pub async fn a_stalled_run_never_overwrites_what_another_run_settled(store: DynStore) {
    let bank = FakeBank::start().await;
    let (consumer, first, first_key) = needs_reconciliation(&store, &bank).await;
    let (_, second, second_key) = needs_reconciliation(&store, &bank).await;
    // The stalled run pays the first payment slowly.
    bank.script([BankFault::Slow(Duration::from_millis(1500))]);
    let sent_before = bank.arrivals().len();
    let stalled = {
        let consumer = consumer.clone();
        tokio::spawn(async move {
            reconciler(&consumer)
                .run(reconcile_options(Duration::ZERO))
                .await
        })
    };
    wait_until(Duration::from_secs(10), "the stalled run's payout", || {
        bank.arrivals().len() > sent_before
    })
    .await;
    assert!(
        bank.payout_for(&first_key).is_none(),
        "the first payout is still in flight"
    );
    // Meanwhile another run pays the second one.
    let other = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(other.paid_now, 1, "{other:?}");
    let settled = payment_of(&store, second.claim_id).await;
    assert_eq!(settled.status, PaymentStatus::Paid);
    // The bank now also lists something that would read as a mismatch.
    bank.hold(&second_key, "bank-x", "paid", "99.00", "EUR");
    let summary = stalled.await.unwrap().unwrap();
    let p = payment_of(&store, second.claim_id).await;
    assert_eq!(
        (p.status, &p.bank_payment_id),
        (PaymentStatus::Paid, &settled.bank_payment_id),
        "the stalled run overwrote a settled payment: {summary:?}"
    );
    assert_eq!(
        payment_of(&store, first.claim_id).await.status,
        PaymentStatus::Paid
    );
    assert_eq!(bank.effective_payouts(), 2);
}

/// Item 5: a full run's worth of mismatched payments must not hide a newer one.
pub async fn mismatches_do_not_starve_newer_payments(store: DynStore) {
    let old = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    for n in 0..claims_payments::reconcile::MAX_PER_RUN {
        let (inbox, payment) = records(&common::new_claim(), &format!("m-{n}"), AttemptId::new());
        let payment = PaymentRecord {
            status: PaymentStatus::Mismatched,
            created_at: old,
            updated_at: old,
            ..payment
        };
        let inbox = InboxRecord {
            status: InboxStatus::Completed,
            lease_until: None,
            ..inbox
        };
        store.claim(&inbox, &payment).await.unwrap();
    }
    let bank = FakeBank::start().await;
    let (consumer, msg, _key) = needs_reconciliation(&store, &bank).await;
    let summary = reconciler(&consumer)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (summary.examined, summary.paid_now),
        (1, 1),
        "{:?}",
        summary.counts()
    );
    assert_eq!(
        summary.needs_a_person,
        claims_payments::reconcile::MAX_PER_RUN,
        "{}",
        summary.counts()
    );
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
}

/// Item 9: a run whose lookup failed gives the message back as it found it; the next
/// run, with the same minimum age, examines the payment at once.
pub async fn a_failed_lookup_leaves_an_orphaned_payout_visible_to_the_next_run(store: DynStore) {
    let bank = FakeBank::start().await;
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_millis(200),
        ..common::policy()
    };
    let consumer =
        common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_millis(500));
    let msg = common::message(&common::new_claim(), "31.00");
    let dying = consumer
        .clone()
        .with_crash_hook(common::crash_once_at(Step::AfterBankCall));
    assert_eq!(
        common::deliver(&dying, &msg, "evt-1", 10).await,
        "retry-later"
    );
    let min_age = Duration::from_millis(300);
    // The scenario: the lease (200 ms) and the minimum age after it pass.
    let ripe = OffsetDateTime::now_utc() + Duration::from_millis(600);
    while OffsetDateTime::now_utc() < ripe {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bank.fail_lookups(1);
    let failed = reconciler(&consumer)
        .run(reconcile_options(min_age))
        .await
        .unwrap();
    assert_eq!(failed.still_unknown, 1, "{failed:?}");
    let next = reconciler(&consumer)
        .run(reconcile_options(min_age))
        .await
        .unwrap();
    assert_eq!(
        (next.examined, next.paid_by_lookup),
        (1, 1),
        "the failed run hid the payment: {}",
        next.counts()
    );
    assert!(next.all_settled(), "{}", next.counts());
    assert_eq!(bank.effective_payouts(), 1);
}

// ---- HTTP payments API -----------------------------------------------------------

fn api(
    consumer: &claims_payments::consumer::Consumer,
) -> claims_payments::payments_api::PaymentsApi {
    claims_payments::payments_api::PaymentsApi::new(
        consumer.clone(),
        claims_payments::payments_api::CallerAuth::FunctionKey,
        Duration::from_secs(24 * 3600),
    )
}

fn key_headers(key: &str) -> axum::http::HeaderMap {
    let mut h = axum::http::HeaderMap::new();
    h.insert("idempotency-key", key.parse().unwrap());
    h
}

fn api_body(claim: &str, amount: &str) -> String {
    format!(
        r#"{{"claimId":"{claim}","amount":"{amount}","currency":"EUR","payee":"NL91ABNA0417164300"}}"#
    )
}

pub async fn api_first_request_replay_and_mismatch(store: DynStore) {
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let api = api(&consumer);
    let claim = common::new_claim();
    let body = api_body(&claim, "60.00");
    let first = api.post(&key_headers("k"), body.as_bytes()).await;
    assert_eq!(first.status, 201, "{first:?}");
    let replay = api.post(&key_headers("k"), body.as_bytes()).await;
    assert!(replay.replayed);
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    let other = api
        .post(&key_headers("k"), api_body(&claim, "61.00").as_bytes())
        .await;
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let p = store
        .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
}

pub async fn api_request_cut_mid_payout_resumes_under_the_same_key(store: DynStore) {
    // The request dies while the bank holds its payout (the process was killed: the
    // future is dropped, nothing after that point runs). The client retries: first
    // while the dead attempt's lease is alive (409), then after it (201, one payout).
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_millis(800))]);
    let policy = claims_payments::consumer::Policy {
        lease: Duration::from_millis(400),
        ..common::policy()
    };
    let consumer = common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_secs(2));
    let api = api(&consumer);
    let body = api_body(&common::new_claim(), "70.00");
    let cut = tokio::time::timeout(
        Duration::from_millis(150),
        api.post(&key_headers("cut"), body.as_bytes()),
    )
    .await;
    assert!(cut.is_err(), "the request was cut mid-payout");
    let in_flight = api.post(&key_headers("cut"), body.as_bytes()).await;
    assert_eq!(in_flight.status, 409, "{in_flight:?}");
    assert!(in_flight.retry_after.is_some());
    // The scenario: the lease (400 ms, on the store's wall clock) expires.
    let lease_gone = OffsetDateTime::now_utc() + Duration::from_millis(450);
    while OffsetDateTime::now_utc() < lease_gone {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = api.post(&key_headers("cut"), body.as_bytes()).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    // The cut request's payout lands at the bank too: the same key makes it one payout.
    wait_until(Duration::from_secs(10), "the cut request's payout", || {
        bank.requests().len() >= 2
    })
    .await;
    assert_eq!(bank.effective_payouts(), 1);
    let replay = api.post(&key_headers("cut"), body.as_bytes()).await;
    assert!(replay.replayed && replay.status == 201, "{replay:?}");
}
