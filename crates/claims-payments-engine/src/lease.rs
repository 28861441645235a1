//! Leases on inbox records: the one place where an attempt takes, takes over, gives
//! back or completes the right to work on something that must happen once (a message's
//! delivery, an HTTP Idempotency-Key, a reconcile run, a payment reconcile settles).
//!
//! A lease is an inbox record `in_progress` with an owner and `lease_until`. It is
//! created with a conditional create and changed only with writes conditional on the
//! version read, so of two attempts that race, exactly one wins; the loser re-reads.
//! Who may take a record over is decided by [`holder`], and nowhere else; every lease
//! is taken with [`Lease::acquire`], which applies it.
//!
//! [`liveness`] tells whether the process behind a live lease is still running, so a
//! lease whose owner died is taken over at once instead of being waited out. Asking
//! costs a store read, so it is asked only of a lease that would otherwise hold the
//! attempt off: a record that is ours, free or superseded needs no answer.

pub mod liveness;

use std::time::Duration;

use time::OffsetDateTime;

use crate::domain::PayloadHash;
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, InsertResult, Store, StoreError,
    StoreResult, Version, Versioned,
};
use crate::telemetry;

/// How long a lease lasts, and how long its record is kept after its last write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub lease: Duration,
    pub retention: Duration,
}

/// Who holds a record, as an attempt sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// This very attempt wrote it (an ambiguous timeout re-sent our own write).
    Us,
    /// Nobody: completed, or its lease ran out (a crash, a given-back lease).
    Nobody,
    /// A live attempt of an earlier delivery, which the broker has given up on (see
    /// [`holder`]).
    Superseded,
    /// The lease is still running, but the process that holds it has ended (see
    /// [`liveness`]).
    OwnerGone,
    /// A live attempt, until then.
    Live(OffsetDateTime),
}

impl Holder {
    /// Why a lease changed hands, as logged with the takeover.
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Us => "own-write",
            Holder::Nobody => "lease-expired",
            Holder::Superseded => "later-delivery",
            Holder::OwnerGone => "owner-gone",
            Holder::Live(_) => "live",
        }
    }
}

/// An attempt that wants a lease: who it is, the broker's count it judges the record
/// with (0: not a broker delivery, or the host did not say) and its clock.
#[derive(Debug, Clone, Copy)]
pub struct Bid {
    pub me: AttemptId,
    pub delivery: u32,
    pub now: OffsetDateTime,
}

impl Bid {
    /// Who holds `record` for this bid ([`holder`]).
    pub fn judge(&self, record: &InboxRecord, owner_gone: bool) -> Holder {
        holder(record, self.me, self.delivery, owner_gone, self.now)
    }
}

/// Whether the process behind a lease has ended ([`liveness::Owners`]).
// Called only where the future is awaited in place (never spawned), so no `Send` bound
// on it is needed.
#[allow(async_fn_in_trait)]
pub trait OwnerLiveness {
    /// What the asker found already, without a read (an attempt's own findings).
    fn known_ended(&self, owner: AttemptId) -> bool;
    /// Whether `owner`'s process has ended: may read its registration.
    async fn ended(&self, owner: AttemptId) -> bool;
}

/// The record found under the key to lease.
pub enum Seen<'a> {
    /// No record: create this one.
    Nothing(InboxRecord),
    /// This one, as read at its version.
    Record(&'a Versioned<InboxRecord>),
}

/// What [`Lease::acquire`] came to.
// One answer per call, matched at once: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Acquired {
    /// This attempt holds the lease, which `from` held before ([`Holder::Nobody`] for a
    /// record it created).
    Held { lease: Lease, from: Holder },
    /// A live attempt holds it, until then.
    Live(OffsetDateTime),
    /// Another attempt wrote first: read the record again to see how it stands.
    Lost,
}

