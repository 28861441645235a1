//! The bank payout client.
//!
//! `POST {BANK_API_URL}/payments` with an `Idempotency-Key` derived from tenant, claim
//! and purpose, and a body stored with the payment before the first call and re-sent
//! byte for byte. The bank answers a replayed key with the original result, so a
//! retry, a takeover after a crash, or a redelivery can never pay twice, as long as
//! the request leaves while the bank still remembers the key (its key window).
//!
//! Every answer is classified in one place, `answer::classify`, as the bank contract
//! lists them (docs/reference.md §7, below its table of outcomes). Transient failures are
//! retried with exponential backoff and full jitter inside a [`SendWindow`]: the caller's
//! retry budget, and the end of the key window (no request ever leaves after it). The
//! credential travels in its own header from its own secret setting (`BANK_API_KEY`),
//! never in the URL, and no error this module produces carries a URL.
//!
//! The bank is a peer, not a friend: an answer is read only as far as the contract
//! defines it (status, `paymentId`, the lookup's entries, an error `code` token), and
//! never more than [`MAX_ANSWER_BYTES`] of it. No other text of the bank's is kept,
//! logged, stored or passed on: a bank (or a proxy in front of it) that echoes the
//! request's headers must not carry `BANK_API_KEY` into a reason, a log line or an
//! answer to a client.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, RETRY_AFTER};
use http::StatusCode;
use rust_decimal::Decimal;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::ambient::Ambient;
use crate::domain::IdempotencyKey;
use crate::telemetry;

mod answer;
pub mod clock;
mod settings;
#[cfg(test)]
mod tests;
pub mod transport;

use answer::{read_answer, read_lookup};
use clock::{ClockCheck, Estimate};
pub use settings::BankSettings;
pub use settings::DEFAULT_KEY_WINDOW;
use transport::{BankAnswer, BankCall, BankTransport, BodyFailure, TransportFailure};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The last request under a key leaves this long before the bank's key window ends,
/// so clock skew and a slow network cannot land it after the bank forgot the key.
pub const KEY_WINDOW_MARGIN: Duration = Duration::from_secs(5 * 60);
/// The most of one answer that is read. A payout answer is an id; a lookup lists the
/// few payments under one reference (a few hundred bytes each). Anything larger is not
/// an answer the contract allows, and is never buffered whole.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The longest `paymentId` or error `code` kept from the bank.
const MAX_TOKEN_CHARS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayoutOutcome {
    /// The bank made (or had already made) the payout.
    Paid { payment_id: String },
    /// The bank refused the payment itself (400, 402): final, a person must look.
    Rejected { status: u16, reason: String },
    /// The bank saw this key with a different body (422). Our bug; never resent.
    KeyMismatch { reason: String },
    /// No request may leave any more: the bank's key window is (nearly) over, and
    /// resending could pay twice. Only a lookup at the bank can settle the payment.
    KeyWindowClosed { attempts: u32, last_error: String },
    /// The bank refused the request for a reason that is the service's own fault
    /// (credential, permission, URL, method, format). Not a verdict on the payment.
    ServiceFault { status: u16, reason: String },
    /// Still failing when the budget ran out; the payout may or may not exist yet.
    GaveUp { attempts: u32, last_error: String },
    /// This process's clock is further from the bank's than [`clock::MAX_CLOCK_ERROR`]:
    /// no request left on it (the key window is judged on it). Not a verdict on the payment.
    ClockUntrusted { attempts: u32, reason: String },
}

/// When requests may leave: before the retry budget's deadline (a request that
/// starts before it runs its full timeout), and never after the last moment the bank
/// is sure to remember the key.
#[derive(Debug, Clone, Copy)]
pub struct SendWindow {
    budget_deadline: Instant,
    last_send: OffsetDateTime,
}

impl SendWindow {
    /// The window for a payout first requested at `created_at`.
    pub fn new(budget: Duration, created_at: OffsetDateTime, key_window: Duration) -> Self {
        let margin = KEY_WINDOW_MARGIN.min(key_window / 10);
        SendWindow {
            budget_deadline: Instant::now() + budget,
            last_send: created_at + key_window.saturating_sub(margin),
        }
    }

    fn key_window_open(&self, now: OffsetDateTime) -> bool {
        now < self.last_send
    }
}

/// What the bank says it holds under a reference (`GET /payments?reference=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// An authoritative answer (200 with a JSON array whose every entry the contract
    /// allows, each under our reference): these payments, maybe none.
    Holds(Vec<BankPayment>),
    /// Anything else (5xx, 429, timeouts, an oversized or unreadable body, an entry
    /// without our reference): ask again later. Never read as "not paid", never as "paid".
    Unknown { reason: String },
}

