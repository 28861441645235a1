//! The consumer's guarantees beyond single scenarios, on the embedded store:
//! random delivery orders with duplicates and crashes (property test) and redelivery
//! after the inbox expired. (The naive baseline that pays twice without the guard is
//! tested in claims-payments-dev.)

use claims_payments_testkit::fixtures as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::bank::BankSettings;
use claims_payments::seams::bank::{BankClient, PayoutOutcome, SendWindow};
use claims_payments::seams::consumer::Policy;
use claims_payments::seams::store::{DynStore, PaymentStatus};
use claims_payments::seams::Step;
use claims_payments::{ClaimApproved, IdempotencyKey};
use claims_payments_sqlite::SqliteStore;
use claims_payments_testkit::bank::{BankFault, FakeBank};
use proptest::prelude::*;
use time::OffsetDateTime;

fn sqlite() -> (DynStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("payments.db")).unwrap();
    (store, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_after_the_inbox_record_expired_is_still_a_duplicate() {
    let (store, _dir) = sqlite();
    let consumer = common::ledger_consumer(store.clone());
    let claim = common::new_claim();
    let msg = common::message(&claim, "10.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "recorded"
    );
    // Past the retention: the inbox record is purged; the payment stays.
    let later = OffsetDateTime::now_utc() + Duration::from_secs(31 * 86_400);
    assert_eq!(store.purge_expired(later, 10).await.unwrap(), 1);
    assert!(store.list_inbox(10).await.unwrap().is_empty());
    // A DLQ re-drive weeks later (another instance, or after a restart: nothing in
    // memory) meets the permanent payment record.
    let consumer = common::ledger_consumer(store.clone());
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "duplicate"
    );
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-2", 1).await,
        "business-duplicate"
    );
    let conflicting = common::message(&claim, "11.00");
    assert_eq!(
        common::deliver(&consumer, &conflicting, "evt-3", 1).await,
        "conflict"
    );
    assert_eq!(store.list_payments(10).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_works_in_small_batches_and_keeps_payments() {
    let (store, _dir) = sqlite();
    let consumer = common::ledger_consumer(store.clone());
    for i in 0..7 {
        let msg = common::message(&common::new_claim(), "1.00");
        consumer
            .handle(&msg, &common::delivery(&format!("evt-{i}"), 1))
            .await;
    }
    let later = OffsetDateTime::now_utc() + Duration::from_secs(31 * 86_400);
    assert_eq!(store.purge_expired(later, 3).await.unwrap(), 7);
    assert_eq!(store.list_payments(100).await.unwrap().len(), 7);
}

/// One delivery in a random schedule.
#[derive(Debug, Clone)]
struct Planned {
    message: usize,
    crash: Option<Step>,
}

fn schedule() -> impl Strategy<Value = (usize, Vec<Vec<Planned>>)> {
    (2usize..6).prop_flat_map(|messages| {
        let delivery = (
            0..messages,
            prop_oneof![
                6 => Just(None),
                1 => Just(Some(Step::AfterClaim)),
                1 => Just(Some(Step::AfterBankCall)),
                1 => Just(Some(Step::AfterFinalize)),
            ],
        )
            .prop_map(|(message, crash)| Planned { message, crash });
        // Deliveries come in waves; a wave's deliveries run concurrently.
        (
            Just(messages),
            prop::collection::vec(prop::collection::vec(delivery, 1..4), 1..6),
        )
    })
}

fn quick_policy() -> Policy {
    Policy {
        lease: Duration::from_millis(120),
        inflight_wait: Duration::from_millis(600),
        retry_budget: Duration::from_millis(80),
        ..common::policy()
    }
}

/// Messages: some share a claim (business duplicates with the same payload).
fn messages(n: usize) -> Vec<(String, ClaimApproved)> {
    let claims: Vec<String> = (0..n.div_ceil(2) + 1)
        .map(|_| common::new_claim())
        .collect();
    (0..n)
        .map(|i| {
            let claim = &claims[i * 2 / 3];
            (format!("evt-{i}"), common::message(claim, "10.00"))
        })
        .collect()
}

async fn run_schedule(messages_n: usize, waves: Vec<Vec<Planned>>) -> Result<(), TestCaseError> {
    let (store, _dir) = sqlite();
    let bank = FakeBank::start().await;
    let msgs = messages(messages_n);
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        quick_policy(),
        Duration::from_millis(40),
    );
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut next_count = |id: &str| {
        let n = counts.entry(id.to_owned()).or_insert(0);
        *n += 1;
        *n
    };

    for wave in waves {
        let mut tasks = Vec::new();
        for planned in wave {
            let (id, msg) = msgs[planned.message].clone();
            // A crash is a property of one delivery: give it a consumer that dies at that step.
            let consumer = match planned.crash {
                Some(step) => consumer
                    .clone()
                    .with_crash_hook(Arc::new(move |s| s == step)),
                None => consumer.clone(),
            };
            let delivery = common::delivery(&id, next_count(&id));
            tasks.push(tokio::spawn(async move {
                consumer.handle(&msg, &delivery).await
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    // Drain: Service Bus keeps redelivering every message, interleaved, until the host
    // completes it (bounded, like maxDeliveryCount).
    let mut pending: Vec<&(String, ClaimApproved)> = msgs.iter().collect();
    for _round in 0..10 {
        let mut still = Vec::new();
        for entry in pending {
            let (id, msg) = entry;
            if !consumer
                .handle(msg, &common::delivery(id, next_count(id)))
                .await
                .completes_message()
            {
                still.push(entry);
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
    }
    prop_assert!(
        pending.is_empty(),
        "never completed: {:?}",
        pending.iter().map(|(id, _)| id).collect::<Vec<_>>()
    );

    let expected: BTreeSet<String> = msgs.iter().map(|(_, m)| m.claim_id.to_string()).collect();
    let payments: Vec<_> = store
        .list_payments(1000)
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ledger: BTreeSet<String> = payments.iter().map(|p| p.claim_id.to_string()).collect();
    prop_assert_eq!(&ledger, &expected, "ledger = distinct claims");
    prop_assert_eq!(payments.len(), expected.len());
    prop_assert!(payments.iter().all(|p| p.status == PaymentStatus::Paid));
    prop_assert_eq!(
        bank.effective_payouts(),
        expected.len(),
        "one payout per claim at the bank"
    );
    for p in &payments {
        let (body, id) = bank
            .payout_for(p.idempotency_key.as_str())
            .expect("paid at the bank");
        prop_assert_eq!(Some(body), p.payout_request.clone());
        prop_assert_eq!(Some(id), p.bank_payment_id.clone());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 50, ..ProptestConfig::default() })]

    #[test]
    fn ledger_equals_the_distinct_claims_whatever_the_deliveries((n, waves) in schedule()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run_schedule(n, waves))?;
    }
}

fn bank_client(bank: &FakeBank, timeout: Duration, api_key: Option<&str>) -> BankClient {
    claims_payments::seams::bank::https_client(&BankSettings {
        url: bank.url().parse().unwrap(),
        api_key: api_key.map(|k| secrecy::SecretString::from(k.to_owned())),
        timeout,
        key_window: Duration::from_secs(86_400),
    })
    .unwrap()
}

fn window(budget: Duration) -> SendWindow {
    SendWindow::new(
        budget,
        OffsetDateTime::now_utc(),
        Duration::from_secs(86_400),
    )
}

/// A `Retry-After` of u64::MAX seconds once overflowed `Instant + wait` and killed the
/// invocation (and every takeover after it). It is capped: the budget ends the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_retry_after_ends_the_attempt_without_panicking() {
    let bank = FakeBank::start().await;
    let key = IdempotencyKey::from_stored("claim-payment-x".into());
    for after in ["18446744073709551615", "Fri, 31 Dec 9999 23:59:59 GMT"] {
        bank.script([BankFault::ThrottledFor(after.into())]);
        let client = bank_client(&bank, Duration::from_secs(1), None);
        let outcome = client.pay(&key, "{}", window(Duration::from_secs(2))).await;
        assert!(
            matches!(&outcome, PayoutOutcome::GaveUp { attempts: 1, .. }),
            "{after}: {outcome:?}"
        );
    }
    // The guarded consumer turns it into a redelivery, not a crash.
    let (store, _dir) = sqlite();
    bank.script([BankFault::ThrottledFor("18446744073709551615".into())]);
    let consumer = common::bank_consumer(store, &bank);
    let msg = common::message(&common::new_claim(), "2.00");
    assert_eq!(
        common::deliver(&consumer, &msg, "evt-1", 1).await,
        "retry-later"
    );
}

/// With a budget shorter than the bank's answer time, the first request once got only
/// what was left of the budget (20 ms), timed out although the bank paid, and the
/// message dead-lettered with the payment in progress. Every request gets its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_bank_request_always_gets_its_full_timeout() {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_millis(300))]);
    let client = bank_client(&bank, Duration::from_secs(10), None);
    let key = IdempotencyKey::from_stored("claim-payment-y".into());
    // A body the bank accepts: it checks the payout contract.
    let body = common::message(&common::new_claim(), "1.00").payout_request_body();
    let outcome = client.pay(&key, &body, window(Duration::ZERO)).await;
    assert!(matches!(outcome, PayoutOutcome::Paid { .. }), "{outcome:?}");
    assert_eq!(bank.requests().len(), 1);
}

/// The credential rides in its own header from BANK_API_KEY, and no error names a URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_credential_is_a_header_and_errors_carry_no_url() {
    let bank = FakeBank::start().await;
    let client = bank_client(&bank, Duration::from_secs(5), Some("s3cr3t-token"));
    let key = IdempotencyKey::from_stored("claim-payment-z".into());
    let body = common::message(&common::new_claim(), "1.00").payout_request_body();
    let outcome = client
        .pay(&key, &body, window(Duration::from_secs(5)))
        .await;
    assert!(matches!(outcome, PayoutOutcome::Paid { .. }), "{outcome:?}");
    assert_eq!(
        bank.authorizations(),
        [Some("Bearer s3cr3t-token".to_owned())]
    );

    // Nothing listens on this port: a connection error, described without the URL.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url: reqwest::Url = format!("http://{}/private-path/", dead.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(dead);
    let client = claims_payments::seams::bank::https_client(&BankSettings {
        url,
        api_key: None,
        timeout: Duration::from_millis(500),
        key_window: Duration::from_secs(86_400),
    })
    .unwrap();
    match client
        .pay(&key, "{}", window(Duration::from_millis(300)))
        .await
    {
        PayoutOutcome::GaveUp { last_error, .. } => {
            assert!(!last_error.is_empty());
            assert!(
                !last_error.contains("private-path") && !last_error.contains("127.0.0.1"),
                "{last_error}"
            );
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
}
