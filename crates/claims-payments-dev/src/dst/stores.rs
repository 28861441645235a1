//! The store a run uses (`dst --store model|sqlite|cosmos`), below the run's store faults
//! ([`super::store::FaultyStore`]) and the settled-state watch ([`SettledWatch`]).
//!
//! - `model`: the in-memory model (`crate::memory_store`). Deterministic.
//! - `sqlite`: the production SQLite adapter on a file of its own per run (under
//!   `/dev/shm` where it exists, so its `fdatasync`s cost nothing). Its writer, syncer and
//!   checkpointer are threads, and its reads go through `spawn_blocking`: awaited on the
//!   runtime, a call would let virtual time run on (or not) while those threads work,
//!   depending on the machine's real timing. So each call is run to its end on the
//!   runtime's thread ([`Immediate`]): the call takes no virtual time (the fault layer
//!   adds its latency) and nothing else runs meanwhile. The adapter reads no clock of its
//!   own (every time it stores comes from the records), so a seed replays, trace hash
//!   and all. Its busy waits (`busy_timeout`, 5 s) cannot happen: one writer connection.
//! - `cosmos`: the production Cosmos DB adapter, through the real `azure_data_cosmos`
//!   client over the SDK's in-memory emulator transport: the SDK's retries, session
//!   handling and error mapping, and the adapter's 409 handling, run as in production.
//!   The client runs on the run's runtime, so the SDK's waits (throttling back-offs,
//!   retry-after) are virtual time. Transport faults are the SDK's own fault-injection
//!   rules ([`CosmosFaults`]), armed by the run's dice for a number of hits rather than
//!   left to the SDK's own probability (which draws `rand::random`). What is not the
//!   seed's: the SDK's retry jitter mixes `SystemTime::now()` into each back-off (its
//!   `driver/jitter.rs`), so a run in which the SDK retries may not replay; the emulator
//!   stamps `_ts` and the SDK its diagnostics from the system clock (neither reaches the
//!   product's decisions); the driver's CPU sampler is a thread that reads nothing of
//!   ours; its one real request (the instance metadata service, for a machine id) is
//!   switched off with `COSMOS_DISABLE_IMDS`. A run without SDK-level retries replays; one with them is a soak of the same
//!   world: its seed is printed, and `--verbose` keeps its event log.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::fault_injection::{
    CustomResponseBuilder, FaultInjectionErrorType, FaultInjectionResultBuilder,
    FaultInjectionRule, FaultInjectionRuleBuilder,
};
use claims_payments::seams::store::{
    ClaimResult, DynStore, PaymentRecord, PaymentStatus, Store, StoreCall, StoreDecorator,
    StoreResult, Versioned,
};
use claims_payments::ClaimId;
use claims_payments_sqlite::SqliteStore;
use std::collections::BTreeMap;
use std::future::Future;

use super::StoreKind;
use crate::emulator::InProcessEmulator;
use crate::memory_store::MemoryStore;

/// What a run's store is and allows.
pub struct Opened {
    /// The store the product uses (the run's faults go above it).
    pub base: DynStore,
    /// The same store through a handle of its own without faults (for Cosmos DB, a
    /// client without fault rules): what the checks read through.
    pub check: DynStore,
    /// Point reads may answer from a state before another session's last write (Cosmos
    /// DB at Session or BoundedStaleness consistency, which `infra/` allows; the model
    /// stands for it). SQLite and PostgreSQL read their own primary: never stale.
    pub stale_reads: bool,
    /// The most an adapter waits by itself on an unreachable or read-only store before it
    /// answers (PostgreSQL's connect and statement waits, 20 s; SQLite's busy timeout,
    /// 5 s; the Cosmos SDK's own retries are its transport faults).
    pub waits: Duration,
    /// The SDK's fault-injection rules, for the Cosmos DB store.
    pub cosmos: Option<Arc<CosmosFaults>>,
    /// The emulator's or the SQLite file's owner, kept for the run.
    _keep: Keep,
}

#[allow(dead_code)] // Held for their lifetime only.
enum Keep {
    None,
    File(tempfile::TempDir),
    Emulator(InProcessEmulator),
}

