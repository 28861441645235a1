//! An in-memory [`Store`]: the store of the deterministic simulator (one thread, a
//! current-thread tokio runtime with paused virtual time, everything replayed from a
//! seed). It passes the same conformance suite as the SQLite, Cosmos DB and PostgreSQL
//! adapters (`tests/dev/memory_conformance.rs`).
//!
//! It is an exact model of the SQLite adapter (the reference), statement by statement:
//!
//! - `claim` inserts the inbox record, then the payment; an existing inbox record
//!   (whatever the payment) is reported first as `InboxExists`, then an existing payment
//!   as `PaymentExists`, and a refusal writes nothing. Both records start at version 1.
//! - `replace_inbox` rewrites every column but the key and `created_at`, only if the
//!   stored version is `expected`; a missing record is `PreconditionFailed`, as an
//!   `UPDATE` that matched no row.
//! - `finalize` checks the inbox version first, then the payment's (when given), and
//!   writes nothing unless both hold. It changes only the payment's `status`,
//!   `bank_payment_id`, `status_reason` and `updated_at`, as SQLite's `UPDATE` does. A
//!   missing payment without a version condition is `Permanent`, as in SQLite.
//! - Versions are SQLite's: a row counter, `"1"` at creation, plus one on every write,
//!   rendered as a decimal string. A version that is not a number is `Permanent`.
//! - Timestamps are kept as SQLite keeps them: in UTC, truncated to the millisecond
//!   (`unix_timestamp_nanos / 1_000_000`, towards zero), so records read back as they
//!   would from any adapter.
//! - Listings: payments by (`created_at`, `claim_id`); inbox records by (`created_at`,
//!   `message_id`), the SQL `ORDER BY`s. Byte order of the claim id's canonical text and
//!   of the MessageId's UTF-8, as SQLite's `BINARY` collation and PostgreSQL's `uuid` /
//!   `bytea` compare. SQL leaves ties beyond that unspecified; here they fall to the rest
//!   of the key (payments: purpose; inbox: consumer, then claim id), so they are
//!   deterministic.
//! - `purge_expired` deletes every inbox record whose `expires_at` is at or before `now`
//!   (at the millisecond), whatever its status or lease, and never a payment. SQLite does
//!   so in batches of `batch` rows until a batch comes back short; here all of them go in
//!   one step, which is the same as no other write landing between two batches.
//!
//! Deterministic: ordered maps only (no hash iteration), no clock reads (callers pass the
//! time), no randomness, no threads. Every method is one synchronous critical section
//! under a [`std::sync::Mutex`] and never awaits while holding it, so on a current-thread
//! runtime the store never blocks and interleavings are decided by the caller alone.
//!
//! Cheap: keys live in ordered maps (the inbox is nested by consumer, claim and
//! MessageId, so a lookup borrows the caller's key instead of building one); only what is
//! returned is cloned. Payments are kept in listing order, with an index of the
//! unsettled ones and a count per status, so `list_payments`, `unsettled_payments` and
//! `count_payments` do not scan the ledger. `list_inbox` and `purge_expired` scan the
//! inbox (operator and maintenance calls).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use claims_payments::seams::store::{
    ClaimResult, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreError, StoreResult, Version, Versioned,
};
use claims_payments::{ClaimId, MessageId, Purpose};
use time::OffsetDateTime;

/// An in-memory store with the SQLite adapter's semantics (see the module documentation).
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

/// A stored record and its row version.
struct Row<T> {
    record: T,
    version: i64,
}

impl<T: Clone> Row<T> {
    fn versioned(&self) -> Versioned<T> {
        Versioned {
            record: self.record.clone(),
            version: Version(self.version.to_string()),
        }
    }
}

/// A payment's place in the listings: (`created_at`, claim id, purpose). `created_at`
/// never changes after the claim, so neither does the place.
type PaymentOrder = (OffsetDateTime, ClaimId, u8);

/// Inbox records by consumer, then claim, then MessageId.
type InboxMap = BTreeMap<String, BTreeMap<ClaimId, BTreeMap<MessageId, Row<InboxRecord>>>>;

