//! The sandbox bank honours the payout contract the service's client relies on: one
//! payout per Idempotency-Key, replays answered with the same payment id, 422 for a
//! reused key, 409 while the key is in flight, refusals for closed accounts, and
//! faults that follow the seed. If the sandbox were lenient, the chaos test would
//! prove nothing about the real payout client.

use std::time::Duration;

use claims_payments_testkit::bank::{BankAnswer, FakeBank, FakeBankSettings};
use claims_payments_testkit::wait::wait_until;

const CLAIM: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

fn body(amount: &str, payee: &str) -> String {
    format!(r#"{{"claimId":"{CLAIM}","amount":"{amount}","currency":"EUR","payee":"{payee}"}}"#)
}

fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap()
}

async fn post(
    client: &reqwest::Client,
    bank: &FakeBank,
    key: Option<&str>,
    body: String,
) -> (u16, serde_json::Value, Option<String>) {
    let mut request = client
        .post(format!("{}/payments", bank.url()))
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("the bank answers");
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, json, replayed)
}

#[tokio::test]
async fn a_replayed_key_returns_the_same_payment_and_pays_once() {
    let bank = FakeBank::start_with(FakeBankSettings::default())
        .await
        .unwrap();
    let c = client(Duration::from_secs(5));
    let (s1, b1, r1) = post(&c, &bank, Some("k1"), body("125.50", "NL91")).await;
    let (s2, b2, r2) = post(&c, &bank, Some("k1"), body("125.50", "NL91")).await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(b1["paymentId"], b2["paymentId"]);
    assert_eq!((r1, r2.as_deref()), (None, Some("true")));
    let ledger = bank.ledger();
    assert_eq!(ledger.payouts.len(), 1);
    assert_eq!(ledger.payouts[0].amount.to_string(), "125.50");
    assert_eq!(ledger.payouts[0].claim_id, CLAIM);
    assert_eq!(ledger.requests.len(), 2);
    assert_eq!(ledger.requests[1].answer, BankAnswer::Replayed);
    assert_eq!(ledger.requests[1].byte_identical, Some(true));
}

