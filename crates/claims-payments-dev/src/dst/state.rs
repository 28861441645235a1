//! The state the simulated world shares: the run's handles (store, bank, chaos, trace),
//! the queue's books, the instances, and the deployed settings every instance starts
//! with. The modules above add behaviour to [`Sim`]: `broker` (the queue and the host),
//! `instances`, `clients` and `run` (the timeline). [`Flights`] counts the attempts
//! that met on a claim.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use claims_payments::seams::ambient::{Ambient, Boot};
use claims_payments::seams::configuration::Settings;
#[cfg(test)]
use claims_payments::seams::consumer::Policy;
use claims_payments::seams::services::Work;
use claims_payments::seams::store::DynStore;
use claims_payments::seams::Registered;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::bank::SimBank;
use super::chaos::Chaos;
use super::check::Checks;
use super::hot::Hot;
use super::store::FaultyStore;
use super::stores::{Opened, SettledWatch};
use super::timings::*;
use super::world::{Dice, Trace};
use super::RunOptions;
use crate::sim::scenario::{CopyKind, Plan};

/// The consumer name the deployment stores (CONSUMER_NAME).
pub const CONSUMER: &str = "ClaimApprovedHandler";
/// The most a calm phase waits for the queue to drain.
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(3 * 3600);

/// A message on the queue.
pub(super) struct Queued {
    pub(super) message_id: String,
    pub(super) body: Vec<u8>,
    /// The claim it names, if its body is valid.
    pub(super) claim: Option<String>,
    pub(super) kind: CopyKind,
    pub(super) delivery_count: u32,
    pub(super) state: QueueState,
    pub(super) enqueued_at: time::OffsetDateTime,
    /// The last answer's outcome label.
    pub(super) last_outcome: String,
    /// Dead-lettered while the run was calm (no fault could explain a transient cause).
    pub(super) dead_lettered_calm: bool,
    /// Its last delivery began while the run was calm, so no fault could meet it (a
    /// delivery begun under faults may end, its lock running out, after they stopped).
    pub(super) delivered_calm: bool,
    /// Removed from the dead-letter queue by the operator's tool, after its copy was
    /// accepted (the copy is a message of its own) or as discarded.
    pub(super) redriven: bool,
    /// The operator's tool sent its re-drive copy.
    pub(super) copy_sent: bool,
    /// Discarded by the operator for a permanent cause: still judged as a dead letter, and
    /// a later copy under its MessageId completes as a duplicate by the person's decision.
    pub(super) discarded: bool,
    /// Why each of its deliveries failed (transient causes only).
    pub(super) failures: Vec<super::invariants::Cause>,
    /// Application properties as sent (a re-drive copy names its original).
    pub(super) properties: Vec<(String, String)>,
    /// The operator's peek-lock on it in the dead-letter queue: its token, until when.
    pub(super) dlq_lock: Option<(u64, Instant)>,
    /// Peek-locks taken on it in the dead-letter queue (each raises its DeliveryCount).
    pub(super) dlq_locks: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QueueState {
    Ready,
    Locked { token: u64, instance: usize },
    Completed,
    DeadLettered,
}

#[derive(Default)]
pub(super) struct Books {
    pub(super) queue: Vec<Queued>,
    pub(super) ready: VecDeque<usize>,
    /// (lock ends, message, token).
    pub(super) locks: BTreeSet<(Instant, usize, u64)>,
    pub(super) next_token: u64,
    /// Duplicate detection: MessageId -> when it was last enqueued.
    pub(super) sent_at: BTreeMap<String, Instant>,
    pub(super) instances: Vec<Instance>,
    pub(super) processes: u64,
    pub(super) deliveries: u64,
    pub(super) http_requests: u64,
    pub(super) outcomes: BTreeMap<String, u64>,
    pub(super) dead_lettered: u64,
    /// The dead-letter queue's letters no one holds, in sequence order.
    pub(super) dlq: BTreeSet<usize>,
    /// Its letters under a lock: (lock ends, letter, token).
    pub(super) dlq_held: BTreeSet<(Instant, usize, u64)>,
    /// Each dead letter by the MessageId its re-drive copy takes.
    pub(super) copies: HashMap<String, usize>,
    pub(super) redriven: u64,
    pub(super) calm: bool,
    /// Deliveries completed by each process: past 20,000 its completed-message cache is full.
    pub(super) completed_by_process: BTreeMap<u64, u64>,
    /// Transient dead letters of the chaos phase, and the faulted deliveries that bound them.
    pub(super) transient: super::invariants::TransientBound,
    /// What the `Reconcile` runs settled.
    pub(super) reconcile: super::tally::ReconcileTally,
}

pub(super) struct Instance {
    pub(super) process: u64,
    pub(super) ambient: Option<Ambient>,
    pub(super) router: Option<Router>,
    pub(super) registered: Option<Registered>,
    pub(super) tasks: JoinSet<()>,
    /// The tasks the product runs its requests' work on (they die with the process).
    pub(super) work: Option<Work>,
    /// Until when the process is paused (see `instances`).
    pub(super) pause: Arc<Pause>,
    pub(super) in_flight: usize,
    pub(super) alive: bool,
    /// A start is under way (it waits for its registration): no second one.
    pub(super) starting: bool,
    /// The boot of the process before, if it crashed on this "port".
    pub(super) crashed_boot: Option<Boot>,
}

pub struct Sim {
    pub(super) seed: u64,
    pub(super) options: RunOptions,
    pub(super) start: Instant,
    pub(super) chaos: Chaos,
    pub(super) trace: Trace,
    pub(super) dice: Dice,
    /// The run's store without faults: what the checks read through.
    pub(super) opened: Opened,
    /// The store's settled payments, watched for a rewrite.
    pub(super) watch: Arc<SettledWatch>,
    /// The store with the run's faults, session 0 (instances have sessions of their own).
    pub(super) faulty: Arc<FaultyStore>,
    pub(super) store: DynStore,
    pub(super) bank: Arc<SimBank>,
    pub(super) plan: Plan,
    /// The plan's hot claims: bursts, and the HTTP payments that go with them.
    pub(super) hot: Hot,
    pub(super) books: Mutex<Books>,
    pub(super) wake: Notify,
    pub(super) checks: Checks,
    /// How HTTP callers are told apart (`HTTP_AUTH`): by function key, or signed in.
    pub(super) signed_in: bool,
    /// The bank is dark past its key window.
    pub(super) bank_dark: std::sync::atomic::AtomicBool,
    /// Tells the on-call operator to stop: the calm phase's runbook is the only run then.
    pub(super) on_call_ends: Notify,
    /// The attempts in flight on each claim (kept apart from `books`: a flight ends when
    /// its task is dropped, which may happen while `books` is held).
    pub(super) flights: Arc<Mutex<Flights>>,
}

/// Which attempts (deliveries and HTTP requests) are in flight on each claim, to count
/// the deliveries that met another attempt on their claim: the interleavings a run
/// exercised. Counting changes nothing in the run (no draw, no event).
#[derive(Default)]
pub(super) struct Flights {
    next: u64,
    /// Claim -> the attempts in flight on it.
    live: BTreeMap<String, BTreeSet<u64>>,
    /// Attempt in flight -> (its claim, a delivery, it met another attempt).
    attempts: BTreeMap<u64, (String, bool, bool)>,
    /// Deliveries whose flight overlapped another attempt's on their claim.
    pub(super) deliveries_met: u64,
}

/// One attempt in flight on a claim, from its first poll until its task ends or is
/// dropped (a crash, a cut connection).
pub(super) struct Flight {
    flights: Arc<Mutex<Flights>>,
    id: u64,
}

impl Flights {
    /// `delivery`: a delivery of the queue (otherwise an HTTP request).
    pub(super) fn begin(flights: &Arc<Mutex<Flights>>, claim: &str, delivery: bool) -> Flight {
        let mut f = flights.lock().unwrap_or_else(|e| e.into_inner());
        f.next += 1;
        let id = f.next;
        let others: Vec<u64> = f
            .live
            .get(claim)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for other in &others {
            if let Some(a) = f.attempts.get_mut(other) {
                a.2 = true;
            }
        }
        f.live.entry(claim.to_owned()).or_default().insert(id);
        f.attempts
            .insert(id, (claim.to_owned(), delivery, !others.is_empty()));
        Flight {
            flights: flights.clone(),
            id,
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut f = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        let Some((claim, delivery, met)) = f.attempts.remove(&self.id) else {
            return;
        };
        if let Some(live) = f.live.get_mut(&claim) {
            live.remove(&self.id);
            if live.is_empty() {
                f.live.remove(&claim);
            }
        }
        if delivery && met {
            f.deliveries_met += 1;
        }
    }
}

/// The consumer's policy [`settings`] give, for tests that build a bare consumer.
#[cfg(test)]
pub(super) fn policy() -> Policy {
    Policy {
        consumer_name: CONSUMER.into(),
        inbox_retention: RETENTION,
        lease: LEASE,
        inflight_wait: INFLIGHT_WAIT,
        retry_budget: RETRY_BUDGET,
        bank_key_window: KEY_WINDOW,
    }
}

/// The product's settings of every simulated process, as the deployment's environment
/// gives them (the timings above), with the HTTP API's caller authentication: the
/// processes are wired by the product's own composition root from these.
pub(super) fn settings(signed_in: bool) -> Settings {
    let ms = |d: Duration| d.as_millis().to_string();
    let pairs = [
        ("CONSUMER_NAME", CONSUMER.to_owned()),
        (
            "INBOX_RETENTION_DAYS",
            (RETENTION.as_secs() / 86_400).to_string(),
        ),
        ("LEASE_MS", ms(LEASE)),
        ("INFLIGHT_WAIT_MS", ms(INFLIGHT_WAIT)),
        ("RETRY_BUDGET_MS", ms(RETRY_BUDGET)),
        ("MAX_DELIVERY_COUNT", MAX_DELIVERY_COUNT.to_string()),
        ("BANK_API_URL", "https://bank.invalid/".to_owned()),
        ("BANK_TIMEOUT_MS", ms(BANK_TIMEOUT)),
        ("BANK_KEY_WINDOW_MS", ms(KEY_WINDOW)),
        (
            "HTTP_AUTH",
            if signed_in {
                "appservice"
            } else {
                "functionkey"
            }
            .to_owned(),
        ),
    ];
    Settings::from_lookup(|name| {
        pairs
            .iter()
            .find(|(setting, _)| *setting == name)
            .map(|(_, value)| value.clone())
    })
    .expect("the simulated deployment's settings are valid")
}

impl Sim {
    pub(super) fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }
}

/// A process's pause: until it ends, none of the process's calls reaches the store or
/// the bank, and no answer reaches the process. Its timers run on, so it wakes with its
/// clock moved on and its leases possibly taken over.
#[derive(Debug, Default)]
pub(super) struct Pause {
    until: Mutex<Option<Instant>>,
}

impl Pause {
    pub(super) fn until(&self, until: Instant) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
    }