#[derive(Default)]
struct State {
    inbox: InboxMap,
    /// Payments in listing order.
    payments: BTreeMap<PaymentOrder, Row<PaymentRecord>>,
    /// (claim, purpose), the payment's unique key, to its place in `payments`.
    payment_places: BTreeMap<(ClaimId, u8), OffsetDateTime>,
    /// The places of the payments `unsettled_payments` lists.
    unsettled: BTreeSet<PaymentOrder>,
    /// How many payments are in each status, by [`status_slot`].
    status_counts: [usize; STATUSES],
    /// Claims whose settled payment (paid, rejected, mismatched, recorded) a finalize
    /// changed (status or bank payment id): what the simulator's `settled-never-rewritten`
    /// invariant reads.
    settled_rewrites: Vec<ClaimId>,
}

const STATUSES: usize = 6;

fn status_slot(status: PaymentStatus) -> usize {
    match status {
        PaymentStatus::Recorded => 0,
        PaymentStatus::InProgress => 1,
        PaymentStatus::Paid => 2,
        PaymentStatus::Rejected => 3,
        PaymentStatus::NeedsReconciliation => 4,
        PaymentStatus::Mismatched => 5,
    }
}

fn is_unsettled(status: PaymentStatus) -> bool {
    matches!(
        status,
        PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation
    )
}

/// The purpose's rank in the key order (its stored text's order, as in SQL).
fn purpose_rank(purpose: Purpose) -> u8 {
    match purpose {
        Purpose::Payout => 0,
    }
}

/// A time as every adapter stores it: UTC, truncated to the millisecond exactly as
/// SQLite's `to_ms` does. (A time that would not read back from SQLite, at the very edge
/// of the representable range, is kept as given.)
fn stored_time(t: OffsetDateTime) -> OffsetDateTime {
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).unwrap_or(t)
}

fn stored_inbox(r: &InboxRecord) -> InboxRecord {
    let mut r = r.clone();
    r.lease_until = r.lease_until.map(stored_time);
    r.created_at = stored_time(r.created_at);
    r.updated_at = stored_time(r.updated_at);
    r.expires_at = stored_time(r.expires_at);
    r
}

fn stored_payment(p: &PaymentRecord) -> PaymentRecord {
    let mut p = p.clone();
    p.created_at = stored_time(p.created_at);
    p.updated_at = stored_time(p.updated_at);
    p
}

/// A version as this store issues them; anything else is refused as SQLite refuses it.
fn parse_version(version: &Version) -> StoreResult<i64> {
    version
        .0
        .parse()
        .map_err(|_| StoreError::Permanent(format!("not a memory store version: {:?}", version.0)))
}

fn first_version() -> Version {
    Version("1".into())
}

impl State {
    fn inbox_row(
        &self,
        consumer: &str,
        claim: &ClaimId,
        message: &MessageId,
    ) -> Option<&Row<InboxRecord>> {
        self.inbox.get(consumer)?.get(claim)?.get(message)
    }

    fn inbox_row_mut(
        &mut self,
        consumer: &str,
        claim: &ClaimId,
        message: &MessageId,
    ) -> Option<&mut Row<InboxRecord>> {
        self.inbox
            .get_mut(consumer)?
            .get_mut(claim)?
            .get_mut(message)
    }

    fn inbox_of(&self, r: &InboxRecord) -> Option<&Row<InboxRecord>> {
        self.inbox_row(&r.consumer, &r.claim_id, &r.message_id)
    }

    /// Inserts a record whose key is known to be free, at version 1.
    fn insert_inbox(&mut self, r: &InboxRecord) {
        let claims = match self.inbox.get_mut(r.consumer.as_str()) {
            Some(claims) => claims,
            None => self.inbox.entry(r.consumer.clone()).or_default(),
        };
        claims.entry(r.claim_id).or_default().insert(
            r.message_id.clone(),
            Row {
                record: stored_inbox(r),
                version: 1,
            },
        );
    }