/// Opens a run's store. `retention`: INBOX_RETENTION_DAYS.
pub async fn open(kind: StoreKind, retention: Duration) -> anyhow::Result<Opened> {
    Ok(match kind {
        StoreKind::Model => {
            let store: DynStore = Arc::new(MemoryStore::new());
            Opened {
                check: store.clone(),
                base: store,
                stale_reads: true,
                waits: Duration::from_secs(20),
                cosmos: None,
                _keep: Keep::None,
            }
        }
        StoreKind::Sqlite => {
            let shm = std::path::Path::new("/dev/shm");
            let dir = if shm.is_dir() {
                tempfile::Builder::new()
                    .prefix("dst-sqlite")
                    .tempdir_in(shm)?
            } else {
                tempfile::Builder::new().prefix("dst-sqlite").tempdir()?
            };
            let store: DynStore =
                Arc::new(Immediate(SqliteStore::open(dir.path().join("claims.db"))?));
            Opened {
                check: store.clone(),
                base: store,
                stale_reads: false,
                waits: Duration::from_secs(5),
                cosmos: None,
                _keep: Keep::File(dir),
            }
        }
        StoreKind::Cosmos => {
            // The driver asks Azure's instance metadata service (a real HTTP request)
            // for a machine id once per process, unless told not to: a simulated run
            // makes no real request.
            if std::env::var_os("COSMOS_DISABLE_IMDS").is_none() {
                std::env::set_var("COSMOS_DISABLE_IMDS", "1");
            }
            let emulator = InProcessEmulator::new()?;
            emulator.provision("claims", "consumer").await?;
            let faults = Arc::new(CosmosFaults::new());
            let store = emulator
                .store("claims", "consumer", retention, faults.rules())
                .await?;
            let check = emulator
                .store("claims", "consumer", retention, Vec::new())
                .await?;
            Opened {
                base: Arc::new(store),
                check: Arc::new(check),
                stale_reads: true,
                waits: Duration::ZERO,
                cosmos: Some(faults),
                _keep: Keep::Emulator(emulator),
            }
        }
    })
}

/// A store whose every call runs to its end on the runtime's thread, before anything else
/// runs: for an adapter whose work happens on threads of its own (see the module docs).
pub struct Immediate<S>(pub Arc<S>);

impl<S: Store> StoreDecorator for Immediate<S> {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }

    async fn around<T: Send + 'static>(
        &self,
        _call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        futures::executor::block_on(work)
    }
}

/// A transport fault of the Cosmos DB SDK, as its fault-injection rules inject it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CosmosFault {
    /// 429 without a retry-after: the SDK backs off by itself.
    Throttled,
    /// 429/3200 with `x-ms-retry-after-ms`: the SDK waits what the service asked.
    ThrottledHint,
    /// 503: the SDK retries once more, then gives up.
    Unavailable,
    /// The request was not sent; no answer (the SDK retries).
    Timeout,
    /// The request was served and its answer lost (the SDK re-sends it: a write applied
    /// once, answered as a second try, for example a batch's 409 on its own inbox record).
    TimeoutAfterService,
}

impl CosmosFault {
    pub const ALL: [CosmosFault; 5] = [
        CosmosFault::Throttled,
        CosmosFault::ThrottledHint,
        CosmosFault::Unavailable,
        CosmosFault::Timeout,
        CosmosFault::TimeoutAfterService,
    ];

    fn name(self) -> &'static str {
        match self {
            CosmosFault::Throttled => "sdk-429",
            CosmosFault::ThrottledHint => "sdk-429-retry-after",
            CosmosFault::Unavailable => "sdk-503",
            CosmosFault::Timeout => "sdk-timeout",
            CosmosFault::TimeoutAfterService => "sdk-timeout-after-service",
        }
    }
}

/// A rule can be hit this many times in all; arming it for `n` hits sets its count to
/// `LIMIT - n`, so the next `n` requests meet the fault and the rest pass.
const LIMIT: u32 = 1_000_000;

/// The SDK's fault-injection rules of a run, one per [`CosmosFault`], each disarmed until
/// the run's dice arm it for a number of requests.
pub struct CosmosFaults {
    rules: Vec<(CosmosFault, Arc<FaultInjectionRule>, Arc<AtomicU32>)>,
    /// Hits armed, to tell the hits that happened.
    armed: Mutex<BTreeMap<CosmosFault, u64>>,
}

impl CosmosFaults {
    fn new() -> Self {
        let rules = CosmosFault::ALL
            .iter()
            .map(|&fault| {
                let result = match fault {
                    CosmosFault::Throttled => FaultInjectionResultBuilder::new()
                        .with_error(FaultInjectionErrorType::TooManyRequests),
                    CosmosFault::ThrottledHint => FaultInjectionResultBuilder::new()
                        .with_custom_response(
                            CustomResponseBuilder::new(
                                azure_core::http::StatusCode::TooManyRequests,
                            )
                            .with_sub_status(3200)
                            .with_header("x-ms-retry-after-ms", "500")
                            .build(),
                        ),
                    CosmosFault::Unavailable => FaultInjectionResultBuilder::new()
                        .with_error(FaultInjectionErrorType::ServiceUnavailable),
                    CosmosFault::Timeout => FaultInjectionResultBuilder::new()
                        .with_error(FaultInjectionErrorType::ResponseTimeout),
                    CosmosFault::TimeoutAfterService => FaultInjectionResultBuilder::new()
                        .with_error(FaultInjectionErrorType::ResponseTimeoutAfterService),
                }
                .with_probability(1.0)
                .build();
                let hits = Arc::new(AtomicU32::new(LIMIT));
                let rule = FaultInjectionRuleBuilder::new(fault.name(), result)
                    .with_hit_limit(LIMIT)
                    .with_shared_state(Arc::new(AtomicBool::new(true)), hits.clone())
                    .build();
                (fault, Arc::new(rule), hits)
            })
            .collect();
        CosmosFaults {
            rules,
            armed: Mutex::new(BTreeMap::new()),
        }
    }

