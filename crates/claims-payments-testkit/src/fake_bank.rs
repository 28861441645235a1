//! Test fixtures shared by the integration tests: messages, consumers and a fake bank
//! that records every Idempotency-Key and body and can be scripted to fail.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Query;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use claims_payments::bank::BankClient;
use claims_payments::config::BankSettings;
use claims_payments::consumer::{Consumer, CrashHook, Delivery, Policy, Step};
use claims_payments::message::{ClaimApproved, MessageId};
use claims_payments::store::DynStore;

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

pub fn bank_consumer(store: DynStore, bank: &FakeBank) -> Consumer {
    bank_consumer_with(store, bank, policy(), Duration::from_millis(60))
}

pub fn bank_consumer_with(
    store: DynStore,
    bank: &FakeBank,
    policy: Policy,
    timeout: Duration,
) -> Consumer {
    let client = BankClient::new(&BankSettings {
        url: bank.url(),
        api_key: None,
        timeout,
        key_window: Duration::from_secs(86_400),
    })
    .unwrap();
    Consumer::new(store, Some(client), policy)
}

/// What the fake bank does with the next request.
#[derive(Debug, Clone, PartialEq)]
pub enum BankFault {
    /// 503 without paying.
    Unavailable,
    /// 429 with Retry-After: 0, without paying.
    Throttled,
    /// Pays, then answers too late for the client's timeout.
    LoseAnswer,
    /// 400: a definite rejection.
    Reject,
    /// Waits this long before handling the request normally.
    Slow(Duration),
    /// Answers this status without paying (401, 404, 402, ...).
    Status(u16),
    /// 429 with this Retry-After value, without paying.
    ThrottledFor(String),
}

#[derive(Default)]
struct BankState {
    /// Every request: (Idempotency-Key, body).
    requests: Vec<(String, String)>,
    /// When each request arrived, in the same order.
    arrivals: Vec<time::OffsetDateTime>,
    /// The Authorization header of each request, in the same order.
    authorizations: Vec<Option<String>>,
    /// Effective payouts by key: (body, payment id).
    payouts: HashMap<String, (String, String)>,
    script: VecDeque<BankFault>,
    /// Applied to every request once the script is empty.
    always: Option<BankFault>,
    /// Payments the lookup lists beyond the effective payouts: (reference, entry).
    held: Vec<(String, serde_json::Value)>,
    /// Lookups to answer 503, then normally.
    failing_lookups: usize,
    lookups: usize,
}

/// A bank that honours Idempotency-Key like a payment provider: a replayed key with
/// the same body returns the original payment; a different body is a 422.
#[derive(Clone)]
pub struct FakeBank {
    addr: SocketAddr,
    state: Arc<Mutex<BankState>>,
}

impl FakeBank {
    pub async fn start() -> FakeBank {
        let state = Arc::new(Mutex::new(BankState::default()));
        let app = Router::new()
            .route("/payments", post(pay).get(lookup))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeBank { addr, state }
    }

    pub fn url(&self) -> reqwest::Url {
        format!("http://{}/", self.addr).parse().unwrap()
    }

    /// Faults for the next requests, in order.
    pub fn script(&self, faults: impl IntoIterator<Item = BankFault>) {
        self.state.lock().unwrap().script.extend(faults);
    }

    pub fn always(&self, fault: Option<BankFault>) {
        self.state.lock().unwrap().always = fault;
    }

    pub fn effective_payouts(&self) -> usize {
        self.state.lock().unwrap().payouts.len()
    }

    pub fn requests(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn arrivals(&self) -> Vec<time::OffsetDateTime> {
        self.state.lock().unwrap().arrivals.clone()
    }

    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().authorizations.clone()
    }

    /// Makes the lookup list a payment under `reference`, as if the bank held it.
    pub fn hold(&self, reference: &str, id: &str, status: &str, amount: &str, currency: &str) {
        self.state.lock().unwrap().held.push((
            reference.to_owned(),
            serde_json::json!({"paymentId": id, "status": status, "amount": amount, "currency": currency, "reference": reference}),
        ));
    }

    /// The next `n` lookups answer 503.
    pub fn fail_lookups(&self, n: usize) {
        self.state.lock().unwrap().failing_lookups = n;
    }

    pub fn lookups(&self) -> usize {
        self.state.lock().unwrap().lookups
    }

    pub fn payout_for(&self, key: &str) -> Option<(String, String)> {
        self.state.lock().unwrap().payouts.get(key).cloned()
    }
}

async fn pay(
    State(state): State<Arc<Mutex<BankState>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let fault = {
        let mut s = state.lock().unwrap();
        s.requests.push((key.clone(), body.clone()));
        s.arrivals.push(time::OffsetDateTime::now_utc());
        s.authorizations.push(
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        );
        s.script.pop_front().or_else(|| s.always.clone())
    };
    match fault {
        Some(BankFault::Unavailable) => {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response()
        }
        Some(BankFault::Throttled) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "0")],
                "slow down",
            )
                .into_response()
        }
        Some(BankFault::Reject) => {
            return (StatusCode::BAD_REQUEST, "payee account closed").into_response()
        }
        Some(BankFault::Status(status)) => {
            return (StatusCode::from_u16(status).unwrap(), "refused").into_response()
        }
        Some(BankFault::ThrottledFor(after)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", after)],
                "slow down",
            )
                .into_response()
        }
        Some(BankFault::Slow(d)) => tokio::time::sleep(d).await,
        Some(BankFault::LoseAnswer) | None => {}
    }
    let answer = {
        let mut s = state.lock().unwrap();
        match s.payouts.get(&key) {
            Some((stored, _)) if stored != &body => Err(()),
            Some((_, id)) => Ok(id.clone()),
            None => {
                let id = format!("pay-{}", s.payouts.len() + 1);
                s.payouts.insert(key.clone(), (body.clone(), id.clone()));
                Ok(id)
            }
        }
    };
    if fault == Some(BankFault::LoseAnswer) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    match answer {
        Ok(id) => (
            StatusCode::CREATED,
            Json(serde_json::json!({"paymentId": id})),
        )
            .into_response(),
        Err(()) => (StatusCode::UNPROCESSABLE_ENTITY, "same key, different body").into_response(),
    }
}

#[derive(serde::Deserialize)]
struct LookupQuery {
    reference: String,
}

/// `GET /payments?reference=`: the effective payouts whose body carries the reference,
/// and whatever `hold` added.
async fn lookup(
    State(state): State<Arc<Mutex<BankState>>>,
    Query(q): Query<LookupQuery>,
) -> Response {
    let mut s = state.lock().unwrap();
    s.lookups += 1;
    if s.failing_lookups > 0 {
        s.failing_lookups -= 1;
        return (StatusCode::SERVICE_UNAVAILABLE, "lookup down").into_response();
    }
    let mut found: Vec<serde_json::Value> = s
        .payouts
        .values()
        .filter_map(|(body, id)| {
            let body: serde_json::Value = serde_json::from_str(body).ok()?;
            (body["reference"] == q.reference.as_str()).then(|| {
                serde_json::json!({"paymentId": id, "status": "paid", "amount": body["amount"], "currency": body["currency"], "reference": q.reference})
            })
        })
        .collect();
    found.extend(
        s.held
            .iter()
            .filter(|(r, _)| *r == q.reference)
            .map(|(_, v)| v.clone()),
    );
    Json(found).into_response()
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
