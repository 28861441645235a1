//! Which processes are still running, so a lease whose owner died is taken over at once.
//!
//! A lease lasts minutes (`LEASE_MS`); a process that dies holds its leases for nothing
//! until they run out, and every attempt that meets one waits and answers retry-later
//! meanwhile. So each `serve` process registers its [`Boot`] in the store before it
//! listens, and renews the registration while it runs; an attempt's owner names its boot
//! ([`AttemptId::boot`]); and an attempt that meets a live lease of another process asks
//! [`Owners::check`] whether that process has ended before it waits.
//!
//! A registration is an inbox record of the pseudo-consumer [`CONSUMER`], keyed by the
//! boot and leased for [`TTL`], renewed every [`RENEW_EVERY`]. Its process has ended when
//! that lease has run out (the process died, hangs or is paused) or was ended: at a clean
//! stop, or by the next process on the same port once that process knows its predecessor
//! has exited (`startup::restarts`). Anything else counts as alive and the lease decides,
//! as before: an owner that names no boot (written by an older build), a boot that never
//! registered (an operator command, a test), a registration that cannot be read.
//!
//! "Ended" is not for good: a process paused for longer than [`TTL`] (a VM frozen for
//! host maintenance, a CPU-throttled container) renews its registration when it runs
//! again, and is alive from then on. So a boot counts as ended only while its
//! registration is unchanged (the same version) since it was found ended or run out
//! ([`judge`]): [`Owners::check`] reads the registration every time it answers "ended",
//! and what an attempt found ([`GoneOwners`]) lasts only as long as that attempt.
//!
//! Being wrong costs time, never money: a lease taken over from a live process is safe
//! (the bank request carries the same Idempotency-Key, and the old attempt's final write
//! is conditional on a version it no longer holds), and a lease waited out only delays.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;

use super::{Created, Lease, OwnerLiveness, Terms};
use crate::ambient::Ambient;
use crate::domain::{ClaimId, MessageId, PayloadHash};
use crate::store::{
    AttemptId, Boot, DynStore, InboxKey, InboxRecord, Store, StoreError, StoreResult, Version,
    Versioned,
};
use crate::telemetry;

/// The pseudo-consumer of registrations (never a consumer name: see `configuration`).
pub const CONSUMER: &str = "process";
/// How long a registration lasts without renewal: how long a process that died without
/// a successor on its port (its machine went away) still counts as alive.
pub const TTL: Duration = Duration::from_secs(30);
/// How often a running process renews its registration; two renewals can fail in a row
/// (a store blip) before the registration runs out.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Ended processes remembered with the version of their registration, and processes
/// found live: each map is cleared when it reaches this size.
const REMEMBERED: usize = 4096;
/// How long a registration found live is taken as live without reading it again: a
/// waiter re-reads the record it waits for every 20 to 500 ms, and need not double that.
pub const ALIVE_FOR: Duration = Duration::from_secs(1);

/// The key of `boot`'s registration.
fn key(boot: Boot) -> StoreResult<InboxKey> {
    let claim_id = ClaimId::parse(&boot.as_uuid().to_string())
        .map_err(|e| StoreError::Permanent(format!("registration key: {e}")))?;
    let message_id = MessageId::parse(CONSUMER)
        .map_err(|e| StoreError::Permanent(format!("registration key: {e}")))?;
    Ok(InboxKey {
        consumer: CONSUMER.into(),
        claim_id,
        message_id,
    })
}

/// The processes one attempt found ended: what [`super::Lease::acquire`] knows without a
/// read ([`super::holder`]'s `owner_gone`, through [`Owners::seen_by`]). Filled by
/// [`Owners::check_for`]; it lives as long as the attempt, so no later attempt acts on what
/// this one read.
#[derive(Debug)]
pub struct GoneOwners {
    /// This process, never gone.
    me: Boot,
    gone: Mutex<HashSet<Boot>>,
}

impl Default for GoneOwners {
    fn default() -> Self {
        GoneOwners::of(Boot::current())
    }
}

impl GoneOwners {
    fn of(me: Boot) -> Self {
        GoneOwners {
            me,
            gone: Mutex::default(),
        }
    }

    /// Whether `owner`'s process was found ended. Never true for this process.
    pub fn contains(&self, owner: AttemptId) -> bool {
        match owner.boot() {
            Some(boot) if boot != self.me => {
                self.gone.lock().is_ok_and(|gone| gone.contains(&boot))
            }
            _ => false,
        }
    }

