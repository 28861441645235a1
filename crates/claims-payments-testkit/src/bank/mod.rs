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
//!
//! Inside, each module uses only those below it: `faults` (at the bottom) decides what
//! goes wrong and when, `ledger` keeps the books (with the fault state in them), `routes`
//! (at the top) serves the HTTP API and gives every answer; this module is the handle
//! tests hold.

mod faults;
mod ledger;
mod routes;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::task::JoinHandle;

pub use faults::BankFault;
pub use ledger::{BankLedger, Payout};

use ledger::{Bank, Books, KeyState};

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

/// Called with the Idempotency-Key and the caller's client name (`None` for a request
/// to the plain `/payments`) while the bank holds a payout it has made, before
/// answering.
pub type MidPayoutHook = Arc<dyn Fn(&str, Option<&str>) + Send + Sync>;

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
        let app = routes::router(bank.clone());
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
        self.bank.books().faults.script.extend(faults);
    }

    /// A fault for every payout request once the script is empty (`None`: no more).
    pub fn always(&self, fault: Option<BankFault>) {
        self.bank.books().faults.always = fault;
    }

    /// The next `n` lookups answer 503.
    pub fn fail_lookups(&self, n: usize) {
        self.bank.books().faults.failing_lookups = n as u64;
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
