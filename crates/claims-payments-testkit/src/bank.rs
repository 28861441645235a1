//! The one fake bank of the workspace: a payment provider's payout API, with
//! idempotency keys and faults. The product's tests, the simulator, the benchmark and
//! `claims-payments-dev sandbox-bank` all run this bank.
//!
//! It behaves like a real provider so the service's payout client is tested against
//! the contract, not against a mock that agrees with it:
//! - `POST /payments` with an `Idempotency-Key` header and a JSON body
//!   `{"claimId","amount" (string),"currency","payee"}` pays once per key and answers
//!   201 `{"paymentId":"..."}`;
//! - a replay of the key with the same body answers 200 with the same paymentId and
//!   pays nothing; the same key with another body answers 422; the same key while the
//!   first request is still being processed answers 409;
//! - a closed payee account (payee `CLOSED-...`) is refused with 402, for good (and the
//!   refusal is replayed for the key); `payee` may be null (the client sends it so for a
//!   claim without one);
//! - `GET /payments?reference=` lists what the bank holds under a reference: its
//!   payouts, its refusals and whatever a test made it [`FakeBank::hold`];
//! - faults, decided per (key, attempt) from the seed ([`FakeBankSettings`]): 503, 429
//!   with Retry-After, and "answer lost": the payout is made but the client never learns
//!   it (the answer comes after the client's timeout, or the connection is cut
//!   mid-body), or the request stays "processing" past the client's timeout before it
//!   pays;
//! - faults a test scripts for the next requests ([`FakeBank::script`],
//!   [`FakeBank::always`], [`FakeBank::fail_lookups`], `POST /_control/fail-next`),
//!   applied before the seeded ones.
//!
//! The API is also served under `/clients/{client}/` (`POST /clients/{client}/payments`
//! and the lookup), so that each caller configured with its own base URL is known by
//! name, the way a bank sees which host a request came from; the mid-payout fault
//! hands that name to the simulator, which kills the caller.
//!
//! It keeps three records: every request as it arrived (key, body, `Authorization`,
//! time), every answer (key, body bytes, what was answered) and every effective payout
//! (one per key). Payouts are made in tasks detached from the HTTP
//! request, so a client that hangs up cannot leave a key half processed.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use rust_decimal::Decimal;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::chance;

/// Fault knobs. Rates are probabilities per request.
#[derive(Debug, Clone)]
pub struct FakeBankSettings {
    pub seed: u64,
    pub error_5xx_rate: f64,
    pub rate_429: f64,
    pub lost_answer_rate: f64,
    /// Processing time of a new payout, uniform in `latency_min_ms..=latency_max_ms`.
    pub latency_min_ms: u64,
    pub latency_max_ms: u64,
    /// The service's `BANK_TIMEOUT_MS`: a lost answer arrives this long plus a margin
    /// after the request, i.e. after the client gave up.
    pub client_timeout_ms: u64,
    pub retry_after_secs: u64,
    /// Probability per new payout that the bank pays and then the handler that asked
    /// dies before the answer reaches it (see [`FakeBank::on_mid_payout`]).
    pub kill_mid_payout_rate: f64,
    /// The bank forgets an Idempotency-Key this long after it first saw it: a request
    /// with a forgotten key is a new payout (as at a real provider). `None`: never.
    pub key_window_ms: Option<u64>,
    /// Probability per lookup (`GET /payments?reference=`) of a 503.
    pub lookup_5xx_rate: f64,
}

impl Default for FakeBankSettings {
    fn default() -> Self {
        FakeBankSettings {
            seed: 0,
            error_5xx_rate: 0.0,
            rate_429: 0.0,
            lost_answer_rate: 0.0,
            latency_min_ms: 0,
            latency_max_ms: 0,
            client_timeout_ms: 1_000,
            retry_after_secs: 1,
            kill_mid_payout_rate: 0.0,
            key_window_ms: None,
            lookup_5xx_rate: 0.0,
        }
    }
}

/// One effective payout: money that left the bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    pub payment_id: String,
    pub idempotency_key: String,
    /// The request's `reference` (the service sends its Idempotency-Key).
    pub reference: Option<String>,
    pub claim_id: String,
    pub amount: Decimal,
    pub currency: String,
    pub payee: Option<String>,
}

