//! The store's faults, as a decorator over whichever store the run uses
//! ([`super::stores`]): every call takes a few virtual milliseconds (so a crash can land
//! between any two of them), and the run's store faults fire here: lost answers to
//! committed writes, throttling with and without a hint, calls slower than a lease,
//! failing reads, outage and read-only windows, and the adapters' own waits inside them
//! (a call that waits up to the adapter's bound before it fails, or goes through when the
//! window ends); a write applied twice (the re-sent request's answer returned), a write
//! that commits after its caller was told it failed, an answer that arrives past a lease
//! after its commit, and a stale point read (a state from before another session's
//! write of the last few seconds, as Cosmos DB's Session and BoundedStaleness
//! consistency allow; never on SQLite). For the Cosmos DB store, the SDK's own transport
//! faults are armed here too ([`super::stores::CosmosFaults`]).
//!
//! Each instance has a session of its own ([`FaultyStore::session`]): the windows and
//! the history are the world's, shared; what a session wrote it reads back fresh. Every
//! call's outcome is counted by the adapter path it took ([`FaultyStore::paths`]).

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use claims_payments::seams::store::{
    ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, PaymentRecord, Store,
    StoreCall, StoreDecorator, StoreError, StoreResult, Version, Versioned,
};
use claims_payments::{ClaimId, Purpose};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::chaos::Chaos;
use super::faults::Fault;
use super::stores::{CosmosFault, CosmosFaults, Opened};

/// How far behind another session's write a stale read may be.
pub const STALE_BOUND: Duration = Duration::from_secs(5);
/// The path of an unsettled listing that came back full: reconcile met its per-run limit.
pub const RECONCILE_FULL: &str = "unsettled listing full (reconcile's limit)";
/// History older than this is dropped (its key's next write has no known prior state).
const HISTORY_KEPT: Duration = Duration::from_secs(60);

pub struct FaultyStore {
    inner: DynStore,
    chaos: Chaos,
    lease: Duration,
    session: u64,
    shared: Arc<Shared>,
}

struct Shared {
    /// (until, writes only): no call, or no write, reaches the store before `until`.
    window: Mutex<Option<(Instant, bool)>>,
    stale_reads: bool,
    waits: Duration,
    cosmos: Option<Arc<CosmosFaults>>,
    history: Mutex<History>,
    paths: Mutex<BTreeMap<&'static str, u64>>,
}

impl FaultyStore {
    /// The faults over `opened`'s store (through `watched`, the same store under its
    /// settled-state watch); session 0.
    pub fn new(watched: DynStore, opened: &Opened, chaos: Chaos, lease: Duration) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner: watched,
            chaos,
            lease,
            session: 0,
            shared: Arc::new(Shared {
                window: Mutex::new(None),
                stale_reads: opened.stale_reads,
                waits: opened.waits,
                cosmos: opened.cosmos.clone(),
                history: Mutex::new(History::default()),
                paths: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The same store and world for another session (an instance's client).
    pub fn session(&self, session: u64) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner: self.inner.clone(),
            chaos: self.chaos.clone(),
            lease: self.lease,
            session,
            shared: self.shared.clone(),
        })
    }