    fn payment_place(&self, claim: ClaimId, purpose: Purpose) -> Option<PaymentOrder> {
        let rank = purpose_rank(purpose);
        self.payment_places
            .get(&(claim, rank))
            .map(|&created| (created, claim, rank))
    }

    fn payment_row(&self, claim: ClaimId, purpose: Purpose) -> Option<&Row<PaymentRecord>> {
        self.payments.get(&self.payment_place(claim, purpose)?)
    }

    /// Inserts a payment whose key is known to be free, at version 1.
    fn insert_payment(&mut self, p: &PaymentRecord) {
        let record = stored_payment(p);
        let place = (
            record.created_at,
            record.claim_id,
            purpose_rank(record.purpose),
        );
        self.payment_places
            .insert((place.1, place.2), record.created_at);
        if is_unsettled(record.status) {
            self.unsettled.insert(place);
        }
        self.status_counts[status_slot(record.status)] += 1;
        self.payments.insert(place, Row { record, version: 1 });
    }

    /// SQLite's conditional `UPDATE` of an inbox row: every column but the key and
    /// `created_at`, if the version is still `expected`. Returns the new version.
    fn replace_inbox(&mut self, r: &InboxRecord, expected: i64) -> Option<i64> {
        let row = self.inbox_row_mut(&r.consumer, &r.claim_id, &r.message_id)?;
        if row.version != expected {
            return None;
        }
        let created_at = row.record.created_at;
        row.record = InboxRecord {
            created_at,
            ..stored_inbox(r)
        };
        row.version += 1;
        Some(row.version)
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section checks before it writes, so a panic inside one (a bug)
        // leaves no half-written state behind; the panic itself fails the run.
        self.state
            .lock()
            .expect("the memory store's lock is poisoned")
    }

    /// Claims whose settled payment a finalize changed, in the order it happened.
    pub fn settled_rewrites(&self) -> Vec<ClaimId> {
        self.state().settled_rewrites.clone()
    }

    /// Every payment, in listing order (`created_at`, then claim id), for the
    /// simulator's invariant checks. A copy: later writes do not change it.
    pub fn payments_snapshot(&self) -> Vec<PaymentRecord> {
        self.state()
            .payments
            .values()
            .map(|row| row.record.clone())
            .collect()
    }