/// How the bank says one payment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BankStatus {
    /// The bank made the payment.
    Paid,
    /// The bank refused it for good.
    Rejected,
    /// Anything else (`pending`, `processing`, a word we do not know): it may still pay.
    Pending,
}

impl std::fmt::Display for BankStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BankStatus::Paid => "paid",
            BankStatus::Rejected => "rejected",
            BankStatus::Pending => "pending",
        })
    }
}

impl BankStatus {
    fn from_word(word: &str) -> Self {
        match word.to_ascii_lowercase().as_str() {
            "paid" | "succeeded" | "completed" | "settled" => BankStatus::Paid,
            "rejected" | "refused" | "failed" => BankStatus::Rejected,
            _ => BankStatus::Pending,
        }
    }
}

/// One payment the bank holds under our reference, as its lookup lists it, read into
/// the contract's types: a token id, a decimal amount, a currency code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BankPayment {
    pub payment_id: String,
    pub status: BankStatus,
    pub amount: Decimal,
    pub currency: String,
}

/// A lookup entry exactly as the contract lists it; every field required.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LookupEntry {
    payment_id: String,
    status: String,
    amount: String,
    currency: String,
    reference: Option<String>,
}

#[derive(Clone)]
pub struct BankClient {
    transport: Arc<dyn BankTransport>,
    timeout: Duration,
    /// The credential's value, only to refuse any bank text that carries it back.
    secret: Option<SecretString>,
    /// The clock of the key window and Retry-After dates, and the backoff's jitter.
    ambient: Ambient,
    /// This clock against the bank's `Date`, shared by the clones of one client.
    clock: Arc<ClockCheck>,
}

/// What one request taught us.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Done(PayoutOutcome),
    Retry {
        error: String,
        /// The bank's Retry-After, already capped (see [`answer::retry_after`]).
        after: Option<Duration>,
    },
}

impl BankClient {
    /// The client on `transport` and `ambient`'s clock: the product's HTTPS transport,
    /// or the deterministic simulator's bank.
    pub fn with_transport(
        settings: &BankSettings,
        transport: Arc<dyn BankTransport>,
        ambient: Ambient,
    ) -> Self {
        BankClient {
            transport,
            timeout: settings.timeout,
            secret: settings.api_key.clone(),
            ambient,
            clock: Arc::default(),
        }
    }

    /// Whether this process's clock is within [`clock::MAX_CLOCK_ERROR`] of the bank's
    /// (see [`clock`]): `Err(why)` when it is not, counted and logged. Asks the bank once
    /// (a lookup under `key`) when no answer has read its clock yet, or when a clock found
    /// beyond the bound was read more than [`clock::REREAD_AFTER`] ago. A bank that
    /// cannot be reached, or sends no `Date`, leaves the clock unchecked.
    pub async fn check_clock(&self, key: &IdempotencyKey) -> Result<(), String> {
        let mut asked = false;
        loop {
            let error = match self.clock.estimate(self.ambient.now()) {
                Estimate::Unchecked => {
                    if self.clock.first_unchecked() {
                        tracing::warn!(
                            event = "clock-unchecked",
                            "the bank's answers carry no Date: this instance's clock cannot be checked against the bank's"
                        );
                    }
                    return Ok(());
                }
                Estimate::Unread if asked => return Ok(()),
                Estimate::Off { error, .. } if !clock::beyond(error) => return Ok(()),
                Estimate::Off { error, fresh } if fresh || asked => error,
                Estimate::Unread | Estimate::Off { .. } => {
                    asked = true;
                    let _ = self.lookup(key).await;
                    continue;
                }
            };
            telemetry::counters().clock_refusals.inc();
            let reason = format!(
                "this instance's clock is {} ms {} the bank's, more than the {} s the key window allows; no payout starts on it",
                error.whole_milliseconds().unsigned_abs(),
                if error.is_positive() { "ahead of" } else { "behind" },
                clock::MAX_CLOCK_ERROR.as_secs()
            );
            tracing::error!(event = "clock-untrusted", idempotencyKey = %key, errorMs = error.whole_milliseconds() as i64, "{reason}");
            return Err(reason);
        }
    }

