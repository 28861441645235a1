//! The queue's side of the operator's dead-letter tool: what `dead-letters` needs from
//! Service Bus, behind [`Broker`], a small trait of our own, and its one adapter,
//! [`rest::RestBroker`], over the Service Bus REST runtime API.
//!
//! Why REST and not AMQP 1.0 (docs/reference.md §12 says the same for operators):
//! - the official Rust crate (`azure_messaging_servicebus` on AMQP) is not published,
//!   and the one AMQP crate that reads a dead-letter queue (`azservicebus`) pins
//!   `azure_identity` 0.25, a second credential stack beside ours (1.0);
//! - the REST subset needed here is small, documented and plain HTTP: peek-lock
//!   (`POST {queue}/$DeadLetterQueue/messages/head?timeout=`), unlock (`PUT`) and delete
//!   (`DELETE .../messages/{messageId}/{lockToken}`), send (`POST {queue}/messages` with
//!   `BrokerProperties`, custom properties as headers), Entra tokens for
//!   `https://servicebus.azure.net/.default`; it is testable against a local stand-in
//!   (the testkit's `servicebus`) without Docker.
//!
//! What REST cannot do, and what that costs here:
//! - **no peek without a lock**: the runtime API has peek-lock and receive-and-delete
//!   only, so `list` locks each dead letter in turn and unlocks it at the end. A lock is
//!   invisible to nobody but another DLQ reader, but it raises the dead letter's
//!   DeliveryCount by one per listing: the count shown is the one the broker reports
//!   minus our own lock; and at most `--limit` messages are locked at once (a lock lasts
//!   the queue's lockDuration, PT1M here; no renewal is needed for batches that size);
//! - no sequence-number access; no dead-lettering time, in REST or anywhere else: the
//!   peek-lock's `BrokerProperties` has `EnqueuedTimeUtc`, `SequenceNumber`,
//!   `DeliveryCount`, `LockToken`, `LockedUntilUtc`, and AMQP's annotations
//!   (`x-opt-enqueued-time`, `x-opt-deadletter-source`, ...) have no such time either, so
//!   the listing shows the enqueued time and "-" for the dead-lettering time
//!   (docs/runbook.md §5, step 2, gives the sources);
//! - application properties travel as HTTP headers: values are kept byte for byte (the
//!   REST encoding, JSON-quoted strings), which AMQP would keep typed; **names arrive in
//!   lower case**: HTTP field names are case-insensitive (RFC 9110 §5.1) and the Rust
//!   HTTP stack (the `http` crate under hyper, reqwest and azure_core) stores them
//!   lower-cased, so `Diagnostic-Id` is read, and re-sent, as `diagnostic-id`. Readers
//!   of the queue match property names ignoring case (the consumer does);
//! - the Service Bus emulator serves messages over AMQP only (its maintainers:
//!   github.com/Azure/azure-service-bus-emulator-installer/issues/29; its HTTP port 5300
//!   is health and management), so this adapter cannot run against it: tests use the
//!   testkit's stand-in.

pub mod rest;
pub(crate) mod settings;

use std::fmt;

use async_trait::async_trait;
use time::OffsetDateTime;

/// The most body bytes the tool keeps of one dead letter: a ClaimApproved is far
/// below it; anything bigger is shown as too large (and never resubmitted).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The broker's lock on one dead letter, from a peek-lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockToken(pub String);

/// Where a locked dead letter is unlocked or deleted: the `Location` the broker gave
/// with the peek-lock (it names the message and its lock token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub location: String,
}

/// The broker's MessageId of a dead letter, as sent (any text up to 128 characters,
/// or absent when the broker's properties do not carry it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerMessageId(pub String);

/// One application (custom) property, as the broker sent it: the header name and its
/// raw value (REST encodes strings as JSON strings, `"text"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    pub name: String,
    pub value: String,
}

/// A dead letter as a peek-lock returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub message_id: Option<BrokerMessageId>,
    pub sequence_number: Option<i64>,
    pub lock_token: LockToken,
    /// Where the broker said the locked message is: unlock and delete go there.
    pub lock: Lock,
    /// As the broker reports it, our own lock included.
    pub delivery_count: u32,
    pub enqueued_at: Option<OffsetDateTime>,
    pub content_type: Option<String>,
    pub properties: Vec<Property>,
    /// At most [`MAX_BODY_BYTES`].
    pub body: Vec<u8>,
    /// The body was longer than [`MAX_BODY_BYTES`] and is cut.
    pub body_truncated: bool,
}

impl DeadLetter {
    /// A custom property's value, the JSON quotes of a string taken off.
    pub fn property(&self, name: &str) -> Option<String> {
        self.properties
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .map(|p| unquote(&p.value))
    }
}

/// A REST property value as text: a JSON string's content, anything else as it is.
pub fn unquote(value: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => value.to_owned(),
    }
}

/// A peek-locked dead letter whose answer did not read: a `BrokerProperties` header that
/// is missing, not JSON or of the wrong shape, no `LockToken`, no `Location`, a body cut
/// off. It concerns this dead letter only: the run reports it and goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// As far as the answer named it (bounded, like any MessageId shown).
    pub message_id: Option<BrokerMessageId>,
    pub sequence_number: Option<i64>,
    /// The lock, when the answer had a usable `Location`: it is given back at the end of
    /// the run like any other; without one the lock expires by itself (lockDuration).
    pub lock: Option<Lock>,
    /// What did not read, in the tool's own words: never the peer's text, which may be
    /// anything (control characters, a token, megabytes).
    pub problem: String,
}

