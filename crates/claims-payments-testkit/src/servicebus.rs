//! A local Service Bus stand-in: one queue and its dead-letter sub-queue, speaking the
//! subset of the REST runtime API that `claims-payments dead-letters` uses, as Microsoft
//! documents it, unkind parts included. It follows:
//! - learn.microsoft.com/rest/api/servicebus/send-message-to-queue: `POST
//!   /{queue}/messages`, `BrokerProperties` `{"MessageId":..}`, custom properties as
//!   headers, `201`; its documented refusals: 401 authorization failure, **403 quota
//!   exceeded or message too large** (a 403 is not always a missing role), 404/410 no
//!   such entity, 500;
//! - learn.microsoft.com/azure/service-bus-messaging/duplicate-detection: a MessageId the
//!   queue saw less than the window ago is answered `201` and **dropped silently**, the
//!   window judged by **the broker's own clock** (which may run ahead of or behind the
//!   client's: [`ServiceBus::set_clock_skew`]);
//! - .../peek-lock-message-non-destructive-read: `POST
//!   /{queue}/$DeadLetterQueue/messages/head?timeout=N`: `201` with the body,
//!   `BrokerProperties` (`MessageId`, `LockToken`, `LockedUntilUtc`, `DeliveryCount`
//!   counted up by each lock, `SequenceNumber`, `EnqueuedTimeUtc`, whole seconds),
//!   `Location` (`.../messages/{sequence}/{lockToken}`) and the custom properties
//!   (`DeadLetterReason`, `DeadLetterErrorDescription`, ...) as headers; `204` when none;
//! - .../unlock-message and .../delete-message: at the `Location`, `200`, or `404` once
//!   the lock expired (lockDuration, **by the broker's clock**) or is not the message's;
//! - .../message-headers-and-properties and "Service Bus throttling": every answer carries
//!   the broker's `Date`; a busy namespace answers `429`/`503` with `Retry-After`;
//! - learn.microsoft.com/azure/service-bus-messaging/service-bus-managed-service-identity
//!   and authenticate-application: with [`ServiceBus::start_https`] every request needs
//!   `Authorization: Bearer` with the expected token (else `401`), over HTTPS (its own
//!   throwaway CA: [`ServiceBus::ca_pem`]); a missing data role ([`ServiceBus::deny`])
//!   answers `403` "Unauthorized access. 'Send' claim(s) are required".
//!
//! Custom property names are kept as the stand-in's HTTP server hands them over. That
//! server (hyper) lower-cases header names, as every Rust HTTP stack does; the real broker
//! keeps what arrives on the wire, and a Rust client sends lower case, so both store the
//! same names for what the tool sends. Values are kept byte for byte.
//!
//! Faults, each for the next call of one operation: a status with a reason (401, 403
//! quota, 500), throttling with `Retry-After`, a lost lock on delete, a send accepted
//! and then answered too late (the client times out after the message was enqueued), and
//! a peek-lock that locks the next dead letter but answers with a `BrokerProperties`
//! header of the test's bytes (or none) or without its `Location`: an answer that does
//! not read. Every accepted operation is logged in order, so a test can check that a send
//! came before its delete.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::Router;
use time::OffsetDateTime;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// The dead-letter sub-queue's path segment.
pub const DLQ: &str = "$DeadLetterQueue";

/// One message on the queue or its dead-letter sub-queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub sequence_number: i64,
    pub message_id: String,
    pub content_type: Option<String>,
    /// Custom properties (header name, raw value), as sent.
    pub properties: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delivery_count: u32,
    pub enqueued_at: OffsetDateTime,
    lock: Option<(Uuid, OffsetDateTime)>,
}

impl Message {
    /// The message it stands for: the original a re-drive copy names
    /// (`redrive::ORIGINAL_MESSAGE_ID`), else its own MessageId; what the consumer keys its
    /// inbox by.
    pub fn stands_for(&self) -> String {
        self.property(claims_payments::redrive::ORIGINAL_MESSAGE_ID)
            .map(claims_payments::seams::servicebus::unquote)
            .unwrap_or_else(|| self.message_id.clone())
    }

    /// A custom property's raw value.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The operations a fault can be set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Send,
    Lock,
    Unlock,
    Delete,
}

