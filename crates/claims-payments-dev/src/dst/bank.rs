//! The simulated bank behind the product's own bank client (`BankTransport`): it honours
//! an Idempotency-Key for its key window, answers a key still being processed with 409,
//! refuses closed accounts, lists payments by reference, and holds the ground truth of
//! what was paid. Its faults are the run's bank faults; its clock is the true one, and
//! dates every answer (`Date`).

use std::collections::BTreeMap;
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

#[derive(Debug, Clone)]
struct KeyEntry {
    body: String,
    kept: Kept,
    created: Instant,
    /// Until then the bank is still processing the payout: the key answers 409.
    ready_at: Instant,
}

/// What a payout request comes to, decided under the ledger's lock.
enum Step {
    Answer(u16, &'static str),
    Lost,
    Kept(Kept),
}

#[derive(Default)]
struct Ledger {
    keys: BTreeMap<String, KeyEntry>,
    payouts: Vec<Payout>,
    refusals: Vec<Refusal>,
    next_id: u64,
    /// Second payouts of one claim, found the moment they were made.
    double_payments: Vec<String>,
}

pub struct SimBank {
    ledger: Mutex<Ledger>,
    /// Until then no request reaches the bank.
    dark_until: Mutex<Option<Instant>>,
    chaos: Chaos,
    start: Instant,
    /// The client's per-request timeout: an answer later than it is never seen.
    timeout: Duration,
    key_window: Duration,
}

/// The body fields the bank reads.
#[derive(serde::Deserialize)]
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
            chaos,
            start,
            timeout,
            key_window,
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.start)
            .as_millis() as u64
    }

    /// No request reaches the bank for `how_long` from now.
    pub fn go_dark(&self, how_long: Duration) {
        *self.dark_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + how_long);
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
                .filter(|e| now < e.created + self.key_window)
                .cloned();
            match remembered {
                Some(entry) if entry.body != body => {
                    Step::Answer(422, r#"{"code":"idempotency_key_reused"}"#)
                }
                Some(entry) if now < entry.ready_at => {
                    Step::Answer(409, r#"{"code":"idempotency_key_in_use"}"#)
                }
                Some(entry) => Step::Kept(entry.kept),
                None => {
                    let kept = if parsed
                        .payee
                        .as_deref()
                        .is_some_and(|p| p.starts_with("CLOSED-"))
                    {
                        ledger.refusals.push(Refusal {
                            claim_id: parsed.claim_id.clone(),
                            key: key.to_owned(),
                        });
                        Kept::Refused
                    } else {
                        ledger.next_id += 1;
                        let payment_id = format!("pay-{:06}", ledger.next_id);
                        let at_ms = self.now_ms();
                        if ledger.payouts.iter().any(|p| p.claim_id == parsed.claim_id) {
                            ledger.double_payments.push(parsed.claim_id.clone());
                        }
                        ledger.payouts.push(Payout {
                            payment_id: payment_id.clone(),
                            claim_id: parsed.claim_id.clone(),
                            amount: parsed.amount.clone(),
                            currency: parsed.currency.clone(),
                            payee: parsed.payee.clone(),
                            reference: parsed.reference.clone(),
                            key: key.to_owned(),
                            body: body.to_owned(),
                            at_ms,
                        });
                        crate::trace_event!(
                            self.chaos.trace(),
                            "bank paid {payment_id} claim {} {} {} key {key}",
                            parsed.claim_id,
                            parsed.amount,
                            parsed.currency
                        );
                        Kept::Paid { payment_id }
                    };
                    let ready_at = if processing {
                        now + self.timeout + Duration::from_millis(200)
                    } else {
                        now
                    };
                    ledger.keys.insert(
                        key.to_owned(),
                        KeyEntry {
                            body: body.to_owned(),
                            kept: kept.clone(),
                            created: now,
                            ready_at,
                        },
                    );
                    if processing {
                        Step::Lost
                    } else {
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
        let lags = self.chaos.fires(Fault::BankLookupLags, reference);
        let now_ms = self.now_ms();
        let ledger = self.ledger();
        let mut entries: Vec<serde_json::Value> = ledger
            .payouts
            .iter()
            .filter(|p| p.reference.eq_ignore_ascii_case(reference))
            .filter(|p| !(lags && now_ms.saturating_sub(p.at_ms) < 5_000))
            .map(|p| {
                serde_json::json!({
                    "paymentId": p.payment_id, "status": "paid", "amount": p.amount,
                    "currency": p.currency, "reference": p.reference,
                })
            })
            .collect();
        for Refusal {
            claim_id: claim,
            key,
        } in &ledger.refusals
        {
            if let Some(entry) = ledger.keys.get(key) {
                if let Ok(body) = serde_json::from_str::<PayoutBody>(&entry.body) {
                    if body.reference.eq_ignore_ascii_case(reference) {
                        entries.push(serde_json::json!({
                            "paymentId": format!("refused-{claim}"), "status": "rejected",
                            "amount": body.amount, "currency": body.currency,
                            "reference": body.reference,
                        }));
                    }
                }
            }
        }
        answer(200, serde_json::Value::Array(entries).to_string())
    }
}

#[async_trait]
impl BankTransport for SimBank {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure> {
        if self.is_dark() {
            self.latency().await;
            return Err(TransportFailure::Connection);
        }
        let mut answer = match call {
            BankCall::Payout { key, body } => self.payout(key.as_str(), body).await,
            BankCall::Lookup { reference } => self.lookup(reference.as_str()).await,
        }?;
        // Every answer is dated by the bank's clock, in whole seconds (RFC 9110 §6.6.1).
        let date = httpdate::fmt_http_date(super::world::wall_at(self.start).into());
        if let Ok(value) = HeaderValue::from_str(&date) {
            answer.headers.insert(axum::http::header::DATE, value);
        }
        Ok(answer)
    }
}