/// The takeover rule. `delivery` is the broker's count for this attempt (0 when it is
/// not a broker delivery or the host did not say); `owner_gone` says that the process
/// of the record's owner was found ended ([`liveness::Owners::check`]).
///
/// A later delivery of the same message supersedes a live lease: the broker only
/// redelivers once it gave up on the earlier one (its lock expired, or the host
/// abandoned it), and waiting out the lease (minutes, with production settings) would
/// only spend the remaining deliveries. That is safe even if the old attempt still runs:
/// the bank request carries the same Idempotency-Key, and its final write is conditional
/// on a version it no longer holds. A lease whose process has ended is over for the same
/// reason, whoever asks.
pub fn holder(
    record: &InboxRecord,
    me: AttemptId,
    delivery: u32,
    owner_gone: bool,
    now: OffsetDateTime,
) -> Holder {
    if record.owner == me {
        Holder::Us
    } else if !record.lease_alive(now) {
        Holder::Nobody
    } else if owner_gone {
        Holder::OwnerGone
    } else if record.last_delivery_count > 0 && delivery > record.last_delivery_count {
        Holder::Superseded
    } else {
        Holder::Live(record.lease_until.unwrap_or(now))
    }
}

/// A new record for `key`: in progress under a lease when `outcome` is `None`,
/// otherwise completed with it.
pub fn new_record(
    key: &InboxKey,
    payload_hash: &PayloadHash,
    owner: AttemptId,
    delivery: u32,
    terms: Terms,
    now: OffsetDateTime,
    outcome: Option<InboxOutcome>,
) -> InboxRecord {
    InboxRecord {
        consumer: key.consumer.clone(),
        claim_id: key.claim_id,
        message_id: key.message_id.clone(),
        payload_hash: payload_hash.clone(),
        status: if outcome.is_some() {
            InboxStatus::Completed
        } else {
            InboxStatus::InProgress
        },
        lease_until: outcome.is_none().then(|| now + terms.lease),
        outcome,
        owner,
        first_delivery_count: delivery,
        last_delivery_count: delivery,
        created_at: now,
        updated_at: now,
        expires_at: now + terms.retention,
    }
}

/// `record` written again at `now`: the latest delivery count kept, and the retention
/// counted from this write (Cosmos counts TTL from the last write; every store does the
/// same).
pub fn touched(
    record: &InboxRecord,
    delivery: u32,
    terms: Terms,
    now: OffsetDateTime,
) -> InboxRecord {
    InboxRecord {
        last_delivery_count: delivery.max(record.last_delivery_count),
        updated_at: now,
        expires_at: now + terms.retention,
        ..record.clone()
    }
}

/// `record` taken over by `me`: in progress under a fresh lease.
pub fn taken_over(
    record: &InboxRecord,
    me: AttemptId,
    delivery: u32,
    terms: Terms,
    now: OffsetDateTime,
) -> InboxRecord {
    InboxRecord {
        status: InboxStatus::InProgress,
        outcome: None,
        owner: me,
        lease_until: Some(now + terms.lease),
        ..touched(record, delivery, terms, now)
    }
}

/// `record` completed with `outcome`: final, no lease.
pub fn completed(record: &InboxRecord, outcome: InboxOutcome, now: OffsetDateTime) -> InboxRecord {
    InboxRecord {
        status: InboxStatus::Completed,
        outcome: Some(outcome),
        lease_until: None,
        updated_at: now,
        ..record.clone()
    }
}

/// Whether `found` is the record `written` by this attempt, read back after an ambiguous
/// answer: our owner (a fresh id per attempt, which no other attempt writes) on a record
/// in progress with our fingerprint. Later writes of ours under the lease go through
/// [`Lease`] and its version, never through this test.
pub fn own_write(written: &InboxRecord, found: &InboxRecord) -> bool {
    found.owner == written.owner
        && found.status == InboxStatus::InProgress
        && found.payload_hash == written.payload_hash
}

/// Counts and logs an attempt's own committed write found after its answer was lost.
pub(crate) fn own_write_recognised(record: &InboxRecord, write: &'static str) {
    telemetry::counters().own_write_recognised.inc();
    tracing::info!(
        claimId = %record.claim_id,
        messageId = %record.message_id,
        consumer = %record.consumer,
        write,
        "own committed write recognised after an ambiguous answer"
    );
}