    pub fn insert(&self, boot: Boot) {
        if let Ok(mut gone) = self.gone.lock() {
            gone.insert(boot);
        }
    }
}

/// What a registration read now says about its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// Running as far as anyone can tell (its lease decides).
    Alive,
    /// Ended: its registration, at this version, ran out or was ended.
    Ended(Version),
}

/// Pure: the liveness rule. `ended_at` is the version the registration had when this
/// process last found it ended, `read` the registration as read now (`None`: never
/// registered, or purged). A boot is ended while its registration is still the one
/// found ended (a clock behind the one that ended it cannot revive it), or when the
/// registration read now has no live lease; a renewal (a new version with a live lease)
/// makes it alive again, whatever was found before.
pub fn judge(
    ended_at: Option<&Version>,
    read: Option<&Versioned<InboxRecord>>,
    now: OffsetDateTime,
) -> Liveness {
    match read {
        None => Liveness::Alive,
        Some(seen) if ended_at == Some(&seen.version) || !seen.record.lease_alive(now) => {
            Liveness::Ended(seen.version.clone())
        }
        Some(_) => Liveness::Alive,
    }
}

/// Whether the owners of leases are still running, as far as their registrations tell.
pub struct Owners {
    store: DynStore,
    ambient: Ambient,
    /// Processes found ended, with the version of the registration that said so.
    ended: Mutex<HashMap<Boot, Version>>,
    /// Processes found live, and when.
    alive: Mutex<HashMap<Boot, Instant>>,
}

impl Owners {
    pub fn new(store: DynStore, ambient: Ambient) -> Self {
        Owners {
            store,
            ambient,
            ended: Mutex::new(HashMap::new()),
            alive: Mutex::new(HashMap::new()),
        }
    }

    fn seen_alive_lately(&self, boot: Boot) -> bool {
        self.alive
            .lock()
            .is_ok_and(|alive| alive.get(&boot).is_some_and(|at| at.elapsed() < ALIVE_FOR))
    }

    fn saw_alive(&self, boot: Boot) {
        if let Ok(mut alive) = self.alive.lock() {
            if alive.len() >= REMEMBERED {
                alive.clear();
            }
            alive.insert(boot, Instant::now());
        }
    }

    fn ended_at(&self, boot: Boot) -> Option<Version> {
        self.ended
            .lock()
            .ok()
            .and_then(|ended| ended.get(&boot).cloned())
    }

    /// Remembers `boot` as ended at `version`; whether that is news (counted once per
    /// registration version found ended).
    fn saw_ended(&self, boot: Boot, version: Version) -> bool {
        let Ok(mut ended) = self.ended.lock() else {
            return false;
        };
        if ended.len() >= REMEMBERED {
            ended.clear();
        }
        ended.insert(boot, version.clone()) != Some(version)
    }

    fn forget_ended(&self, boot: Boot) {
        if let Ok(mut ended) = self.ended.lock() {
            ended.remove(&boot);
        }
    }

    /// Forgets every live finding, as if each were older than it may be trusted (a
    /// process paused past it): the next check reads the registration.
    pub fn forget_live_findings(&self) {
        if let Ok(mut alive) = self.alive.lock() {
            alive.clear();
        }
    }

    /// A view for one attempt: empty, filled by [`Self::check_for`].
    pub fn view(&self) -> GoneOwners {
        GoneOwners::of(self.ambient.boot())
    }

    /// Whether `owner`'s process has ended: one read of its registration, unless that
    /// cannot tell (no boot, our own) or it was found live within [`ALIVE_FOR`]. Every
    /// "ended" comes from a read: a process that renewed its registration since it was
    /// found ended is alive again.
    pub async fn check(&self, owner: AttemptId) -> bool {
        let Some(boot) = owner.boot() else {
            return false;
        };
        if boot == self.ambient.boot() || self.seen_alive_lately(boot) {
            return false;
        }
        let registration = match key(boot) {
            Ok(key) => self.store.inbox(&key).await,
            Err(e) => Err(e),
        };
        let read = match registration {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(boot = %boot, error = %e, "cannot read a process registration; its lease decides");
                return false;
            }
        };
        match judge(
            self.ended_at(boot).as_ref(),
            read.as_ref(),
            self.ambient.now(),
        ) {
            Liveness::Ended(version) => {
                if self.saw_ended(boot, version) {
                    telemetry::counters().owners_found_gone.inc();
                }
                true
            }
            Liveness::Alive => {
                self.forget_ended(boot);
                self.saw_alive(boot);
                false
            }
        }
    }

    /// [`Self::check`], noting an ended owner in the attempt's `view`.
    pub async fn check_for(&self, owner: AttemptId, view: &GoneOwners) -> bool {
        let ended = self.check(owner).await;
        if let (true, Some(boot)) = (ended, owner.boot()) {
            view.insert(boot);
        }
        ended
    }

    /// These owners as one attempt sees them: what it found ended stays ended for it.
    pub fn seen_by<'a>(&'a self, view: &'a GoneOwners) -> SeenBy<'a> {
        SeenBy { owners: self, view }
    }
}

