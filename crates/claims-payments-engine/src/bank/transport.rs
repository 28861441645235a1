//! The bank's transport: one request out, one bounded answer back. Production sends it
//! over HTTPS with reqwest (the product crate's `bank::http`); the deterministic simulator puts a
//! simulated bank behind the same trait. Everything above it (classifying answers,
//! retries, backoff, the send window) is the client's, and runs the same on both.

use async_trait::async_trait;
use http::{HeaderMap, StatusCode};

#[cfg(doc)]
use super::MAX_ANSWER_BYTES;
use crate::domain::IdempotencyKey;

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
