//! The bank payout client.
//!
//! `POST {BANK_API_URL}/payments` with an `Idempotency-Key` derived from tenant, claim
//! and purpose, and a body stored with the payment before the first call and re-sent
//! byte for byte. The bank answers a replayed key with the original result, so a
//! retry, a takeover after a crash, or a redelivery can never pay twice.
//!
//! Transient failures (connection errors, timeouts, 5xx, 429 with Retry-After, 409
//! "same key still in progress") are retried with exponential backoff and full jitter,
//! inside a deadline the caller derives from `RETRY_BUDGET_MS`. A 422 means we sent a
//! different body under the same key: a bug on our side, never retried. Other 4xx
//! answers are a definite rejection: the claim needs a person, not a retry.

use std::time::Duration;

use rand::RngExt;
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use crate::config::BankSettings;
use crate::message::IdempotencyKey;
use crate::telemetry;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// An attempt with less time than this left would only time out.
const MIN_ATTEMPT: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayoutOutcome {
    /// The bank made (or had already made) the payout.
    Paid { payment_id: String },
    /// The bank refused the payout for good.
    Rejected { status: u16, reason: String },
    /// The bank saw this key with a different body. Our bug; never retried.
    KeyMismatch { reason: String },
    /// Still failing when the budget ran out; the payout may or may not exist yet.
    GaveUp { attempts: u32, last_error: String },
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

enum Attempt {
    Done(PayoutOutcome),
    Retry {
        error: String,
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
        let http = reqwest::Client::builder()
            .connect_timeout(settings.timeout.min(Duration::from_secs(5)))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(BankClient {
            http,
            payments_url,
            timeout: settings.timeout,
        })
    }

    /// Sends the payout until the bank gives a definite answer or `deadline` passes.
    pub async fn pay(&self, key: &IdempotencyKey, body: &str, deadline: Instant) -> PayoutOutcome {
        let mut attempts = 0u32;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining < MIN_ATTEMPT && attempts > 0 {
                return PayoutOutcome::GaveUp {
                    attempts,
                    last_error: "retry budget exhausted".into(),
                };
            }
            attempts += 1;
            telemetry::counters().bank_calls.inc();
            let (error, after) = match self
                .attempt(key, body, self.timeout.min(remaining.max(MIN_ATTEMPT)))
                .await
            {
                Attempt::Done(outcome) => return outcome,
                Attempt::Retry { error, after } => (error, after),
            };
            // Full jitter keeps many instances retrying after one outage from arriving together.
            let jittered =
                Duration::from_millis(rand::rng().random_range(0..=backoff.as_millis() as u64));
            let wait = after.map_or(jittered, |a| a.max(jittered));
            if Instant::now() + wait + MIN_ATTEMPT > deadline {
                return PayoutOutcome::GaveUp {
                    attempts,
                    last_error: error,
                };
            }
            tracing::warn!(
                idempotencyKey = %key,
                attempt = attempts,
                waitMs = wait.as_millis() as u64,
                error = %error,
                "bank payout failed transiently; retrying"
            );
            telemetry::counters().bank_retries.inc();
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn attempt(&self, key: &IdempotencyKey, body: &str, timeout: Duration) -> Attempt {
        let response = self
            .http
            .post(self.payments_url.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("Idempotency-Key", key.as_str())
            .body(body.to_owned())
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else {
                    "connection error"
                };
                return Attempt::Retry {
                    error: format!("{kind}: {e}"),
                    after: None,
                };
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response.text().await.unwrap_or_default();
        classify(status, &text, retry_after)
    }
}

fn snippet(text: &str) -> String {
    text.chars().take(200).collect()
}

fn classify(status: StatusCode, text: &str, retry_after: Option<Duration>) -> Attempt {
    if status.is_success() {
        return match serde_json::from_str::<PaidBody>(text) {
            Ok(body) if !body.payment_id.trim().is_empty() => Attempt::Done(PayoutOutcome::Paid {
                payment_id: body.payment_id,
            }),
            // The bank may have paid; a replay of the key returns the id, so ask again.
            _ => Attempt::Retry {
                error: format!("{status} without a paymentId: {}", snippet(text)),
                after: None,
            },
        };
    }
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::CONFLICT | StatusCode::REQUEST_TIMEOUT => {
            Attempt::Retry {
                error: format!("{status}: {}", snippet(text)),
                after: retry_after,
            }
        }
        StatusCode::UNPROCESSABLE_ENTITY => Attempt::Done(PayoutOutcome::KeyMismatch {
            reason: format!(
                "bank answered 422 (same Idempotency-Key, different body): {}",
                snippet(text)
            ),
        }),
        s if s.is_server_error() => Attempt::Retry {
            error: format!("{status}: {}", snippet(text)),
            after: retry_after,
        },
        s => Attempt::Done(PayoutOutcome::Rejected {
            status: s.as_u16(),
            reason: format!("bank answered {status}: {}", snippet(text)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: u16, body: &str) -> Result<PayoutOutcome, String> {
        match classify(StatusCode::from_u16(status).unwrap(), body, None) {
            Attempt::Done(o) => Ok(o),
            Attempt::Retry { error, .. } => Err(error),
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
        for transient in [409, 429, 408, 500, 502, 503] {
            assert!(outcome(transient, "").is_err(), "{transient} is transient");
        }
        assert!(matches!(
            outcome(422, ""),
            Ok(PayoutOutcome::KeyMismatch { .. })
        ));
        for rejected in [400, 403, 404] {
            assert!(
                matches!(outcome(rejected, ""), Ok(PayoutOutcome::Rejected { .. })),
                "{rejected}"
            );
        }
    }
}
