//! The store port: what the consumer needs from a database, and nothing more.
//!
//! The guard lives behind [`Store::claim`]: the inbox record ("this message is being
//! or was handled") and the payment record (the business fact) are created in one
//! atomic step, under keys the database itself keeps unique. A second claim of the
//! same message, or of the same claim under another message, is refused by the
//! database, never by a read that happened to come first.
//!
//! Adapters live outside the engine, in the product crate's `store`: `sqlite` (the
//! embedded default), `cosmos` (production) and `postgres` (several instances on one
//! PostgreSQL database). All pass the same conformance suite (the testkit's `conformance`
//! module, run by the product crate's `tests/product/sqlite_conformance.rs` and
//! `postgres_conformance.rs`, and the dev crate's `cosmos_conformance.rs`).
//!
//! A second guard, for consumers whose work is one record, is the capability in [`once`]:
//! the inbox record and an effect record in one atomic step. It is a trait of its own
//! ([`once::OnceStore`]), implemented by all three adapters.

pub mod decorator;
pub mod once;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::domain::OutcomeKind;
use crate::domain::{
    ClaimId, IdempotencyKey, MessageId, Money, PayeeRef, PayloadHash, Purpose, TenantId,
};

pub use crate::ambient::{AttemptId, Boot};
pub use decorator::{StoreCall, StoreDecorator};

/// An opaque concurrency token: a Cosmos ETag, or a SQLite row version.
/// Conditional writes succeed only if the record still carries it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    pub record: T,
    pub version: Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxStatus {
    InProgress,
    Completed,
}

impl InboxStatus {
    const ALL: [InboxStatus; 2] = [InboxStatus::InProgress, InboxStatus::Completed];

    pub fn as_str(&self) -> &'static str {
        match self {
            InboxStatus::InProgress => "in_progress",
            InboxStatus::Completed => "completed",
        }
    }

    /// The status a stored string names, as [`Self::as_str`] writes it; `None` for any
    /// other string.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// The "already handled" record, one per (consumer, claim, message). It expires after
/// the retention; the payment record is the permanent guard behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxRecord {
    pub consumer: String,
    pub claim_id: ClaimId,
    pub message_id: MessageId,
    pub payload_hash: PayloadHash,
    pub status: InboxStatus,
    /// How the message ended, once completed.
    pub outcome: Option<InboxOutcome>,
    /// The attempt that created the record or last took it over.
    pub owner: AttemptId,
    /// While in progress: the owner's lease. After it, another attempt may take over.
    pub lease_until: Option<OffsetDateTime>,
    pub first_delivery_count: u32,
    pub last_delivery_count: u32,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    /// When the record may be purged (Cosmos: `ttl`, counted from the last write).
    pub expires_at: OffsetDateTime,
}

impl InboxRecord {
    pub fn lease_alive(&self, now: OffsetDateTime) -> bool {
        self.status == InboxStatus::InProgress && self.lease_until.is_some_and(|until| until > now)
    }
}

/// What a completed inbox record says about how it ended. Stored as one string (the
/// `outcome` column or field), exactly as before this type existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxOutcome {
    /// A message's outcome (`paid`, `recorded`, ...), written by the consumer or reconcile.
    Message(OutcomeKind),
    /// A reconcile run's lease record, given back after the run (`reconciled`).
    RunReleased,
    /// A `payments-api` key record: the answer it replays, as JSON text (always an
    /// object, so it never collides with a name above), kept byte for byte.
    HttpAnswer(String),
}

impl InboxOutcome {
    const RUN_RELEASED: &'static str = "reconciled";

    /// The stored string.
    pub fn as_str(&self) -> &str {
        match self {
            InboxOutcome::Message(kind) => kind.as_str(),
            InboxOutcome::RunReleased => Self::RUN_RELEASED,
            InboxOutcome::HttpAnswer(json) => json,
        }
    }

    /// Reads a stored string. An unknown one is an error (a bug or a hand edit), never
    /// guessed at.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(kind) = OutcomeKind::parse(s) {
            Ok(InboxOutcome::Message(kind))
        } else if s == Self::RUN_RELEASED {
            Ok(InboxOutcome::RunReleased)
        } else if s.starts_with('{') {
            Ok(InboxOutcome::HttpAnswer(s.to_owned()))
        } else {
            Err(format!("unknown outcome {s:?}"))
        }
    }

    /// The message outcome, if this is one.
    pub fn kind(&self) -> Option<OutcomeKind> {
        match self {
            InboxOutcome::Message(kind) => Some(*kind),
            _ => None,
        }
    }
}

