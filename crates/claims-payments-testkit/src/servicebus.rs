//! A local Service Bus stand-in: one queue and its dead-letter sub-queue, speaking the
//! subset of the REST runtime API that `claims-payments dead-letters` uses, as
//! documented (learn.microsoft.com/rest/api/servicebus):
//! - send: `POST /{queue}/messages`, `BrokerProperties` `{"MessageId":..}`, custom
//!   properties as headers, `201`; **duplicate detection**: a MessageId the queue saw less
//!   than the window ago is answered `201` and dropped silently, as the broker does;
//! - peek-lock: `POST /{queue}/$DeadLetterQueue/messages/head?timeout=N`: `201` with the
//!   body, `BrokerProperties` (`MessageId`, `LockToken`, `LockedUntilUtc`,
//!   `DeliveryCount` counted up by each lock, `SequenceNumber`, `EnqueuedTimeUtc`),
//!   `Location` (`.../messages/{sequence}/{lockToken}`) and the custom properties
//!   (`DeadLetterReason`, `DeadLetterErrorDescription`, ...) as headers; `204` when none;
//! - unlock (`PUT`) and delete (`DELETE`) at the `Location`: `200`, or `404` when the
//!   lock expired (lockDuration) or is not the message's (lock lost).
//!
//! Faults, each for the next call of one operation: a status with a reason (401, 403,
//! 429, 503), a lost lock on delete, a send accepted and then answered too late (the
//! client times out after the message was enqueued), and a peek-lock that locks the next
//! dead letter but answers with a `BrokerProperties` header of the test's bytes (or
//! none) or without its `Location`: an answer that does not read. Every accepted
//! operation is logged in order, so a test can check that a send came before its delete.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
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
    /// A send the queue kept, with its MessageId.
    Sent(String),
    /// A send dropped as a duplicate inside the window.
    DroppedDuplicate(String),
    /// A dead letter removed.
    Deleted(String),
}

struct Inner {
    queue: String,
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

/// A running stand-in on a loopback port. Stops when dropped.
pub struct ServiceBus {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: JoinHandle<()>,
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
    /// A queue named `queue` with this duplicate-detection window and lock duration.
    pub async fn start(queue: &str, window: Duration, lock_duration: Duration) -> ServiceBus {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a loopback port for the Service Bus stand-in");
        let addr = listener.local_addr().expect("its address");
        let inner = Arc::new(Mutex::new(Inner {
            queue: queue.to_owned(),
            active: Vec::new(),
            dead: Vec::new(),
            seen: HashMap::new(),
            window,
            lock_duration,
            next_sequence: 1,
            faults: HashMap::new(),
            log: Vec::new(),
            base: format!("http://{addr}"),
        }));
        let app = Router::new()
            .route("/{queue}/messages", post(send))
            .route("/{queue}/{sub}/messages/head", post(peek_lock))
            .route(
                "/{queue}/{sub}/messages/{seq}/{lock}",
                put(unlock).delete(delete),
            )
            .with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ServiceBus {
            addr,
            inner,
            server,
        }
    }

    /// The endpoint for `SERVICEBUS_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
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
        let hang = match fault(&mut inner, Op::Send) {
            Some(Fault::Status(code, reason)) => return status(code, &reason),
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
        let now = OffsetDateTime::now_utc();
        let window = inner.window;
        let duplicate = inner
            .seen
            .get(&message_id)
            .is_some_and(|&seen| now < seen + window);
        if duplicate {
            inner.log.push(Logged::DroppedDuplicate(message_id));
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
            inner.seen.insert(message_id.clone(), now);
            inner.log.push(Logged::Sent(message_id));
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
    let mangle = match fault(&mut inner, Op::Lock) {
        Some(Fault::Status(code, reason)) => return status(code, &reason),
        other => other,
    };
    let now = OffsetDateTime::now_utc();
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
    let now = OffsetDateTime::now_utc();
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
    if let Some(Fault::Status(code, reason)) = fault(&mut inner, Op::Unlock) {
        return status(code, &reason);
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
    match fault(&mut inner, Op::Delete) {
        Some(Fault::Status(code, reason)) => return status(code, &reason),
        Some(Fault::LockLost) => {
            if let Some(m) = inner.dead.iter_mut().find(|m| m.sequence_number == seq) {
                m.lock = None;
            }
            return status(404, "the lock is lost");
        }
        _ => {}
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