/// What the bank answered (or did) for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BankAnswer {
    /// 201: a new payout.
    Paid,
    /// 200: the key was paid before; same paymentId, nothing paid.
    Replayed,
    /// 402: the payee account is closed.
    Rejected,
    /// 402 again for a key that was refused before.
    RejectedReplay,
    /// 409: the key is still being processed.
    KeyInProgress,
    /// 422: the key was used with another body.
    KeyReused,
    /// 400: no key, or a body that breaks the contract.
    InvalidRequest,
    /// Injected 503.
    Injected5xx,
    /// Injected 429 with Retry-After.
    Injected429,
    /// Paid, then answered after the client's timeout.
    LostAfterPay,
    /// Paid, then the connection was cut in the middle of the answer.
    CutAfterPay,
    /// Kept "processing" past the client's timeout, then paid.
    LostWhileProcessing,
    /// A status a test scripted ([`BankFault::Reject`], [`BankFault::Status`]); nothing
    /// paid.
    Scripted(u16),
}

impl BankAnswer {
    /// The fault kinds the sandbox injected on purpose.
    pub fn is_injected_fault(&self) -> bool {
        matches!(
            self,
            BankAnswer::Injected5xx
                | BankAnswer::Injected429
                | BankAnswer::LostAfterPay
                | BankAnswer::CutAfterPay
                | BankAnswer::LostWhileProcessing
                | BankAnswer::Scripted(_)
        )
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BankRequest {
    pub idempotency_key: Option<String>,
    #[serde(skip)]
    pub body: Vec<u8>,
    pub answer: BankAnswer,
    /// For replays: whether the body bytes were identical to the first request's
    /// (the service promises to re-send the stored bytes unchanged).
    pub byte_identical: Option<bool>,
}

/// What a test makes the bank do with the next payout request, before the seeded
/// faults and before the request is read.
#[derive(Debug, Clone, PartialEq)]
pub enum BankFault {
    /// 503 without paying.
    Unavailable,
    /// 503 with this Retry-After value, without paying.
    UnavailableFor(String),
    /// 429 with Retry-After: 0, without paying.
    Throttled,
    /// 429 with this Retry-After value, without paying.
    ThrottledFor(String),
    /// Handles the request, then answers after the client's timeout
    /// ([`FakeBankSettings::client_timeout_ms`]): a new key is paid and the client never
    /// learns it.
    LoseAnswer,
    /// 400: a definite rejection, without paying.
    Reject,
    /// Answers this status without paying (401, 404, 402, ...).
    Status(u16),
    /// Waits this long before handling the request normally (the bank has not seen
    /// the key yet while it waits).
    Slow(Duration),
}

/// A request as it arrived, before the bank did anything with it.
#[derive(Debug, Clone)]
struct Arrival {
    idempotency_key: Option<String>,
    body: Vec<u8>,
    authorization: Option<String>,
    /// The W3C trace context the caller sent (`traceparent`).
    traceparent: Option<String>,
    at: time::OffsetDateTime,
}

/// Everything the bank saw and did.
#[derive(Debug, Clone, Default)]
pub struct BankLedger {
    pub payouts: Vec<Payout>,
    pub requests: Vec<BankRequest>,
}

#[derive(Debug, Clone)]
enum KeyState {
    Processing,
    Paid(String),
    Rejected,
}

#[derive(Debug)]
struct KeyEntry {
    request: serde_json::Value,
    body: Vec<u8>,
    state: KeyState,
    first_seen: std::time::Instant,
}

#[derive(Debug, Default)]
struct Books {
    keys: HashMap<String, KeyEntry>,
    attempts: HashMap<String, u64>,
    lookups: u64,
    /// Faults for the next payout requests, in order.
    script: VecDeque<BankFault>,
    /// Applied to every payout request once the script is empty.
    always: Option<BankFault>,
    /// Lookups still to answer 503, before the seeded lookup faults.
    failing_lookups: u64,
    /// Payments the lookup lists beyond the bank's own: (reference, entry).
    held: Vec<(String, serde_json::Value)>,
    /// Keys forgotten after the key window, and how often a forgotten key came back.
    forgotten_keys: u64,
    arrivals: Vec<Arrival>,
    payouts: Vec<Payout>,
    requests: Vec<BankRequest>,
}

/// Called with the Idempotency-Key and the caller's client name (`None` for a request
/// to the plain `/payments`) while the bank holds a payout it has made, before
/// answering.
pub type MidPayoutHook = Arc<dyn Fn(&str, Option<&str>) + Send + Sync>;

struct Bank {
    settings: FakeBankSettings,
    books: Mutex<Books>,
    mid_payout: Mutex<Option<MidPayoutHook>>,
}

impl std::fmt::Debug for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bank")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Bank {
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(
        &self,
        key: Option<&str>,
        body: &[u8],
        answer: BankAnswer,
        byte_identical: Option<bool>,
    ) {
        self.books().requests.push(BankRequest {
            idempotency_key: key.map(str::to_owned),
            body: body.to_vec(),
            answer,
            byte_identical,
        });
    }

    /// Makes the payout for `key` (which must be Processing) and returns its id.
    fn pay(&self, key: &str, request: &ValidRequest) -> String {
        let mut books = self.books();
        let payment_id = format!("pay-{}", books.payouts.len() + 1);
        books.payouts.push(Payout {
            payment_id: payment_id.clone(),
            idempotency_key: key.to_owned(),
            reference: request.reference.clone(),
            claim_id: request.claim_id.clone(),
            amount: request.amount,
            currency: request.currency.clone(),
            payee: request.payee.clone(),
        });
        if let Some(entry) = books.keys.get_mut(key) {
            entry.state = KeyState::Paid(payment_id.clone());
        }
        payment_id
    }
}

/// A running fake bank on a loopback port. Stops when dropped.
pub struct FakeBank {
    addr: SocketAddr,
    bank: Arc<Bank>,
    server: JoinHandle<()>,
}

impl Drop for FakeBank {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeBank {
    /// A bank without seeded faults on any free port: what a test scripts is all that
    /// goes wrong.
    pub async fn start() -> FakeBank {
        Self::start_with(FakeBankSettings::default())
            .await
            .expect("the fake bank binds a loopback port")
    }