/// What the next call of an operation meets.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answered with this status and reason; nothing happens.
    Status(u16, String),
    /// Answered `429` or `503` with `Retry-After: seconds`; nothing happens.
    Throttled(u16, u64),
    /// Delete: the lock is gone (expired, taken): `404`, the message stays, unlocked.
    LockLost,
    /// Send: the message is enqueued, then the answer waits this long (past the
    /// client's timeout).
    AcceptThenHang(Duration),
    /// Lock: the next dead letter is locked as usual, but the answer's `BrokerProperties`
    /// is these bytes (`None`: no such header).
    BrokerProperties(Option<Vec<u8>>),
    /// Lock: the next dead letter is locked as usual, but the answer has no `Location`.
    NoLocation,
}

/// An accepted operation, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logged {
    /// A send the queue kept, with the MessageId of the message it stands for
    /// ([`Message::stands_for`]: a re-drive copy's original).
    Sent(String),
    /// A send dropped as a duplicate inside the window (the same).
    DroppedDuplicate(String),
    /// A dead letter removed, with its MessageId.
    Deleted(String),
}

struct Inner {
    queue: String,
    /// The broker's clock: the real one shifted by this many milliseconds.
    skew_ms: i64,
    /// With HTTPS: the bearer token every request must carry.
    token: Option<String>,
    /// Operations the caller's identity has no data role for (403).
    denied: Vec<Op>,
    /// Requests answered, by operation (throttled and refused included).
    requests: HashMap<Op, usize>,
    active: Vec<Message>,
    dead: Vec<Message>,
    /// MessageId -> when the queue last accepted it (duplicate detection).
    seen: HashMap<String, OffsetDateTime>,
    window: Duration,
    lock_duration: Duration,
    next_sequence: i64,
    faults: HashMap<Op, VecDeque<Fault>>,
    log: Vec<Logged>,
    base: String,
}

impl Inner {
    /// The broker's own time.
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + time::Duration::milliseconds(self.skew_ms)
    }
}

/// A running stand-in on a loopback port. Stops when dropped.
pub struct ServiceBus {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: JoinHandle<()>,
    ca_pem: Option<String>,
}

impl Drop for ServiceBus {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Shared = Arc<Mutex<Inner>>;

fn locked(inner: &Shared) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

impl ServiceBus {
    /// A queue named `queue` with this duplicate-detection window and lock duration, over
    /// plain HTTP without tokens (`SERVICEBUS_ENDPOINT`).
    pub async fn start(queue: &str, window: Duration, lock_duration: Duration) -> ServiceBus {
        Self::launch(queue, window, lock_duration, None).await
    }

    /// The same over HTTPS (a certificate for 127.0.0.1 from its own CA: [`Self::ca_pem`]),
    /// where every request must carry `Authorization: Bearer {token}`, as the namespace
    /// wants an Entra token: the operator tool's real path.
    pub async fn start_https(
        queue: &str,
        window: Duration,
        lock_duration: Duration,
        token: &str,
    ) -> ServiceBus {
        Self::launch(queue, window, lock_duration, Some(token.to_owned())).await
    }

    async fn launch(
        queue: &str,
        window: Duration,
        lock_duration: Duration,
        token: Option<String>,
    ) -> ServiceBus {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a loopback port for the Service Bus stand-in");
        let addr = listener.local_addr().expect("its address");
        let https = token.is_some();
        let scheme = if https { "https" } else { "http" };
        let inner = Arc::new(Mutex::new(Inner {
            queue: queue.to_owned(),
            skew_ms: 0,
            token,
            denied: Vec::new(),
            requests: HashMap::new(),
            active: Vec::new(),
            dead: Vec::new(),
            seen: HashMap::new(),
            window,
            lock_duration,
            next_sequence: 1,
            faults: HashMap::new(),
            log: Vec::new(),
            base: format!("{scheme}://{addr}"),
        }));
        let app = Router::new()
            .route("/{queue}/messages", post(send))
            .route("/{queue}/{sub}/messages/head", post(peek_lock))
            .route(
                "/{queue}/{sub}/messages/{seq}/{lock}",
                put(unlock).delete(delete),
            )
            .layer(middleware::from_fn_with_state(inner.clone(), authorise))
            .with_state(inner.clone());
        let (server, ca_pem) = if https {
            let (config, ca_pem) = tls_config();
            (tokio::spawn(serve_tls(listener, app, config)), Some(ca_pem))
        } else {
            let server = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            (server, None)
        };
        ServiceBus {
            addr,
            inner,
            server,
            ca_pem,
        }
    }