    /// Every inbox record, in key order (consumer, claim id, MessageId), for the
    /// simulator's invariant checks. A copy, as [`payments_snapshot`](Self::payments_snapshot).
    pub fn inbox_snapshot(&self) -> Vec<InboxRecord> {
        self.state()
            .inbox
            .values()
            .flat_map(BTreeMap::values)
            .flat_map(BTreeMap::values)
            .map(|row| row.record.clone())
            .collect()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        let mut state = self.state();
        if let Some(existing) = state.inbox_of(inbox) {
            return Ok(ClaimResult::InboxExists(existing.versioned()));
        }
        if let Some(existing) = state.payment_row(payment.claim_id, payment.purpose) {
            return Ok(ClaimResult::PaymentExists(existing.versioned()));
        }
        state.insert_inbox(inbox);
        state.insert_payment(payment);
        Ok(ClaimResult::Claimed {
            inbox_version: first_version(),
        })
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        Ok(self
            .state()
            .inbox_row(&key.consumer, &key.claim_id, &key.message_id)
            .map(Row::versioned))
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        Ok(self.state().payment_row(claim, purpose).map(Row::versioned))
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        let mut state = self.state();
        if let Some(existing) = state.inbox_of(inbox) {
            return Ok(InsertResult::AlreadyExists(Box::new(existing.versioned())));
        }
        state.insert_inbox(inbox);
        Ok(InsertResult::Inserted(first_version()))
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        let expected = parse_version(expected)?;
        match self.state().replace_inbox(inbox, expected) {
            Some(version) => Ok(Version(version.to_string())),
            None => Err(StoreError::PreconditionFailed),
        }
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        // In SQLite's order: the payment's version is parsed first, then the inbox's; the
        // inbox condition is checked before the payment's.
        let payment_version = write.payment_version.map(parse_version).transpose()?;
        let inbox_version = parse_version(write.inbox_version)?;
        let (inbox, payment) = (write.inbox, write.payment);
        let mut state = self.state();
        if state.inbox_of(inbox).map(|row| row.version) != Some(inbox_version) {
            return Err(StoreError::PreconditionFailed);
        }
        let place = state.payment_place(payment.claim_id, payment.purpose);
        let place = match (place, payment_version) {
            (Some(place), None) => place,
            (Some(place), Some(expected)) if state.payments[&place].version == expected => place,
            (_, Some(_)) => return Err(StoreError::PreconditionFailed),
            (None, None) => {
                return Err(StoreError::Permanent(format!(
                    "payment for claim {} is missing at finalize",
                    payment.claim_id
                )))
            }
        };
        // Both conditions hold: write both.
        let replaced = state.replace_inbox(inbox, inbox_version);
        debug_assert!(replaced.is_some(), "the inbox version was checked above");
        let State {
            payments,
            unsettled,
            status_counts,
            settled_rewrites,
            ..
        } = &mut *state;
        let row = payments
            .get_mut(&place)
            .expect("the payment was found above");
        let before = row.record.status;
        // A settled payment written again with other facts (a status, a bank payment id).
        // The same facts again can happen: two attempts that raced through takeovers both
        // settle from the bank's one answer under the same key.
        if !matches!(
            before,
            PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation
        ) && (before != payment.status || row.record.bank_payment_id != payment.bank_payment_id)
        {
            settled_rewrites.push(payment.claim_id);
        }
        row.record.status = payment.status;
        row.record
            .bank_payment_id
            .clone_from(&payment.bank_payment_id);
        row.record.status_reason.clone_from(&payment.status_reason);
        row.record.updated_at = stored_time(payment.updated_at);
        row.version += 1;
        status_counts[status_slot(before)] -= 1;
        status_counts[status_slot(payment.status)] += 1;
        match (is_unsettled(before), is_unsettled(payment.status)) {
            (false, true) => {
                unsettled.insert(place);
            }
            (true, false) => {
                unsettled.remove(&place);
            }
            _ => {}
        }
        Ok(())
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        Ok(self
            .state()
            .payments
            .values()
            .take(limit)
            .map(|row| Ok(row.record.clone()))
            .collect())
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        let state = self.state();
        Ok(state
            .unsettled
            .iter()
            .take(limit)
            .map(|place| state.payments[place].versioned())
            .collect())
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        Ok(self.state().status_counts[status_slot(status)].min(limit))
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        let state = self.state();
        let mut rows: Vec<&InboxRecord> = state
            .inbox
            .values()
            .flat_map(BTreeMap::values)
            .flat_map(BTreeMap::values)
            .map(|row| &row.record)
            .collect();
        // Keys are unique, so an unstable sort is deterministic.
        rows.sort_unstable_by(|a, b| {
            (a.created_at, &a.message_id, &a.consumer, a.claim_id).cmp(&(
                b.created_at,
                &b.message_id,
                &b.consumer,
                b.claim_id,
            ))
        });
        Ok(rows
            .into_iter()
            .take(limit)
            .map(|r| Ok(r.clone()))
            .collect())
    }