    pub async fn start_with(settings: FakeBankSettings) -> anyhow::Result<FakeBank> {
        Self::start_on(settings, 0).await
    }

    /// Starts on a given loopback port (0: any), for `claims-payments-dev sandbox-bank`.
    pub async fn start_on(settings: FakeBankSettings, port: u16) -> anyhow::Result<FakeBank> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let bank = Arc::new(Bank {
            settings,
            books: Mutex::new(Books::default()),
            mid_payout: Mutex::new(None),
        });
        let app = Router::new()
            .route("/payments", post(payments).get(lookup))
            .route("/_control/fail-next", post(fail_next))
            .route("/_control/payouts", axum::routing::get(payouts_of_claim))
            .route(
                "/clients/{client}/payments",
                post(client_payments).get(client_lookup),
            )
            .with_state(bank.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "fake bank stopped");
            }
        });
        Ok(FakeBank { addr, bank, server })
    }

    /// What a mid-payout fault does while the bank holds the request: the simulator
    /// kills the handler process that sent it (named by its client, see
    /// [`FakeBank::client_url`]).
    pub fn on_mid_payout(&self, hook: MidPayoutHook) {
        if let Ok(mut slot) = self.bank.mid_payout.lock() {
            *slot = Some(hook);
        }
    }

    /// The base URL to give the service as `BANK_API_URL` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The same API under `/clients/<client>`: a `BANK_API_URL` by which the bank knows
    /// the caller as `client` (letters, digits, `-`, `.` and `_`).
    pub fn client_url(&self, client: &str) -> String {
        format!("http://{}/clients/{client}", self.addr)
    }

    pub fn ledger(&self) -> BankLedger {
        let books = self.bank.books();
        BankLedger {
            payouts: books.payouts.clone(),
            requests: books.requests.clone(),
        }
    }

    /// Faults for the next payout requests, in order, after those already scripted.
    pub fn script(&self, faults: impl IntoIterator<Item = BankFault>) {
        self.bank.books().script.extend(faults);
    }

    /// A fault for every payout request once the script is empty (`None`: no more).
    pub fn always(&self, fault: Option<BankFault>) {
        self.bank.books().always = fault;
    }

    /// The next `n` lookups answer 503.
    pub fn fail_lookups(&self, n: usize) {
        self.bank.books().failing_lookups = n as u64;
    }

    /// Makes the lookup list a payment under `reference`, as if the bank held it.
    pub fn hold(&self, reference: &str, id: &str, status: &str, amount: &str, currency: &str) {
        self.bank.books().held.push((
            reference.to_owned(),
            serde_json::json!({"paymentId": id, "status": status, "amount": amount, "currency": currency, "reference": reference}),
        ));
    }

    /// Makes the lookup for `listed_under` list `entry` exactly as given: an entry of a
    /// hostile or sloppy bank (a reference in other letter case, none at all, another one).
    pub fn hold_entry(&self, listed_under: &str, entry: serde_json::Value) {
        self.bank
            .books()
            .held
            .push((listed_under.to_owned(), entry));
    }

    /// Money that left the bank: one payout per key (per key window).
    pub fn effective_payouts(&self) -> usize {
        self.bank.books().payouts.len()
    }

    /// Every payout request as it arrived, answered yet or not: (Idempotency-Key or
    /// "", body).
    pub fn requests(&self) -> Vec<(String, String)> {
        self.bank
            .books()
            .arrivals
            .iter()
            .map(|a| {
                (
                    a.idempotency_key.clone().unwrap_or_default(),
                    String::from_utf8_lossy(&a.body).into_owned(),
                )
            })
            .collect()
    }

    /// When each payout request arrived, in the order of [`FakeBank::requests`].
    pub fn arrivals(&self) -> Vec<time::OffsetDateTime> {
        self.bank.books().arrivals.iter().map(|a| a.at).collect()
    }

    /// The `Authorization` header of each payout request, in the same order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.bank
            .books()
            .arrivals
            .iter()
            .map(|a| a.authorization.clone())
            .collect()
    }

    /// The `traceparent` header of each payout request, in the same order.
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.bank
            .books()
            .arrivals
            .iter()
            .map(|a| a.traceparent.clone())
            .collect()
    }

    /// How many lookups (`GET /payments?reference=`) the bank was asked.
    pub fn lookups(&self) -> usize {
        self.bank.books().lookups as usize
    }

    /// Whether the bank is still processing the first request under `key` (a request
    /// with that key now is answered 409).
    pub fn processing(&self, key: &str) -> bool {
        self.bank
            .books()
            .keys
            .get(key)
            .is_some_and(|e| matches!(e.state, KeyState::Processing))
    }

    /// The payout made under `key`: (the first request's body, payment id).
    pub fn payout_for(&self, key: &str) -> Option<(String, String)> {
        let books = self.bank.books();
        let entry = books.keys.get(key)?;
        match &entry.state {
            KeyState::Paid(id) => Some((
                String::from_utf8_lossy(&entry.body).into_owned(),
                id.clone(),
            )),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct ValidRequest {
    claim_id: String,
    amount: Decimal,
    currency: String,
    payee: Option<String>,
    reference: Option<String>,
}

fn validate(body: &[u8]) -> Result<(serde_json::Value, ValidRequest), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let field = |name: &str| -> Result<String, String> {
        match value.get(name) {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(serde_json::Value::String(_)) => Err(format!("{name} is empty")),
            Some(other) => Err(format!("{name} must be a string, got {other}")),
            None => Err(format!("{name} is missing")),
        }
    };
    let claim_id = field("claimId")?;
    uuid::Uuid::try_parse(&claim_id).map_err(|_| format!("claimId {claim_id:?} is not a UUID"))?;
    let amount_text = field("amount")?;
    let amount = Decimal::from_str(&amount_text)
        .map_err(|_| format!("amount {amount_text:?} is not a decimal string"))?;
    if amount <= Decimal::ZERO || amount.normalize().scale() > 2 {
        return Err(format!(
            "amount {amount_text} must be positive with at most 2 fraction digits"
        ));
    }
    let currency = field("currency")?;
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("currency {currency:?} is not an ISO 4217 code"));
    }
    let payee = match value.get("payee") {
        None | Some(serde_json::Value::Null) => None,
        Some(_) => Some(field("payee")?),
    };
    let reference = match value.get("reference") {
        None => None,
        Some(_) => Some(field("reference")?),
    };
    Ok((
        value,
        ValidRequest {
            claim_id,
            amount,
            currency,
            payee,
            reference,
        },
    ))
}

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (status, axum::Json(value)).into_response()
}