/// A lease this attempt holds: the record as it wrote it, and the version that proves it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub record: InboxRecord,
    pub version: Version,
}

/// What a conditional create found.
#[derive(Debug)]
pub enum Created {
    Held(Lease),
    /// The record exists; judge it with [`holder`].
    Exists(Versioned<InboxRecord>),
}

impl Lease {
    /// Takes the lease of the record `seen` for `bid`: creates it when there is none,
    /// otherwise writes `take(record)` over it (conditional on the version read) when
    /// [`holder`] lets `bid` take it over.
    ///
    /// `owners` is asked whether the holder's process has ended only when the lease would
    /// otherwise be live: a record that is ours, free or superseded is taken without that
    /// read.
    pub async fn acquire(
        store: &dyn Store,
        seen: Seen<'_>,
        bid: Bid,
        owners: &impl OwnerLiveness,
        take: impl FnOnce(&InboxRecord) -> InboxRecord,
    ) -> StoreResult<Acquired> {
        let seen = match seen {
            Seen::Nothing(record) => {
                return Ok(match Lease::create(store, record).await? {
                    Created::Held(lease) => Acquired::Held {
                        lease,
                        from: Holder::Nobody,
                    },
                    Created::Exists(_) => Acquired::Lost,
                })
            }
            Seen::Record(seen) => seen,
        };
        let record = &seen.record;
        let mut from = bid.judge(record, owners.known_ended(record.owner));
        if matches!(from, Holder::Live(_)) && owners.ended(record.owner).await {
            from = bid.judge(record, true);
        }
        if let Holder::Live(until) = from {
            return Ok(Acquired::Live(until));
        }
        Ok(match Lease::take_over(store, seen, take(record)).await? {
            Some(lease) => Acquired::Held { lease, from },
            None => Acquired::Lost,
        })
    }

    /// Creates `record` if no record of its key exists.
    ///
    /// A `Transient` answer may hide a create that committed (the connection dropped
    /// after the commit, before the reply). The record is read again: if it is ours
    /// ([`own_write`]), we hold the lease, as the consumer's claim recognises its own
    /// record; if another attempt's, it is judged as any existing record; if there is
    /// none, nothing was written and the error stands.
    pub async fn create(store: &dyn Store, record: InboxRecord) -> StoreResult<Created> {
        let lost = match store.record_handled(&record).await {
            Ok(InsertResult::Inserted(version)) => {
                return Ok(Created::Held(Lease { record, version }))
            }
            Ok(InsertResult::AlreadyExists(seen)) => return Ok(Created::Exists(*seen)),
            Err(lost @ StoreError::Transient(_)) => lost,
            Err(e) => return Err(e),
        };
        match store.inbox(&record.key()).await {
            Ok(Some(seen)) if own_write(&record, &seen.record) => {
                own_write_recognised(&record, "create");
                Ok(Created::Held(Lease {
                    record: seen.record,
                    version: seen.version,
                }))
            }
            Ok(Some(seen)) => Ok(Created::Exists(seen)),
            // Nothing was written, or the record cannot be read now: the first answer
            // is the one to give.
            Ok(None) | Err(_) => Err(lost),
        }
    }

    /// Writes `taken` over `seen` if nothing changed it since it was read. `None`:
    /// another attempt moved first.
    ///
    /// After a `Transient` answer the record is read again, as after a create: a record
    /// that now carries our owner (and did not before) is our committed write.
    pub async fn take_over(
        store: &dyn Store,
        seen: &Versioned<InboxRecord>,
        taken: InboxRecord,
    ) -> StoreResult<Option<Lease>> {
        let lost = match store.replace_inbox(&taken, &seen.version).await {
            Ok(version) => {
                return Ok(Some(Lease {
                    record: taken,
                    version,
                }))
            }
            Err(StoreError::PreconditionFailed) => return Ok(None),
            Err(lost @ StoreError::Transient(_)) => lost,
            Err(e) => return Err(e),
        };
        if seen.record.owner == taken.owner {
            // Our owner was there before the write: the record cannot tell.
            return Err(lost);
        }
        match store.inbox(&taken.key()).await {
            Ok(Some(now)) if own_write(&taken, &now.record) => {
                own_write_recognised(&taken, "take-over");
                Ok(Some(Lease {
                    record: now.record,
                    version: now.version,
                }))
            }
            // Changed by someone else: another attempt moved first.
            Ok(Some(now)) if now.version != seen.version => Ok(None),
            _ => Err(lost),
        }
    }

