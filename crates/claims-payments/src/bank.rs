//! The bank payout client.
//!
//! `POST {BANK_API_URL}/payments` with an `Idempotency-Key` derived from tenant, claim
//! and purpose, and a body stored with the payment before the first call and re-sent
//! byte for byte. The bank answers a replayed key with the original result, so a
//! retry, a takeover after a crash, or a redelivery can never pay twice, as long as
//! the request leaves while the bank still remembers the key (its key window).
//!
//! Every answer is classified in one place, [`classify`], exactly as DESIGN.md §8 lists
//! them. Transient failures are retried with exponential backoff and full jitter inside
//! a [`SendWindow`]: the caller's retry budget, and the end of the key window (no
//! request ever leaves after it). The credential travels in its own header from its
//! own secret setting (`BANK_API_KEY`), never in the URL, and no error this module
//! produces carries a URL.
//!
//! The bank is a peer, not a friend: an answer is read only as far as the contract
//! defines it (status, `paymentId`, the lookup's entries, an error `code` token), and
//! never more than [`MAX_ANSWER_BYTES`] of it. No other text of the bank's is kept,
//! logged, stored or passed on: a bank (or a proxy in front of it) that echoes the
//! request's headers must not carry `BANK_API_KEY` into a reason, a log line or an
//! answer to a client.

use std::time::{Duration, SystemTime};

use rand::RngExt;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use rust_decimal::Decimal;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::config::BankSettings;
use crate::message::IdempotencyKey;
use crate::telemetry;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The last request under a key leaves this long before the bank's key window ends,
/// so clock skew and a slow network cannot land it after the bank forgot the key.
pub(crate) const KEY_WINDOW_MARGIN: Duration = Duration::from_secs(5 * 60);
/// The most of one answer that is read. A payout answer is an id; a lookup lists the
/// few payments under one reference (a few hundred bytes each). Anything larger is not
/// an answer the contract allows, and is never buffered whole.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;
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
}

/// When requests may leave: before the retry budget's deadline (a request that
/// starts before it runs its full timeout), and never after the last moment the bank
/// is sure to remember the key.
#[derive(Debug, Clone, Copy)]
pub struct SendWindow {
    pub budget_deadline: Instant,
    pub last_send: OffsetDateTime,
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

    fn key_window_open(&self) -> bool {
        OffsetDateTime::now_utc() < self.last_send
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
/// the contract's types (DESIGN.md §8): a token id, a decimal amount, a currency code.
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
    http: reqwest::Client,
    payments_url: Url,
    timeout: Duration,
    /// The credential's value, only to refuse any bank text that carries it back.
    secret: Option<SecretString>,
}

/// What one request taught us.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Done(PayoutOutcome),
    Retry {
        error: String,
        /// The bank's Retry-After, already capped (see [`retry_after`]).
        after: Option<Duration>,
    },
}