impl From<OutcomeKind> for InboxOutcome {
    fn from(kind: OutcomeKind) -> Self {
        InboxOutcome::Message(kind)
    }
}

impl fmt::Display for InboxOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for InboxOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for InboxOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        InboxOutcome::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Ledger-only mode: the payment is recorded; no bank is called.
    Recorded,
    /// A payout is owed and may be in flight at the bank.
    InProgress,
    Paid,
    /// The bank refused the payout for good; a person must look at the claim.
    Rejected,
    /// The outcome at the bank cannot be known yet; `reconcile` asks the bank.
    NeedsReconciliation,
    /// The bank holds something that contradicts the ledger under this payment's
    /// reference (another amount or currency, several payouts, a refused replay with
    /// another body). Never paid, settled or rewritten automatically: `reconcile`
    /// leaves it out, and only a person, with the evidence in `status_reason`, may
    /// change it.
    Mismatched,
}

impl PaymentStatus {
    const ALL: [PaymentStatus; 6] = [
        PaymentStatus::Recorded,
        PaymentStatus::InProgress,
        PaymentStatus::Paid,
        PaymentStatus::Rejected,
        PaymentStatus::NeedsReconciliation,
        PaymentStatus::Mismatched,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            PaymentStatus::Recorded => "recorded",
            PaymentStatus::InProgress => "in_progress",
            PaymentStatus::Paid => "paid",
            PaymentStatus::Rejected => "rejected",
            PaymentStatus::NeedsReconciliation => "needs_reconciliation",
            PaymentStatus::Mismatched => "mismatched",
        }
    }

    /// The status a stored string names, as [`Self::as_str`] writes it; `None` for any
    /// other string.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    pub fn is_terminal(&self) -> bool {
        !matches!(self, PaymentStatus::InProgress)
    }
}

/// The business fact, one per (claim, purpose). It never expires.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentRecord {
    pub claim_id: ClaimId,
    pub purpose: Purpose,
    pub tenant_id: Option<TenantId>,
    /// Stored as two strings: the amount exactly as sent to the bank
    /// ([`Money::amount_string`]) and the currency code.
    pub money: Money,
    pub payee: Option<PayeeRef>,
    pub payload_hash: PayloadHash,
    /// The message that created the payment.
    pub message_id: MessageId,
    pub idempotency_key: IdempotencyKey,
    /// The exact payout request body, re-sent byte for byte. None in ledger-only mode.
    pub payout_request: Option<String>,
    pub status: PaymentStatus,
    pub bank_payment_id: Option<String>,
    /// Why the payment was rejected or needs reconciliation.
    pub status_reason: Option<String>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// The answer to [`Store::claim`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimResult {
    /// Both records were created by this call (or by this attempt's earlier, ambiguous
    /// try: adapters report that case as `InboxExists` with our owner token).
    Claimed { inbox_version: Version },
    /// The message was seen before: here is its inbox record. Nothing was written.
    InboxExists(Versioned<InboxRecord>),
    /// The message is new but the claim already has a payment (another message, or
    /// this one after its inbox record expired). Nothing was written.
    PaymentExists(Versioned<PaymentRecord>),
}

