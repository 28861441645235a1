//! Test fixtures shared by the integration tests: messages, deliveries, policies,
//! services and consumers (with or without the [`FakeBank`]).

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::ambient::Ambient;
use claims_payments::seams::bank::BankSettings;
use claims_payments::seams::consumer::{Consumer, Delivery, Policy};
use claims_payments::seams::services::Services;
use claims_payments::seams::store::DynStore;
use claims_payments::seams::{CrashHook, Step};
use claims_payments::{ClaimApproved, MessageId};

use crate::bank::FakeBank;

pub fn message(claim: &str, amount: &str) -> ClaimApproved {
    ClaimApproved::parse(&format!(
        r#"{{"claimId":"{claim}","amount":"{amount}","currency":"EUR","payee":"NL91ABNA0417164300"}}"#
    ))
    .expect("valid test message")
}

pub fn new_claim() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub fn delivery(message_id: &str, count: u32) -> Delivery {
    Delivery {
        message_id: MessageId::parse(message_id).unwrap(),
        delivery_count: count,
    }
}

/// Short timings so lease expiry and waits happen within a test.
pub fn policy() -> Policy {
    Policy {
        consumer_name: "ClaimApprovedHandler".into(),
        inbox_retention: Duration::from_secs(30 * 86_400),
        lease: Duration::from_millis(1_000),
        inflight_wait: Duration::from_millis(5_000),
        retry_budget: Duration::from_millis(800),
        bank_key_window: Duration::from_secs(86_400),
    }
}

pub fn ledger_consumer(store: DynStore) -> Consumer {
    Consumer::new(store, None, policy())
}

/// What a ledger-only process's parts share: the store, no bank, [`policy`].
pub fn ledger_services(store: DynStore) -> Services {
    Services::new(store, None, policy(), Ambient::system())
}

pub fn bank_consumer(store: DynStore, bank: &FakeBank) -> Consumer {
    bank_services(store, bank).consumer()
}

/// What a process paying through `bank` shares, with [`policy`].
pub fn bank_services(store: DynStore, bank: &FakeBank) -> Services {
    bank_services_with(store, bank, policy(), Duration::from_millis(60))
}

pub fn bank_consumer_with(
    store: DynStore,
    bank: &FakeBank,
    policy: Policy,
    timeout: Duration,
) -> Consumer {
    bank_services_with(store, bank, policy, timeout).consumer()
}

/// What a process paying through `bank` shares, its requests cut off after `timeout`.
pub fn bank_services_with(
    store: DynStore,
    bank: &FakeBank,
    policy: Policy,
    timeout: Duration,
) -> Services {
    let client = claims_payments::seams::bank::https_client(&BankSettings {
        url: bank.url().parse().expect("the fake bank's URL parses"),
        api_key: None,
        timeout,
        key_window: Duration::from_secs(86_400),
    })
    .unwrap();
    Services::new(store, Some(client), policy, Ambient::system())
}

/// Delivers `msg` under `message_id` (delivery `count`) and returns the outcome's label.
pub async fn deliver(
    consumer: &Consumer,
    msg: &ClaimApproved,
    message_id: &str,
    count: u32,
) -> &'static str {
    consumer
        .handle(msg, &delivery(message_id, count))
        .await
        .label()
}

/// A crash hook that fires the first time `step` is reached, and never again.
pub fn crash_once_at(step: Step) -> CrashHook {
    let fired = std::sync::atomic::AtomicBool::new(false);
    Arc::new(move |s| s == step && !fired.swap(true, std::sync::atomic::Ordering::SeqCst))
}