#[tokio::test]
async fn a_reused_key_with_another_body_is_refused_with_422() {
    let bank = FakeBank::start_with(FakeBankSettings::default())
        .await
        .unwrap();
    let c = client(Duration::from_secs(5));
    assert_eq!(
        post(&c, &bank, Some("k"), body("10.00", "NL91")).await.0,
        201
    );
    let (status, json, _) = post(&c, &bank, Some("k"), body("10.01", "NL91")).await;
    assert_eq!(status, 422);
    assert_eq!(json["code"], "idempotency_key_reused");
    // The same fields in another order and spelling of whitespace are the same request.
    let reordered =
        format!(r#"{{ "payee":"NL91", "currency":"EUR", "amount":"10.00", "claimId":"{CLAIM}" }}"#);
    let (status, _, _) = post(&c, &bank, Some("k"), reordered).await;
    assert_eq!(status, 200);
    let ledger = bank.ledger();
    assert_eq!(ledger.payouts.len(), 1);
    assert_eq!(ledger.requests[2].byte_identical, Some(false));
}

#[tokio::test]
async fn a_key_still_being_processed_gets_409_then_the_replay() {
    let bank = FakeBank::start_with(FakeBankSettings {
        latency_min_ms: 300,
        latency_max_ms: 300,
        ..FakeBankSettings::default()
    })
    .await
    .unwrap();
    let c = client(Duration::from_secs(5));
    let first = {
        let c = c.clone();
        let url = bank.url();
        tokio::spawn(async move {
            c.post(format!("{url}/payments"))
                .header("Idempotency-Key", "slow")
                .body(body("7.00", "NL91"))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    };
    wait_until(
        Duration::from_secs(10),
        "the first request is processing",
        || bank.processing("slow"),
    )
    .await;
    let (status, json, _) = post(&c, &bank, Some("slow"), body("7.00", "NL91")).await;
    assert_eq!(status, 409, "{json}");
    let paid = first.await.unwrap();
    let (status, replay, _) = post(&c, &bank, Some("slow"), body("7.00", "NL91")).await;
    assert_eq!(status, 200);
    assert_eq!(paid["paymentId"], replay["paymentId"]);
    assert_eq!(bank.ledger().payouts.len(), 1);
}

#[tokio::test]
async fn a_closed_account_is_refused_for_good_and_never_paid() {
    let bank = FakeBank::start_with(FakeBankSettings::default())
        .await
        .unwrap();
    let c = client(Duration::from_secs(5));
    for _ in 0..2 {
        let (status, json, _) = post(&c, &bank, Some("c"), body("5.00", "CLOSED-1")).await;
        assert_eq!(status, 402);
        assert_eq!(json["code"], "account_closed");
    }
    let ledger = bank.ledger();
    assert!(ledger.payouts.is_empty());
    let answers: Vec<_> = ledger.requests.iter().map(|r| r.answer).collect();
    assert_eq!(
        answers,
        vec![BankAnswer::Rejected, BankAnswer::RejectedReplay]
    );
}

#[tokio::test]
async fn requests_that_break_the_contract_are_400_and_pay_nothing() {
    let bank = FakeBank::start_with(FakeBankSettings::default())
        .await
        .unwrap();
    let c = client(Duration::from_secs(5));
    assert_eq!(post(&c, &bank, None, body("5.00", "NL91")).await.0, 400);
    let number_amount =
        format!(r#"{{"claimId":"{CLAIM}","amount":5.5,"currency":"EUR","payee":"NL91"}}"#);
    assert_eq!(post(&c, &bank, Some("a"), number_amount).await.0, 400);
    assert_eq!(
        post(&c, &bank, Some("b"), body("5.005", "NL91")).await.0,
        400
    );
    assert_eq!(
        post(&c, &bank, Some("c"), body("-5.00", "NL91")).await.0,
        400
    );
    assert_eq!(post(&c, &bank, Some("d"), "not json".into()).await.0, 400);
    assert!(bank.ledger().payouts.is_empty());
}

#[tokio::test]
async fn a_lost_answer_pays_but_the_client_never_learns_the_payment_id() {
    let timeout = Duration::from_millis(150);
    let bank = FakeBank::start_with(FakeBankSettings {
        seed: 7,
        lost_answer_rate: 1.0,
        client_timeout_ms: timeout.as_millis() as u64,
        ..FakeBankSettings::default()
    })
    .await
    .unwrap();
    let c = client(timeout);
    let keys: Vec<String> = (0..24).map(|i| format!("lost-{i}")).collect();
    let attempts = keys.iter().map(|key| {
        let c = c.clone();
        let url = bank.url();
        let key = key.clone();
        async move {
            let response = c
                .post(format!("{url}/payments"))
                .header("Idempotency-Key", &key)
                .body(body("9.99", "NL91"))
                .send()
                .await;
            match response {
                Err(_) => None,
                Ok(r) => r
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["paymentId"].as_str().map(str::to_owned)),
            }
        }
    });
    let learned = futures::future::join_all(attempts).await;
    assert!(learned.iter().all(Option::is_none), "{learned:?}");
    // Let the stalled requests finish paying (each is recorded once it paid), then ask
    // again: each key was paid once and the replay hands out that payment's id.
    wait_until(
        Duration::from_secs(10),
        "every stalled request paid",
        || bank.ledger().requests.len() == keys.len(),
    )
    .await;
    let ledger = bank.ledger();
    assert_eq!(ledger.payouts.len(), keys.len());
    let kinds: std::collections::BTreeSet<_> = ledger.requests.iter().map(|r| r.answer).collect();
    assert_eq!(
        kinds,
        [
            BankAnswer::LostAfterPay,
            BankAnswer::CutAfterPay,
            BankAnswer::LostWhileProcessing
        ]
        .into_iter()
        .collect(),
        "seed 7 exercises every way of losing an answer"
    );
    let patient = client(Duration::from_secs(5));
    for key in &keys {
        let (status, json, _) = post(&patient, &bank, Some(key), body("9.99", "NL91")).await;
        assert_eq!(status, 200);
        let paid = ledger
            .payouts
            .iter()
            .find(|p| &p.idempotency_key == key)
            .unwrap();
        assert_eq!(json["paymentId"], paid.payment_id.as_str());
    }
    assert_eq!(bank.ledger().payouts.len(), keys.len());
}

#[tokio::test]
async fn injected_faults_follow_the_seed() {
    async fn statuses(seed: u64) -> Vec<u16> {
        let bank = FakeBank::start_with(FakeBankSettings {
            seed,
            error_5xx_rate: 0.3,
            rate_429: 0.3,
            ..FakeBankSettings::default()
        })
        .await
        .unwrap();
        let c = client(Duration::from_secs(5));
        let mut out = Vec::new();
        for i in 0..40 {
            let (status, _, _) =
                post(&c, &bank, Some(&format!("k{i}")), body("1.00", "NL91")).await;
            out.push(status);
        }
        out
    }
    let a = statuses(11).await;
    assert_eq!(a, statuses(11).await);
    assert_ne!(a, statuses(12).await);
    assert!(
        a.contains(&503) && a.contains(&429) && a.contains(&201),
        "{a:?}"
    );
}

fn with_reference(amount: &str, payee: &str, reference: &str) -> String {
    format!(
        r#"{{"claimId":"{CLAIM}","amount":"{amount}","currency":"EUR","payee":"{payee}","reference":"{reference}"}}"#
    )
}

async fn lookup(c: &reqwest::Client, bank: &FakeBank, reference: &str) -> (u16, serde_json::Value) {
    let response = c
        .get(format!("{}/payments?reference={reference}", bank.url()))
        .send()
        .await
        .expect("the bank answers");
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

/// The lookup the reconciler relies on: what the bank holds under a reference, paid or
/// refused, and an empty list when it holds nothing.
#[tokio::test]
async fn the_lookup_lists_what_the_bank_holds_under_a_reference() {
    let bank = FakeBank::start_with(FakeBankSettings::default())
        .await
        .unwrap();
    let c = client(Duration::from_secs(5));
    assert_eq!(lookup(&c, &bank, "r1").await, (200, serde_json::json!([])));
    let (status, paid, _) =
        post(&c, &bank, Some("r1"), with_reference("12.50", "NL91", "r1")).await;
    assert_eq!(status, 201);
    let (status, held) = lookup(&c, &bank, "r1").await;
    assert_eq!(status, 200);
    assert_eq!(held.as_array().unwrap().len(), 1, "{held}");
    assert_eq!(held[0]["paymentId"], paid["paymentId"]);
    assert_eq!(
        (held[0]["status"].as_str(), held[0]["amount"].as_str()),
        (Some("paid"), Some("12.50"))
    );
    post(
        &c,
        &bank,
        Some("r2"),
        with_reference("3.00", "CLOSED-9", "r2"),
    )
    .await;
    let (_, refused) = lookup(&c, &bank, "r2").await;
    assert_eq!(refused[0]["status"], "rejected", "{refused}");
    let (status, _) = lookup(&c, &bank, "unknown").await;
    assert_eq!(status, 200);
}

/// Past its key window the bank forgets the key: the same request pays again, which is
/// why the service never sends after the window and asks by reference instead.
#[tokio::test]
async fn a_forgotten_key_pays_again_and_the_lookup_still_finds_both() {
    let bank = FakeBank::start_with(FakeBankSettings {
        key_window_ms: Some(50),
        ..FakeBankSettings::default()
    })
    .await
    .unwrap();
    let c = client(Duration::from_secs(5));
    let (s1, first, _) = post(&c, &bank, Some("f1"), with_reference("9.00", "NL91", "f1")).await;
    // The scenario: the key window (50 ms) passes.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let (s2, second, _) = post(&c, &bank, Some("f1"), with_reference("9.00", "NL91", "f1")).await;
    assert_eq!((s1, s2), (201, 201));
    assert_ne!(first["paymentId"], second["paymentId"]);
    assert_eq!(bank.ledger().payouts.len(), 2);
    let (_, held) = lookup(&c, &bank, "f1").await;
    assert_eq!(held.as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn lookup_faults_answer_503() {
    let bank = FakeBank::start_with(FakeBankSettings {
        lookup_5xx_rate: 1.0,
        ..FakeBankSettings::default()
    })
    .await
    .unwrap();
    let c = client(Duration::from_secs(5));
    assert_eq!(lookup(&c, &bank, "x").await.0, 503);
}
