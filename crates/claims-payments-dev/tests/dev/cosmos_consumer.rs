//! The consumer on Cosmos DB when the SDK re-sends a write whose response was lost:
//! the first attempt committed, the re-send meets a 409 (batch) or 412 (ETag), and the
//! consumer must recognise its own write instead of treating it as someone else's.

use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::wait::wait_until;

use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::fault_injection::{
    FaultInjectionConditionBuilder, FaultInjectionErrorType, FaultInjectionResultBuilder,
    FaultInjectionRule, FaultInjectionRuleBuilder, FaultOperationType,
};
use claims_payments::seams::store::{DynStore, PaymentStatus};
use claims_payments::Purpose;
use claims_payments_dev::emulator::InProcessEmulator;
use claims_payments_testkit::bank::{BankFault, FakeBank};

fn lost_batch_response(id: &str) -> Arc<FaultInjectionRule> {
    let result = FaultInjectionResultBuilder::new()
        .with_error(FaultInjectionErrorType::ResponseTimeoutAfterService)
        .with_probability(1.0)
        .build();
    let condition = FaultInjectionConditionBuilder::new()
        .with_operation_type(FaultOperationType::BatchItem)
        .build();
    Arc::new(
        FaultInjectionRuleBuilder::new(id, result)
            .with_condition(condition)
            .with_hit_limit(1)
            .build(),
    )
}

async fn store_with(rule: Arc<FaultInjectionRule>) -> DynStore {
    let emulator = InProcessEmulator::new().unwrap();
    emulator.provision("payments", "payments").await.unwrap();
    Arc::new(
        emulator
            .store(
                "payments",
                "payments",
                Duration::from_secs(86_400),
                vec![rule],
            )
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_before_its_response_was_lost_still_pays_once() {
    let rule = lost_batch_response("lost-claim-response");
    let store = store_with(rule.clone()).await;
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "19.99");
    let outcome = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    assert_eq!(rule.hit_count(), 1, "the claim's response was lost once");
    assert_eq!(outcome.label(), "paid", "{outcome:?}");
    assert_eq!(bank.effective_payouts(), 1);
    assert_eq!(
        consumer
            .handle(&msg, &common::delivery("evt-1", 2))
            .await
            .label(),
        "duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_claim_whose_response_was_lost_is_recorded_not_duplicate() {
    let rule = lost_batch_response("lost-ledger-response");
    let store = store_with(rule.clone()).await;
    let consumer = common::ledger_consumer(store.clone());
    let msg = common::message(&common::new_claim(), "5.00");
    let outcome = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    assert_eq!(rule.hit_count(), 1);
    assert_eq!(
        outcome.label(),
        "recorded",
        "our own write is not a duplicate: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalize_committed_before_its_response_was_lost_reports_paid() {
    let rule = lost_batch_response("lost-finalize-response");
    rule.disable();
    let store = store_with(rule.clone()).await;
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    // Let the claim through, then lose the finalize's response: the SDK re-sends it with
    // the old ETag and gets 412 for our own committed write.
    bank.script([BankFault::Slow(Duration::from_millis(200))]);
    let msg = common::message(&common::new_claim(), "8.00");
    let handle = {
        let (consumer, msg) = (consumer.clone(), msg.clone());
        tokio::spawn(async move { consumer.handle(&msg, &common::delivery("evt-1", 1)).await })
    };
    // The claim is committed once the bank has the request; only the finalize remains.
    wait_until(Duration::from_secs(10), "the payout request", || {
        !bank.requests().is_empty()
    })
    .await;
    rule.enable();
    let outcome = handle.await.unwrap();
    assert_eq!(rule.hit_count(), 1, "the finalize's response was lost once");
    assert_eq!(outcome.label(), "paid", "{outcome:?}");
    let p = store
        .payment(msg.claim_id, Purpose::Payout)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.record.status, PaymentStatus::Paid);
    assert_eq!(bank.effective_payouts(), 1);
}