    /// How many calls took each adapter path, with the SDK's transport faults met.
    pub fn paths(&self) -> BTreeMap<&'static str, u64> {
        let mut paths = self
            .shared
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(cosmos) = &self.shared.cosmos {
            for (name, hits) in cosmos.hits() {
                paths.insert(name, hits);
            }
        }
        paths
    }

    fn count(&self, path: &'static str) {
        *self
            .shared
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path)
            .or_default() += 1;
    }

    /// Before every call: latency, and whether a window refuses it.
    async fn enter(&self, op: &'static str, write: bool) -> StoreResult<()> {
        let dice = self.chaos.dice();
        tokio::time::sleep(dice.millis(1, 5)).await;
        loop {
            let now = Instant::now();
            let refused = {
                let mut window = self.shared.window.lock().unwrap_or_else(|e| e.into_inner());
                // A window ends when it runs out, or when the run turns calm.
                if window.is_some_and(|(until, _)| until <= now) || !self.chaos.is_on() {
                    *window = None;
                }
                if window.is_none() {
                    if self.chaos.fires(Fault::StoreOutage, op) {
                        *window = Some((now + dice.millis(500, 30_000), false));
                    } else if self.chaos.fires(Fault::StoreReadOnly, op) {
                        *window = Some((now + dice.millis(500, 30_000), true));
                    }
                }
                match *window {
                    Some((until, false)) => Some((until, "the store cannot be reached")),
                    Some((until, true)) if write => {
                        Some((until, "the server is read-only (failover)"))
                    }
                    _ => None,
                }
            };
            let Some((until, why)) = refused else { break };
            // The adapter's own wait: it retries or blocks up to its bound before it
            // answers, while leases and locks run; the call goes through if the window
            // ends meanwhile.
            if self.shared.waits > Duration::ZERO && self.chaos.fires(Fault::StoreWaits, op) {
                let wait = until.saturating_duration_since(now).min(self.shared.waits);
                tokio::time::sleep(wait).await;
                if Instant::now() >= until {
                    continue;
                }
            }
            return Err(StoreError::Transient(format!("{op}: {why}")));
        }
        if let Some(cosmos) = &self.shared.cosmos {
            // The SDK's transport faults, met by this call's requests (and its retries).
            for (fault, kind, hits) in [
                (Fault::CosmosThrottled, CosmosFault::Throttled, (1, 5)),
                (
                    Fault::CosmosThrottledHint,
                    CosmosFault::ThrottledHint,
                    (1, 2),
                ),
                (Fault::CosmosUnavailable, CosmosFault::Unavailable, (1, 3)),
                (Fault::CosmosTimeout, CosmosFault::Timeout, (1, 2)),
            ] {
                if self.chaos.fires(fault, op) {
                    cosmos.arm(kind, dice.range(hits.0, hits.1) as u32);
                }
            }
            if write && self.chaos.fires(Fault::CosmosTimeoutAfterService, op) {
                cosmos.arm(CosmosFault::TimeoutAfterService, 1);
            }
        }
        if !write {
            if self.chaos.fires(Fault::StoreReadFails, op) {
                return Err(StoreError::Transient(format!("{op}: read timed out")));
            }
            return Ok(());
        }
        if self.chaos.fires(Fault::StoreThrottled, op) {
            return Err(StoreError::Transient(format!("{op}: throttled (429)")));
        }
        if self.chaos.fires(Fault::StoreThrottledHint, op) {
            tokio::time::sleep(dice.millis(10, 2_000)).await;
        }
        if self.chaos.fires(Fault::StoreSlowBeyondLease, op) {
            tokio::time::sleep(self.lease + dice.millis(1, 30_000)).await;
        }
        Ok(())
    }

    /// After a write committed: its answer may be lost.
    fn leave<T>(&self, op: &'static str, result: StoreResult<T>) -> StoreResult<T> {
        if result.is_ok() && self.chaos.fires(Fault::StoreWriteUnknown, op) {
            return Err(StoreError::Transient(format!(
                "{op}: timed out; the write may have committed"
            )));
        }
        result
    }

    /// `write` once more on the store, its answer as the caller's type.
    async fn again<T: Send + 'static>(&self, write: &Write) -> Option<StoreResult<T>> {
        let answer = write.apply(&*self.inner).await;
        answer.downcast::<StoreResult<T>>().ok().map(|b| *b)
    }

    fn record<T: 'static>(&self, call: &StoreCall<'_>, result: &StoreResult<T>) {
        let any = result as &dyn Any;
        let path = match call {
            StoreCall::Claim { inbox, .. } => {
                match any.downcast_ref::<StoreResult<ClaimResult>>() {
                    Some(Ok(ClaimResult::Claimed { .. })) => "claim created both records",
                    Some(Ok(ClaimResult::InboxExists(v))) if v.record.owner == inbox.owner => {
                        "claim found its own earlier write"
                    }
                    Some(Ok(ClaimResult::InboxExists(_))) => "claim met the message's record",
                    Some(Ok(ClaimResult::PaymentExists(_))) => "claim met the claim's payment",
                    _ => "",
                }
            }
            StoreCall::RecordHandled(_) => match any.downcast_ref::<StoreResult<InsertResult>>() {
                Some(Ok(InsertResult::Inserted(_))) => "record_handled inserted",
                Some(Ok(InsertResult::AlreadyExists(_))) => "record_handled met a record",
                _ => "",
            },
            StoreCall::UnsettledPayments { limit } => {
                match any.downcast_ref::<StoreResult<Vec<Versioned<PaymentRecord>>>>() {
                    Some(Ok(list)) if list.len() >= *limit => RECONCILE_FULL,
                    _ => "",
                }
            }
            _ => "",
        };
        if !path.is_empty() {
            self.count(path);
        }
        match result {
            Err(StoreError::PreconditionFailed) => self.count("precondition failed (412)"),
            Err(StoreError::Transient(_)) => self.count("transient error"),
            Err(StoreError::Permanent(_)) => self.count("permanent error"),
            Ok(_) => {}
        }
    }
}

