//! [`Broker`] over the Service Bus REST runtime API (see the module above for why REST):
//! peek-lock on `{queue}/$DeadLetterQueue/messages/head`, unlock and delete at the
//! `Location` the broker gave, send to `{queue}/messages`. Tokens are Entra ID tokens
//! for [`SCOPE`]; a loopback endpoint (the testkit's stand-in) may go without one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use base64::Engine;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::StatusCode;
use time::OffsetDateTime;

use super::{
    bounded, Broker, BrokerMessageId, BusError, BusErrorKind, DeadLetter, Lock, LockToken, Locked,
    Outgoing, Property, Unreadable, MAX_BODY_BYTES,
};

/// The Entra scope of every Service Bus namespace.
pub const SCOPE: &str = "https://servicebus.azure.net/.default";

/// Headers that are the protocol's, not application properties.
const PROTOCOL_HEADERS: &[&str] = &[
    "brokerproperties",
    "content-type",
    "content-length",
    "content-encoding",
    "location",
    "date",
    "server",
    "transfer-encoding",
    "connection",
    "strict-transport-security",
    "keep-alive",
    "authorization",
];

/// How the adapter authenticates.
pub enum Auth {
    /// Entra ID tokens (the operator's `az login`, a managed identity).
    Entra(Arc<dyn TokenCredential>),
    /// No token: a loopback endpoint only (the stand-in).
    LoopbackWithoutToken,
}

pub struct RestBroker {
    http: reqwest::Client,
    /// `https://{namespace}/` (or the stand-in's loopback URL), with a trailing slash.
    base: reqwest::Url,
    queue: String,
    auth: Auth,
}

/// `BrokerProperties` as the broker sends it; only what the tool reads.
struct BrokerProperties {
    message_id: Option<String>,
    lock_token: Option<String>,
    delivery_count: Option<u32>,
    sequence_number: Option<i64>,
    enqueued_time_utc: Option<String>,
}

/// The longest `BrokerProperties` header read: the broker's is well under 1 KiB.
const MAX_BROKER_PROPERTIES: usize = 16 * 1024;

/// Where a JSON text stops reading, in words that repeat none of it.
fn json_problem(e: &serde_json::Error) -> String {
    let what = match e.classify() {
        serde_json::error::Category::Eof => "ends too early",
        serde_json::error::Category::Syntax => "is not JSON",
        serde_json::error::Category::Data => "has a value of the wrong type",
        serde_json::error::Category::Io => "could not be read",
    };
    format!("{what} (at column {})", e.column())
}

impl BrokerProperties {
    /// Reads the header field by field, so a problem names the field and never repeats
    /// the value; what did read (MessageId, SequenceNumber) comes back with the problem.
    fn read(headers: &HeaderMap) -> Result<Self, (Self, String)> {
        let none = || BrokerProperties {
            message_id: None,
            lock_token: None,
            delivery_count: None,
            sequence_number: None,
            enqueued_time_utc: None,
        };
        let Some(raw) = headers.get("BrokerProperties") else {
            return Err((none(), "no BrokerProperties header".into()));
        };
        if raw.len() > MAX_BROKER_PROPERTIES {
            return Err((
                none(),
                format!("the BrokerProperties header is longer than {MAX_BROKER_PROPERTIES} bytes"),
            ));
        }
        let Ok(text) = raw.to_str() else {
            return Err((
                none(),
                "the BrokerProperties header is not visible ASCII".into(),
            ));
        };
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| (none(), format!("BrokerProperties {}", json_problem(&e))))?;
        let Some(object) = value.as_object() else {
            return Err((none(), "BrokerProperties is not a JSON object".into()));
        };
        let mut problems: Vec<&str> = Vec::new();
        let field = |name: &'static str| -> Option<&serde_json::Value> {
            object.get(name).filter(|v| !v.is_null())
        };
        let text_of = |v: Option<&serde_json::Value>,
                       name: &'static str,
                       problems: &mut Vec<&'static str>| {
            v.and_then(|v| {
                let s = v.as_str().map(str::to_owned);
                if s.is_none() {
                    problems.push(name);
                }
                s
            })
        };
        let message_id = text_of(field("MessageId"), "MessageId", &mut problems);
        let lock_token = text_of(field("LockToken"), "LockToken", &mut problems);
        let enqueued_time_utc = text_of(field("EnqueuedTimeUtc"), "EnqueuedTimeUtc", &mut problems);
        let delivery_count = field("DeliveryCount").and_then(|v| {
            let n = v.as_u64().and_then(|n| u32::try_from(n).ok());
            if n.is_none() {
                problems.push("DeliveryCount");
            }
            n
        });
        let sequence_number = field("SequenceNumber").and_then(|v| {
            let n = v.as_i64();
            if n.is_none() {
                problems.push("SequenceNumber");
            }
            n
        });
        let read = BrokerProperties {
            message_id,
            lock_token,
            delivery_count,
            sequence_number,
            enqueued_time_utc,
        };
        if !problems.is_empty() {
            let problem = format!(
                "BrokerProperties has a value of the wrong type for {}",
                problems.join(", ")
            );
            return Err((read, problem));
        }
        if read.lock_token.is_none() {
            return Err((read, "BrokerProperties has no LockToken".into()));
        }
        Ok(read)
    }
}