    async fn purge_expired(&self, now: OffsetDateTime, _batch: usize) -> StoreResult<u64> {
        let cutoff = stored_time(now);
        let mut state = self.state();
        let mut removed = 0u64;
        state.inbox.retain(|_, claims| {
            claims.retain(|_, messages| {
                messages.retain(|_, row| {
                    let expired = row.record.expires_at <= cutoff;
                    removed += u64::from(expired);
                    !expired
                });
                !messages.is_empty()
            });
            !claims.is_empty()
        });
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use claims_payments::seams::store::{AttemptId, InboxKey, InboxStatus};
    use claims_payments::OutcomeKind;
    use claims_payments_testkit::fixtures::{message, new_claim};
    use claims_payments_testkit::records::{completed, paid, records_for};
    use time::macros::datetime;
    use time::Duration;

    use super::*;

    const T0: OffsetDateTime = datetime!(2026-01-01 00:00:00 UTC);

    fn records_at(
        claim: &str,
        message_id: &str,
        at: OffsetDateTime,
    ) -> (InboxRecord, PaymentRecord) {
        records_for(&message(claim, "100.00"), message_id, AttemptId::new(), at)
    }

    fn claimed(result: ClaimResult) -> Version {
        match result {
            ClaimResult::Claimed { inbox_version } => inbox_version,
            other => panic!("expected Claimed, got {other:?}"),
        }
    }

    async fn inbox_of(store: &MemoryStore, r: &InboxRecord) -> Option<Versioned<InboxRecord>> {
        store.inbox(&r.key()).await.unwrap()
    }

    async fn payment_of(store: &MemoryStore, p: &PaymentRecord) -> Versioned<PaymentRecord> {
        store.payment(p.claim_id, p.purpose).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn inbox_exists_takes_precedence_over_payment_exists_and_nothing_is_written() {
        let store = MemoryStore::new();
        let claim = new_claim();
        let (inbox, payment) = records_at(&claim, "m-1", T0);
        claimed(store.claim(&inbox, &payment).await.unwrap());
        // Both the message's inbox record and the claim's payment exist: the inbox wins.
        let (again, again_payment) = records_at(&claim, "m-1", T0 + Duration::seconds(1));
        match store.claim(&again, &again_payment).await.unwrap() {
            ClaimResult::InboxExists(seen) => {
                assert_eq!(seen.record, inbox);
                assert_eq!(seen.version, Version("1".into()));
            }
            other => panic!("expected InboxExists, got {other:?}"),
        }
        // The message's record exists but its claim has no payment: still InboxExists,
        // and the payment is not created.
        let other_claim = new_claim();
        let (handled, handled_payment) = records_at(&other_claim, "m-2", T0);
        store.record_handled(&completed(&handled)).await.unwrap();
        assert!(matches!(
            store.claim(&handled, &handled_payment).await.unwrap(),
            ClaimResult::InboxExists(_)
        ));
        assert_eq!(
            store
                .payment(handled_payment.claim_id, Purpose::Payout)
                .await
                .unwrap(),
            None
        );
        // A new message of a paid claim: PaymentExists, and no inbox record.
        let (fresh, fresh_payment) = records_at(&claim, "m-3", T0);
        match store.claim(&fresh, &fresh_payment).await.unwrap() {
            ClaimResult::PaymentExists(seen) => assert_eq!(seen.record, payment),
            other => panic!("expected PaymentExists, got {other:?}"),
        }
        assert_eq!(inbox_of(&store, &fresh).await, None);
        assert_eq!(store.payments_snapshot(), vec![payment]);
        assert_eq!(store.inbox_snapshot().len(), 2);
    }

    #[tokio::test]
    async fn finalize_writes_nothing_unless_both_conditions_hold() {
        let store = MemoryStore::new();
        let (inbox, payment) = records_at(&new_claim(), "m-1", T0);
        let v1 = claimed(store.claim(&inbox, &payment).await.unwrap());
        let (done, settled) = (completed(&inbox), paid(&payment));
        let payment_v1 = payment_of(&store, &payment).await.version;
        assert_eq!(payment_v1, Version("1".into()));

        // The inbox holds, the payment's version does not.
        let stale = Version("7".into());
        let refused = store
            .finalize(Finalize {
                inbox: &done,
                inbox_version: &v1,
                payment: &settled,
                payment_version: Some(&stale),
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::PreconditionFailed)),
            "{refused:?}"
        );
        // The payment holds, the inbox's version does not.
        let refused = store
            .finalize(Finalize {
                inbox: &done,
                inbox_version: &stale,
                payment: &settled,
                payment_version: Some(&payment_v1),
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::PreconditionFailed)),
            "{refused:?}"
        );
        // The inbox holds and the payment is missing: SQLite's Permanent.
        let (_, unknown) = records_at(&new_claim(), "m-1", T0);
        let refused = store
            .finalize(Finalize {
                inbox: &done,
                inbox_version: &v1,
                payment: &unknown,
                payment_version: None,
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::Permanent(_))),
            "{refused:?}"
        );
        let refused = store
            .finalize(Finalize {
                inbox: &done,
                inbox_version: &v1,
                payment: &unknown,
                payment_version: Some(&payment_v1),
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::PreconditionFailed)),
            "{refused:?}"
        );
        // Nothing was written by any of them.
        let read = inbox_of(&store, &inbox).await.unwrap();
        assert_eq!((read.record, read.version), (inbox.clone(), v1.clone()));
        let read = payment_of(&store, &payment).await;
        assert_eq!(
            (read.record, read.version),
            (payment.clone(), payment_v1.clone())
        );
        assert_eq!(store.unsettled_payments(10).await.unwrap().len(), 1);

        // Both hold: both are written, and only the payment's outcome columns change.
        let mut settled_elsewhere = settled.clone();
        settled_elsewhere.payout_request = Some("another body".into());
        settled_elsewhere.created_at = T0 + Duration::days(1);
        store
            .finalize(Finalize {
                inbox: &done,
                inbox_version: &v1,
                payment: &settled_elsewhere,
                payment_version: Some(&payment_v1),
            })
            .await
            .unwrap();
        let read = inbox_of(&store, &inbox).await.unwrap();
        assert_eq!((read.record, read.version), (done, Version("2".into())));
        let read = payment_of(&store, &payment).await;
        assert_eq!((read.record, read.version), (settled, Version("2".into())));
        assert!(store.unsettled_payments(10).await.unwrap().is_empty());
        assert_eq!(
            store.count_payments(PaymentStatus::Paid, 10).await.unwrap(),
            1
        );
        assert_eq!(
            store
                .count_payments(PaymentStatus::InProgress, 10)
                .await
                .unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn replace_inbox_keeps_created_at_and_refuses_missing_or_foreign_versions() {
        let store = MemoryStore::new();
        let (inbox, _) = records_at(&new_claim(), "m-1", T0);
        let InsertResult::Inserted(v1) = store.record_handled(&inbox).await.unwrap() else {
            panic!("not inserted")
        };
        let moved = InboxRecord {
            created_at: T0 + Duration::hours(1),
            status: InboxStatus::Completed,
            outcome: Some(OutcomeKind::Paid.into()),
            ..inbox.clone()
        };
        let v2 = store.replace_inbox(&moved, &v1).await.unwrap();
        assert_eq!(v2, Version("2".into()));
        let read = inbox_of(&store, &inbox).await.unwrap().record;
        assert_eq!(
            read,
            InboxRecord {
                created_at: T0,
                ..moved
            }
        );
        let (missing, _) = records_at(&new_claim(), "m-1", T0);
        assert!(matches!(
            store.replace_inbox(&missing, &v1).await,
            Err(StoreError::PreconditionFailed)
        ));
        assert!(matches!(
            store.replace_inbox(&inbox, &Version("etag-1".into())).await,
            Err(StoreError::Permanent(_))
        ));
    }

    #[tokio::test]
    async fn purge_removes_exactly_the_records_expired_at_the_millisecond_never_payments() {
        let store = MemoryStore::new();
        let now = T0 + Duration::days(40);
        let expiring = |claim: &str, id: &str, expires_at: OffsetDateTime| {
            let (inbox, payment) = records_at(claim, id, T0);
            let inbox = InboxRecord {
                expires_at,
                lease_until: Some(now + Duration::hours(1)),
                ..inbox
            };
            (inbox, payment)
        };
        // Expired (even under a live lease), expired at `now` exactly (and within its
        // millisecond), not expired by a millisecond.
        let c = [new_claim(), new_claim(), new_claim(), new_claim()];
        let cases = [
            (expiring(&c[0], "old", now - Duration::days(1)), false),
            (expiring(&c[1], "at-now", now), false),
            (
                expiring(&c[2], "same-ms", now + Duration::microseconds(900)),
                false,
            ),
            (
                expiring(&c[3], "later", now + Duration::milliseconds(1)),
                true,
            ),
        ];
        for ((inbox, payment), _) in &cases {
            claimed(store.claim(inbox, payment).await.unwrap());
        }
        assert_eq!(store.purge_expired(now, 1).await.unwrap(), 3);
        for ((inbox, payment), kept) in &cases {
            assert_eq!(
                inbox_of(&store, inbox).await.is_some(),
                *kept,
                "{}",
                inbox.message_id
            );
            payment_of(&store, payment).await;
        }
        assert_eq!(store.payments_snapshot().len(), 4);
        assert_eq!(store.purge_expired(now, 10).await.unwrap(), 0);
        // A purged message's key is free again; its new record starts over at version 1.
        let ((inbox, _), _) = &cases[0];
        let again = store.record_handled(inbox).await.unwrap();
        assert_eq!(again, InsertResult::Inserted(Version("1".into())));
    }

    #[tokio::test]
    async fn times_are_kept_in_utc_at_the_millisecond_and_listings_break_ties_by_key() {
        let store = MemoryStore::new();
        let at = datetime!(2026-01-01 01:00:00.123_456_789 +01:00);
        let mut claims = [new_claim(), new_claim(), new_claim()];
        for (i, claim) in claims.iter().enumerate() {
            let (inbox, payment) = records_at(claim, &format!("m-{}", 2 - i), at);
            claimed(store.claim(&inbox, &payment).await.unwrap());
        }
        let listed = store.list_payments(10).await.unwrap();
        let expected_at = datetime!(2026-01-01 00:00:00.123 UTC);
        claims.sort();
        let order: Vec<String> = listed
            .iter()
            .map(|p| {
                let p = p.as_ref().unwrap();
                assert_eq!(p.created_at, expected_at);
                assert_eq!(p.created_at.offset(), time::UtcOffset::UTC);
                p.claim_id.to_string()
            })
            .collect();
        assert_eq!(order, claims);
        let inbox = store.list_inbox(2).await.unwrap();
        let ids: Vec<&str> = inbox
            .iter()
            .map(|r| r.as_ref().unwrap().message_id.as_str())
            .collect();
        assert_eq!(ids, ["m-0", "m-1"]);
        let first = inbox[0].as_ref().unwrap();
        assert_eq!(first.lease_until, Some(expected_at + Duration::seconds(60)));
        let key = InboxKey {
            consumer: first.consumer.clone(),
            claim_id: first.claim_id,
            message_id: first.message_id.clone(),
        };
        assert_eq!(store.inbox(&key).await.unwrap().unwrap().record, *first);
    }

    #[tokio::test]
    async fn unsettled_and_counts_follow_the_status_and_the_limit() {
        let store = MemoryStore::new();
        let mut payments = Vec::new();
        for (i, status) in [
            PaymentStatus::Mismatched,
            PaymentStatus::NeedsReconciliation,
            PaymentStatus::InProgress,
            PaymentStatus::Recorded,
            PaymentStatus::InProgress,
        ]
        .into_iter()
        .enumerate()
        {
            let (inbox, payment) = records_at(&new_claim(), "m", T0 + Duration::seconds(i as i64));
            let payment = PaymentRecord { status, ..payment };
            claimed(store.claim(&inbox, &payment).await.unwrap());
            payments.push(payment);
        }
        let unsettled: Vec<PaymentRecord> = store
            .unsettled_payments(10)
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.record)
            .collect();
        assert_eq!(
            unsettled,
            vec![
                payments[1].clone(),
                payments[2].clone(),
                payments[4].clone()
            ]
        );
        assert_eq!(store.unsettled_payments(2).await.unwrap().len(), 2);
        assert_eq!(
            store
                .count_payments(PaymentStatus::InProgress, 10)
                .await
                .unwrap(),
            2
        );
        assert_eq!(
            store
                .count_payments(PaymentStatus::InProgress, 1)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .count_payments(PaymentStatus::Mismatched, 10)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store.count_payments(PaymentStatus::Paid, 10).await.unwrap(),
            0
        );
        assert_eq!(store.payments_snapshot(), payments);
    }
}
