//! The bank over HTTPS with reqwest: the production transport behind the engine's
//! [`BankTransport`]. One request out, one bounded answer back; a dependency span carries
//! `traceparent` to the bank when telemetry is exported.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;
use secrecy::ExposeSecret;

use super::transport::{BankAnswer, BankCall, BankTransport, BodyFailure, TransportFailure};
use super::{BankSettings, MAX_ANSWER_BYTES};
use crate::telemetry;

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