/// The chaos plan's name of each call, and whether it writes.
fn operation(call: &StoreCall<'_>) -> (&'static str, bool) {
    match call {
        StoreCall::Claim { .. } => ("claim", true),
        StoreCall::Inbox(_) => ("inbox", false),
        StoreCall::Payment { .. } => ("payment", false),
        StoreCall::RecordHandled(_) => ("record_handled", true),
        StoreCall::ReplaceInbox { .. } => ("replace_inbox", true),
        StoreCall::Finalize(_) => ("finalize", true),
        StoreCall::ListPayments { .. } => ("list_payments", false),
        StoreCall::UnsettledPayments { .. } => ("unsettled_payments", false),
        StoreCall::CountPayments { .. } => ("count_payments", false),
        StoreCall::ListInbox { .. } => ("list_inbox", false),
        StoreCall::PurgeExpired { .. } => ("purge_expired", true),
    }
}

/// A write with its arguments owned: to apply it again, or later.
enum Write {
    Claim(InboxRecord, PaymentRecord),
    RecordHandled(InboxRecord),
    ReplaceInbox(InboxRecord, Version),
    Finalize {
        inbox: InboxRecord,
        inbox_version: Version,
        payment: PaymentRecord,
        payment_version: Option<Version>,
    },
    Purge(OffsetDateTime, usize),
}

impl Write {
    fn of(call: &StoreCall<'_>) -> Option<Write> {
        Some(match *call {
            StoreCall::Claim { inbox, payment } => Write::Claim(inbox.clone(), payment.clone()),
            StoreCall::RecordHandled(inbox) => Write::RecordHandled(inbox.clone()),
            StoreCall::ReplaceInbox { inbox, expected } => {
                Write::ReplaceInbox(inbox.clone(), expected.clone())
            }
            StoreCall::Finalize(w) => Write::Finalize {
                inbox: w.inbox.clone(),
                inbox_version: w.inbox_version.clone(),
                payment: w.payment.clone(),
                payment_version: w.payment_version.cloned(),
            },
            StoreCall::PurgeExpired { now, batch } => Write::Purge(now, batch),
            _ => return None,
        })
    }

    async fn apply(&self, store: &dyn Store) -> Box<dyn Any + Send> {
        match self {
            Write::Claim(inbox, payment) => Box::new(store.claim(inbox, payment).await),
            Write::RecordHandled(inbox) => Box::new(store.record_handled(inbox).await),
            Write::ReplaceInbox(inbox, expected) => {
                Box::new(store.replace_inbox(inbox, expected).await)
            }
            Write::Finalize {
                inbox,
                inbox_version,
                payment,
                payment_version,
            } => Box::new(
                store
                    .finalize(Finalize {
                        inbox,
                        inbox_version,
                        payment,
                        payment_version: payment_version.as_ref(),
                    })
                    .await,
            ),
            Write::Purge(now, batch) => Box::new(store.purge_expired(*now, *batch).await),
        }
    }
}

impl StoreDecorator for FaultyStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let (op, write) = operation(&call);
        self.enter(op, write).await?;
        let history = self.shared.stale_reads && self.chaos.is_active(Fault::StoreStaleRead);
        if write && self.chaos.is_on() && self.chaos.fires(Fault::StoreCommitsAfterFailure, op) {
            // The caller is told it failed; the request is still on its way and commits
            // later, in the world (no caller waits for it, a crash does not stop it).
            if let Some(late) = Write::of(&call) {
                let (inner, delay) = (self.inner.clone(), self.chaos.dice().millis(10, 30_000));
                let trace = self.chaos.trace().clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = late.apply(&*inner).await;
                    crate::trace_event!(trace, "store commits late {op}");
                });
                self.count("write committed after its caller was told it failed");
                return Err(StoreError::Transient(format!(
                    "{op}: timed out; the write may still commit"
                )));
            }
        }
        if history && !write {
            let stale = self.history_lock().stale::<T>(&call, self.session);
            if let Some(stale) = stale {
                if self.chaos.fires(Fault::StoreStaleRead, op) {
                    self.count("stale read");
                    return stale;
                }
            }
        }
        let again = (write && self.chaos.is_active(Fault::StoreWriteTwice))
            .then(|| Write::of(&call))
            .flatten();
        let mut result = work.await;
        if history {
            self.history_lock().after(&call, &result, self.session);
        }
        self.record(&call, &result);
        if let Some(again) = again {
            if result.is_ok() && self.chaos.fires(Fault::StoreWriteTwice, op) {
                // The first answer was lost and the request re-sent: both applied, the
                // second answer returned.
                if let Some(second) = self.again::<T>(&again).await {
                    self.record(&call, &second);
                    result = second;
                }
            }
        }
        if write && result.is_ok() && self.chaos.fires(Fault::StoreAnswerAfterLease, op) {
            tokio::time::sleep(self.lease + self.chaos.dice().millis(1, 30_000)).await;
        }
        if write {
            self.leave(op, result)
        } else {
            result
        }
    }
}

