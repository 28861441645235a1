//! The naive baseline, to show what the guard buys: without it, a crash between the bank
//! call and the record pays twice.

use claims_payments::seams::functions::claim_approved::ClaimHandler;
use claims_payments::seams::store::DynStore;
use claims_payments::seams::Step;
use claims_payments_dev::baselines::Naive;
use claims_payments_sqlite::SqliteStore;
use claims_payments_testkit::bank::FakeBank;
use claims_payments_testkit::fixtures as common;

fn sqlite() -> (DynStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("payments.db")).unwrap();
    (store, dir)
}

/// The hands-on exercise with the guard removed: a crash between the bank call and the
/// record, then the redelivery. The guarded consumer pays once (see the conformance
/// suite's crash scenarios); the naive one pays twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_a_redelivery_after_a_crash_pays_twice() {
    let (store, _dir) = sqlite();
    let bank = FakeBank::start().await;
    let services = common::bank_services(store.clone(), &bank);
    let msg = common::message(&common::new_claim(), "500.00");
    let naive = Naive::new(&services).with_crash_hook(common::crash_once_at(Step::AfterBankCall));
    let first = naive.handle(&msg, &common::delivery("evt-1", 1)).await;
    let second = naive.handle(&msg, &common::delivery("evt-1", 2)).await;
    assert_eq!((first.label(), second.label()), ("retry-later", "paid"));
    assert_eq!(
        bank.effective_payouts(),
        2,
        "the naive consumer must pay twice here"
    );

    // The same deliveries through the guarded consumer: one payout.
    let (store, _dir2) = sqlite();
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store, &bank)
        .with_crash_hook(common::crash_once_at(Step::AfterBankCall));
    consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    consumer.handle(&msg, &common::delivery("evt-1", 2)).await;
    assert_eq!(bank.effective_payouts(), 1);
}