impl RestBroker {
    /// `endpoint`: `https://{namespace}.servicebus.windows.net` or a loopback `http` URL.
    pub fn new(endpoint: &str, queue: &str, auth: Auth, timeout: Duration) -> anyhow::Result<Self> {
        let mut base = reqwest::Url::parse(endpoint)
            .map_err(|e| anyhow::anyhow!("the Service Bus endpoint {endpoint:?}: {e}"))?;
        let loopback = matches!(base.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
        if base.scheme() != "https" && !loopback {
            anyhow::bail!("the Service Bus endpoint must be https (http only on loopback)");
        }
        if matches!(auth, Auth::LoopbackWithoutToken) && !loopback {
            anyhow::bail!("a Service Bus endpoint that is not loopback needs an Entra credential");
        }
        if queue.is_empty() || queue.contains(['/', '?', '#']) {
            anyhow::bail!("the queue name {queue:?} is not a queue name");
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client: {e}"))?;
        Ok(RestBroker {
            http,
            base,
            queue: queue.to_owned(),
            auth,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, BusError> {
        self.base
            .join(path)
            .map_err(|e| BusError::new(BusErrorKind::Other, format!("bad URL {path:?}: {e}")))
    }

    /// Unlocks (PUT) or deletes (DELETE) a locked dead letter at its `Location`.
    async fn settle_lock(&self, method: reqwest::Method, lock: &Lock) -> Result<(), BusError> {
        let url = self.lock_url(&lock.location)?;
        let response = self.send_without_body(method, url).await?;
        match response.status() {
            StatusCode::OK => Ok(()),
            _ => Err(Self::refused(response, true).await),
        }
    }

    /// The lock's URL, from the broker's `Location`: only on the endpoint's own origin,
    /// so a token is never sent elsewhere.
    fn lock_url(&self, location: &str) -> Result<reqwest::Url, BusError> {
        let url = self.url(location)?;
        if url.origin() != self.base.origin() {
            return Err(BusError::new(
                BusErrorKind::Other,
                "the broker's Location is on another origin",
            ));
        }
        Ok(url)
    }

    async fn token(&self) -> Result<Option<String>, BusError> {
        match &self.auth {
            Auth::LoopbackWithoutToken => Ok(None),
            Auth::Entra(credential) => credential
                .get_token(&[SCOPE], None)
                .await
                .map(|t| Some(t.token.secret().to_owned()))
                // The error names the credential's problem, never a token.
                .map_err(|e| {
                    BusError::new(
                        BusErrorKind::Unauthorized,
                        format!("no Entra token for {SCOPE}: {e}"),
                    )
                }),
        }
    }

    async fn request(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
    ) -> Result<reqwest::RequestBuilder, BusError> {
        let mut request = self.http.request(method, url);
        if let Some(token) = self.token().await? {
            request = request.bearer_auth(token);
        }
        Ok(request)
    }

    /// Sends a request that has no body (the broker wants its length said: `0`).
    async fn send_without_body(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
    ) -> Result<reqwest::Response, BusError> {
        self.request(method, url)
            .await?
            .header(reqwest::header::CONTENT_LENGTH, "0")
            .send()
            .await
            .map_err(transport)
    }

    /// The error for a refused answer: the status and the broker's reason, bounded.
    async fn refused(response: reqwest::Response, lock: bool) -> BusError {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let kind = match status {
            StatusCode::UNAUTHORIZED => BusErrorKind::Unauthorized,
            StatusCode::FORBIDDEN => BusErrorKind::Forbidden,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                BusErrorKind::Throttled
            }
            StatusCode::NOT_FOUND | StatusCode::GONE if lock => BusErrorKind::LockLost,
            _ => BusErrorKind::Other,
        };
        BusError::new(kind, format!("{status}: {}", bounded(text.trim(), 200)))
    }
}

fn transport(e: reqwest::Error) -> BusError {
    if e.is_timeout() {
        BusError::new(BusErrorKind::Timeout, e.to_string())
    } else {
        BusError::new(BusErrorKind::Other, e.to_string())
    }
}

/// Reads a peek-lock answer (201): `BrokerProperties`, `Location`, the custom
/// properties and the body, at most [`MAX_BODY_BYTES`] of it. An answer that does not
/// read concerns this dead letter only: it comes back as [`Unreadable`], with the lock
/// when the `Location` is usable, so the run reports it and goes on.
async fn dead_letter(broker: &RestBroker, response: reqwest::Response) -> Locked {
    let headers = response.headers().clone();
    let lock = headers
        .get(reqwest::header::LOCATION)
        .ok_or("no Location header")
        .and_then(|v| {
            v.to_str()
                .map_err(|_| "the Location header is not visible ASCII")
        })
        .and_then(|l| match broker.lock_url(l) {
            Ok(_) => Ok(Lock {
                location: l.to_owned(),
            }),
            Err(_) => Err("the Location header is not a URL on the namespace's own origin"),
        });
    let unreadable = |read: &BrokerProperties, lock: Option<Lock>, problem: String| {
        Locked::Unreadable(Unreadable {
            message_id: read
                .message_id
                .as_deref()
                .map(|m| BrokerMessageId(bounded(m, 128))),
            sequence_number: read.sequence_number,
            lock,
            problem,
        })
    };
    let broker_properties = match BrokerProperties::read(&headers) {
        Ok(read) => read,
        Err((read, problem)) => return unreadable(&read, lock.ok(), problem),
    };
    let lock = match lock {
        Ok(lock) => lock,
        Err(problem) => {
            return unreadable(
                &broker_properties,
                None,
                format!("{problem}: it cannot be unlocked or removed"),
            )
        }
    };
    let properties = headers
        .iter()
        .filter(|(name, _)| !PROTOCOL_HEADERS.contains(&name.as_str()))
        .map(|(name, value)| Property {
            name: name.as_str().to_owned(),
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
        })
        .collect();
    let content_type = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (body, body_truncated) = match bounded_body(response).await {
        Ok(body) => body,
        Err(e) => {
            let how = match e.kind {
                BusErrorKind::Timeout => "timed out",
                _ => "the connection failed",
            };
            return unreadable(
                &broker_properties,
                Some(lock),
                format!("the body could not be read to its end ({how})"),
            );
        }
    };
    let BrokerProperties {
        message_id,
        lock_token,
        delivery_count,
        sequence_number,
        enqueued_time_utc,
    } = broker_properties;
    Locked::Letter(DeadLetter {
        message_id: message_id.map(BrokerMessageId),
        sequence_number,
        lock_token: LockToken(lock_token.unwrap_or_default()),
        lock,
        delivery_count: delivery_count.unwrap_or(0),
        enqueued_at: enqueued_time_utc
            .as_deref()
            .and_then(|t| httpdate::parse_http_date(t).ok())
            .map(OffsetDateTime::from),
        content_type,
        properties,
        body,
        body_truncated,
    })
}

/// The body, read chunk by chunk and cut at [`MAX_BODY_BYTES`]: a huge body is never
/// held whole.
async fn bounded_body(mut response: reqwest::Response) -> Result<(Vec<u8>, bool), BusError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        let room = MAX_BODY_BYTES - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// Who a JWT names (`upn`, `unique_name`, `appid`, `oid`), read without checking it:
/// it is only written into the re-drive record.
fn token_principal(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    ["upn", "unique_name", "preferred_username", "appid", "oid"]
        .iter()
        .find_map(|k| claims.get(k).and_then(|v| v.as_str()))
        .map(|s| bounded(s, 128))
}

#[async_trait]
impl Broker for RestBroker {
    async fn lock_next_dead_letter(&self) -> Result<Option<Locked>, BusError> {
        let url = self.url(&format!(
            "{}/$DeadLetterQueue/messages/head?timeout=1",
            self.queue
        ))?;
        let response = self.send_without_body(reqwest::Method::POST, url).await?;
        match response.status() {
            StatusCode::CREATED => Ok(Some(dead_letter(self, response).await)),
            StatusCode::NO_CONTENT => Ok(None),
            _ => Err(Self::refused(response, false).await),
        }
    }

    async fn unlock(&self, lock: &Lock) -> Result<(), BusError> {
        self.settle_lock(reqwest::Method::PUT, lock).await
    }

    async fn delete(&self, lock: &Lock) -> Result<(), BusError> {
        self.settle_lock(reqwest::Method::DELETE, lock).await
    }

    async fn send(&self, message: &Outgoing) -> Result<(), BusError> {
        let url = self.url(&format!("{}/messages", self.queue))?;
        let mut headers = HeaderMap::new();
        let broker = super::header_json(&serde_json::json!({ "MessageId": message.message_id.0 }));
        let value = |v: &str| {
            HeaderValue::from_str(v).map_err(|_| {
                BusError::new(
                    BusErrorKind::Other,
                    "a property value is not a header value",
                )
            })
        };
        headers.insert("BrokerProperties", value(&broker)?);
        if let Some(content_type) = &message.content_type {
            headers.insert(reqwest::header::CONTENT_TYPE, value(content_type)?);
        }
        for p in &message.properties {
            let name = HeaderName::from_bytes(p.name.as_bytes()).map_err(|_| {
                BusError::new(BusErrorKind::Other, "a property name is not a header name")
            })?;
            headers.insert(name, value(&p.value)?);
        }
        let response = self
            .request(reqwest::Method::POST, url)
            .await?
            .headers(headers)
            .body(message.body.clone())
            .send()
            .await
            .map_err(transport)?;
        match response.status() {
            StatusCode::CREATED => Ok(()),
            _ => Err(Self::refused(response, false).await),
        }
    }

    async fn principal(&self) -> String {
        match self.token().await {
            Ok(Some(token)) => {
                token_principal(&token).unwrap_or_else(|| "unknown principal".into())
            }
            Ok(None) => "unauthenticated (loopback)".into(),
            Err(_) => "unknown principal".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_principal_comes_from_the_token_claims_and_a_bad_token_names_none() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"oid":"o-1","upn":"ops@example.com"}"#);
        assert_eq!(
            token_principal(&format!("h.{payload}.s")).as_deref(),
            Some("ops@example.com")
        );
        assert_eq!(token_principal("not a token"), None);
    }

    /// A `BrokerProperties` that does not read names the field or the flaw, never the
    /// value (which is the peer's: it may hold anything), and keeps what did read.
    #[test]
    fn broker_properties_that_do_not_read_name_the_flaw_never_the_value() {
        let long = format!(
            "{{\"LockToken\":\"{}\"}}",
            "x".repeat(MAX_BROKER_PROPERTIES)
        );
        let cases: [(Option<&[u8]>, &str); 8] = [
            (None, "no BrokerProperties header"),
            (Some(b"SECRET"), "BrokerProperties is not JSON (at column 1)"),
            (Some(b"{\"SECRET"), "BrokerProperties ends too early"),
            (Some(b"[\"SECRET\"]"), "BrokerProperties is not a JSON object"),
            (Some(b"{\"MessageId\":\"m-1\"}"), "BrokerProperties has no LockToken"),
            (
                Some(b"{\"MessageId\":\"m-1\",\"LockToken\":\"t\",\"DeliveryCount\":\"SECRET\",\"SequenceNumber\":-1.5}"),
                "BrokerProperties has a value of the wrong type for DeliveryCount, SequenceNumber",
            ),
            (Some(b"{\"MessageId\":\"SECRET \xff\"}"), "BrokerProperties header is not visible ASCII"),
            (Some(long.as_bytes()), "longer than 16384 bytes"),
        ];
        for (raw, expected) in cases {
            let mut headers = HeaderMap::new();
            if let Some(raw) = raw {
                headers.insert("BrokerProperties", HeaderValue::from_bytes(raw).unwrap());
            }
            let Err((read, problem)) = BrokerProperties::read(&headers) else {
                panic!("{raw:?} read");
            };
            assert!(problem.contains(expected), "{problem:?} for {raw:?}");
            assert!(
                !problem.contains("SECRET") && problem.len() < 120,
                "{problem:?}"
            );
            if expected.contains("DeliveryCount") || expected.contains("LockToken") {
                assert_eq!(read.message_id.as_deref(), Some("m-1"));
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            "BrokerProperties",
            HeaderValue::from_static(r#"{"LockToken":"t","DeliveryCount":3,"SequenceNumber":7}"#),
        );
        let read = BrokerProperties::read(&headers).ok().unwrap();
        assert_eq!(
            (read.delivery_count, read.sequence_number),
            (Some(3), Some(7))
        );
    }

    #[test]
    fn only_loopback_may_go_without_https_or_a_token() {
        let t = Duration::from_secs(1);
        assert!(RestBroker::new("http://127.0.0.1:1", "q", Auth::LoopbackWithoutToken, t).is_ok());
        assert!(RestBroker::new("http://sb.example", "q", Auth::LoopbackWithoutToken, t).is_err());
        assert!(RestBroker::new("https://sb.example", "q", Auth::LoopbackWithoutToken, t).is_err());
        assert!(
            RestBroker::new("http://127.0.0.1:1", "a/b", Auth::LoopbackWithoutToken, t).is_err()
        );
    }
}