impl FaultyStore {
    fn history_lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// What the point reads of the last minute answered and which session wrote since: the
/// states a stale read may answer from.
#[derive(Default)]
struct History {
    inbox: Keyed<InboxKey, InboxRecord>,
    payments: Keyed<(ClaimId, Purpose), PaymentRecord>,
    /// Per session, the latest write it has seen the effect of (its own, or one it read):
    /// Session consistency is a consistent prefix, so no read of that session is answered
    /// from a state before it (an inbox record read fresh, then its batch's payment read
    /// stale, would show half a transactional batch).
    horizons: Horizons,
}

#[derive(Default)]
struct Horizons(HashMap<u64, Instant>);

impl Horizons {
    fn saw(&mut self, session: u64, write: Option<Instant>) {
        if let Some(at) = write {
            let seen = self.0.entry(session).or_insert(at);
            if *seen < at {
                *seen = at;
            }
        }
    }

    /// Whether `session` may still be answered from a state before the write at `at`.
    fn before(&self, session: u64, at: Instant) -> bool {
        self.0.get(&session).is_none_or(|seen| *seen < at)
    }
}

struct Keyed<K, T> {
    entries: HashMap<K, Entry<T>>,
    /// (last touched, key), oldest first, to forget what is older than [`HISTORY_KEPT`].
    touched: VecDeque<(Instant, K)>,
}

impl<K, T> Default for Keyed<K, T> {
    fn default() -> Self {
        Keyed {
            entries: HashMap::new(),
            touched: VecDeque::new(),
        }
    }
}

struct Entry<T> {
    touched: Instant,
    /// The last answer read, and when.
    read: Option<(Instant, Option<Versioned<T>>)>,
    last_write: Option<Instant>,
    /// The state before the last write, when known, and the write's time.
    before: Option<(Option<Versioned<T>>, Instant)>,
    /// The sessions that saw the state after the last write (its writer first): Session
    /// consistency reads back a session's own writes and never goes back on what the
    /// session read (monotonic reads), so none of them reads it stale.
    seen: Vec<u64>,
}

impl<K: Eq + Hash + Clone, T: Clone> Keyed<K, T> {
    fn entry(&mut self, key: &K, now: Instant) -> &mut Entry<T> {
        while let Some((at, _)) = self.touched.front() {
            if now.saturating_duration_since(*at) <= HISTORY_KEPT {
                break;
            }
            let (at, old) = self.touched.pop_front().expect("a front");
            if self.entries.get(&old).is_some_and(|e| e.touched == at) {
                self.entries.remove(&old);
            }
        }
        self.touched.push_back((now, key.clone()));
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            touched: now,
            read: None,
            last_write: None,
            before: None,
            seen: Vec::new(),
        });
        entry.touched = now;
        entry
    }

    /// A fresh answer read by `session`.
    fn read(
        &mut self,
        key: &K,
        answer: &Option<Versioned<T>>,
        session: u64,
        horizons: &mut Horizons,
    ) {
        let now = Instant::now();
        let entry = self.entry(key, now);
        entry.read = Some((now, answer.clone()));
        entry.saw(session);
        horizons.saw(session, entry.last_write);
    }

    /// `session` saw the record as it is now (a write refused with the record's state).
    fn saw(&mut self, key: &K, session: u64, horizons: &mut Horizons) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.saw(session);
            horizons.saw(session, entry.last_write);
        }
    }

    /// A write by `session`; `created`: the record did not exist before it.
    fn written(&mut self, key: &K, session: u64, created: bool, horizons: &mut Horizons) {
        let now = Instant::now();
        horizons.saw(session, Some(now));
        let entry = self.entry(key, now);
        let prior = if created {
            Some(None)
        } else {
            match &entry.read {
                Some((at, answer)) if entry.last_write.is_none_or(|w| *at >= w) => {
                    Some(answer.clone())
                }
                _ => None,
            }
        };
        entry.before = prior.map(|p| (p, now));
        entry.last_write = Some(now);
        entry.read = None;
        entry.seen.clear();
        entry.seen.push(session);
    }

    fn stale(&self, key: &K, session: u64, horizons: &Horizons) -> Option<Option<Versioned<T>>> {
        let entry = self.entries.get(key)?;
        let (prior, at) = entry.before.as_ref()?;
        (!entry.seen.contains(&session)
            && horizons.before(session, *at)
            && Instant::now().saturating_duration_since(*at) <= STALE_BOUND)
            .then(|| prior.clone())
    }
}