fn error(status: StatusCode, message: &str, code: &str) -> Response {
    json(status, serde_json::json!({"error": message, "code": code}))
}

enum Step {
    New,
    Replay(String),
    RejectedReplay,
    InProgress,
    Reused,
}

async fn payments(State(bank): State<Arc<Bank>>, headers: HeaderMap, body: Bytes) -> Response {
    pay_request(bank, None, headers, body).await
}

async fn client_payments(
    State(bank): State<Arc<Bank>>,
    Path(client): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    pay_request(bank, Some(client), headers, body).await
}

async fn client_lookup(
    State(bank): State<Arc<Bank>>,
    Path(_client): Path<String>,
    query: Query<LookupQuery>,
) -> Response {
    lookup(State(bank), query).await
}

async fn pay_request(
    bank: Arc<Bank>,
    client: Option<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (fault, key) = {
        let mut books = bank.books();
        books.arrivals.push(Arrival {
            idempotency_key: header("idempotency-key"),
            body: body.to_vec(),
            authorization: header("authorization"),
            traceparent: header("traceparent"),
            at: time::OffsetDateTime::now_utc(),
        });
        let fault = books.script.pop_front().or_else(|| books.always.clone());
        let key = header("idempotency-key")
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty() && k.len() <= 255);
        (fault, key)
    };
    let s = &bank.settings;
    let past_timeout = Duration::from_millis(s.client_timeout_ms + 200);
    let scripted = |answer: BankAnswer, status: StatusCode, retry_after: Option<&str>| {
        bank.record(key.as_deref(), &body, answer, None);
        let (message, code) = match status {
            StatusCode::SERVICE_UNAVAILABLE => ("payment engine unavailable", "unavailable"),
            StatusCode::TOO_MANY_REQUESTS => ("slow down", "rate_limited"),
            _ => ("scripted by the test", "scripted"),
        };
        let mut response = error(status, message, code);
        if let Some(after) = retry_after.and_then(|a| header::HeaderValue::from_str(a).ok()) {
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        response
    };
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let throttled = StatusCode::TOO_MANY_REQUESTS;
    let mut lose_answer = false;
    match &fault {
        Some(BankFault::Unavailable) => {
            return scripted(BankAnswer::Injected5xx, unavailable, None)
        }
        Some(BankFault::UnavailableFor(after)) => {
            return scripted(BankAnswer::Injected5xx, unavailable, Some(after))
        }
        Some(BankFault::Throttled) => {
            return scripted(BankAnswer::Injected429, throttled, Some("0"))
        }
        Some(BankFault::ThrottledFor(after)) => {
            return scripted(BankAnswer::Injected429, throttled, Some(after))
        }
        Some(BankFault::Reject) => {
            return scripted(BankAnswer::Scripted(400), StatusCode::BAD_REQUEST, None)
        }
        Some(BankFault::Status(status)) => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::IM_A_TEAPOT);
            return scripted(BankAnswer::Scripted(*status), code, None);
        }
        Some(BankFault::Slow(wait)) => tokio::time::sleep(*wait).await,
        Some(BankFault::LoseAnswer) => lose_answer = true,
        None => {}
    }
    let Some(key) = key else {
        bank.record(None, &body, BankAnswer::InvalidRequest, None);
        return error(
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key header (1 to 255 characters) is required",
            "idempotency_key_missing",
        );
    };
    let attempt = {
        let mut books = bank.books();
        let n = books.attempts.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let k = key.as_bytes();

    if chance::hit(s.error_5xx_rate, s.seed, "bank-5xx", k, attempt) {
        bank.record(Some(&key), &body, BankAnswer::Injected5xx, None);
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "payment engine unavailable",
            "unavailable",
        );
    }
    if chance::hit(s.rate_429, s.seed, "bank-429", k, attempt) {
        bank.record(Some(&key), &body, BankAnswer::Injected429, None);
        let mut response = error(StatusCode::TOO_MANY_REQUESTS, "slow down", "rate_limited");
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(s.retry_after_secs),
        );
        return response;
    }

    let (value, request) = match validate(&body) {
        Ok(ok) => ok,
        Err(problem) => {
            bank.record(Some(&key), &body, BankAnswer::InvalidRequest, None);
            return error(StatusCode::BAD_REQUEST, &problem, "invalid_request");
        }
    };

    let (step, identical) = {
        let mut books = bank.books();
        // Past its window the bank has forgotten the key: the request is a new payout.
        let forget = s.key_window_ms.is_some_and(|window| {
            books.keys.get(&key).is_some_and(|e| {
                !matches!(e.state, KeyState::Processing)
                    && e.first_seen.elapsed() >= Duration::from_millis(window)
            })
        });
        if forget {
            books.keys.remove(&key);
            books.forgotten_keys += 1;
        }
        match books.keys.get(&key) {
            Some(entry) if entry.request != value => (Step::Reused, None),
            Some(entry) => {
                let identical = Some(entry.body == body.as_ref());
                match &entry.state {
                    KeyState::Processing => (Step::InProgress, identical),
                    KeyState::Paid(id) => (Step::Replay(id.clone()), identical),
                    KeyState::Rejected => (Step::RejectedReplay, identical),
                }
            }
            None => {
                books.keys.insert(
                    key.clone(),
                    KeyEntry {
                        request: value,
                        body: body.to_vec(),
                        state: KeyState::Processing,
                        first_seen: std::time::Instant::now(),
                    },
                );
                (Step::New, None)
            }
        }
    };

    if let Step::New = step {
        return process_new(bank, key, body, request, attempt, client, lose_answer).await;
    }
    let response = match step {
        Step::Reused => {
            bank.record(Some(&key), &body, BankAnswer::KeyReused, Some(false));
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this Idempotency-Key was used with a different request body",
                "idempotency_key_reused",
            )
        }
        Step::InProgress => {
            bank.record(Some(&key), &body, BankAnswer::KeyInProgress, identical);
            error(
                StatusCode::CONFLICT,
                "a request with this Idempotency-Key is still being processed",
                "idempotency_key_in_use",
            )
        }
        Step::Replay(payment_id) => {
            bank.record(Some(&key), &body, BankAnswer::Replayed, identical);
            let mut response = json(
                StatusCode::OK,
                serde_json::json!({"paymentId": payment_id, "status": "paid"}),
            );
            response.headers_mut().insert(
                "idempotent-replayed",
                header::HeaderValue::from_static("true"),
            );
            response
        }
        Step::RejectedReplay => {
            bank.record(Some(&key), &body, BankAnswer::RejectedReplay, identical);
            error(
                StatusCode::PAYMENT_REQUIRED,
                "payee account closed",
                "account_closed",
            )
        }
        Step::New => unreachable!("handled above"),
    };
    if lose_answer {
        tokio::time::sleep(past_timeout).await;
    }
    response
}