/// The answer to [`Store::record_handled`].
#[derive(Debug, Clone, PartialEq)]
pub enum InsertResult {
    Inserted(Version),
    AlreadyExists(Box<Versioned<InboxRecord>>),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Someone else changed the record since we read it (ETag / version mismatch).
    #[error("precondition failed: the record changed since it was read")]
    PreconditionFailed,
    /// Worth retrying later: throttling, unavailability, timeouts, a busy database.
    #[error("store temporarily unavailable: {0}")]
    Transient(String),
    /// Retrying cannot help: bad credentials, missing container, corrupt data.
    #[error("store failure: {0}")]
    Permanent(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A stored record that does not read back as what was written: a hand edit or a bug
/// (an amount `80.5` for EUR, an unknown status). Which record, which column and why,
/// so a person can find and repair it. A listing reports it in place of the record and
/// goes on ([`Listed`]); a read of the one record answers [`StoreError::Permanent`] with
/// the same words, so the consumer stops (needs a person) and never takes the record
/// for absent. Every part is bounded: stored text is whatever an edit left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord {
    /// `payment` or `inbox`.
    pub record: &'static str,
    /// The claim id as stored (it may itself be the corrupt column).
    pub claim_id: String,
    /// An inbox record's MessageId as stored; `None` for payments.
    pub message_id: Option<String>,
    /// The column (SQLite, PostgreSQL) or document field (Cosmos DB) that does not read.
    pub column: &'static str,
    pub reason: String,
}

/// The most characters of stored text a [`CorruptRecord`] repeats, per part.
const CORRUPT_TEXT_CHARS: usize = 160;

fn bounded(text: &str) -> String {
    match text.char_indices().nth(CORRUPT_TEXT_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

impl CorruptRecord {
    pub fn payment(claim_id: &str, column: &'static str, reason: impl fmt::Display) -> Self {
        CorruptRecord {
            record: "payment",
            claim_id: bounded(claim_id),
            message_id: None,
            column,
            reason: bounded(&reason.to_string()),
        }
    }

    pub fn inbox(
        claim_id: &str,
        message_id: &str,
        column: &'static str,
        reason: impl fmt::Display,
    ) -> Self {
        CorruptRecord {
            record: "inbox",
            message_id: Some(bounded(message_id)),
            ..CorruptRecord::payment(claim_id, column, reason)
        }
    }
}

impl fmt::Display for CorruptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of claim {:?}", self.record, self.claim_id)?;
        if let Some(message) = &self.message_id {
            write!(f, ", message {message:?}")?;
        }
        write!(f, ": {}: {}", self.column, self.reason)
    }
}

impl From<CorruptRecord> for StoreError {
    fn from(c: CorruptRecord) -> Self {
        StoreError::Permanent(format!(
            "corrupt {} in the database: {c}; a person must repair the record",
            c.record
        ))
    }
}

/// One row of a listing: the record, or why it does not read.
pub type Listed<T> = Result<T, CorruptRecord>;

/// Which inbox record: (consumer, claim, message). The claim is part of the key
/// because Cosmos partitions by claim; both stores keep the same scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboxKey {
    pub consumer: String,
    pub claim_id: ClaimId,
    pub message_id: MessageId,
}

impl InboxRecord {
    pub fn key(&self) -> InboxKey {
        InboxKey {
            consumer: self.consumer.clone(),
            claim_id: self.claim_id,
            message_id: self.message_id.clone(),
        }
    }
}

/// The last write of an attempt ([`Store::finalize`]): both records in one atomic step.
#[derive(Debug, Clone, Copy)]
pub struct Finalize<'a> {
    pub inbox: &'a InboxRecord,
    /// The inbox record must still carry it: our lease was not taken over.
    pub inbox_version: &'a Version,
    pub payment: &'a PaymentRecord,
    /// When given, the payment must still carry it: nobody settled it since we read it.
    pub payment_version: Option<&'a Version>,
}

/// The consumer's store. Every method is one round trip to the database unless
/// its documentation says otherwise.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The guard: atomically create `inbox` and `payment` (same claim), or create
    /// nothing and report which record already exists. An adapter may spend one extra
    /// read on a refusal, to return the existing record.
    async fn claim(&self, inbox: &InboxRecord, payment: &PaymentRecord)
        -> StoreResult<ClaimResult>;

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>>;

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>>;

    /// Create an inbox record alone, for a message whose payment already exists.
    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult>;

    /// Replace the inbox record if it still carries `expected` (take over an expired
    /// lease, release our own). `PreconditionFailed` otherwise.
    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version>;

    /// Atomically write the final payment and inbox records, if each still carries the
    /// version the caller read (see [`Finalize`]). `PreconditionFailed` otherwise, and
    /// nothing is written.
    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()>;

    /// Payments, oldest first, at most `limit`. A row that does not read is listed as
    /// its [`CorruptRecord`], in its place; the rest are still read.
    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>>;

    /// Payments whose outcome is not final yet (`in_progress`, `needs_reconciliation`),
    /// oldest first, at most `limit`: what `reconcile` examines. `mismatched` payments
    /// are not in it: no automatic process may touch them.
    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>>;

    /// How many payments are in `status`, counting at most `limit` (reconcile's report
    /// of what still needs a person).
    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize>;

    /// Inbox records, oldest first, at most `limit`; a row that does not read as in
    /// [`list_payments`](Self::list_payments).
    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>>;

    /// Remove inbox records whose retention ended before `now`, in batches of at most
    /// `batch` rows. Returns how many were removed. Payments are never purged.
    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64>;

    /// Whether the database expires inbox records by itself (Cosmos DB's `ttl`), so that
    /// [`purge_expired`](Self::purge_expired) has nothing to do. Decorators forward it
    /// ([`StoreDecorator`]).
    fn expires_by_itself(&self) -> bool {
        false
    }

    /// Resolves, with the reason, once the store can no longer keep its promises (SQLite:
    /// a WAL sync failed). The server stops on it and exits non-zero. Decorators forward
    /// it; the default never resolves.
    async fn failed(&self) -> String {
        std::future::pending().await
    }
}

