//! The simulated bank behind the product's own bank client (`BankTransport`), on the
//! contract the test kit's bank keeps: it honours an Idempotency-Key for its key window,
//! answers a key still being processed with 409, refuses closed accounts, lists payments
//! by reference, and holds the ground truth of what was paid. As a real provider, a slow
//! payout is booked when its processing ends, which may be minutes after the client
//! gave up waiting; until then the lookup lists it as pending. A lagging lookup
//! answers from a view of the books minutes to hours old. Its faults are the run's bank
//! faults (a lookup's drawn before a dark bank refuses the call); its clock is the true
//! one, and dates every answer (`Date`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use claims_payments::seams::bank::transport::{
    BankAnswer, BankCall, BankTransport, BodyFailure, TransportFailure,
};
use tokio::time::Instant;

use super::chaos::Chaos;
use super::faults::Fault;

/// One payout the bank made: what counts as money that left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payout {
    pub payment_id: String,
    pub claim_id: String,
    pub amount: String,
    pub currency: String,
    pub payee: Option<String>,
    pub reference: String,
    pub key: String,
    /// The request's body as the bank received it.
    pub body: String,
    pub at_ms: u64,
}

/// A payout the bank refused for good (a closed account): the only ground for a
/// `rejected` payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub claim_id: String,
    pub key: String,
}

#[derive(Debug, Clone)]
enum Kept {
    Paid { payment_id: String },
    Refused,
}

/// One payout request the bank took on under a key: booked (paid or refused) at
/// `booked_at`, pending until then, listed by the lookup under its reference either way.
#[derive(Debug, Clone)]
struct Booking {
    key: String,
    body: String,
    parsed: PayoutBody,
    kept: Kept,
    created: Instant,
    /// Until then the bank is still processing the payout: the key answers 409 and the
    /// lookup lists the payout as pending. It may be long after the client gave up.
    booked_at: Instant,
}

/// What a payout request comes to, decided under the ledger's lock.
enum Step {
    Answer(u16, &'static str),
    Lost,
    Kept(Kept),
}

#[derive(Default)]
struct Ledger {
    bookings: Vec<Booking>,
    /// Key -> its booking, while the bank remembers the key.
    keys: BTreeMap<String, usize>,
    /// Reference (lower case) -> its bookings, for ever.
    by_reference: BTreeMap<String, Vec<usize>>,
    /// Bookings still being processed, by when they are booked.
    due: BTreeSet<(Instant, usize)>,
    payouts: Vec<Payout>,
    /// The claims `payouts` paid, to find a second payout without scanning them all.
    paid_claims: HashSet<String>,
    refusals: Vec<Refusal>,
    next_id: u64,
    /// Second payouts of one claim, found the moment they were made.
    double_payments: Vec<String>,
}

pub struct SimBank {
    ledger: Mutex<Ledger>,
    /// Until then no request reaches the bank.
    dark_until: Mutex<Option<Instant>>,
    /// A dark period that begins inside the next payout: booked, its answer never sent.
    dark_armed: Mutex<Option<Duration>>,
    /// Told when an armed dark period began.
    went_dark: tokio::sync::Notify,
    chaos: Chaos,
    start: Instant,
    /// The client's per-request timeout: an answer later than it is never seen.
    timeout: Duration,
    key_window: Duration,
}

/// The body fields the bank reads.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PayoutBody {
    claim_id: String,
    amount: String,
    currency: String,
    payee: Option<String>,
    reference: String,
}

fn answer(status: u16, body: String) -> Result<BankAnswer, TransportFailure> {
    Ok(BankAnswer {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        headers: HeaderMap::new(),
        body: Ok(body.into_bytes()),
    })
}