/// Asked afresh each time (the reconcile run, the payments API).
impl OwnerLiveness for Owners {
    fn known_ended(&self, _: AttemptId) -> bool {
        false
    }

    async fn ended(&self, owner: AttemptId) -> bool {
        self.check(owner).await
    }
}

/// [`Owners`] as one attempt sees them ([`Owners::seen_by`]).
pub struct SeenBy<'a> {
    owners: &'a Owners,
    view: &'a GoneOwners,
}

impl OwnerLiveness for SeenBy<'_> {
    fn known_ended(&self, owner: AttemptId) -> bool {
        self.view.contains(owner)
    }

    async fn ended(&self, owner: AttemptId) -> bool {
        self.owners.check_for(owner, self.view).await
    }
}

/// This process's registration, held while it runs.
pub struct Registration {
    lease: Lease,
    terms: Terms,
}

/// Registers this process's boot, leased for [`TTL`]; its records are kept for
/// `retention` after the last renewal, like any inbox record.
pub async fn register(
    store: &dyn Store,
    retention: Duration,
    ambient: &Ambient,
) -> StoreResult<Registration> {
    let boot = ambient.boot();
    let terms = Terms {
        lease: TTL,
        retention,
    };
    let now = ambient.now();
    let hash = PayloadHash::from_stored(CONSUMER.into());
    let record = super::new_record(
        &key(boot)?,
        &hash,
        ambient.attempt_id(),
        0,
        terms,
        now,
        None,
    );
    let lease = match Lease::create(store, record).await? {
        Created::Held(lease) => lease,
        // Our own create, re-sent after an ambiguous answer: ours to renew.
        Created::Exists(seen) if seen.record.owner.boot() == Some(boot) => {
            let renewed = renewed(&seen.record, terms, now);
            match Lease::take_over(store, &seen, renewed).await? {
                Some(lease) => lease,
                None => return Err(StoreError::Transient("the registration changed".into())),
            }
        }
        Created::Exists(_) => {
            return Err(StoreError::Permanent(format!(
                "boot {boot} is registered by another process"
            )))
        }
    };
    Ok(Registration { lease, terms })
}

fn renewed(record: &InboxRecord, terms: Terms, now: OffsetDateTime) -> InboxRecord {
    InboxRecord {
        lease_until: Some(now + terms.lease),
        ..super::touched(record, 0, terms, now)
    }
}