    fn rules(&self) -> Vec<Arc<FaultInjectionRule>> {
        self.rules.iter().map(|(_, rule, _)| rule.clone()).collect()
    }

    /// The next `hits` requests through the client meet `fault` (replacing what was armed
    /// and not hit yet).
    pub fn arm(&self, fault: CosmosFault, hits: u32) {
        if let Some((_, _, count)) = self.rules.iter().find(|(f, _, _)| *f == fault) {
            count.store(LIMIT - hits.min(LIMIT), Ordering::SeqCst);
            *self
                .armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(fault)
                .or_default() += u64::from(hits);
        }
    }

    /// Disarms every rule (the run turned calm).
    pub fn disarm(&self) {
        for (_, _, count) in &self.rules {
            count.store(LIMIT, Ordering::SeqCst);
        }
    }

    /// The requests each fault met so far (armed hits minus those still waiting).
    pub fn hits(&self) -> BTreeMap<&'static str, u64> {
        let armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        self.rules
            .iter()
            .map(|(fault, _, count)| {
                let waiting = u64::from(LIMIT - count.load(Ordering::SeqCst).min(LIMIT));
                let armed = armed.get(fault).copied().unwrap_or(0);
                (fault.name(), armed.saturating_sub(waiting))
            })
            .collect()
    }
}

/// Watches every payment the store answers or is told to write, and records a settled
/// payment (paid, rejected, recorded, mismatched) whose status or bank payment id later
/// changed: "a settled payment is never rewritten", for any store, without the store's
/// own bookkeeping. It sits right above the store, below the faults, so it sees what the
/// store holds.
pub struct SettledWatch {
    inner: DynStore,
    settled: Mutex<BTreeMap<ClaimId, (PaymentStatus, Option<String>)>>,
    rewrites: Mutex<Vec<(ClaimId, String)>>,
}

fn settled(status: PaymentStatus) -> bool {
    !matches!(
        status,
        PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation
    )
}

impl SettledWatch {
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(SettledWatch {
            inner,
            settled: Mutex::new(BTreeMap::new()),
            rewrites: Mutex::new(Vec::new()),
        })
    }

    /// The store below the watch.
    pub fn store(&self) -> &DynStore {
        &self.inner
    }

    /// Each settled payment seen changed afterwards: its claim and what changed.
    pub fn rewrites(&self) -> Vec<(ClaimId, String)> {
        self.rewrites
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A payment as the store holds it now (read back or just written).
    pub fn observe(&self, p: &PaymentRecord) {
        let mut seen = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        let now = (p.status, p.bank_payment_id.clone());
        match seen.get(&p.claim_id) {
            Some(first) if *first != now => {
                let what = format!(
                    "settled as {} {:?}, later {} {:?}",
                    first.0.as_str(),
                    first.1,
                    now.0.as_str(),
                    now.1
                );
                drop(seen);
                self.rewrites
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((p.claim_id, what));
            }
            Some(_) => {}
            None if settled(p.status) => {
                seen.insert(p.claim_id, now);
            }
            None => {}
        }
    }
}

impl StoreDecorator for SettledWatch {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let written = match call {
            StoreCall::Claim { payment, .. } => Some(payment.clone()),
            StoreCall::Finalize(write) => Some(write.payment.clone()),
            _ => None,
        };
        let result = work.await;
        let any = &result as &dyn std::any::Any;
        if let Some(Ok(answer)) = any.downcast_ref::<StoreResult<ClaimResult>>() {
            match answer {
                ClaimResult::Claimed { .. } => {
                    if let Some(p) = &written {
                        self.observe(p);
                    }
                }
                ClaimResult::PaymentExists(v) => self.observe(&v.record),
                ClaimResult::InboxExists(_) => {}
            }
        } else if let Some(Ok(())) = any.downcast_ref::<StoreResult<()>>() {
            // Only finalize answers `()`.
            if let Some(p) = &written {
                self.observe(p);
            }
        } else if let Some(Ok(Some(v))) =
            any.downcast_ref::<StoreResult<Option<Versioned<PaymentRecord>>>>()
        {
            self.observe(&v.record);
        } else if let Some(Ok(list)) =
            any.downcast_ref::<StoreResult<Vec<Versioned<PaymentRecord>>>>()
        {
            for v in list {
                self.observe(&v.record);
            }
        }
        result
    }
}