/// What a peek-lock returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Locked {
    Letter(DeadLetter),
    Unreadable(Unreadable),
}

/// A message to send: MessageId, body, content type and the custom properties.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub message_id: BrokerMessageId,
    pub content_type: Option<String>,
    pub properties: Vec<Property>,
    pub body: Vec<u8>,
}

/// What went wrong talking to the broker, by what an operator does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusErrorKind {
    /// 401, or no token: the credential.
    Unauthorized,
    /// 403 naming a missing role: the identity lacks Data Receiver or Data Sender.
    Forbidden,
    /// 403 to a send naming a quota or a size: the namespace's quota is exceeded (the
    /// queue is full) or the message is too large.
    QuotaExceeded,
    /// 403 to a send that names neither: a missing role or a quota (both documented).
    ForbiddenOrQuota,
    /// 429 or 503 still after the retries, which honoured `Retry-After`.
    Throttled,
    /// 404/410 on a lock: the lock expired or the message is gone.
    LockLost,
    /// 404/410 on the queue: the queue (or namespace path) does not exist.
    NoSuchQueue,
    /// No answer in time: a send may or may not have been accepted.
    Timeout,
    /// Anything else (the connection, a 5xx after retries, an answer that does not read).
    Other,
}

impl BusErrorKind {
    /// Whether it concerns the whole run rather than one dead letter: the run stops
    /// (nothing more is sent or removed) and every lock is given back.
    pub fn ends_the_run(self) -> bool {
        !matches!(self, BusErrorKind::LockLost | BusErrorKind::Timeout)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BusError {
    pub kind: BusErrorKind,
    /// The tool's own words (the status and the request), bounded: never the broker's
    /// text, never a token.
    pub detail: String,
}

impl fmt::Display for BusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            BusErrorKind::Unauthorized => "not authenticated (401): sign in again (az login) or check the managed identity",
            BusErrorKind::Forbidden => {
                "not authorised (403): the identity needs Azure Service Bus Data Receiver and Data Sender on the queue"
            }
            BusErrorKind::QuotaExceeded => {
                "refused (403): the namespace's quota is exceeded (the queue is full) or the message is too large; free space on the queue, then run again"
            }
            BusErrorKind::ForbiddenOrQuota => {
                "refused (403): either the identity lacks Azure Service Bus Data Sender on the queue, or the namespace's quota is exceeded (the queue is full)"
            }
            BusErrorKind::Throttled => "throttled (429/503) still after retrying as the broker asked (Retry-After); run again later",
            BusErrorKind::LockLost => "lock lost",
            BusErrorKind::NoSuchQueue => "no such queue (404): check CLAIM_APPROVED_QUEUE and the namespace",
            BusErrorKind::Timeout => "timed out",
            BusErrorKind::Other => "failed",
        };
        write!(f, "Service Bus {what}: {}", self.detail)
    }
}

impl BusError {
    pub fn new(kind: BusErrorKind, detail: impl Into<String>) -> Self {
        BusError {
            kind,
            detail: bounded(&detail.into(), 300),
        }
    }
}

/// `value` as JSON text in ASCII only (every other character as a `\u` escape, UTF-16
/// surrogate pairs beyond the BMP), so it fits an HTTP header (`BrokerProperties`) whatever
/// the MessageId holds: a header value is visible ASCII, and a MessageId may be any string.
pub fn header_json(value: &serde_json::Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && !c.is_ascii_control() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// At most `chars` characters of `text`.
pub fn bounded(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// The queue operations the dead-letter tool uses.
#[async_trait]
pub trait Broker: Send + Sync {
    /// Peek-locks the next unlocked dead letter; `None` when there is none. An error is
    /// one that concerns the whole run (401/403, throttling, the namespace unreachable);
    /// an answer about one dead letter that does not read is [`Locked::Unreadable`].
    async fn lock_next_dead_letter(&self) -> Result<Option<Locked>, BusError>;
    /// Gives a lock back: the dead letter stays, for the next reader.
    async fn unlock(&self, lock: &Lock) -> Result<(), BusError>;
    /// Removes a locked dead letter.
    async fn delete(&self, lock: &Lock) -> Result<(), BusError>;
    /// Sends `message` to the queue; `Ok` once the broker accepted it.
    async fn send(&self, message: &Outgoing) -> Result<(), BusError>;
    /// Who acts, as far as the credential says (for the re-drive record).
    async fn principal(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_properties_fit_a_header_whatever_the_message_id_holds() {
        for id in [
            "zahlung ä 695 ✓",
            "emoji 💸",
            "tab\there",
            "plain-1",
            "quote\"and\\",
        ] {
            let json = header_json(&serde_json::json!({ "MessageId": id }));
            // What the reading side does with the header: visible ASCII only.
            let header = reqwest::header::HeaderValue::from_str(&json).unwrap();
            assert_eq!(header.to_str().ok(), Some(json.as_str()), "{id:?}");
            let read: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(read["MessageId"], id);
        }
    }
}