impl BankClient {
    pub fn new(settings: &BankSettings) -> anyhow::Result<Self> {
        let mut payments_url = settings.url.clone();
        payments_url
            .path_segments_mut()
            .map_err(|_| anyhow::anyhow!("BANK_API_URL cannot be a base URL"))?
            .pop_if_empty()
            .push("payments");
        let mut headers = HeaderMap::new();
        if let Some(key) = &settings.api_key {
            let mut value = HeaderValue::try_from(format!("Bearer {}", key.expose_secret()))
                .map_err(|_| {
                    anyhow::anyhow!("BANK_API_KEY holds characters a header cannot carry")
                })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(settings.timeout.min(Duration::from_secs(5)))
            .pool_idle_timeout(Duration::from_secs(30))
            // A redirect of a payout is a misconfigured URL or proxy; never follow it.
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(BankClient {
            http,
            payments_url,
            timeout: settings.timeout,
            secret: settings.api_key.clone(),
        })
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
            // bank may have forgotten the key.
            if !window.key_window_open() {
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
            let jittered =
                Duration::from_millis(rand::rng().random_range(0..=backoff.as_millis() as u64));
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
        let mut url = self.payments_url.clone();
        url.query_pairs_mut()
            .append_pair("reference", reference.as_str());
        let response =
            telemetry::trace::bank_call("lookup", self.http.get(url).timeout(self.timeout)).await;
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("lookup {}", self.transport_failure(&e)),
                }
            }
        };
        let status = response.status();
        match read_bounded(response).await {
            Ok(body) => read_lookup(status, &body, reference, self.secret()),
            Err(ReadFailure::TooLarge) => Lookup::Unknown {
                reason: format!(
                    "lookup answered {status} with more than {MAX_ANSWER_BYTES} bytes, more than any answer the contract allows"
                ),
            },
            Err(ReadFailure::Transport(e)) => Lookup::Unknown {
                reason: format!("lookup {}", self.transport_failure(&e)),
            },
        }
    }

    /// "timed out after N ms" or "failed: connection error", without the URL or any
    /// text of the peer's.
    fn transport_failure(&self, e: &reqwest::Error) -> String {
        if e.is_timeout() {
            format!("timed out after {} ms", self.timeout.as_millis())
        } else if e.is_body() || e.is_decode() {
            "failed: the answer was cut off".into()
        } else {
            "failed: connection error".into()
        }
    }

    fn secret(&self) -> Option<&str> {
        self.secret.as_ref().map(|s| s.expose_secret())
    }

    async fn attempt(&self, key: &IdempotencyKey, body: &str) -> Answer {
        let request = self
            .http
            .post(self.payments_url.clone())
            .timeout(self.timeout)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("Idempotency-Key", key.as_str())
            .body(body.to_owned());
        // A dependency span carrying traceparent to the bank (only when telemetry is on).
        let response = telemetry::trace::bank_call("payout", request).await;
        let response = match response {
            Ok(r) => r,
            // Without the URL: an operator's URL may still carry something private.
            Err(e) => {
                return Answer::Retry {
                    error: self.transport_failure(&e),
                    after: None,
                }
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let body = match read_bounded(response).await {
            Ok(body) => body,
            // An error's body is only read for its code; a success needs its id: ask
            // again (a replay of the key answers with the same id).
            Err(ReadFailure::TooLarge) if !status.is_success() => Vec::new(),
            Err(ReadFailure::TooLarge) => {
                return Answer::Retry {
                    error: format!(
                        "bank answered {status} with more than {MAX_ANSWER_BYTES} bytes"
                    ),
                    after: None,
                }
            }
            Err(ReadFailure::Transport(e)) => {
                return Answer::Retry {
                    error: self.transport_failure(&e),
                    after: None,
                }
            }
        };
        read_answer(status, &headers, &body, SystemTime::now(), self.secret())
    }
}

enum ReadFailure {
    TooLarge,
    Transport(reqwest::Error),
}

/// Reads at most [`MAX_ANSWER_BYTES`] of an answer, chunk by chunk: a hostile or broken
/// bank cannot make us buffer more than that.
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, ReadFailure> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(ReadFailure::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadFailure::Transport)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ReadFailure::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads one answer of the bank. Pure, and total: no status, header or body can make
/// it panic (a property test feeds it arbitrary ones).
fn read_answer(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    secret: Option<&str>,
) -> Answer {
    let after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, now));
    classify(status, body, after, secret)
}

/// A token the contract lets us keep (`paymentId`, an error `code`): visible ASCII,
/// bounded, and never carrying the credential back.
fn token<'a>(text: &'a str, secret: Option<&str>) -> Option<&'a str> {
    let ok = !text.is_empty()
        && text.len() <= MAX_TOKEN_CHARS
        && text.bytes().all(|b| b.is_ascii_graphic())
        && secret.is_none_or(|s| s.is_empty() || !text.contains(s));
    ok.then_some(text)
}

/// The bank's error `code` (`{"code": "..."}`), when the body has a usable one.
fn error_code(body: &[u8], secret: Option<&str>) -> Option<String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        code: String,
    }
    let parsed: ErrorBody = serde_json::from_slice(body).ok()?;
    token(&parsed.code, secret).map(str::to_owned)
}

/// Where a JSON body stopped making sense, without quoting it.
fn json_position(e: &serde_json::Error) -> String {
    format!("line {} column {}", e.line(), e.column())
}