    /// The PEM of the CA that signed an HTTPS stand-in's certificate (for `SSL_CERT_FILE`).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The namespace's host and port (`ServiceBusConnection__fullyQualifiedNamespace`),
    /// for an HTTPS stand-in.
    pub fn namespace(&self) -> String {
        self.addr.to_string()
    }

    /// Shifts the broker's clock (negative: behind the caller's): its enqueued times,
    /// duplicate-detection window, lock expiry and `Date` headers follow it.
    pub fn set_clock_skew(&self, skew: time::Duration) {
        locked(&self.inner).skew_ms = skew.whole_milliseconds() as i64;
    }

    /// The broker's own time.
    pub fn now(&self) -> OffsetDateTime {
        locked(&self.inner).now()
    }

    /// The caller's identity has no data role for `op` from now on: `403`.
    pub fn deny(&self, op: Op) {
        locked(&self.inner).denied.push(op);
    }

    /// How many requests of `op` were answered (refused and throttled ones included).
    pub fn requests(&self, op: Op) -> usize {
        locked(&self.inner).requests.get(&op).copied().unwrap_or(0)
    }

    /// The endpoint for `SERVICEBUS_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        locked(&self.inner).base.clone()
    }

    /// Puts a dead letter in the sub-queue as the broker would after `delivery_count`
    /// deliveries (the MessageId also enters the duplicate-detection history at
    /// `enqueued_at`). Extra properties are added as they are given.
    #[allow(clippy::too_many_arguments)]
    pub fn dead_letter(
        &self,
        message_id: &str,
        body: &[u8],
        delivery_count: u32,
        reason: &str,
        description: &str,
        enqueued_at: OffsetDateTime,
        properties: &[(&str, &str)],
    ) {
        let mut inner = locked(&self.inner);
        let sequence_number = inner.next_sequence;
        inner.next_sequence += 1;
        let quoted = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let mut props = vec![
            ("DeadLetterReason".to_owned(), quoted(reason)),
            ("DeadLetterErrorDescription".to_owned(), quoted(description)),
        ];
        props.extend(
            properties
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string())),
        );
        inner.dead.push(Message {
            sequence_number,
            message_id: message_id.to_owned(),
            content_type: Some("application/json".into()),
            properties: props,
            body: body.to_vec(),
            delivery_count,
            enqueued_at,
            lock: None,
        });
        let seen = inner
            .seen
            .entry(message_id.to_owned())
            .or_insert(enqueued_at);
        *seen = (*seen).max(enqueued_at);
    }

    /// The next call of `op` meets `fault`.
    pub fn fail_next(&self, op: Op, fault: Fault) {
        locked(&self.inner)
            .faults
            .entry(op)
            .or_default()
            .push_back(fault);
    }

    /// The messages on the queue (sent and kept).
    pub fn active(&self) -> Vec<Message> {
        locked(&self.inner).active.clone()
    }

    /// Takes the messages on the queue off it (a receiver that completes them).
    pub fn take_active(&self) -> Vec<Message> {
        std::mem::take(&mut locked(&self.inner).active)
    }

    /// A message the broker dead-lettered on its own after its last delivery
    /// (`MaxDeliveryCountExceeded` at the deployed MaxDeliveryCount, 10).
    pub fn exhausted(&self, message_id: &str, body: &[u8], enqueued_at: OffsetDateTime) {
        self.dead_letter(
            message_id,
            body,
            10,
            "MaxDeliveryCountExceeded",
            "",
            enqueued_at,
            &[],
        );
    }

    /// The dead letters still in the sub-queue.
    pub fn dead_letters(&self) -> Vec<Message> {
        locked(&self.inner).dead.clone()
    }

    /// Every accepted send, dropped duplicate and delete, in order.
    pub fn log(&self) -> Vec<Logged> {
        locked(&self.inner).log.clone()
    }
}

fn fault(inner: &mut Inner, op: Op) -> Option<Fault> {
    inner.faults.get_mut(&op).and_then(VecDeque::pop_front)
}

/// The answer of a fault that refuses the call outright, if it is one.
fn refusal(fault: &Option<Fault>) -> Option<Response> {
    match fault {
        Some(Fault::Status(code, reason)) => Some(status(*code, reason)),
        Some(Fault::Throttled(code, seconds)) => {
            let mut r = status(*code, "The request was terminated because the entity is being throttled. Please wait and retry.");
            r.headers_mut()
                .insert("Retry-After", HeaderValue::from(*seconds));
            Some(r)
        }
        _ => None,
    }
}

