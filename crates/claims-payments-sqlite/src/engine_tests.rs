//! The engine's leases and process liveness on a real store (SQLite): the tests of
//! `lease` and `lease::liveness` that need one, kept beside the adapter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

use super::SqliteStore;
use claims_payments_engine::ambient::{Ambient, AttemptId, Boot, Entropy, WallClock};
use claims_payments_engine::domain::{ClaimId, MessageId, PayloadHash};
use claims_payments_engine::lease::liveness::{register, Owners, TTL};
use claims_payments_engine::lease::{
    new_record, taken_over, Acquired, Bid, Created, Holder, Lease, OwnerLiveness, Seen, Terms,
};
use claims_payments_engine::store::{DynStore, InboxKey, InboxRecord, Versioned};

fn at(s: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
}

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

/// Liveness that answers `ended` and counts how often it was asked (each ask is a
/// store read with [`liveness::Owners`]).
struct Counted {
    ended: bool,
    asked: std::sync::atomic::AtomicU32,
}

impl OwnerLiveness for Counted {
    fn known_ended(&self, _: AttemptId) -> bool {
        false
    }

    async fn ended(&self, _: AttemptId) -> bool {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ended
    }
}

/// Whether the holder's process ended is asked only of a lease that would otherwise
/// hold the bid off, once; a record that is ours, free or superseded is taken without
/// the read, and so is a record created.
#[tokio::test]
async fn liveness_is_asked_only_of_a_lease_that_would_otherwise_be_live() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = SqliteStore::open(dir.path().join("l.db")).unwrap();
    let store = store.as_ref();
    let now = OffsetDateTime::now_utc();
    let (me, other) = (AttemptId::new(), AttemptId::new());
    let terms = Terms {
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
    };
    let bid = |delivery| Bid { me, delivery, now };
    let take = |record: &InboxRecord| taken_over(record, me, 1, terms, now);
    let stored = |owner, lease_until, count| async move {
        let Ok(Created::Held(lease)) =
            Lease::create(store, record(owner, lease_until, count)).await
        else {
            panic!("a new key is created");
        };
        Versioned {
            record: lease.record,
            version: lease.version,
        }
    };
    // (the record found, the bid's count, its owner's process ended) -> what comes of
    // it, and how often liveness was asked.
    let later = now + Duration::from_secs(30);
    let (ran_out, live, held_off) = (Some(now), Some(later), Holder::Live(later));
    let cases = [
        (stored(other, ran_out, 2).await, 1, true, Holder::Nobody, 0),
        (stored(other, live, 2).await, 3, true, Holder::Superseded, 0),
        (stored(me, live, 2).await, 1, true, Holder::Us, 0),
        (stored(other, live, 2).await, 1, true, Holder::OwnerGone, 1),
        (stored(other, live, 2).await, 1, false, held_off, 1),
    ];
    for (seen, delivery, ended, expected, asks) in cases {
        let owners = Counted {
            ended,
            asked: Default::default(),
        };
        let acquired = Lease::acquire(store, Seen::Record(&seen), bid(delivery), &owners, take)
            .await
            .unwrap();
        match (acquired, expected) {
            (Acquired::Live(until), Holder::Live(expected)) => assert_eq!(until, expected),
            (Acquired::Held { lease, from }, _) => {
                assert_eq!(from, expected);
                assert_eq!(lease.record.owner, me);
            }
            (other, _) => panic!("{expected:?}: came to {other:?}"),
        }
        assert_eq!(owners.asked.into_inner(), asks, "{expected:?}");
    }
    // A record created asks nothing; one found created meanwhile is a lost race.
    let owners = Counted {
        ended: true,
        asked: Default::default(),
    };
    let fresh = record(me, Some(later), 1);
    let created = Lease::acquire(store, Seen::Nothing(fresh.clone()), bid(1), &owners, take)
        .await
        .unwrap();
    assert!(matches!(
        created,
        Acquired::Held {
            from: Holder::Nobody,
            ..
        }
    ));
    let again = Lease::acquire(store, Seen::Nothing(fresh), bid(1), &owners, take)
        .await
        .unwrap();
    assert!(matches!(again, Acquired::Lost));
    // A record changed since it was read: another attempt moved first.
    let seen = stored(other, Some(now), 1).await;
    Lease::take_over(store, &seen, take(&seen.record))
        .await
        .unwrap()
        .unwrap();
    let lost = Lease::acquire(store, Seen::Record(&seen), bid(1), &owners, take)
        .await
        .unwrap();
    assert!(matches!(lost, Acquired::Lost));
    assert_eq!(owners.asked.into_inner(), 0);
}

struct Clock(Mutex<OffsetDateTime>);
impl WallClock for Clock {
    fn now(&self) -> OffsetDateTime {
        *self.0.lock().unwrap()
    }
}
struct Counter(std::sync::atomic::AtomicU64);
impl Entropy for Counter {
    fn fill(&self, bytes: &mut [u8]) {
        let n = self
            .0
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_be_bytes();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = n[i % n.len()];
        }
    }
}

fn ambient(boot: u64, clock: &Arc<Clock>) -> Ambient {
    Ambient::new(
        clock.clone(),
        Arc::new(Counter(std::sync::atomic::AtomicU64::new(boot << 32))),
        Boot::numbered(boot),
    )
}

/// Process A is paused past its registration's TTL, found ended by process B, then
/// runs again and renews: B finds it alive from then on, and ended again only once
/// its renewed registration runs out in turn.
#[tokio::test]
async fn a_paused_process_that_renews_is_alive_again() {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = SqliteStore::open(dir.path().join("p.db")).unwrap();
    let clock_a = Arc::new(Clock(Mutex::new(at(0))));
    let clock_b = Arc::new(Clock(Mutex::new(at(0))));
    let (a, b) = (ambient(1, &clock_a), ambient(2, &clock_b));
    let mut registration = register(store.as_ref(), Duration::from_secs(86_400), &a)
        .await
        .unwrap();
    let owners = Owners::new(store.clone(), b.clone());
    let a_attempt = a.attempt_id();
    assert!(!owners.check(a_attempt).await, "registered and live");

    // A is paused; its registration runs out (and B's live finding is past trusting).
    owners.forget_live_findings();
    *clock_b.lock() = at(0) + TTL + Duration::from_secs(1);
    let view = owners.view();
    assert!(owners.check_for(a_attempt, &view).await);
    assert!(
        view.contains(a_attempt),
        "the attempt acts on what it found"
    );
    assert!(
        !owners.view().contains(a_attempt),
        "a later attempt starts from nothing"
    );

    // A runs again and renews: alive for B, at once.
    *clock_a.lock() = at(0) + TTL + Duration::from_secs(2);
    registration
        .renew(store.as_ref(), clock_a.now())
        .await
        .unwrap();
    *clock_b.lock() = at(0) + TTL + Duration::from_secs(3);
    assert!(
        !owners.check(a_attempt).await,
        "a renewal makes it alive again"
    );

    // Paused again past the renewed registration: ended again.
    *clock_b.lock() = at(0) + TTL * 2 + Duration::from_secs(3);
    // (Past the time a live finding is trusted without a read.)
    owners.forget_live_findings();
    assert!(owners.check(a_attempt).await);
}

impl Clock {
    fn lock(&self) -> std::sync::MutexGuard<'_, OffsetDateTime> {
        self.0.lock().unwrap()
    }
}