/// Reads a lookup answer. Only a 200 whose body is a JSON array of entries the contract
/// allows, each under our reference, is an answer. The bank may normalise the
/// reference's letter case, so it is compared case-insensitively (our keys are ASCII).
/// An entry without a reference, or under another one (a bank that ignores the filter),
/// makes the whole answer unusable: trusting it could mark the claim paid with another
/// claim's payment, dropping it could read "nothing held" and pay again.
fn read_lookup(
    status: StatusCode,
    body: &[u8],
    reference: &IdempotencyKey,
    secret: Option<&str>,
) -> Lookup {
    let unknown = |reason: String| Lookup::Unknown { reason };
    if status != StatusCode::OK {
        return unknown(match error_code(body, secret) {
            Some(code) => format!("lookup answered {status} (code {code})"),
            None => format!("lookup answered {status}"),
        });
    }
    let entries: Vec<LookupEntry> = match serde_json::from_slice(body) {
        Ok(entries) => entries,
        Err(e) => {
            return unknown(format!(
                "lookup answer is not a list of payments as the contract defines them (at {})",
                json_position(&e)
            ))
        }
    };
    let mut held = Vec::with_capacity(entries.len());
    for (n, entry) in entries.into_iter().enumerate() {
        let n = n + 1;
        match entry.reference.as_deref() {
            None => return unknown(format!("lookup entry {n} has no reference")),
            Some(r) if !r.eq_ignore_ascii_case(reference.as_str()) => {
                return unknown(format!(
                    "lookup entry {n} is under another reference: the bank ignored the filter"
                ))
            }
            Some(_) => {}
        }
        let Some(payment_id) = token(&entry.payment_id, secret) else {
            return unknown(format!("lookup entry {n} has an unusable paymentId"));
        };
        let Some(amount) = crate::message::parse_decimal_amount(&entry.amount) else {
            return unknown(format!(
                "lookup entry {n} has an amount that is not a decimal"
            ));
        };
        let currency = entry.currency.as_str();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return unknown(format!(
                "lookup entry {n} has a currency that is not a code"
            ));
        }
        held.push(BankPayment {
            payment_id: payment_id.to_owned(),
            status: BankStatus::from_word(&entry.status),
            amount,
            currency: currency.to_owned(),
        });
    }
    Lookup::Holds(held)
}