    pub(super) fn is_paused(&self) -> bool {
        self.until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// Waits out the pause, if any.
    pub(super) async fn pass(&self) {
        loop {
            let until = *self.until.lock().unwrap_or_else(|e| e.into_inner());
            match until {
                Some(until) if Instant::now() < until => tokio::time::sleep_until(until).await,
                _ => return,
            }
        }
    }
}

/// One request to an instance's router: its status and body (at most 1 MiB), or `None`
/// when no answer came.
pub(super) async fn call(
    router: Router,
    request: axum::http::Request<axum::body::Body>,
) -> Option<(u16, Vec<u8>)> {
    use tower::ServiceExt;
    let response = router.oneshot(request).await.ok()?;
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .ok()?;
    Some((status, body.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use claims_payments::seams::startup::Composition;
    use claims_payments::seams::Seams;

    /// The processes are wired from [`settings`] by the product's composition root: the
    /// policy it derives is the simulated deployment's timings, so a seed's run does not
    /// depend on how the processes are wired.
    #[test]
    fn the_settings_give_the_simulated_deployments_policy_and_bank() {
        for signed_in in [false, true] {
            let settings = settings(signed_in);
            let store = Arc::new(crate::memory_store::MemoryStore::new());
            let parts = Composition::new(&settings, store, Seams::default()).unwrap();
            assert_eq!(
                format!("{:?}", parts.services.policy),
                format!("{:?}", policy())
            );
            assert!(parts.services.bank.is_some(), "the processes pay");
        }
    }
}