#[derive(serde::Deserialize)]
struct FailNext {
    count: u64,
}

/// Test control: the next `count` payout requests answer 503 and pay nothing (what was
/// scripted before is replaced). The 503 says how long the outage lasts (Retry-After): a
/// client honours it, so each request of the service meets exactly one of the failures.
async fn fail_next(State(bank): State<Arc<Bank>>, axum::Json(f): axum::Json<FailNext>) -> Response {
    let after = BankFault::UnavailableFor(bank.settings.retry_after_secs.to_string());
    bank.books().script = std::iter::repeat_n(after, f.count as usize).collect();
    json(StatusCode::OK, serde_json::json!({"failNext": f.count}))
}

#[derive(serde::Deserialize)]
struct ClaimQuery {
    #[serde(rename = "claimId")]
    claim_id: String,
}

/// Test control: how many payouts the bank made for a claim.
async fn payouts_of_claim(State(bank): State<Arc<Bank>>, Query(q): Query<ClaimQuery>) -> Response {
    let count = bank
        .books()
        .payouts
        .iter()
        .filter(|p| p.claim_id == q.claim_id)
        .count();
    json(StatusCode::OK, serde_json::json!({"count": count}))
}

#[derive(serde::Deserialize)]
struct LookupQuery {
    reference: Option<String>,
}

