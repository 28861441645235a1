//! Reconciliation: payments left `needs_reconciliation` (or orphaned in progress) are
//! settled from what the bank holds under their reference, never paid twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::store::{
    AttemptId, DynStore, InboxRecord, InboxStatus, PaymentRecord, PaymentStatus, Store, StoreCall,
    StoreDecorator, StoreError, StoreResult,
};
use claims_payments::seams::Step;
use claims_payments::{ClaimId, Purpose};
use time::OffsetDateTime;

use crate::bank::{BankFault, FakeBank};
use crate::fixtures as common;
use crate::records::{records, records_for};
use crate::wait::wait_until;

fn reconcile_options(min_age: Duration) -> claims_payments::seams::reconcile::Options {
    claims_payments::seams::reconcile::Options {
        min_age,
        dry_run: false,
        budget: None,
    }
}

/// A payment left in `needs_reconciliation` by a real delivery: the bank stayed down
/// until the (short) key window closed. Returns the services, the consumer on them, the
/// message and its key.
///
/// Only the closing key window may end that delivery. The bank client sends until the
/// key window closes (`needs-reconciliation`) or until its next wait would pass the
/// retry budget (`retry-later`, checked after each request). With a 5 s budget, one
/// request stalled for a few seconds on a loaded machine let the budget run out first.
/// Here the budget is an hour: no wait is longer than 5 s and the window closes 540 ms
/// after the claim, so the window always ends it. Unlike a configured service, the lease
/// (10 s) may be shorter than the budget: no other delivery runs meanwhile. The
/// scenario's redeliveries and reconcile runs keep this policy; the key window bounds
/// their payout loops as before.
async fn needs_reconciliation(
    store: &DynStore,
    bank: &FakeBank,
) -> (
    claims_payments::seams::services::Services,
    claims_payments::seams::consumer::Consumer,
    claims_payments::ClaimApproved,
    String,
) {
    bank.always(Some(BankFault::Unavailable));
    let policy = claims_payments::seams::consumer::Policy {
        retry_budget: Duration::from_secs(3600),
        lease: Duration::from_secs(10),
        bank_key_window: Duration::from_millis(600),
        ..common::policy()
    };
    let services =
        common::bank_services_with(store.clone(), bank, policy, Duration::from_millis(200));
    let consumer = services.consumer();
    let msg = common::message(&common::new_claim(), "75.00");
    let outcome = consumer.handle(&msg, &common::delivery("evt-1", 1)).await;
    assert_eq!(outcome.label(), "needs-reconciliation", "{outcome:?}");
    bank.always(None);
    let key = msg.idempotency_key().as_str().to_owned();
    (services, consumer, msg, key)
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
    services: &claims_payments::seams::services::Services,
) -> claims_payments::seams::reconcile::Reconciler {
    claims_payments::seams::reconcile::Reconciler::new(services).expect("a bank is configured")
}

pub async fn reconcile_marks_paid_what_the_bank_holds(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, consumer, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-77", "paid", "75.00", "EUR");
    let sent_before = bank.requests().len();
    let summary = reconciler(&services)
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
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    assert_eq!(bank.effective_payouts(), 0);
    let summary = reconciler(&services)
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
    let again = reconciler(&services)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(again.examined, 0, "{again:?}");
    assert_eq!(bank.effective_payouts(), 1);
}

pub async fn reconcile_never_pays_a_mismatch(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-9", "paid", "57.00", "EUR");
    let summary = reconciler(&services)
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
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-r", "rejected", "75.00", "EUR");
    let summary = reconciler(&services)
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
    let (services, _, msg, _key) = needs_reconciliation(&store, &bank).await;
    bank.fail_lookups(1);
    let summary = reconciler(&services)
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
    let next = reconciler(&services)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(next.paid_now, 1, "{next:?}");
}