/// Which operation a request is, by its method and path.
fn operation(request: &Request) -> Option<Op> {
    let path = request.uri().path();
    match *request.method() {
        axum::http::Method::POST if path.ends_with("/messages/head") => Some(Op::Lock),
        axum::http::Method::POST if path.ends_with("/messages") => Some(Op::Send),
        axum::http::Method::PUT => Some(Op::Unlock),
        axum::http::Method::DELETE => Some(Op::Delete),
        _ => None,
    }
}

/// Every request: counted; refused without the token (401) or its data role (403), as
/// the namespace does with Entra ID; every answer carries the broker's `Date`.
async fn authorise(State(inner): State<Shared>, request: Request, next: Next) -> Response {
    let refused = {
        let mut inner = locked(&inner);
        let op = operation(&request);
        if let Some(op) = op {
            *inner.requests.entry(op).or_default() += 1;
        }
        let bearer = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match (&inner.token, op) {
            (Some(token), _) if bearer != Some(token.as_str()) => Some(status(
                401,
                "ExpiredToken: The token is expired or missing.",
            )),
            (_, Some(op)) if inner.denied.contains(&op) => {
                let claim = if op == Op::Send { "Send" } else { "Listen" };
                Some(status(
                    403,
                    &format!("Unauthorized access. '{claim}' claim(s) are required to perform this operation."),
                ))
            }
            _ => None,
        }
    };
    let date = httpdate::fmt_http_date(locked(&inner).now().into());
    let mut response = match refused {
        Some(r) => r,
        None => next.run(request).await,
    };
    if let Ok(v) = HeaderValue::from_str(&date) {
        response.headers_mut().insert("Date", v);
    }
    response
}

/// A throwaway CA and a certificate for 127.0.0.1 and localhost signed by it: the TLS
/// server's configuration and the CA's PEM.
fn tls_config() -> (Arc<rustls::ServerConfig>, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca_params = CertificateParams::new(Vec::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Service Bus stand-in CA");
    let ca = ca_params.self_signed(&ca_key).expect("the CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("a server key");
    let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server parameters");
    let cert = params
        .signed_by(&key, &issuer)
        .expect("the server certificate");
    let chain = vec![cert.der().clone()];
    let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
        .expect("the server key as DER");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(chain, private)
    .expect("the server certificate and key");
    (Arc::new(config), ca.pem())
}

/// Serves `app` over TLS on `listener`, one task per connection.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: Router,
    config: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
        });
    }
}

fn status(code: u16, reason: &str) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        format!(
            "<Error><Code>{}</Code><Detail>{reason}</Detail></Error>",
            code.as_u16()
        ),
    )
        .into_response()
}

/// Headers that are the protocol's, not custom properties.
fn is_protocol_header(name: &str) -> bool {
    matches!(
        name,
        "brokerproperties"
            | "content-type"
            | "content-length"
            | "host"
            | "authorization"
            | "accept"
            | "accept-encoding"
            | "user-agent"
            | "connection"
            | "transfer-encoding"
            // Azure's request id, which every Azure SDK pipeline adds.
            | "x-ms-client-request-id"
    )
}

async fn send(
    State(inner): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hang = {
        let mut inner = locked(&inner);
        if queue != inner.queue {
            return status(404, "no such queue");
        }
        let fault = fault(&mut inner, Op::Send);
        if let Some(r) = refusal(&fault) {
            return r;
        }
        let hang = match fault {
            Some(Fault::AcceptThenHang(d)) => Some(d),
            _ => None,
        };
        let broker: serde_json::Value = headers
            .get("BrokerProperties")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        let message_id = broker
            .get("MessageId")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| Uuid::new_v4().simple().to_string());
        let now = inner.now();
        let window = inner.window;
        let duplicate = inner
            .seen
            .get(&message_id)
            .is_some_and(|&seen| now < seen + window);
        let original = headers
            .get(claims_payments::redrive::ORIGINAL_MESSAGE_ID)
            .and_then(|v| v.to_str().ok())
            .map(claims_payments::seams::servicebus::unquote)
            .unwrap_or_else(|| message_id.clone());
        if duplicate {
            inner.log.push(Logged::DroppedDuplicate(original));
        } else {
            let sequence_number = inner.next_sequence;
            inner.next_sequence += 1;
            let properties = headers
                .iter()
                .filter(|(n, _)| !is_protocol_header(n.as_str()))
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            inner.active.push(Message {
                sequence_number,
                message_id: message_id.clone(),
                content_type: headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                properties,
                body: body.to_vec(),
                delivery_count: 0,
                enqueued_at: now,
                lock: None,
            });
            inner.seen.insert(message_id, now);
            inner.log.push(Logged::Sent(original));
        }
        hang
    };
    if let Some(d) = hang {
        tokio::time::sleep(d).await;
    }
    StatusCode::CREATED.into_response()
}