/// `GET /payments?reference=`: every payment the bank holds under that reference,
/// paid or refused, whether or not it still remembers the Idempotency-Key.
async fn lookup(State(bank): State<Arc<Bank>>, Query(q): Query<LookupQuery>) -> Response {
    let Some(reference) = q.reference.filter(|r| !r.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the reference query parameter is required",
            "invalid_request",
        );
    };
    let s = &bank.settings;
    let (n, failing) = {
        let mut books = bank.books();
        books.lookups += 1;
        let failing = books.failing_lookups > 0;
        books.failing_lookups = books.failing_lookups.saturating_sub(1);
        (books.lookups, failing)
    };
    if failing
        || chance::hit(
            s.lookup_5xx_rate,
            s.seed,
            "bank-lookup-5xx",
            reference.as_bytes(),
            n,
        )
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "lookup unavailable",
            "unavailable",
        );
    }
    let books = bank.books();
    let mut held: Vec<serde_json::Value> = books
        .payouts
        .iter()
        .filter(|p| p.reference.as_deref() == Some(reference.as_str()))
        .map(|p| {
            serde_json::json!({
                "paymentId": p.payment_id, "status": "paid", "amount": p.amount.to_string(),
                "currency": p.currency, "reference": reference,
            })
        })
        .collect();
    for (key, entry) in &books.keys {
        if matches!(entry.state, KeyState::Rejected)
            && entry.request["reference"] == reference.as_str()
        {
            held.push(serde_json::json!({
                "paymentId": format!("rej_{key}"), "status": "rejected",
                "amount": entry.request["amount"], "currency": entry.request["currency"],
                "reference": reference,
            }));
        }
    }
    held.extend(
        books
            .held
            .iter()
            .filter(|(r, _)| *r == reference)
            .map(|(_, v)| v.clone()),
    );
    json(StatusCode::OK, serde_json::Value::Array(held))
}