impl<T> Entry<T> {
    fn saw(&mut self, session: u64) {
        if !self.seen.contains(&session) {
            self.seen.push(session);
        }
    }
}

impl History {
    /// A stale answer to the point read `call` by `session`, if one is allowed now.
    fn stale<T: 'static>(&self, call: &StoreCall<'_>, session: u64) -> Option<StoreResult<T>> {
        let answer: Box<dyn Any> = match call {
            StoreCall::Inbox(key) => Box::new(Ok::<_, StoreError>(self.inbox.stale(
                key,
                session,
                &self.horizons,
            )?)),
            StoreCall::Payment { claim, purpose } => Box::new(Ok::<_, StoreError>(
                self.payments
                    .stale(&(*claim, *purpose), session, &self.horizons)?,
            )),
            _ => return None,
        };
        answer.downcast::<StoreResult<T>>().ok().map(|b| *b)
    }

    /// Remembers a point read's answer, or which records a write changed.
    fn after<T: 'static>(&mut self, call: &StoreCall<'_>, result: &StoreResult<T>, session: u64) {
        let any = result as &dyn Any;
        match call {
            StoreCall::Inbox(key) => {
                if let Some(Ok(answer)) =
                    any.downcast_ref::<StoreResult<Option<Versioned<InboxRecord>>>>()
                {
                    self.inbox.read(key, answer, session, &mut self.horizons);
                }
            }
            StoreCall::Payment { claim, purpose } => {
                if let Some(Ok(answer)) =
                    any.downcast_ref::<StoreResult<Option<Versioned<PaymentRecord>>>>()
                {
                    self.payments
                        .read(&(*claim, *purpose), answer, session, &mut self.horizons);
                }
            }
            StoreCall::Claim { inbox, payment } => {
                let payment_key = (payment.claim_id, payment.purpose);
                match any.downcast_ref::<StoreResult<ClaimResult>>() {
                    Some(Ok(ClaimResult::Claimed { .. })) => {
                        self.inbox
                            .written(&inbox.key(), session, true, &mut self.horizons);
                        self.payments
                            .written(&payment_key, session, true, &mut self.horizons);
                    }
                    Some(Ok(ClaimResult::InboxExists(_))) => {
                        self.inbox.saw(&inbox.key(), session, &mut self.horizons)
                    }
                    Some(Ok(ClaimResult::PaymentExists(_))) => {
                        self.payments.saw(&payment_key, session, &mut self.horizons)
                    }
                    _ => {}
                }
            }
            StoreCall::RecordHandled(inbox) => {
                match any.downcast_ref::<StoreResult<InsertResult>>() {
                    Some(Ok(InsertResult::Inserted(_))) => {
                        self.inbox
                            .written(&inbox.key(), session, true, &mut self.horizons)
                    }
                    Some(Ok(InsertResult::AlreadyExists(_))) => {
                        self.inbox.saw(&inbox.key(), session, &mut self.horizons)
                    }
                    _ => {}
                }
            }
            StoreCall::ReplaceInbox { inbox, .. } if result.is_ok() => {
                self.inbox
                    .written(&inbox.key(), session, false, &mut self.horizons);
            }
            StoreCall::Finalize(w) if result.is_ok() => {
                self.inbox
                    .written(&w.inbox.key(), session, false, &mut self.horizons);
                self.payments.written(
                    &(w.payment.claim_id, w.payment.purpose),
                    session,
                    false,
                    &mut self.horizons,
                );
            }
            StoreCall::PurgeExpired { .. } if result.is_ok() => {
                // What a purge removed is not known here: no inbox record's prior state
                // is either.
                self.inbox = Keyed::default();
            }
            _ => {}
        }
    }
}
