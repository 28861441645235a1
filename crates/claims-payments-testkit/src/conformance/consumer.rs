//! The consumer's state machine on top of the store, with a fake bank: duplicates,
//! crashes between steps, takeovers, bank faults, and the bank's key window.

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::consumer::Outcome;

use claims_payments::seams::store::{DynStore, InboxKey, PaymentStatus};
use claims_payments::seams::Step;
use claims_payments::{MessageId, Purpose};
use time::OffsetDateTime;
use tokio::sync::Barrier;

use super::claim_id;
use crate::bank::{BankFault, FakeBank};
use crate::fixtures as common;
use crate::wait::wait_until;

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
    let policy = claims_payments::seams::consumer::Policy {
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
    let policy = claims_payments::seams::consumer::Policy {
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

pub async fn a_business_duplicate_that_loses_an_adopted_payout_defers_to_its_new_owner(
    store: DynStore,
) {
    // evt-2 adopts evt-1's orphaned payout and stalls at the bank past the lease; evt-1's
    // redelivery takes its record back and pays under the same key. evt-2's finalize is
    // refused: the payout is evt-1's again, and evt-2, which has no inbox record of its
    // own, goes back to waiting for the payment and ends as a business duplicate.
    let bank = FakeBank::start().await;
    let policy = claims_payments::seams::consumer::Policy {
        lease: Duration::from_millis(100),
        retry_budget: Duration::from_secs(3),
        ..common::policy()
    };
    let consumer = common::bank_consumer_with(store.clone(), &bank, policy, Duration::from_secs(2));
    let msg = common::message(&common::new_claim(), "82.00");
    let dying = consumer
        .clone()
        .with_crash_hook(Arc::new(|s| s == Step::AfterClaim));
    assert_eq!(
        common::deliver(&dying, &msg, "evt-1", 1).await,
        "retry-later"
    );
    // The scenario: the dead worker's lease (100 ms) expires.
    tokio::time::sleep(Duration::from_millis(150)).await;
    bank.script([BankFault::Slow(Duration::from_millis(400))]);
    let adopter = {
        let (consumer, msg) = (consumer.clone(), msg.clone());
        tokio::spawn(async move { consumer.handle(&msg, &common::delivery("evt-2", 1)).await })
    };
    wait_until(
        Duration::from_secs(10),
        "the adopted payout request",
        || !bank.requests().is_empty(),
    )
    .await;
    // The scenario: the adopter's lease (100 ms) expires while it stalls.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(common::deliver(&consumer, &msg, "evt-1", 2).await, "paid");
    let adopter = adopter.await.unwrap();
    assert_eq!(adopter.label(), "business-duplicate", "{adopter:?}");
    assert_eq!(bank.effective_payouts(), 1);
    let requests = bank.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0], requests[1], "same key, same bytes");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-2", 2).await,
        "duplicate"
    );
}

pub async fn a_later_delivery_takes_over_a_dead_attempt_at_once(store: DynStore) {
    // The deployed timings (infra/main.bicepparam): a 120 s lease and a 15 s in-flight
    // wait. The handler dies mid-payout, leaving a live lease; the host redelivers at
    // once with DeliveryCount + 1. Waiting on the dead lease would answer 503 to every
    // delivery until the message is dead-lettered; a later delivery takes over instead.
    let bank = FakeBank::start().await;
    let policy = claims_payments::seams::consumer::Policy {
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
    // Every answer here is immediate: a generous timeout, so that a loaded machine cannot
    // turn a scripted status into a timeout whose retry is answered unscripted (and paid).
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        common::policy(),
        Duration::from_secs(5),
    );
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
    let policy = claims_payments::seams::consumer::Policy {
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