impl Registration {
    /// Extends the registration by [`TTL`] from now. `PreconditionFailed`: someone ended
    /// it (this process then counts as ended; its leases may be taken over, safely).
    pub async fn renew(&mut self, store: &dyn Store, now: OffsetDateTime) -> StoreResult<()> {
        let record = renewed(&self.lease.record, self.terms, now);
        match self.lease.clone().write(store, record.clone()).await {
            Ok(lease) => {
                self.lease = lease;
                Ok(())
            }
            // An earlier renewal may have committed with its answer lost: the record then
            // holds a lease later than the last one we know of, which only we extend (an
            // end writes the moment it ends it). Found by the deterministic simulator
            // (seed 126): this process took its own lost renewal for an end, stopped
            // renewing, and every process took its live leases over from then on.
            Err(StoreError::PreconditionFailed) => {
                let seen = store.inbox(&self.lease.record.key()).await?;
                match seen {
                    Some(seen)
                        if seen.record.owner == self.lease.record.owner
                            && seen.record.lease_until > self.lease.record.lease_until =>
                    {
                        let ours = Lease {
                            record: seen.record,
                            version: seen.version,
                        };
                        self.lease = ours.write(store, record).await?;
                        Ok(())
                    }
                    _ => Err(StoreError::PreconditionFailed),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the registration (a clean stop): this process's leases are over at once.
    pub async fn end(self, store: &dyn Store, now: OffsetDateTime) {
        self.lease.release(store, now).await;
    }
}

/// The task that renews this process's registration every [`RENEW_EVERY`],
/// until [`Registered::end`] ends it.
/// Dropped without [`Registered::end`] (the process dies), the renewals stop and the
/// registration runs out.
pub struct Registered {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Registered {
    /// Registers the process `ambient` names and renews its registration until
    /// [`Registered::end`] (`serve`, and each of the simulator's instances).
    pub async fn register(
        store: DynStore,
        retention: Duration,
        ambient: Ambient,
    ) -> StoreResult<Registered> {
        let registration = register(store.as_ref(), retention, &ambient).await?;
        Ok(Self::keep(store, registration, ambient))
    }

    fn keep(store: DynStore, mut registration: Registration, ambient: Ambient) -> Registered {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.tick().await;
            loop {
                // Biased: a stop that is due wins over a renewal that is due, every time.
                tokio::select! {
                    biased;
                    _ = &mut stopped => {
                        registration.end(store.as_ref(), ambient.now()).await;
                        return;
                    }
                    _ = tick.tick() => {}
                }
                match registration.renew(store.as_ref(), ambient.now()).await {
                    Ok(()) => {}
                    Err(StoreError::PreconditionFailed) => {
                        // Someone ended it: other processes may now take our leases over.
                        // Safe (the final writes are conditional), so carry on serving.
                        tracing::error!("this process's registration was ended by another; its leases may be taken over");
                        return;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "cannot renew this process's registration; trying again"
                    ),
                }
            }
        });
        Registered {
            stop: Some(stop),
            task,
        }
    }

    /// Ends the registration (bounded: a store that does not answer lets it run out).
    pub async fn end(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

/// Ends the registration of `boot`, a process known to have ended (the previous process
/// on this port, which did not stop cleanly). Whether there was a live one to end.
pub async fn end_registration_of(
    store: &dyn Store,
    boot: Boot,
    now: OffsetDateTime,
) -> StoreResult<bool> {
    let Some(seen) = store.inbox(&key(boot)?).await? else {
        return Ok(false);
    };
    if !seen.record.lease_alive(now) {
        return Ok(false);
    }
    let ended = InboxRecord {
        lease_until: Some(now),
        updated_at: now,
        ..seen.record.clone()
    };
    match store.replace_inbox(&ended, &seen.version).await {
        Ok(_) => Ok(true),
        // It changed since we read it: it renewed (then it was not gone) or ended.
        Err(StoreError::PreconditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    /// A registration at `version`, leased until `until` (`None`: ended without a lease).
    fn registration(version: &str, until: i64) -> Versioned<InboxRecord> {
        let boot = Boot::numbered(1);
        let hash = PayloadHash::from_stored(CONSUMER.into());
        let terms = Terms {
            lease: TTL,
            retention: Duration::from_secs(86_400),
        };
        let mut record = super::super::new_record(
            &key(boot).unwrap(),
            &hash,
            AttemptId::of(boot),
            0,
            terms,
            at(0),
            None,
        );
        record.lease_until = Some(at(until));
        Versioned {
            record,
            version: Version(version.into()),
        }
    }

    #[test]
    fn a_boot_is_ended_only_while_its_registration_is_unchanged_since_found_ended() {
        let v = |s: &str| Version(s.into());
        // Never registered (or purged): unknown, the lease decides.
        assert_eq!(judge(None, None, at(0)), Liveness::Alive);
        assert_eq!(judge(Some(&v("1")), None, at(0)), Liveness::Alive);
        // Renewed and live; then run out (paused, hung or dead): ended at that version.
        let live = registration("1", 30);
        assert_eq!(judge(None, Some(&live), at(29)), Liveness::Alive);
        assert_eq!(judge(None, Some(&live), at(30)), Liveness::Ended(v("1")));
        // Unchanged since it was found ended: still ended, even by a clock that reads
        // its lease as live (the clock of whoever ended it ran ahead of ours).
        assert_eq!(
            judge(Some(&v("1")), Some(&live), at(10)),
            Liveness::Ended(v("1"))
        );
        // A renewal (a new version with a live lease): alive again, whatever was found
        // before; the memory of the old version does not outlive it.
        let renewed = registration("2", 70);
        assert_eq!(
            judge(Some(&v("1")), Some(&renewed), at(40)),
            Liveness::Alive
        );
        // It runs out again: ended again, at the new version.
        assert_eq!(
            judge(Some(&v("1")), Some(&renewed), at(70)),
            Liveness::Ended(v("2"))
        );
    }
}
