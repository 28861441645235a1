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
//! that lease has run out (the process died or hangs) or was ended: at a clean stop, or
//! by the next process on the same port, which knows that its predecessor is gone
//! (`startup::restarts`). Anything else counts as alive and the lease decides, as
//! before: an owner that names no boot (written by an older build), a boot that never
//! registered (an operator command, a test), a registration that cannot be read.
//!
//! Being wrong costs time, never money: a lease taken over from a live process is safe
//! (the bank request carries the same Idempotency-Key, and the old attempt's final write
//! is conditional on a version it no longer holds), and a lease waited out only delays.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;

use super::{Created, Lease, Terms};
use crate::ambient::Ambient;
use crate::domain::{ClaimId, MessageId, PayloadHash};
use crate::store::{
    AttemptId, Boot, DynStore, InboxKey, InboxRecord, Store, StoreError, StoreResult,
};
use crate::telemetry;

/// The pseudo-consumer of registrations (never a consumer name: see `config`).
pub(crate) const CONSUMER: &str = "process";
/// How long a registration lasts without renewal: how long a process that died without
/// a successor on its port (its machine went away) still counts as alive.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// How often a running process renews its registration; two renewals can fail in a row
/// (a store blip) before the registration runs out.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Ended processes remembered, so a waiter reads each one's registration once.
const GONE_REMEMBERED: usize = 4096;
/// How long a registration found live is taken as live without reading it again: a
/// waiter re-reads the record it waits for every 20 to 500 ms, and need not double that.
const ALIVE_FOR: Duration = Duration::from_secs(1);

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

/// The processes known to have ended: what the pure decisions read
/// ([`super::holder`]'s `owner_gone`). Filled by [`Owners::check`].
#[derive(Debug)]
pub(crate) struct GoneOwners {
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

    /// Whether `owner`'s process is known to have ended. Never true for this process.
    pub(crate) fn contains(&self, owner: AttemptId) -> bool {
        match owner.boot() {
            Some(boot) if boot != self.me => {
                self.gone.lock().is_ok_and(|gone| gone.contains(&boot))
            }
            _ => false,
        }
    }

    pub(crate) fn insert(&self, boot: Boot) {
        if let Ok(mut gone) = self.gone.lock() {
            if gone.len() >= GONE_REMEMBERED {
                gone.clear();
            }
            gone.insert(boot);
        }
    }
}

/// Whether the owners of leases are still running, as far as their registrations tell.
pub(crate) struct Owners {
    store: DynStore,
    ambient: Ambient,
    gone: GoneOwners,
    /// Processes found live, and when.
    alive: Mutex<HashMap<Boot, Instant>>,
}

impl Owners {
    pub(crate) fn new(store: DynStore, ambient: Ambient) -> Self {
        Owners {
            store,
            gone: GoneOwners::of(ambient.boot()),
            ambient,
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
            if alive.len() >= GONE_REMEMBERED {
                alive.clear();
            }
            alive.insert(boot, Instant::now());
        }
    }

    /// The processes known to have ended so far.
    pub(crate) fn gone(&self) -> &GoneOwners {
        &self.gone
    }

    /// Whether `owner`'s process has ended: one read of its registration, unless that is
    /// already known or cannot be (no boot, our own). Once true, [`Self::gone`] says so
    /// too, for good: a boot never runs again.
    pub(crate) async fn check(&self, owner: AttemptId) -> bool {
        let Some(boot) = owner.boot() else {
            return false;
        };
        if boot == self.ambient.boot() {
            return false;
        }
        if self.gone.contains(owner) {
            return true;
        }
        if self.seen_alive_lately(boot) {
            return false;
        }
        let registration = match key(boot) {
            Ok(key) => self.store.inbox(&key).await,
            Err(e) => Err(e),
        };
        let ended = match registration {
            Ok(Some(seen)) => !seen.record.lease_alive(self.ambient.now()),
            // Never registered (an operator command, a test) or long purged: unknown.
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(boot = %boot, error = %e, "cannot read a process registration; its lease decides");
                false
            }
        };
        if ended {
            telemetry::counters().owners_found_gone.inc();
            self.gone.insert(boot);
        } else {
            self.saw_alive(boot);
        }
        ended
    }
}

/// This process's registration, held while it runs.
pub(crate) struct Registration {
    lease: Lease,
    terms: Terms,
}

/// Registers this process's boot, leased for [`TTL`]; its records are kept for
/// `retention` after the last renewal, like any inbox record.
pub(crate) async fn register(
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
    pub(crate) async fn renew(
        &mut self,
        store: &dyn Store,
        now: OffsetDateTime,
    ) -> StoreResult<()> {
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
    pub(crate) async fn end(self, store: &dyn Store, now: OffsetDateTime) {
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
