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

use std::time::{Duration, SystemTime};

use rand::RngExt;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use secrecy::ExposeSecret;
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
/// How much of the bank's answer goes into reasons and logs.
const SNIPPET_CHARS: usize = 200;

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
    /// An authoritative answer (200 with a JSON array): these payments, maybe none.
    Holds(Vec<BankPayment>),
    /// Anything else (5xx, 429, timeouts, an unreadable body): ask again later. Never
    /// read as "not paid".
    Unknown { reason: String },
}

/// One payment the bank holds, as its lookup lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BankPayment {
    pub payment_id: String,
    /// The bank's word (`paid`, `rejected`, ...).
    pub status: String,
    /// Decimal text, compared as a decimal.
    pub amount: String,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
}

impl BankPayment {
    /// Whether the bank made this payment (as opposed to refusing it).
    pub fn is_paid(&self) -> bool {
        matches!(
            self.status.to_ascii_lowercase().as_str(),
            "paid" | "succeeded" | "completed" | "settled"
        )
    }

    pub fn is_rejected(&self) -> bool {
        matches!(
            self.status.to_ascii_lowercase().as_str(),
            "rejected" | "refused" | "failed"
        )
    }
}

#[derive(Clone)]
pub struct BankClient {
    http: reqwest::Client,
    payments_url: Url,
    timeout: Duration,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaidBody {
    payment_id: String,
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
                    reason: format!("lookup failed: {}", e.without_url()),
                }
            }
        };
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        read_lookup(status, &body, reference)
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
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else {
                    "connection error"
                };
                // Without the URL: an operator's URL may still carry something private.
                return Answer::Retry {
                    error: format!("{kind}: {}", e.without_url()),
                    after: None,
                };
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_default();
        read_answer(status, &headers, &body, SystemTime::now())
    }
}

/// Reads one answer of the bank. Pure, and total: no status, header or body can make
/// it panic (a property test feeds it arbitrary ones).
fn read_answer(status: StatusCode, headers: &HeaderMap, body: &[u8], now: SystemTime) -> Answer {
    let text = String::from_utf8_lossy(body);
    let after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, now));
    classify(status, &text, after)
}

/// Reads a lookup answer. Only a 200 whose body is a JSON array of payments is an
/// answer; the entries for other references (a bank that ignores the filter) are dropped.
fn read_lookup(status: StatusCode, body: &[u8], reference: &IdempotencyKey) -> Lookup {
    if status != StatusCode::OK {
        return Lookup::Unknown {
            reason: format!(
                "lookup answered {status}: {}",
                snippet(&String::from_utf8_lossy(body))
            ),
        };
    }
    match serde_json::from_slice::<Vec<BankPayment>>(body) {
        Ok(payments) => Lookup::Holds(
            payments
                .into_iter()
                .filter(|p| {
                    p.reference
                        .as_deref()
                        .is_none_or(|r| r == reference.as_str())
                })
                .collect(),
        ),
        Err(e) => Lookup::Unknown {
            reason: format!("lookup answer is not a list of payments: {e}"),
        },
    }
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

fn snippet(text: &str) -> String {
    text.chars()
        .take(SNIPPET_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The bank contract's answers (DESIGN.md §8), in one place.
fn classify(status: StatusCode, text: &str, after: Option<Duration>) -> Answer {
    let described = || format!("bank answered {status}: {}", snippet(text));
    if status.is_success() {
        return match serde_json::from_str::<PaidBody>(text) {
            Ok(body) if !body.payment_id.trim().is_empty() => Answer::Done(PayoutOutcome::Paid {
                payment_id: body.payment_id,
            }),
            // The bank may have paid; a replay of the key returns the id, so ask again.
            _ => Answer::Retry {
                error: format!("{status} without a paymentId: {}", snippet(text)),
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
            reason: format!(
                "bank answered 422 (same Idempotency-Key, different body): {}",
                snippet(text)
            ),
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
        match classify(StatusCode::from_u16(status).unwrap(), body, None) {
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

    #[test]
    fn only_a_200_with_a_list_is_a_lookup_answer() {
        let key = IdempotencyKey::from_stored("claim-payment-1".into());
        let ok = |body: &str| read_lookup(StatusCode::OK, body.as_bytes(), &key);
        assert_eq!(ok("[]"), Lookup::Holds(vec![]));
        let one = r#"[{"paymentId":"p1","status":"paid","amount":"10.00","currency":"EUR","reference":"claim-payment-1"},
                     {"paymentId":"p2","status":"paid","amount":"10.00","currency":"EUR","reference":"other"}]"#;
        match ok(one) {
            Lookup::Holds(p) => assert_eq!(p.len(), 1, "{p:?}"),
            other => panic!("{other:?}"),
        }
        for unknown in [
            read_lookup(StatusCode::SERVICE_UNAVAILABLE, b"[]", &key),
            read_lookup(StatusCode::TOO_MANY_REQUESTS, b"[]", &key),
            read_lookup(StatusCode::NOT_FOUND, b"[]", &key),
            ok("{}"),
            ok("not json"),
            ok(r#"[{"paymentId":"p1"}]"#),
        ] {
            assert!(matches!(unknown, Lookup::Unknown { .. }), "{unknown:?}");
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
            match read_answer(status, &headers, &body, now) {
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