    /// Sends the payout until the bank gives a definite answer or the window closes.
    /// Every request gets the full `BANK_TIMEOUT_MS`: a shorter one could time out on
    /// a payout the bank makes anyway.
    pub async fn pay(&self, key: &IdempotencyKey, body: &str, window: SendWindow) -> PayoutOutcome {
        let mut attempts = 0u32;
        let mut backoff = FIRST_BACKOFF;
        let mut last_error = String::new();
        loop {
            // Checked before every request, not once: a retry must not leave after the
            // bank may have forgotten the key, nor on a clock that misjudges when that is.
            if let Err(reason) = self.check_clock(key).await {
                return PayoutOutcome::ClockUntrusted { attempts, reason };
            }
            if !window.key_window_open(self.ambient.now()) {
                return PayoutOutcome::KeyWindowClosed {
                    attempts,
                    last_error,
                };
            }
            attempts += 1;
            telemetry::counters().bank_calls.inc();
            let after = match self.attempt(key, body).await {
                Answer::Done(outcome) => {
                    if let PayoutOutcome::ServiceFault { status, reason } = &outcome {
                        telemetry::counters().bank_service_faults.inc();
                        tracing::error!(
                            event = "bank-service-fault",
                            bankStatus = status,
                            idempotencyKey = %key,
                            reason = %reason,
                            "the bank refused the service's request (credential, URL, method or format); the message will be retried"
                        );
                    }
                    return outcome;
                }
                Answer::Retry { error, after } => {
                    last_error = error;
                    after
                }
            };
            let remaining = window
                .budget_deadline
                .saturating_duration_since(Instant::now());
            // Full jitter keeps many instances retrying after one outage from arriving together.
            let jittered = Duration::from_millis(self.ambient.upto(backoff.as_millis() as u64));
            let wait = after.map_or(jittered, |a| a.max(jittered));
            if wait >= remaining {
                return PayoutOutcome::GaveUp {
                    attempts,
                    last_error,
                };
            }
            tracing::warn!(
                idempotencyKey = %key,
                attempt = attempts,
                waitMs = wait.as_millis() as u64,
                error = %last_error,
                "bank payout failed transiently; retrying"
            );
            telemetry::counters().bank_retries.inc();
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Asks the bank which payments it holds under `reference` (our Idempotency-Key).
    /// One request; the caller decides when to ask again.
    pub async fn lookup(&self, reference: &IdempotencyKey) -> Lookup {
        telemetry::counters().bank_lookups.inc();
        let answer = match self.transport.send(BankCall::Lookup { reference }).await {
            Ok(answer) => answer,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("lookup {}", self.transport_failure(e)),
                }
            }
        };
        self.clock.note(&answer.headers, self.ambient.now());
        let status = answer.status;
        match answer.body {
            Ok(body) => read_lookup(status, &body, reference, self.secret()),
            Err(BodyFailure::TooLarge) => Lookup::Unknown {
                reason: format!(
                    "lookup answered {status} with more than {MAX_ANSWER_BYTES} bytes, more than any answer the contract allows"
                ),
            },
            Err(BodyFailure::Transport(e)) => Lookup::Unknown {
                reason: format!("lookup {}", self.transport_failure(e)),
            },
        }
    }

    /// "timed out after N ms" or "failed: connection error", without the URL or any
    /// text of the peer's.
    fn transport_failure(&self, e: TransportFailure) -> String {
        match e {
            TransportFailure::TimedOut => {
                format!("timed out after {} ms", self.timeout.as_millis())
            }
            TransportFailure::CutOff => "failed: the answer was cut off".into(),
            TransportFailure::Connection => "failed: connection error".into(),
        }
    }

    fn secret(&self) -> Option<&str> {
        self.secret.as_ref().map(|s| s.expose_secret())
    }

    async fn attempt(&self, key: &IdempotencyKey, body: &str) -> Answer {
        let answer = match self.transport.send(BankCall::Payout { key, body }).await {
            Ok(answer) => answer,
            // Without the URL: an operator's URL may still carry something private.
            Err(e) => {
                return Answer::Retry {
                    error: self.transport_failure(e),
                    after: None,
                }
            }
        };
        self.clock.note(&answer.headers, self.ambient.now());
        let BankAnswer {
            status,
            headers,
            body,
        } = answer;
        let body = match body {
            Ok(body) => body,
            // An error's body is only read for its code; a success needs its id: ask
            // again (a replay of the key answers with the same id).
            Err(BodyFailure::TooLarge) if !status.is_success() => Vec::new(),
            Err(BodyFailure::TooLarge) => {
                return Answer::Retry {
                    error: format!(
                        "bank answered {status} with more than {MAX_ANSWER_BYTES} bytes"
                    ),
                    after: None,
                }
            }
            Err(BodyFailure::Transport(e)) => {
                return Answer::Retry {
                    error: self.transport_failure(e),
                    after: None,
                }
            }
        };
        read_answer(
            status,
            &headers,
            &body,
            self.ambient.system_time(),
            self.secret(),
        )
    }
}