/// Processes a first request for a key. The work runs in its own task so it always
/// finishes (and the key never stays "processing") even if the client hangs up.
async fn process_new(
    bank: Arc<Bank>,
    key: String,
    body: Bytes,
    request: ValidRequest,
    attempt: u64,
    client: Option<String>,
    lose_answer: bool,
) -> Response {
    let s = bank.settings.clone();
    let k = key.as_bytes().to_vec();
    let spread = s.latency_max_ms.saturating_sub(s.latency_min_ms);
    let latency = s.latency_min_ms + chance::upto(spread, s.seed, "bank-latency", &k, attempt);
    let lost = !lose_answer && chance::hit(s.lost_answer_rate, s.seed, "bank-lost", &k, attempt);
    let lost_mode = chance::upto(2, s.seed, "bank-lost-mode", &k, attempt);
    let past_timeout = Duration::from_millis(s.client_timeout_ms + 200);
    let mid_payout = chance::hit(
        s.kill_mid_payout_rate,
        s.seed,
        "bank-kill-mid-payout",
        &k,
        attempt,
    )
    .then(|| bank.mid_payout.lock().ok().and_then(|h| h.clone()))
    .flatten();

    let work = tokio::spawn(async move {
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if request
            .payee
            .as_deref()
            .is_some_and(|p| p.starts_with("CLOSED"))
        {
            if let Some(entry) = bank.books().keys.get_mut(&key) {
                entry.state = KeyState::Rejected;
            }
            bank.record(Some(&key), &body, BankAnswer::Rejected, None);
            return error(
                StatusCode::PAYMENT_REQUIRED,
                "payee account closed",
                "account_closed",
            );
        }
        if lost && lost_mode == 0 {
            // Still "processing" when the client gives up; its retries meet 409.
            tokio::time::sleep(past_timeout).await;
            let id = bank.pay(&key, &request);
            bank.record(Some(&key), &body, BankAnswer::LostWhileProcessing, None);
            return paid(&id);
        }
        let id = bank.pay(&key, &request);
        if let Some(kill) = mid_payout {
            // The money moved; the handler that asked dies before it hears so.
            bank.record(Some(&key), &body, BankAnswer::LostAfterPay, None);
            kill(&key, client.as_deref());
            tokio::time::sleep(past_timeout).await;
            return paid(&id);
        }
        if lose_answer || (lost && lost_mode == 1) {
            bank.record(Some(&key), &body, BankAnswer::LostAfterPay, None);
            tokio::time::sleep(past_timeout).await;
            return paid(&id);
        }
        if lost {
            bank.record(Some(&key), &body, BankAnswer::CutAfterPay, None);
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"{\"paymentId\":\"pay-")),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "sandbox bank cut the connection",
                )),
            ];
            return Response::builder()
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        bank.record(Some(&key), &body, BankAnswer::Paid, None);
        paid(&id)
    });
    work.await
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn paid(payment_id: &str) -> Response {
    json(
        StatusCode::CREATED,
        serde_json::json!({"paymentId": payment_id, "status": "paid"}),
    )
}
