//! [`Broker`] over the Service Bus REST runtime API (see the module above for why REST):
//! peek-lock on `{queue}/$DeadLetterQueue/messages/head`, unlock and delete at the
//! `Location` the broker gave, send to `{queue}/messages`.
//!
//! Every request goes through azure_core's pipeline, as the Azure SDK clients do:
//! - its bearer-token policy asks the credential for an Entra token for [`SCOPE`] once and
//!   keeps it until shortly before it expires (`AzureCliCredential` caches nothing: each
//!   of its tokens costs an `az` run of about a second, longer than a whole request);
//! - its retry policy retries 408, 429, 500, 502, 503, 504 and transport failures with
//!   exponential back-off and honours the broker's `Retry-After`. Retrying a send whose
//!   answer was lost is safe: a copy's MessageId is derived from its dead letter
//!   (`domain::redrive`), so the broker drops a second one as a duplicate.
//!
//! A loopback endpoint (the testkit's stand-in over plain HTTP) may go without a token.
//! Nothing the broker says is passed on: a refusal is named by its status and what it
//! means, and a 403's body is read (bounded) only to tell a quota from a missing role.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use azure_core::http::headers::Headers;
use azure_core::http::policies::auth::BearerTokenAuthorizationPolicy;
use azure_core::http::policies::Policy;
use azure_core::http::{
    AsyncRawResponse, ClientOptions, Context, ExponentialRetryOptions, Method, Pipeline,
    PipelineStreamOptions, Request, RetryOptions, StatusCode, Transport, Url,
};
use base64::Engine;
use futures::StreamExt;
use time::OffsetDateTime;

use super::{
    bounded, Broker, BrokerMessageId, BusError, BusErrorKind, DeadLetter, Lock, LockToken, Locked,
    Outgoing, Property, Unreadable, MAX_BODY_BYTES,
};

/// The Entra scope of every Service Bus namespace.
pub const SCOPE: &str = "https://servicebus.azure.net/.default";

/// Headers that are the protocol's, not application properties (names as the HTTP stack
/// gives them: lower case).
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
    "retry-after",
    "x-ms-request-id",
    "x-ms-client-request-id",
];

/// How much of a refusal's body is read to classify it (never shown).
const MAX_REFUSAL_BYTES: usize = 4096;

/// The pipeline's transport: reqwest, as azure_core's own adapter, except that a
/// response header whose value is not visible ASCII is kept (as UTF-8 text, invalid
/// bytes replaced) instead of dropped with a warning: application properties travel as
/// headers, and a dead letter must not lose one of them on its way to the copy.
#[derive(Debug)]
struct Http(reqwest::Client);

#[async_trait]
impl azure_core::http::HttpClient for Http {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        use azure_core::error::{Error, ErrorKind};
        let method = match request.method() {
            Method::Delete => reqwest::Method::DELETE,
            Method::Get => reqwest::Method::GET,
            Method::Head => reqwest::Method::HEAD,
            Method::Patch => reqwest::Method::PATCH,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            _ => {
                return Err(Error::with_message(
                    ErrorKind::Other,
                    "the Service Bus client uses no other method",
                ))
            }
        };
        let mut builder = self.0.request(method, request.url().clone());
        for (name, value) in request.headers().iter() {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let body = match request.body() {
            azure_core::http::Body::Bytes(bytes) => bytes.clone(),
            azure_core::http::Body::SeekableStream(_) => {
                return Err(Error::with_message(
                    ErrorKind::Other,
                    "the Service Bus client sends no streamed bodies",
                ))
            }
        };
        let response = builder.body(body).send().await.map_err(|e| {
            let kind = if e.is_connect() {
                ErrorKind::Connection
            } else {
                ErrorKind::Io
            };
            Error::with_error(kind, e, "the Service Bus request failed")
        })?;
        let status = response.status().as_u16().into();
        let mut headers = Headers::new();
        for (name, value) in response.headers() {
            headers.insert(
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            );
        }
        let body: azure_core::http::response::PinnedStream =
            Box::pin(response.bytes_stream().map(|chunk| {
                chunk.map_err(|e| Error::with_error(ErrorKind::Io, e, "the answer's body failed"))
            }));
        Ok(AsyncRawResponse::new(status, headers, body))
    }
}