impl SimBank {
    pub fn new(chaos: Chaos, start: Instant, timeout: Duration, key_window: Duration) -> Arc<Self> {
        Arc::new(SimBank {
            ledger: Mutex::new(Ledger::default()),
            dark_until: Mutex::new(None),
            dark_armed: Mutex::new(None),
            went_dark: tokio::sync::Notify::new(),
            chaos,
            start,
            timeout,
            key_window,
        })
    }

    /// The books, with every payout whose processing ended by now booked.
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some(&(at, i)) = ledger.due.first() {
            if at > now {
                break;
            }
            ledger.due.pop_first();
            self.book(&mut ledger, i);
        }
        ledger
    }

    /// Makes booking `i` take effect: money leaves, or the refusal is final.
    fn book(&self, ledger: &mut Ledger, i: usize) {
        let b = ledger.bookings[i].clone();
        match &b.kept {
            Kept::Refused => ledger.refusals.push(Refusal {
                claim_id: b.parsed.claim_id.clone(),
                key: b.key.clone(),
            }),
            Kept::Paid { payment_id } => {
                if !ledger.paid_claims.insert(b.parsed.claim_id.clone()) {
                    ledger.double_payments.push(b.parsed.claim_id.clone());
                }
                let at_ms = b
                    .booked_at
                    .saturating_duration_since(self.start)
                    .as_millis() as u64;
                ledger.payouts.push(Payout {
                    payment_id: payment_id.clone(),
                    claim_id: b.parsed.claim_id.clone(),
                    amount: b.parsed.amount.clone(),
                    currency: b.parsed.currency.clone(),
                    payee: b.parsed.payee.clone(),
                    reference: b.parsed.reference.clone(),
                    key: b.key.clone(),
                    body: b.body.clone(),
                    at_ms,
                });
                crate::trace_event!(
                    self.chaos.trace(),
                    "bank paid {payment_id} claim {} {} {} key {} at {at_ms}",
                    b.parsed.claim_id,
                    b.parsed.amount,
                    b.parsed.currency,
                    b.key
                );
            }
        }
    }

    /// How long a slow payout stays in processing: mostly just past the client's
    /// timeout, sometimes minutes (a delivery's whole retry budget and more). Not hours:
    /// a message whose every delivery meets the key in processing is dead-lettered, and
    /// the run could not tell that from a transient cause left over in its calm phase.
    fn processing_time(&self) -> Duration {
        let dice = self.chaos.dice();
        let past = self.timeout + Duration::from_millis(200);
        past + match dice.range(0, 9) {
            0..=5 => dice.millis(0, 10_000),
            _ => dice.millis(10_000, 300_000),
        }
    }

    /// How far behind a lagging lookup is: minutes to hours.
    fn lookup_lag(&self) -> Duration {
        let dice = self.chaos.dice();
        match dice.range(0, 19) {
            0..=9 => dice.millis(1_000, 300_000),
            10..=16 => dice.millis(300_000, 3_600_000),
            _ => dice.millis(3_600_000, 6 * 3_600_000),
        }
    }

    /// No request reaches the bank for `how_long` from now (and a dark period armed for
    /// a payout no longer waits for one).
    pub fn go_dark(&self, how_long: Duration) {
        *self.dark_armed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.dark_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + how_long);
    }

    /// The bank goes dark for `how_long` inside the next payout it books: the outage
    /// takes its front door down after its books took the payout and before the answer
    /// left. Returns once that happened.
    pub async fn go_dark_mid_payout(&self, how_long: Duration) {
        let began = self.went_dark.notified();
        *self.dark_armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(how_long);
        began.await;
    }

    fn is_dark(&self) -> bool {
        self.dark_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// Every payout made, in order.
    pub fn payouts(&self) -> Vec<Payout> {
        self.ledger().payouts.clone()
    }

    /// Claims paid more than once, as found when the second payout was made.
    pub fn double_payments(&self) -> Vec<String> {
        self.ledger().double_payments.clone()
    }

    /// Every payout the bank refused (closed account), in order.
    pub fn refusals(&self) -> Vec<Refusal> {
        self.ledger().refusals.clone()
    }

    /// A network's worth of latency: every bank call is a point where a crash can land.
    async fn latency(&self) {
        let dice = self.chaos.dice();
        tokio::time::sleep(dice.millis(5, 150)).await;
    }

    /// What the client sees of an answer that never comes back in time.
    async fn lost(&self) -> Result<BankAnswer, TransportFailure> {
        tokio::time::sleep(self.timeout).await;
        Err(TransportFailure::TimedOut)
    }

    async fn payout(&self, key: &str, body: &str) -> Result<BankAnswer, TransportFailure> {
        self.latency().await;
        if self.chaos.fires(Fault::BankFailsBefore, key) {
            return match self.chaos.dice().range(0, 2) {
                0 => answer(503, r#"{"code":"unavailable"}"#.into()),
                1 => Ok(BankAnswer {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    headers: HeaderMap::from_iter([(
                        axum::http::header::RETRY_AFTER,
                        HeaderValue::from_static("1"),
                    )]),
                    body: Ok(Vec::new()),
                }),
                _ => Err(TransportFailure::Connection),
            };
        }
        let Ok(parsed) = serde_json::from_str::<PayoutBody>(body) else {
            return answer(400, r#"{"code":"invalid_request"}"#.into());
        };
        let now = Instant::now();
        let processing = self.chaos.fires(Fault::BankSlowProcessing, key);
        let step = {
            let mut ledger = self.ledger();
            let remembered = ledger
                .keys
                .get(key)
                .map(|&i| &ledger.bookings[i])
                .filter(|b| now < b.created + self.key_window);
            match remembered {
                Some(b) if b.body != body => {
                    Step::Answer(422, r#"{"code":"idempotency_key_reused"}"#)
                }
                Some(b) if now < b.booked_at => {
                    Step::Answer(409, r#"{"code":"idempotency_key_in_use"}"#)
                }
                Some(b) => Step::Kept(b.kept.clone()),
                None => {
                    let kept = if parsed
                        .payee
                        .as_deref()
                        .is_some_and(|p| p.starts_with("CLOSED-"))
                    {
                        Kept::Refused
                    } else {
                        ledger.next_id += 1;
                        Kept::Paid {
                            payment_id: format!("pay-{:06}", ledger.next_id),
                        }
                    };
                    let booked_at = if processing {
                        now + self.processing_time()
                    } else {
                        now
                    };
                    let i = ledger.bookings.len();
                    ledger.bookings.push(Booking {
                        key: key.to_owned(),
                        body: body.to_owned(),
                        parsed: parsed.clone(),
                        kept: kept.clone(),
                        created: now,
                        booked_at,
                    });
                    ledger.keys.insert(key.to_owned(), i);
                    ledger
                        .by_reference
                        .entry(parsed.reference.to_ascii_lowercase())
                        .or_default()
                        .push(i);
                    if processing {
                        // Booked once processing ends, long after the client gave up.
                        ledger.due.insert((booked_at, i));
                        Step::Lost
                    } else {
                        self.book(&mut ledger, i);
                        Step::Kept(kept)
                    }
                }
            }
        };
        let kept = match step {
            Step::Answer(status, body) => return answer(status, body.into()),
            Step::Lost => return self.lost().await,
            Step::Kept(kept) => kept,
        };
        let armed = self
            .dark_armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(how_long) = armed {
            crate::trace_event!(self.chaos.trace(), "bank dark mid-payout {key}");
            self.go_dark(how_long);
            self.went_dark.notify_one();
            return Err(TransportFailure::CutOff);
        }
        if self.chaos.fires(Fault::BankFailsAfter, key) {
            return if self.chaos.dice().hit(0.5) {
                answer(500, r#"{"code":"internal"}"#.into())
            } else {
                Err(TransportFailure::CutOff)
            };
        }
        if self.chaos.fires(Fault::BankAnswerLost, key) {
            return self.lost().await;
        }
        if self.chaos.fires(Fault::BankHostileAnswer, key) {
            return match self.chaos.dice().range(0, 3) {
                0 => answer(201, r#"{"paymentId":""}"#.into()),
                1 => Ok(BankAnswer {
                    status: StatusCode::CREATED,
                    headers: HeaderMap::new(),
                    body: Err(BodyFailure::TooLarge),
                }),
                2 => answer(201, r#"{"paymentId":"pay\nment"}"#.into()),
                _ => answer(201, "not json".into()),
            };
        }
        match kept {
            Kept::Paid { payment_id } => answer(201, format!(r#"{{"paymentId":"{payment_id}"}}"#)),
            Kept::Refused => answer(402, r#"{"code":"account_closed"}"#.into()),
        }
    }

    /// What the bank holds under `reference`: every payout and refusal, booked or
    /// still pending. A lagging lookup answers from a view of the books some minutes or
    /// hours old: what was booked since shows as pending, what arrived since not at all.
    async fn lookup(&self, reference: &str) -> Result<BankAnswer, TransportFailure> {
        self.latency().await;
        if self.chaos.fires(Fault::BankLookupFails, reference) {
            return match self.chaos.dice().range(0, 3) {
                0 => answer(500, String::new()),
                1 => answer(200, "[{".into()),
                2 => answer(
                    200,
                    format!(
                        r#"[{{"paymentId":"x","status":"paid","amount":"1.00","currency":"EUR","reference":"{reference}-other"}}]"#
                    ),
                ),
                _ => Err(TransportFailure::TimedOut),
            };
        }
        if self.is_dark() {
            return Err(TransportFailure::Connection);
        }
        let now = Instant::now();
        let seen = if self.chaos.fires(Fault::BankLookupLags, reference) {
            let lag = self.lookup_lag();
            crate::trace_event!(
                self.chaos.trace(),
                "bank lookup {reference} lags {} s",
                lag.as_secs()
            );
            now.checked_sub(lag).unwrap_or(self.start)
        } else {
            now
        };
        let ledger = self.ledger();
        let held = ledger
            .by_reference
            .get(&reference.to_ascii_lowercase())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let entries: Vec<serde_json::Value> = held
            .iter()
            .map(|&i| &ledger.bookings[i])
            .filter(|b| b.created <= seen)
            .map(|b| {
                let (payment_id, booked) = match &b.kept {
                    Kept::Paid { payment_id } => (payment_id.clone(), "paid"),
                    Kept::Refused => (format!("refused-{}", b.parsed.claim_id), "rejected"),
                };
                let status = if b.booked_at <= seen {
                    booked
                } else {
                    "pending"
                };
                serde_json::json!({
                    "paymentId": payment_id, "status": status, "amount": b.parsed.amount,
                    "currency": b.parsed.currency, "reference": b.parsed.reference,
                })
            })
            .collect();
        answer(200, serde_json::Value::Array(entries).to_string())
    }
}

#[async_trait]
impl BankTransport for SimBank {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure> {
        let mut answer = match call {
            // A lookup's own faults are drawn before the dark bank refuses it, so they
            // fire in runs where the bank goes dark too.
            BankCall::Lookup { reference } => self.lookup(reference.as_str()).await,
            BankCall::Payout { .. } if self.is_dark() => {
                self.latency().await;
                Err(TransportFailure::Connection)
            }
            BankCall::Payout { key, body } => self.payout(key.as_str(), body).await,
        }?;
        // Every answer is dated by the bank's clock, in whole seconds (RFC 9110 §6.6.1).
        let date = httpdate::fmt_http_date(super::world::wall_at(self.start).into());
        if let Ok(value) = HeaderValue::from_str(&date) {
            answer.headers.insert(axum::http::header::DATE, value);
        }
        Ok(answer)
    }
}