pub type DynStore = Arc<dyn Store>;

/// The round trips an adapter sent to its database: its own count, for measurements,
/// and the process-wide `store_round_trips` counter of `/metrics`.
#[derive(Debug, Default)]
pub struct RoundTrips(AtomicU64);

impl RoundTrips {
    pub fn count(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::counters().store_round_trips.inc();
    }

    pub fn so_far(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The strings are stored: each status reads back from exactly the string it writes.
    #[test]
    fn statuses_read_back_from_the_strings_they_are_stored_as() {
        assert_eq!(
            InboxStatus::ALL.map(|s| s.as_str()),
            ["in_progress", "completed"]
        );
        assert_eq!(
            PaymentStatus::ALL.map(|s| s.as_str()),
            [
                "recorded",
                "in_progress",
                "paid",
                "rejected",
                "needs_reconciliation",
                "mismatched"
            ]
        );
        for status in InboxStatus::ALL {
            assert_eq!(InboxStatus::parse(status.as_str()), Some(status));
        }
        for status in PaymentStatus::ALL {
            assert_eq!(PaymentStatus::parse(status.as_str()), Some(status));
        }
        for other in ["", "Paid", "in-progress", "completed "] {
            assert_eq!(PaymentStatus::parse(other), None, "{other:?}");
        }
        assert_eq!(InboxStatus::parse("paid"), None);
    }

    #[test]
    fn an_attempt_names_its_boot_and_an_old_owner_names_none() {
        let other = Boot::random();
        assert_eq!(AttemptId::new().boot(), Some(Boot::current()));
        assert_eq!(AttemptId::of(other).boot(), Some(other));
        assert_ne!(AttemptId::of(other), AttemptId::of(other));
        assert_eq!(AttemptId(uuid::Uuid::new_v4()).boot(), None);
        assert_eq!(Boot::parse(&other.to_string()), Some(other));
        for bad in [
            "",
            "0123456789a",
            "0123456789abc",
            "0123456789ag",
            "+123456789ab",
        ] {
            assert_eq!(Boot::parse(bad), None, "{bad:?}");
        }
        assert_ne!(other.as_uuid(), Boot::random().as_uuid());
    }

    #[test]
    fn stored_outcomes_written_before_read_back_and_unknown_ones_are_refused() {
        for kind in OutcomeKind::ALL {
            let stored = format!("\"{}\"", kind.as_str());
            let read: InboxOutcome = serde_json::from_str(&stored).unwrap();
            assert_eq!(read, InboxOutcome::Message(kind));
            assert_eq!(serde_json::to_string(&read).unwrap(), stored);
        }
        assert_eq!(
            InboxOutcome::parse("reconciled"),
            Ok(InboxOutcome::RunReleased)
        );
        let answer = r#"{"status":201,"body":"{}"}"#;
        let read = InboxOutcome::parse(answer).unwrap();
        assert_eq!(read, InboxOutcome::HttpAnswer(answer.into()));
        assert_eq!(read.as_str(), answer);
        for bad in ["", "Paid", "lost", " paid"] {
            assert!(InboxOutcome::parse(bad).is_err(), "{bad:?}");
            let json = serde_json::to_string(bad).unwrap();
            assert!(
                serde_json::from_str::<InboxOutcome>(&json).is_err(),
                "{bad:?}"
            );
        }
    }
}