    /// Replaces the leased record with `record`, under the lease.
    pub async fn write(self, store: &dyn Store, record: InboxRecord) -> StoreResult<Lease> {
        let version = store.replace_inbox(&record, &self.version).await?;
        Ok(Lease { record, version })
    }

    /// Completes the record with `outcome`, under the lease.
    pub async fn complete(
        self,
        store: &dyn Store,
        outcome: InboxOutcome,
        now: OffsetDateTime,
    ) -> StoreResult<Lease> {
        let done = completed(&self.record, outcome, now);
        self.write(store, done).await
    }

    /// Ends the lease now, so the next attempt may take over at once instead of waiting
    /// it out. Best effort: if the write fails, the lease simply runs out.
    pub async fn release(&self, store: &dyn Store, now: OffsetDateTime) {
        let released = InboxRecord {
            lease_until: Some(now),
            updated_at: now,
            ..self.record.clone()
        };
        self.give_back(store, released).await;
    }

    /// Writes `record` back under the lease (best effort), for a holder that must leave
    /// the record as it found it.
    pub async fn give_back(&self, store: &dyn Store, record: InboxRecord) {
        if let Err(e) = store.replace_inbox(&record, &self.version).await {
            tracing::warn!(
                claimId = %record.claim_id,
                messageId = %record.message_id,
                error = %e,
                "could not give the lease back; it will run out"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ClaimId, MessageId};

    fn record(owner: AttemptId, lease_until: Option<OffsetDateTime>, count: u32) -> InboxRecord {
        let now = OffsetDateTime::now_utc();
        let key = InboxKey {
            consumer: "payments".into(),
            claim_id: ClaimId::random(),
            message_id: MessageId::parse("m-1").unwrap(),
        };
        let terms = Terms {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(3600),
        };
        InboxRecord {
            lease_until,
            ..new_record(
                &key,
                &PayloadHash::from_stored("h".into()),
                owner,
                count,
                terms,
                now,
                None,
            )
        }
    }

    #[test]
    fn only_a_live_lease_of_another_attempt_holds_off_a_takeover() {
        let now = OffsetDateTime::now_utc();
        let (me, other) = (AttemptId::new(), AttemptId::new());
        let later = now + Duration::from_secs(30);
        let live = record(other, Some(later), 2);
        assert_eq!(holder(&live, me, 2, false, now), Holder::Live(later));
        assert_eq!(holder(&live, me, 0, false, now), Holder::Live(later));
        assert_eq!(holder(&live, me, 1, false, now), Holder::Live(later));
        assert_eq!(holder(&live, me, 3, false, now), Holder::Superseded);
        assert_eq!(holder(&live, other, 1, false, now), Holder::Us);
        let ran_out = record(other, Some(now), 2);
        assert_eq!(holder(&ran_out, me, 1, false, now), Holder::Nobody);
        let done = completed(&live, InboxOutcome::RunReleased, now);
        assert_eq!(holder(&done, me, 1, false, now), Holder::Nobody);
        // A count of 0 on the holder means the host did not say: only the lease decides.
        let unnumbered = record(other, Some(later), 0);
        assert_eq!(holder(&unnumbered, me, 5, false, now), Holder::Live(later));
        // A live lease of a process that has ended is over for anyone; our own is ours.
        assert_eq!(holder(&live, me, 0, true, now), Holder::OwnerGone);
        assert_eq!(holder(&live, me, 1, true, now), Holder::OwnerGone);
        assert_eq!(holder(&live, other, 0, true, now), Holder::Us);
        assert_eq!(holder(&ran_out, me, 0, true, now), Holder::Nobody);
    }
}