/// How the adapter authenticates.
pub enum Auth {
    /// Entra ID tokens (the operator's `az login`, a managed identity).
    Entra(Arc<dyn TokenCredential>),
    /// No token: a loopback endpoint only (the stand-in).
    LoopbackWithoutToken,
}

pub struct RestBroker {
    pipeline: Pipeline,
    /// `https://{namespace}/` (or the stand-in's loopback URL), with a trailing slash.
    base: Url,
    queue: String,
    /// Asked once more, for the principal written into the re-drive record.
    credential: Option<Arc<dyn TokenCredential>>,
}

/// Which request a refusal answered: a 403 or 404 means something else for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Lock,
    Settle,
    Send,
}

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

impl BrokerProperties {
    /// Reads the header field by field, so a problem names the field and never repeats
    /// the value; what did read (MessageId, SequenceNumber) comes back with the problem.
    fn read(raw: Option<&str>) -> Result<Self, (Self, String)> {
        let none = || BrokerProperties {
            message_id: None,
            lock_token: None,
            delivery_count: None,
            sequence_number: None,
            enqueued_time_utc: None,
        };
        let Some(text) = raw else {
            return Err((none(), "no BrokerProperties header".into()));
        };
        if text.len() > MAX_BROKER_PROPERTIES {
            return Err((
                none(),
                format!("the BrokerProperties header is longer than {MAX_BROKER_PROPERTIES} bytes"),
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err((
                none(),
                "the BrokerProperties header is not visible ASCII".into(),
            ));
        }
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
    /// `endpoint`: `https://{namespace}.servicebus.windows.net` or a loopback URL;
    /// `timeout`: per request (each try of it).
    pub fn new(endpoint: &str, queue: &str, auth: Auth, timeout: Duration) -> anyhow::Result<Self> {
        let mut base = Url::parse(endpoint)
            .map_err(|e| anyhow::anyhow!("the Service Bus endpoint {endpoint:?}: {e}"))?;
        let loopback = matches!(base.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
        if base.scheme() != "https" && !loopback {
            anyhow::bail!("the Service Bus endpoint must be https (http only on loopback)");
        }
        if matches!(auth, Auth::LoopbackWithoutToken) && !loopback {
            anyhow::bail!("a Service Bus endpoint that is not loopback needs an Entra credential");
        }
        if matches!(auth, Auth::Entra(_)) && base.scheme() != "https" {
            anyhow::bail!("an Entra token is only sent over https");
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
        let (per_try, credential): (Vec<Arc<dyn Policy>>, _) = match auth {
            Auth::Entra(credential) => (
                vec![Arc::new(BearerTokenAuthorizationPolicy::new(
                    credential.clone(),
                    [SCOPE],
                ))],
                Some(credential),
            ),
            Auth::LoopbackWithoutToken => (Vec::new(), None),
        };
        let options = ClientOptions {
            // Short first waits (an operator is watching), at most a minute in all; the
            // broker's Retry-After wins when it asks for longer.
            retry: RetryOptions::exponential(ExponentialRetryOptions {
                initial_delay: azure_core::time::Duration::milliseconds(200),
                max_retries: 4,
                max_total_elapsed: azure_core::time::Duration::seconds(60),
                max_delay: azure_core::time::Duration::seconds(30),
            }),
            transport: Some(Transport::new(Arc::new(Http(http)))),
            ..ClientOptions::default()
        };
        let pipeline = Pipeline::new(
            Some(env!("CARGO_PKG_NAME")),
            Some(env!("CARGO_PKG_VERSION")),
            options,
            Vec::new(),
            per_try,
            None,
        );
        Ok(RestBroker {
            pipeline,
            base,
            queue: queue.to_owned(),
            credential,
        })
    }

    fn url(&self, path: &str) -> Result<Url, BusError> {
        self.base
            .join(path)
            .map_err(|_| BusError::new(BusErrorKind::Other, "a request URL does not parse"))
    }

    /// The lock's URL, from the broker's `Location`: only on the endpoint's own origin,
    /// so a token is never sent elsewhere.
    fn lock_url(&self, location: &str) -> Result<Url, BusError> {
        let url = self.url(location)?;
        if url.origin() != self.base.origin() {
            return Err(BusError::new(
                BusErrorKind::Other,
                "the broker's Location is on another origin",
            ));
        }
        Ok(url)
    }

    /// One request through the pipeline (token, retries); the answer whatever its status.
    async fn exchange(
        &self,
        method: Method,
        url: Url,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<AsyncRawResponse, BusError> {
        let mut request = Request::new(url, method);
        if body.is_empty() {
            // The broker wants a bodiless request's length said.
            request.insert_header("content-length", "0");
        }
        for (name, value) in headers {
            request.insert_header(name, value);
        }
        request.set_body(body);
        let options = PipelineStreamOptions {
            skip_checks: true,
            ..PipelineStreamOptions::default()
        };
        self.pipeline
            .stream(&Context::new(), &mut request, Some(options))
            .await
            .map_err(failed)
    }

    /// Unlocks (PUT) or deletes (DELETE) a locked dead letter at its `Location`.
    async fn settle_lock(&self, method: Method, lock: &Lock) -> Result<(), BusError> {
        let url = self.lock_url(&lock.location)?;
        let response = self.exchange(method, url, Vec::new(), Vec::new()).await?;
        match response.status() {
            StatusCode::Ok => Ok(()),
            _ => Err(refused(response, Call::Settle).await),
        }
    }
}

/// A request that got no answer: the credential, a timeout, the connection.
fn failed(e: azure_core::Error) -> BusError {
    if matches!(e.kind(), azure_core::error::ErrorKind::Credential) {
        return BusError::new(
            BusErrorKind::Unauthorized,
            format!("no Entra token for {SCOPE}: the credential failed (az login, or the managed identity's settings)"),
        );
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if err
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_timeout)
        {
            return BusError::new(
                BusErrorKind::Timeout,
                "no answer in time (SERVICEBUS_TIMEOUT_MS), after retries",
            );
        }
        source = err.source();
    }
    BusError::new(
        BusErrorKind::Other,
        "the namespace could not be reached, after retries",
    )
}

/// The error for a refused answer, by its status and the request it answered. The
/// broker's text is never passed on; a 403's is read, bounded, to tell a quota or a
/// message too large (documented for send) from a missing role.
async fn refused(response: AsyncRawResponse, request: Call) -> BusError {
    let status = response.status();
    let code = u16::from(status);
    let kind = match status {
        StatusCode::Unauthorized => BusErrorKind::Unauthorized,
        StatusCode::Forbidden => {
            let (_, _, body) = response.deconstruct();
            let text = String::from_utf8_lossy(&bounded_stream(body, MAX_REFUSAL_BYTES).await.0)
                .to_ascii_lowercase();
            if text.contains("quota") || text.contains("too large") || text.contains("size") {
                BusErrorKind::QuotaExceeded
            } else if request == Call::Send
                && !(text.contains("claim") || text.contains("unauthori") || text.contains("role"))
            {
                BusErrorKind::ForbiddenOrQuota
            } else {
                BusErrorKind::Forbidden
            }
        }
        StatusCode::TooManyRequests | StatusCode::ServiceUnavailable => BusErrorKind::Throttled,
        StatusCode::NotFound | StatusCode::Gone if request == Call::Settle => {
            BusErrorKind::LockLost
        }
        StatusCode::NotFound | StatusCode::Gone => BusErrorKind::NoSuchQueue,
        _ => BusErrorKind::Other,
    };
    let what = match request {
        Call::Lock => "peek-lock",
        Call::Settle => "unlock or delete",
        Call::Send => "send",
    };
    BusError::new(kind, format!("the broker answered {code} to a {what}"))
}

/// Up to `limit` bytes of a body, read chunk by chunk (a huge body is never held
/// whole); whether it was longer; whether reading it failed, and how.
async fn bounded_stream(
    mut body: azure_core::http::AsyncResponseBody,
    limit: usize,
) -> (Vec<u8>, bool, Option<BusError>) {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return (out, false, Some(failed(e))),
        };
        let room = limit - out.len();
        if chunk.len() > room {
            out.extend_from_slice(&chunk[..room]);
            return (out, true, None);
        }
        out.extend_from_slice(&chunk);
    }
    (out, false, None)
}

/// Reads a peek-lock answer (201): `BrokerProperties`, `Location`, the custom
/// properties and the body, at most [`MAX_BODY_BYTES`] of it. An answer that does not
/// read concerns this dead letter only: it comes back as [`Unreadable`], with the lock
/// when the `Location` is usable, so the run reports it and goes on.
async fn dead_letter(broker: &RestBroker, response: AsyncRawResponse) -> Locked {
    let (_, headers, body) = response.deconstruct();
    let header = |name: &'static str| headers.get_optional_str(&name.into());
    let lock = header("location")
        .ok_or("no Location header")
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
    let broker_properties = match BrokerProperties::read(header("brokerproperties")) {
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
    let properties = application_properties(&headers);
    let content_type = header("content-type").map(str::to_owned);
    let (body, body_truncated, failure) = bounded_stream(body, MAX_BODY_BYTES).await;
    if let Some(e) = failure {
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

/// The application properties of an answer: every header that is not the protocol's.
fn application_properties(headers: &Headers) -> Vec<Property> {
    let mut properties: Vec<Property> = headers
        .iter()
        .filter(|(name, _)| !PROTOCOL_HEADERS.contains(&name.as_str()))
        .map(|(name, value)| Property {
            name: name.as_str().to_owned(),
            value: value.as_str().to_owned(),
        })
        .collect();
    // The pipeline's headers are a map: give them a stable order.
    properties.sort_by(|a, b| a.name.cmp(&b.name));
    properties
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
        let response = self
            .exchange(Method::Post, url, Vec::new(), Vec::new())
            .await?;
        match response.status() {
            StatusCode::Created => Ok(Some(dead_letter(self, response).await)),
            StatusCode::NoContent => Ok(None),
            _ => Err(refused(response, Call::Lock).await),
        }
    }

    async fn unlock(&self, lock: &Lock) -> Result<(), BusError> {
        self.settle_lock(Method::Put, lock).await
    }

    async fn delete(&self, lock: &Lock) -> Result<(), BusError> {
        self.settle_lock(Method::Delete, lock).await
    }

    async fn send(&self, message: &Outgoing) -> Result<(), BusError> {
        let url = self.url(&format!("{}/messages", self.queue))?;
        // A header value: any text without control characters (UTF-8 beyond ASCII goes
        // as its bytes, as HTTP's obs-text).
        let header_value = |v: &str| -> Result<String, BusError> {
            if !v.chars().any(|c| c.is_control() && c != '\t') {
                Ok(v.to_owned())
            } else {
                Err(BusError::new(
                    BusErrorKind::Other,
                    "a property value is not a header value",
                ))
            }
        };
        let mut headers = vec![(
            "BrokerProperties".to_owned(),
            super::header_json(&serde_json::json!({ "MessageId": message.message_id.0 })),
        )];
        if let Some(content_type) = &message.content_type {
            headers.push(("content-type".to_owned(), header_value(content_type)?));
        }
        for p in &message.properties {
            let name_ok = !p.name.is_empty()
                && p.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok {
                return Err(BusError::new(
                    BusErrorKind::Other,
                    "a property name is not a header name",
                ));
            }
            headers.push((p.name.clone(), header_value(&p.value)?));
        }
        let response = self
            .exchange(Method::Post, url, headers, message.body.clone())
            .await?;
        match response.status() {
            StatusCode::Created => Ok(()),
            _ => Err(refused(response, Call::Send).await),
        }
    }

    async fn principal(&self) -> String {
        let Some(credential) = &self.credential else {
            return "unauthenticated (loopback)".into();
        };
        match credential.get_token(&[SCOPE], None).await {
            Ok(token) => {
                token_principal(token.token.secret()).unwrap_or_else(|| "unknown principal".into())
            }
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
            let raw = raw.map(|r| String::from_utf8_lossy(r).into_owned());
            let Err((read, problem)) = BrokerProperties::read(raw.as_deref()) else {
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
        let read = BrokerProperties::read(Some(
            r#"{"LockToken":"t","DeliveryCount":3,"SequenceNumber":7}"#,
        ))
        .ok()
        .unwrap();
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