async fn peek_lock(
    State(inner): State<Shared>,
    Path((queue, sub)): Path<(String, String)>,
) -> Response {
    let mut inner = locked(&inner);
    if queue != inner.queue || sub != DLQ {
        return status(404, "no such entity");
    }
    let mangle = fault(&mut inner, Op::Lock);
    if let Some(r) = refusal(&mangle) {
        return r;
    }
    let now = inner.now();
    let until = now + inner.lock_duration;
    let base = format!("{}/{}/{DLQ}/messages", inner.base, inner.queue);
    let Some(m) = inner
        .dead
        .iter_mut()
        .find(|m| m.lock.is_none_or(|(_, until)| until <= now))
    else {
        return StatusCode::NO_CONTENT.into_response();
    };
    let token = Uuid::new_v4();
    m.lock = Some((token, until));
    m.delivery_count += 1;
    let broker = serde_json::json!({
        "MessageId": m.message_id,
        "LockToken": token.to_string(),
        "LockedUntilUtc": httpdate::fmt_http_date(until.into()),
        "DeliveryCount": m.delivery_count,
        "SequenceNumber": m.sequence_number,
        "EnqueuedTimeUtc": httpdate::fmt_http_date(m.enqueued_at.into()),
        "State": "Active",
    });
    let mut headers = HeaderMap::new();
    let mut put = |name: &str, value: &str| {
        if let (Ok(n), Ok(v)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(n, v);
        }
    };
    let broker_properties = match &mangle {
        Some(Fault::BrokerProperties(bytes)) => bytes.as_deref().map(HeaderValue::from_bytes),
        _ => Some(HeaderValue::from_str(
            &claims_payments::seams::servicebus::header_json(&broker),
        )),
    };
    if !matches!(mangle, Some(Fault::NoLocation)) {
        put("Location", &format!("{base}/{}/{token}", m.sequence_number));
    }
    if let Some(ct) = &m.content_type {
        put("Content-Type", ct);
    }
    for (n, v) in &m.properties {
        put(n, v);
    }
    if let Some(Ok(v)) = broker_properties {
        headers.insert("BrokerProperties", v);
    }
    (StatusCode::CREATED, headers, m.body.clone()).into_response()
}

/// The dead letter a lock URL names, if the lock is still its own and alive.
fn holder(inner: &mut Inner, seq: i64, lock: &str) -> Option<usize> {
    let now = inner.now();
    inner.dead.iter().position(|m| {
        m.sequence_number == seq
            && m.lock
                .is_some_and(|(t, until)| t.to_string() == lock && until > now)
    })
}

async fn unlock(
    State(inner): State<Shared>,
    Path((_queue, _sub, seq, lock)): Path<(String, String, i64, String)>,
) -> Response {
    let mut inner = locked(&inner);
    if let Some(r) = refusal(&fault(&mut inner, Op::Unlock)) {
        return r;
    }
    match holder(&mut inner, seq, &lock) {
        Some(i) => {
            inner.dead[i].lock = None;
            StatusCode::OK.into_response()
        }
        None => status(404, "the lock is lost or the message is gone"),
    }
}

async fn delete(
    State(inner): State<Shared>,
    Path((_queue, _sub, seq, lock)): Path<(String, String, i64, String)>,
) -> Response {
    let mut inner = locked(&inner);
    let fault = fault(&mut inner, Op::Delete);
    if let Some(r) = refusal(&fault) {
        return r;
    }
    if let Some(Fault::LockLost) = fault {
        if let Some(m) = inner.dead.iter_mut().find(|m| m.sequence_number == seq) {
            m.lock = None;
        }
        return status(404, "the lock is lost");
    }
    match holder(&mut inner, seq, &lock) {
        Some(i) => {
            let m = inner.dead.remove(i);
            inner.log.push(Logged::Deleted(m.message_id));
            StatusCode::OK.into_response()
        }
        None => status(404, "the lock is lost or the message is gone"),
    }
}