/// The longest Retry-After honoured; anything longer is beyond every retry budget
/// (`RETRY_BUDGET_MS` is at most 10 minutes) and ends the attempt as given up.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` as delay-seconds or an HTTP date, capped at [`MAX_RETRY_AFTER`].
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The bank contract's answers (DESIGN.md §8), in one place. Of the body, only the
/// `paymentId` of a success and the `code` of an error are read.
fn classify(
    status: StatusCode,
    body: &[u8],
    after: Option<Duration>,
    secret: Option<&str>,
) -> Answer {
    let described = || match error_code(body, secret) {
        Some(code) => format!("bank answered {status} (code {code})"),
        None => format!("bank answered {status}"),
    };
    if status.is_success() {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct PaidBody {
            payment_id: String,
        }
        let id = serde_json::from_slice::<PaidBody>(body).ok();
        return match id.as_ref().and_then(|b| token(&b.payment_id, secret)) {
            Some(payment_id) => Answer::Done(PayoutOutcome::Paid {
                payment_id: payment_id.to_owned(),
            }),
            // The bank may have paid; a replay of the key returns the id, so ask again.
            None => Answer::Retry {
                error: format!("bank answered {status} without a usable paymentId"),
                after: None,
            },
        };
    }
    match status.as_u16() {
        // The payment itself is refused: invalid instruction, funds, limits, closed account.
        400 | 402 => Answer::Done(PayoutOutcome::Rejected {
            status: status.as_u16(),
            reason: described(),
        }),
        // Same key still in progress, timeouts, throttling, the bank's own failures.
        408 | 409 | 429 | 500..=599 => Answer::Retry {
            error: described(),
            after,
        },
        422 => Answer::Done(PayoutOutcome::KeyMismatch {
            reason: format!("{} (same Idempotency-Key, different body)", described()),
        }),
        // 401, 403, 404, 405, 407, 413, 415, any other 4xx, and redirects (3xx): the
        // request was wrong, not the payment.
        _ => Answer::Done(PayoutOutcome::ServiceFault {
            status: status.as_u16(),
            reason: described(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outcome(status: u16, body: &str) -> Result<PayoutOutcome, String> {
        match classify(
            StatusCode::from_u16(status).unwrap(),
            body.as_bytes(),
            None,
            None,
        ) {
            Answer::Done(o) => Ok(o),
            Answer::Retry { error, .. } => Err(error),
        }
    }

    #[test]
    fn classification_follows_the_bank_contract() {
        assert_eq!(
            outcome(201, r#"{"paymentId":"p-1"}"#),
            Ok(PayoutOutcome::Paid {
                payment_id: "p-1".into()
            })
        );
        assert!(
            outcome(200, "{}").is_err(),
            "a 2xx without an id is asked again"
        );
        for transient in [409, 429, 408, 500, 502, 503, 599] {
            assert!(outcome(transient, "").is_err(), "{transient} is transient");
        }
        assert!(matches!(
            outcome(422, ""),
            Ok(PayoutOutcome::KeyMismatch { .. })
        ));
        for rejected in [400, 402] {
            assert!(
                matches!(outcome(rejected, ""), Ok(PayoutOutcome::Rejected { .. })),
                "{rejected}"
            );
        }
    }

    #[test]
    fn the_services_own_faults_never_reject_a_payment() {
        for status in [
            301, 302, 307, 401, 403, 404, 405, 407, 410, 413, 415, 418, 451,
        ] {
            assert!(
                matches!(
                    outcome(status, "no"),
                    Ok(PayoutOutcome::ServiceFault { status: s, .. }) if s == status
                ),
                "{status} must be a service fault, got {:?}",
                outcome(status, "no")
            );
        }
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date_and_is_capped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("18446744073709551615", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        let in_ten = httpdate::fmt_http_date(now + Duration::from_secs(10));
        assert_eq!(retry_after(&in_ten, now), Some(Duration::from_secs(10)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(10));
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-1", now), None);
    }

    #[test]
    fn the_window_ends_before_the_key_window_by_a_margin() {
        let created = OffsetDateTime::now_utc();
        let day = Duration::from_secs(86_400);
        let w = SendWindow::new(Duration::from_secs(60), created, day);
        assert_eq!(w.last_send, created + day - KEY_WINDOW_MARGIN);
        let short = SendWindow::new(Duration::from_secs(60), created, Duration::from_secs(10));
        assert_eq!(short.last_send, created + Duration::from_secs(9));
    }

    const KEY: &str = "tenant-a:claim-payment-1";

    fn entry(reference: Option<&str>, status: &str, amount: &str) -> serde_json::Value {
        let mut e = serde_json::json!({"paymentId": "p1", "status": status, "amount": amount, "currency": "EUR"});
        if let Some(r) = reference {
            e["reference"] = r.into();
        }
        e
    }

    fn lookup_of(entries: &[serde_json::Value]) -> Lookup {
        let body = serde_json::to_vec(entries).unwrap();
        read_lookup(
            StatusCode::OK,
            &body,
            &IdempotencyKey::from_stored(KEY.into()),
            Some("s3cr3t"),
        )
    }

    #[test]
    fn only_a_200_with_a_list_is_a_lookup_answer() {
        let key = IdempotencyKey::from_stored(KEY.into());
        let ok = |body: &str| read_lookup(StatusCode::OK, body.as_bytes(), &key, None);
        assert_eq!(ok("[]"), Lookup::Holds(vec![]));
        match lookup_of(&[entry(Some(KEY), "paid", "10.0")]) {
            Lookup::Holds(p) => assert_eq!(
                p,
                vec![BankPayment {
                    payment_id: "p1".into(),
                    status: BankStatus::Paid,
                    amount: Decimal::new(10, 0),
                    currency: "EUR".into(),
                }]
            ),
            other => panic!("{other:?}"),
        }
        for unknown in [
            read_lookup(StatusCode::SERVICE_UNAVAILABLE, b"[]", &key, None),
            read_lookup(StatusCode::TOO_MANY_REQUESTS, b"[]", &key, None),
            read_lookup(StatusCode::NOT_FOUND, b"[]", &key, None),
            ok("{}"),
            ok("not json"),
            ok(r#"[{"paymentId":"p1"}]"#),
        ] {
            assert!(matches!(unknown, Lookup::Unknown { .. }), "{unknown:?}");
        }
    }

    /// The bank may normalise the reference's case: still ours. An entry without a
    /// reference, or under another one, is neither ours nor "nothing held".
    #[test]
    fn lookup_references_compare_ignoring_case_and_must_be_there() {
        let upper = KEY.to_uppercase();
        assert!(matches!(
            lookup_of(&[entry(Some(&upper), "paid", "10.00")]),
            Lookup::Holds(p) if p.len() == 1
        ));
        for (entries, why) in [
            (vec![entry(None, "paid", "10.00")], "no reference"),
            (
                vec![entry(Some("tenant-b:claim-payment-9"), "paid", "10.00")],
                "another reference",
            ),
            (
                vec![
                    entry(Some(KEY), "paid", "10.00"),
                    entry(Some("other"), "paid", "10.00"),
                ],
                "another reference",
            ),
            (vec![entry(Some(KEY), "paid", "1e3")], "amount"),
            (vec![entry(Some(KEY), "paid", "-")], "amount"),
        ] {
            match lookup_of(&entries) {
                Lookup::Unknown { reason } => assert!(reason.contains(why), "{reason}"),
                other => panic!("{entries:?}: {other:?}"),
            }
        }
        let mut lower_currency = entry(Some(KEY), "paid", "10.00");
        lower_currency["currency"] = "eur".into();
        assert!(matches!(
            lookup_of(&[lower_currency]),
            Lookup::Unknown { .. }
        ));
    }

    /// A bank (or proxy) that reflects our request in its answers: nothing of its text
    /// is kept, and a token carrying the credential is refused.
    #[test]
    fn no_text_of_the_bank_is_kept_and_the_credential_never_is() {
        let secret = "s3cr3t-bank-key";
        let echo = format!("Authorization: Bearer {secret}\nIdempotency-Key: k");
        let key = IdempotencyKey::from_stored(KEY.into());
        for status in [400u16, 402, 404, 409, 422, 429, 500, 503] {
            let status = StatusCode::from_u16(status).unwrap();
            let text = match classify(status, echo.as_bytes(), None, Some(secret)) {
                Answer::Retry { error, .. } => error,
                Answer::Done(outcome) => format!("{outcome:?}"),
            };
            assert!(!text.contains(secret) && !text.contains("Bearer"), "{text}");
            let Lookup::Unknown { reason } =
                read_lookup(status, echo.as_bytes(), &key, Some(secret))
            else {
                panic!("a {status} lookup is not an answer")
            };
            assert!(!reason.contains(secret), "{reason}");
        }
        // The contract's error code is kept; one that carries the credential is not.
        let coded = classify(
            StatusCode::PAYMENT_REQUIRED,
            br#"{"code":"insufficient_funds","error":"Bearer x"}"#,
            None,
            Some(secret),
        );
        assert_eq!(
            coded,
            Answer::Done(PayoutOutcome::Rejected {
                status: 402,
                reason: "bank answered 402 Payment Required (code insufficient_funds)".into()
            })
        );
        let leaked = format!(r#"{{"code":"{secret}"}}"#);
        assert!(!format!(
            "{:?}",
            classify(
                StatusCode::BAD_REQUEST,
                leaked.as_bytes(),
                None,
                Some(secret)
            )
        )
        .contains(secret));
        // A "payment id" that reflects the credential is no payment id.
        let paid = format!(r#"{{"paymentId":"Bearer-{secret}"}}"#);
        assert!(matches!(
            classify(StatusCode::CREATED, paid.as_bytes(), None, Some(secret)),
            Answer::Retry { .. }
        ));
        let mut e = entry(Some(KEY), "paid", "10.00");
        e["paymentId"] = secret.into();
        assert!(matches!(lookup_of(&[e]), Lookup::Unknown { .. }));
        // A JSON error quotes the value it choked on; the reason must not.
        let bad = format!(r#"[{{"paymentId":1,"status":"{secret}"}}]"#);
        match read_lookup(StatusCode::OK, bad.as_bytes(), &key, Some(secret)) {
            Lookup::Unknown { reason } => assert!(!reason.contains(secret), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    /// A bank answer larger than any the contract allows is never read whole: a lookup
    /// is unknown, with the reason; a payout success is asked again.
    #[tokio::test]
    async fn oversized_answers_are_cut_off_and_read_as_unknown() {
        use axum::routing::get;
        let big = || "[".to_owned() + &"{\"paymentId\":\"p\"},".repeat(40_000) + "{}]";
        let app = axum::Router::new()
            .route(
                "/sized/payments",
                get(move || async move { big() }).post(|| async {
                    (
                        axum::http::StatusCode::CREATED,
                        "{\"paymentId\":\"".to_owned() + &"x".repeat(MAX_ANSWER_BYTES) + "\"}",
                    )
                }),
            )
            // Chunked, without a Content-Length: the cap holds while streaming.
            .route(
                "/streamed/payments",
                get(move || async move {
                    let chunks = (0..1000).map(|_| Ok::<_, std::io::Error>("[{}],".repeat(100)));
                    axum::body::Body::from_stream(futures::stream::iter(chunks))
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let key = IdempotencyKey::from_stored(KEY.into());
        for path in ["sized", "streamed"] {
            let client = BankClient::new(&BankSettings {
                url: format!("http://{addr}/{path}").parse().unwrap(),
                api_key: None,
                timeout: Duration::from_secs(10),
                key_window: Duration::from_secs(3600),
            })
            .unwrap();
            match client.lookup(&key).await {
                Lookup::Unknown { reason } => {
                    assert!(reason.contains("more than 65536 bytes"), "{path}: {reason}")
                }
                other => panic!("{path}: {other:?}"),
            }
            if path == "sized" {
                let window = SendWindow::new(
                    Duration::from_millis(50),
                    OffsetDateTime::now_utc(),
                    Duration::from_secs(3600),
                );
                match client.pay(&key, "{}", window).await {
                    PayoutOutcome::GaveUp { last_error, .. } => {
                        assert!(last_error.contains("more than"), "{last_error}")
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    /// A lookup that times out says so (and never reads as "not paid").
    #[tokio::test]
    async fn a_lookup_that_times_out_is_named_a_timeout() {
        let app = axum::Router::new().route(
            "/payments",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "[]"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = BankClient::new(&BankSettings {
            url: format!("http://{addr}/").parse().unwrap(),
            api_key: None,
            timeout: Duration::from_millis(100),
            key_window: Duration::from_secs(3600),
        })
        .unwrap();
        match client
            .lookup(&IdempotencyKey::from_stored(KEY.into()))
            .await
        {
            Lookup::Unknown { reason } => assert_eq!(reason, "lookup timed out after 100 ms"),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// No answer of the bank may panic the handler: arbitrary statuses, headers and
        /// bodies are read into an outcome or a retry, and a retry's wait is bounded.
        #[test]
        fn any_bank_answer_is_read_without_panicking(
            status in 100u16..=999,
            header_values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
            header_names in proptest::collection::vec("[a-zA-Z-]{1,20}", 0..4),
            retry in prop_oneof![
                any::<u64>().prop_map(|n| n.to_string()),
                "[0-9]{0,40}",
                ".{0,40}",
                any::<u32>().prop_map(|s| httpdate::fmt_http_date(
                    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(s) * 2))),
            ],
            body in proptest::collection::vec(any::<u8>(), 0..300),
            now_secs in any::<u32>(),
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in header_names.iter().zip(&header_values) {
                if let (Ok(n), Ok(v)) = (
                    reqwest::header::HeaderName::try_from(name.as_str()),
                    HeaderValue::from_bytes(value),
                ) {
                    headers.append(n, v);
                }
            }
            if let Ok(v) = HeaderValue::from_str(&retry) {
                headers.insert(RETRY_AFTER, v);
            }
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(now_secs));
            let status = StatusCode::from_u16(status).unwrap();
            match read_answer(status, &headers, &body, now, None) {
                Answer::Retry { after, .. } => {
                    prop_assert!(after.is_none_or(|a| a <= MAX_RETRY_AFTER));
                    // The wait is added to a clock reading: it must never overflow.
                    let wait = after.unwrap_or_default();
                    prop_assert!(Instant::now().checked_add(wait).is_some());
                }
                Answer::Done(PayoutOutcome::Paid { payment_id }) => {
                    prop_assert!(status.is_success() && !payment_id.trim().is_empty());
                }
                Answer::Done(_) => prop_assert!(!status.is_success()),
            }
        }
    }
}