pub async fn reconcile_settles_an_orphaned_payout_and_leaves_live_ones_alone(store: DynStore) {
    // Its handler died mid-payout and the message was dead-lettered, never re-driven.
    let bank = FakeBank::start().await;
    let policy = claims_payments::seams::consumer::Policy {
        lease: Duration::from_millis(200),
        ..common::policy()
    };
    let services =
        common::bank_services_with(store.clone(), &bank, policy, Duration::from_millis(500));
    let consumer = services.consumer();
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
    let early = reconciler(&services)
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
    let summary = reconciler(&services)
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
    let (services, consumer, msg, _key) = needs_reconciliation(&store, &bank).await;
    // Both go to the bank at about the same time, under the same key.
    bank.script([BankFault::Slow(Duration::from_millis(300))]);
    let run = {
        let services = services.clone();
        tokio::spawn(async move {
            reconciler(&services)
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
    reconciler(&services)
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
    let (services, _, msg, _key) = needs_reconciliation(&store, &bank).await;
    bank.script([BankFault::Slow(Duration::from_millis(200))]);
    let (first, second) = (reconciler(&services), reconciler(&services));
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
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-9", "paid", "57.00", "EUR");
    let first = reconciler(&services)
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
    let services = common::bank_services_with(
        store.clone(),
        &bank,
        services.policy.clone(),
        Duration::from_millis(200),
    );
    let consumer = services.consumer();
    let later = reconciler(&services)
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

/// A bank may normalise the reference's letter case (docs/runbook.md §4, how the lookup is
/// read): still ours, so no second payout. An entry without a reference is no answer at all.
pub async fn lookup_references_differing_in_case_are_ours_and_missing_ones_are_unusable(
    store: DynStore,
) {
    let bank = FakeBank::start().await;
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold_entry(
        &key,
        serde_json::json!({"paymentId": "other-claims-payment", "status": "paid",
            "amount": "75.00", "currency": "EUR"}),
    );
    let unusable = reconciler(&services)
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
    let services = common::bank_services_with(
        store.clone(),
        &bank,
        services.policy.clone(),
        Duration::from_millis(200),
    );
    let summary = reconciler(&services)
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

/// Two payouts under one reference are a double payment: a mismatch for a
/// person, counted, never "paid by lookup".
pub async fn a_double_payment_at_the_bank_needs_a_person(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-1", "paid", "75.00", "EUR");
    bank.hold(&key, "bank-2", "paid", "75.00", "EUR");
    let summary = reconciler(&services)
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

/// A pending entry may still pay, whatever else is listed beside it.
pub async fn a_pending_entry_beside_a_refusal_stays_unknown(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, _, msg, key) = needs_reconciliation(&store, &bank).await;
    bank.hold(&key, "bank-r", "rejected", "75.00", "EUR");
    bank.hold(&key, "bank-p", "pending", "75.00", "EUR");
    let summary = reconciler(&services)
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

/// A run stalled on one payment must not settle the next one from the list it
/// read at its start, after another run settled it meanwhile.
pub async fn a_stalled_run_never_overwrites_what_another_run_settled(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, _, first, first_key) = needs_reconciliation(&store, &bank).await;
    let (_, _, second, second_key) = needs_reconciliation(&store, &bank).await;
    // The stalled run pays the first payment slowly.
    bank.script([BankFault::Slow(Duration::from_millis(1500))]);
    let sent_before = bank.arrivals().len();
    let stalled = {
        let services = services.clone();
        tokio::spawn(async move {
            reconciler(&services)
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
    let other = reconciler(&services)
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

/// A full run's worth of mismatched payments must not hide a newer one.
pub async fn mismatches_do_not_starve_newer_payments(store: DynStore) {
    let old = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    for n in 0..claims_payments::seams::reconcile::MAX_PER_RUN {
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
    let (services, _, msg, _key) = needs_reconciliation(&store, &bank).await;
    let summary = reconciler(&services)
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
        claims_payments::seams::reconcile::MAX_PER_RUN,
        "{}",
        summary.counts()
    );
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
}

/// A run whose lookup failed gives the message back as it found it; the next
/// run, with the same minimum age, examines the payment at once.
pub async fn a_failed_lookup_leaves_an_orphaned_payout_visible_to_the_next_run(store: DynStore) {
    let bank = FakeBank::start().await;
    let policy = claims_payments::seams::consumer::Policy {
        lease: Duration::from_millis(200),
        ..common::policy()
    };
    let services =
        common::bank_services_with(store.clone(), &bank, policy, Duration::from_millis(500));
    let consumer = services.consumer();
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
    let failed = reconciler(&services)
        .run(reconcile_options(min_age))
        .await
        .unwrap();
    assert_eq!(failed.still_unknown, 1, "{failed:?}");
    let next = reconciler(&services)
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

/// A run that gives back a lease on a record it created (the message's inbox record had
/// expired) leaves the payment as idle as it found it: the next run, with the same
/// minimum age, examines it at once instead of waiting the minimum age again.
pub async fn a_payment_whose_inbox_record_expired_stays_visible_after_a_failed_lookup(
    store: DynStore,
) {
    let bank = FakeBank::start().await;
    let services = common::bank_services_with(
        store.clone(),
        &bank,
        common::policy(),
        Duration::from_millis(500),
    );
    let msg = common::message(&common::new_claim(), "44.00");
    let an_hour_ago = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    let (mut inbox, payment) = records_for(&msg, "evt-1", AttemptId::new(), an_hour_ago);
    // Its message's inbox record is gone (expired): written under another consumer's
    // name, which the run does not read, the payment stands alone for it.
    inbox.consumer = "AnotherConsumer".into();
    store.claim(&inbox, &payment).await.unwrap();
    let min_age = Duration::from_secs(600);
    bank.fail_lookups(1);
    let failed = reconciler(&services)
        .run(reconcile_options(min_age))
        .await
        .unwrap();
    assert_eq!(
        (failed.orphaned_in_progress_before, failed.still_unknown),
        (1, 1),
        "{}",
        failed.counts()
    );
    let next = reconciler(&services)
        .run(reconcile_options(min_age))
        .await
        .unwrap();
    assert_eq!(
        (next.examined, next.paid_now),
        (1, 1),
        "the failed run hid the payment: {}",
        next.counts()
    );
    assert_eq!(bank.effective_payouts(), 1);
    assert_eq!(
        payment_of(&store, msg.claim_id).await.status,
        PaymentStatus::Paid
    );
}

/// Fails every read of one claim's inbox record, and of another claim's payment, as a
/// flaky store would.
struct Unreadable {
    inner: DynStore,
    inbox_of: ClaimId,
    payment_of: ClaimId,
}

impl StoreDecorator for Unreadable {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let fails = match call {
            StoreCall::Inbox(key) => key.claim_id == self.inbox_of,
            StoreCall::Payment { claim, .. } => claim == self.payment_of,
            _ => false,
        };
        if fails {
            return Err(StoreError::Transient(
                "injected: the store did not answer".into(),
            ));
        }
        work.await
    }
}

/// A store error on one payment is that payment's: the run reports it open and goes on
/// with the others; the next run settles it. An error under the message's lease gives
/// the lease back, so the next run need not wait for it to run out.
pub async fn a_store_error_on_one_payment_does_not_end_the_run(store: DynStore) {
    let bank = FakeBank::start().await;
    let (services, _, flaky, _) = needs_reconciliation(&store, &bank).await;
    let (_, _, held, _) = needs_reconciliation(&store, &bank).await;
    let (_, _, fine, _) = needs_reconciliation(&store, &bank).await;
    let failing: DynStore = Arc::new(Unreadable {
        inner: store.clone(),
        inbox_of: flaky.claim_id,
        payment_of: held.claim_id,
    });
    let on_a_flaky_store =
        common::bank_services_with(failing, &bank, common::policy(), Duration::from_millis(500));
    let summary = reconciler(&on_a_flaky_store)
        .run(reconcile_options(Duration::ZERO))
        .await
        .expect("a store error on one payment does not end the run");
    assert_eq!(
        (summary.store_errors, summary.paid_now),
        (2, 1),
        "{}",
        summary.counts()
    );
    assert!(!summary.all_settled(), "{}", summary.counts());
    assert!(
        summary.counts().contains("store errors 2"),
        "{}",
        summary.counts()
    );
    assert_eq!(
        payment_of(&store, fine.claim_id).await.status,
        PaymentStatus::Paid
    );
    for claim in [flaky.claim_id, held.claim_id] {
        assert_eq!(
            payment_of(&store, claim).await.status,
            PaymentStatus::NeedsReconciliation
        );
    }
    let next = reconciler(&services)
        .run(reconcile_options(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (next.paid_now, next.store_errors),
        (2, 0),
        "{}",
        next.counts()
    );
    assert!(next.all_settled(), "{}", next.counts());
    assert_eq!(bank.effective_payouts(), 3);
}
