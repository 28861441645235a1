//! The bank's transport: one request out, one bounded answer back. Production sends it
//! over HTTPS with reqwest ([`HttpTransport`]); the deterministic simulator puts a
//! simulated bank behind the same trait. Everything above it (classifying answers,
//! retries, backoff, the send window) is the client's, and runs the same on both.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use secrecy::ExposeSecret;

use super::{BankSettings, MAX_ANSWER_BYTES};
use crate::domain::IdempotencyKey;
use crate::telemetry;

/// What the client asks the bank.
#[derive(Debug, Clone, Copy)]
pub enum BankCall<'a> {
    /// `POST /payments` with the Idempotency-Key and the stored body, byte for byte.
    Payout {
        key: &'a IdempotencyKey,
        body: &'a str,
    },
    /// `GET /payments?reference=`: what the bank holds under our key.
    Lookup { reference: &'a IdempotencyKey },
}

/// Why no whole answer arrived. Never the peer's text or the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// No answer within the request's timeout: the bank may have acted.
    TimedOut,
    /// The answer began and was cut off.
    CutOff,
    /// No connection, or it broke before an answer.
    Connection,
}

/// Why an answer's body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFailure {
    /// Longer than [`MAX_ANSWER_BYTES`]: never buffered whole.
    TooLarge,
    Transport(TransportFailure),
}

/// An answer: its status, its headers (only `Retry-After` is read) and its body, at
/// most [`MAX_ANSWER_BYTES`] of it.
#[derive(Debug)]
pub struct BankAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Result<Vec<u8>, BodyFailure>,
}

#[async_trait]
pub trait BankTransport: Send + Sync + 'static {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure>;
}

/// The bank over HTTPS.
pub(crate) struct HttpTransport {
    http: reqwest::Client,
    payments_url: Url,
    timeout: Duration,
}

impl HttpTransport {
    pub(crate) fn new(settings: &BankSettings) -> anyhow::Result<Self> {
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
        Ok(HttpTransport {
            http,
            payments_url,
            timeout: settings.timeout,
        })
    }
}

#[async_trait]
impl BankTransport for HttpTransport {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure> {
        let (operation, request) = match call {
            BankCall::Payout { key, body } => (
                "payout",
                self.http
                    .post(self.payments_url.clone())
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                    .header("Idempotency-Key", key.as_str())
                    .body(body.to_owned()),
            ),
            BankCall::Lookup { reference } => {
                let mut url = self.payments_url.clone();
                url.query_pairs_mut()
                    .append_pair("reference", reference.as_str());
                ("lookup", self.http.get(url))
            }
        };
        // A dependency span carrying traceparent to the bank (only when telemetry is on).
        let response = telemetry::trace::bank_call(operation, request.timeout(self.timeout))
            .await
            .map_err(|e| failure(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = read_bounded(response).await;
        Ok(BankAnswer {
            status,
            headers,
            body,
        })
    }
}

fn failure(e: &reqwest::Error) -> TransportFailure {
    if e.is_timeout() {
        TransportFailure::TimedOut
    } else if e.is_body() || e.is_decode() {
        TransportFailure::CutOff
    } else {
        TransportFailure::Connection
    }
}

/// Reads at most [`MAX_ANSWER_BYTES`] of an answer, chunk by chunk: a hostile or broken
/// bank cannot make us buffer more than that.
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, BodyFailure> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(BodyFailure::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyFailure::Transport(failure(&e)))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(BodyFailure::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
