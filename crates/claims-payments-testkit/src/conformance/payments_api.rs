//! The HTTP payments API on top of the store: a client's Idempotency-Key makes a
//! replayed or resumed request one payout.

use std::time::Duration;

use claims_payments::seams::store::{DynStore, PaymentStatus};
use claims_payments::{ClaimId, Purpose};
use time::OffsetDateTime;

use crate::bank::{BankFault, FakeBank};
use crate::fixtures as common;
use crate::wait::wait_until;

fn api(
    services: &claims_payments::seams::services::Services,
) -> claims_payments::seams::payments_api::PaymentsApi {
    claims_payments::seams::payments_api::PaymentsApi::new(
        services.consumer(),
        services,
        claims_payments::seams::payments_api::CallerAuth::FunctionKey,
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
    let services = common::bank_services(store.clone(), &bank);
    let api = api(&services);
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
    let policy = claims_payments::seams::consumer::Policy {
        lease: Duration::from_millis(400),
        ..common::policy()
    };
    let services = common::bank_services_with(store.clone(), &bank, policy, Duration::from_secs(2));
    let api = api(&services);
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
