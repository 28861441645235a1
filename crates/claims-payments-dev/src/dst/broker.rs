//! Service Bus, the Functions host, the instances, the HTTP clients and the timers: the
//! simulated world around the product's router, and the run's timeline.
//!
//! The queue is peek-lock: a receive locks a message and counts a delivery; a 2xx
//! completes it, anything else abandons it (redelivered at once), a lock that runs out
//! makes it visible again, and a message whose deliveries reach `maxDeliveryCount` is
//! dead-lettered. Duplicate detection drops a MessageId sent again within its window.
//! Each instance's invocations run as tasks of its own, so a crash drops them wherever
//! they wait; the instance then restarts as a new process (a new boot), as the host does.
//!
//! The timeline: a chaos phase (messages, late re-sends, HTTP clients, timers, faults),
//! then a calm one (faults off, dead instances back, the queue drained, the dead letters
//! re-driven once their window passed, reconcile), then a jump past the bank's key window
//! and the inbox retention (purge, old messages sent again), and the final checks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use claims_payments::ambient::{Ambient, Boot};
use claims_payments::bank::{BankClient, BankSettings};
use claims_payments::consumer::{Consumer, Policy};
use claims_payments::payments_api::CallerAuth;
use claims_payments::seams::{self, Registered};
use claims_payments::store::DynStore;
use claims_payments_testkit::host::{envelope, DataType, DeliveryFields};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt;

use super::bank::SimBank;
use super::chaos::Chaos;
use super::check::{Checks, Violation};
use super::faults::{Fault, FaultPlan};
use super::store::FaultyStore;
use super::timings::*;
use super::world::{self, Dice, Trace};
use super::RunOptions;
use crate::memory_store::MemoryStore;
use crate::sim::scenario::{self, CopyKind, Plan, ScenarioSettings};
use crate::trace_event;

/// The consumer name the deployment stores (CONSUMER_NAME).
pub const CONSUMER: &str = "ClaimApprovedHandler";
/// How long the chaos phase lasts: past the duplicate-detection window, so late
/// re-sends of the producer reach the queue while faults still fire.
const CHAOS_PHASE: Duration = Duration::from_secs(75 * 60);
/// The most a calm phase waits for the queue to drain.
const DRAIN_LIMIT: Duration = Duration::from_secs(3 * 3600);

/// What one run did and found.
pub struct RunResult {
    pub seed: u64,
    pub trace_hash: String,
    pub deliveries: u64,
    pub http_requests: u64,
    pub virtual_time: Duration,
    pub violations: Vec<Violation>,
    pub fired: BTreeMap<Fault, u64>,
    pub plan: String,
    pub instances: usize,
    pub outcomes: BTreeMap<String, u64>,
    pub dead_lettered: u64,
    pub redriven: u64,
    pub payouts: usize,
    /// Every event, when the run kept them.
    pub events: Vec<String>,
    trace: Trace,
}

impl RunResult {
    pub fn summary(&self) -> String {
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "seed {}: ok; trace {}; {} instance(s); {} deliveries, {} HTTP requests, {} payouts, {} dead-lettered ({} re-driven); {:.1} virtual hours; faults: {}; outcomes: {}",
            self.seed,
            self.trace_hash,
            self.instances,
            self.deliveries,
            self.http_requests,
            self.payouts,
            self.dead_lettered,
            self.redriven,
            self.virtual_time.as_secs_f64() / 3600.0,
            self.plan,
            outcomes.join(", ")
        )
    }

    /// The seed, each invariant that failed, and the events of the claim concerned.
    pub fn failure_report(&self) -> String {
        let mut out = format!(
            "seed {} FAILED ({} violation(s)); replay: claims-payments-dev dst --seeds 1 --seed {}\n  faults: {}\n",
            self.seed,
            self.violations.len(),
            self.seed,
            self.plan
        );
        for v in self.violations.iter().take(5) {
            out.push_str(&format!("  invariant: {}: {}\n", v.invariant, v.detail));
            if let Some(claim) = &v.claim {
                let lines = self.trace.lines_with(claim);
                out.push_str(&format!("  events of claim {claim} ({}):\n", lines.len()));
                for line in lines.iter().take(60) {
                    out.push_str(&format!("    {line}\n"));
                }
            }
        }
        out
    }
}

/// A message on the queue.
struct Queued {
    message_id: String,
    body: Vec<u8>,
    /// The claim it names, if its body is valid.
    claim: Option<String>,
    kind: CopyKind,
    delivery_count: u32,
    state: QueueState,
    enqueued_at: time::OffsetDateTime,
    /// The last answer's outcome label.
    last_outcome: String,
    /// Dead-lettered while the run was calm (no fault could explain a transient cause).
    dead_lettered_calm: bool,
    /// Sent again from the dead-letter queue (the copy is a message of its own).
    redriven: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueueState {
    Ready,
    Locked { token: u64, instance: usize },
    Completed,
    DeadLettered,
}

struct Instance {
    process: u64,
    ambient: Option<Ambient>,
    router: Option<Router>,
    registered: Option<Registered>,
    tasks: JoinSet<()>,
    in_flight: usize,
    alive: bool,
    /// A start is under way (it waits for its registration): no second one.
    starting: bool,
    /// The boot of the process before, if it crashed on this "port".
    crashed_boot: Option<Boot>,
}

#[derive(Default)]
struct Books {
    queue: Vec<Queued>,
    ready: VecDeque<usize>,
    /// (lock ends, message, token).
    locks: BTreeSet<(Instant, usize, u64)>,
    next_token: u64,
    /// Duplicate detection: MessageId -> when it was last enqueued.
    sent_at: BTreeMap<String, Instant>,
    instances: Vec<Instance>,
    processes: u64,
    deliveries: u64,
    http_requests: u64,
    outcomes: BTreeMap<String, u64>,
    dead_lettered: u64,
    redriven: u64,
    calm: bool,
}

pub struct Sim {
    seed: u64,
    options: RunOptions,
    start: Instant,
    chaos: Chaos,
    trace: Trace,
    dice: Dice,
    memory: Arc<MemoryStore>,
    store: DynStore,
    bank: Arc<SimBank>,
    plan: Plan,
    books: Mutex<Books>,
    wake: Notify,
    checks: Checks,
    /// How HTTP callers are told apart (`HTTP_AUTH`): by function key, or signed in.
    signed_in: bool,
    /// The bank is dark past its key window.
    bank_dark: std::sync::atomic::AtomicBool,
}

fn policy() -> Policy {
    Policy {
        consumer_name: CONSUMER.into(),
        inbox_retention: RETENTION,
        lease: LEASE,
        inflight_wait: INFLIGHT_WAIT,
        retry_budget: RETRY_BUDGET,
        bank_key_window: KEY_WINDOW,
    }
}

fn bank_settings() -> BankSettings {
    BankSettings {
        url: "https://bank.invalid/".parse().expect("a URL"),
        api_key: None,
        timeout: BANK_TIMEOUT,
        key_window: KEY_WINDOW,
    }
}

/// An HTTP caller: a signed-in principal with the pay role (or, by function key, all
/// callers are one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caller(u64);

impl Caller {
    /// The key as the service scopes it: per caller.
    fn scoped(&self, key: &str) -> String {
        format!("{}/{key}", self.0)
    }

    /// App Service Authentication's `x-ms-client-principal` for this caller.
    fn principal(&self) -> String {
        use base64::Engine;
        let principal = serde_json::json!({
            "auth_typ": "aad",
            "name_typ": "name",
            "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
            "claims": [
                {"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier",
                 "val": format!("00000000-0000-4000-8000-{:012}", self.0)},
                {"typ": "http://schemas.microsoft.com/identity/claims/tenantid",
                 "val": "72f988bf-86f1-41af-91ab-2d7cd011db47"},
                {"typ": "roles", "val": "Payments.Pay"},
            ],
        });
        base64::engine::general_purpose::STANDARD.encode(principal.to_string())
    }
}

/// How the host judges an invocation's answer: 2xx with a JSON object completes it.
fn judge(status: StatusCode, body: &[u8]) -> (bool, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let label = parsed
        .as_ref()
        .and_then(|v| v.pointer("/ReturnValue/outcome"))
        .and_then(|v| v.as_str())
        .unwrap_or("-")
        .to_owned();
    let completes = status.is_success() && parsed.as_ref().is_some_and(|v| v.is_object());
    (completes, label)
}

/// Outcomes that redelivery cannot change (the message belongs in the DLQ).
fn is_permanent(label: &str) -> bool {
    matches!(label, "conflict" | "invalid-message" | "store-failure")
}

impl Sim {
    pub async fn run(seed: u64, plan: FaultPlan, options: RunOptions) -> RunResult {
        let start = Instant::now();
        let trace = Trace::new(start, options.keep_trace);
        let dice = Dice::new(seed);
        let chaos = Chaos::new(plan, dice.fork(), trace.clone());
        let memory = Arc::new(MemoryStore::new());
        let store: DynStore = FaultyStore::new(memory.clone(), chaos.clone(), LEASE);
        let bank = SimBank::new(chaos.clone(), start, BANK_TIMEOUT, KEY_WINDOW);
        let instances = match options.instances {
            0 => dice.range(1, 4) as usize,
            n => n,
        };
        let scenario = scenario::plan(&ScenarioSettings {
            messages: options.messages,
            duplicate_rate: 0.08,
            business_duplicate_rate: 0.06,
            conflict_rate: 0.03,
            invalid_rate: 0.03,
            closed_account_rate: 0.04,
            allow_non_utf8: true,
            race_window: 16,
            seed,
        });
        let signed_in = dice.hit(0.5);
        trace_event!(
            trace,
            "run seed {seed} instances {instances} signed-in callers {signed_in} faults {}",
            chaos.plan()
        );
        let sim = Arc::new(Sim {
            seed,
            options,
            start,
            chaos,
            trace,
            dice,
            memory,
            store,
            bank,
            plan: scenario,
            books: Mutex::new(Books::default()),
            wake: Notify::new(),
            checks: Checks::default(),
            signed_in,
            bank_dark: Default::default(),
        });
        sim.clone().timeline(instances).await;
        sim.result(instances)
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }

    async fn timeline(self: Arc<Self>, instances: usize) {
        let mut background = JoinSet::new();
        for slot in 0..instances {
            self.books().instances.push(Instance {
                process: 0,
                ambient: None,
                router: None,
                registered: None,
                tasks: JoinSet::new(),
                in_flight: 0,
                alive: false,
                starting: false,
                crashed_boot: None,
            });
            self.clone().start_instance(slot).await;
        }
        background.spawn(self.clone().dispatcher());
        background.spawn(self.clone().timers());
        background.spawn(self.clone().crashes());
        // The bank dark past its key window, from a moment while messages flow: the
        // payouts whose answers were lost just before outlive the bank's memory of
        // their keys. The chaos phase lasts until the bank is back.
        let dark = self
            .chaos
            .fires(Fault::BankDarkPastKeyWindow, "bank")
            .then(|| tokio::spawn(self.clone().bank_goes_dark()));
        let producer = tokio::spawn(self.clone().producer());
        let clients = tokio::spawn(self.clone().http_clients());

        // Chaos.
        tokio::time::sleep(CHAOS_PHASE).await;
        let _ = producer.await;
        let _ = clients.await;
        if let Some(dark) = dark {
            let _ = dark.await;
        }
        self.chaos.calm();
        self.books().calm = true;
        trace_event!(self.trace, "calm");
        for slot in 0..instances {
            self.clone().start_instance(slot).await;
        }
        // The dead letters, re-driven once their duplicate-detection window has passed:
        // those of long ago at once (before reconcile's next run), the others after it.
        self.redrive();
        self.drain().await;
        tokio::time::sleep(DUPLICATE_WINDOW).await;
        self.redrive();
        self.drain().await;
        self.timer("Reconcile").await;
        self.drain().await;

        // Past the bank's key window and the inbox retention: stop cleanly, jump, purge,
        // and send a sample of old messages again.
        background.abort_all();
        for slot in 0..instances {
            self.stop_instance(slot).await;
        }
        tokio::time::sleep(RETENTION + Duration::from_secs(24 * 3600)).await;
        for slot in 0..instances {
            self.clone().start_instance(slot).await;
        }
        background.spawn(self.clone().dispatcher());
        self.timer("Purge").await;
        self.resend_old();
        self.drain().await;
        self.timer("Reconcile").await;
        background.abort_all();
        for slot in 0..instances {
            self.stop_instance(slot).await;
        }
        self.final_checks().await;
    }

    async fn bank_goes_dark(self: Arc<Self>) {
        tokio::time::sleep(self.dice.millis(5_000, 60_000)).await;
        let dark = KEY_WINDOW + Duration::from_secs(3600);
        trace_event!(self.trace, "bank dark for {} s", dark.as_secs());
        self.bank.go_dark(dark);
        self.bank_dark
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(dark).await;
        self.bank_dark
            .store(false, std::sync::atomic::Ordering::Relaxed);
        trace_event!(self.trace, "bank back");
    }

    /// Starts (or restarts) the process in `slot`: a new boot, fresh memory. A process
    /// that follows a crash on the same slot ends its predecessor's registration first,
    /// as `serve` does on its port.
    async fn start_instance(self: Arc<Self>, slot: usize) {
        let (process, crashed) = {
            let mut books = self.books();
            let instance = &mut books.instances[slot];
            if instance.alive || instance.starting {
                return;
            }
            instance.starting = true;
            let crashed = instance.crashed_boot.take();
            books.processes += 1;
            (books.processes, crashed)
        };
        let skew = if self.chaos.is_active(Fault::ClockSkew) {
            self.dice.range(0, 2 * MAX_SKEW_MS as u64) as i64 - MAX_SKEW_MS
        } else {
            0
        };
        let ambient = world::ambient(self.start, process, skew, &self.dice);
        if let Some(boot) = crashed {
            let _ = seams::end_registration_of(self.store.as_ref(), boot, ambient.now()).await;
        }
        let registered = loop {
            match Registered::register(self.store.clone(), RETENTION, ambient.clone()).await {
                Ok(registered) => break registered,
                // `serve` exits and the host starts it again.
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        let client =
            BankClient::with_transport(&bank_settings(), self.bank.clone(), ambient.clone());
        let consumer =
            Consumer::with_ambient(self.store.clone(), Some(client), policy(), ambient.clone());
        let auth = if self.signed_in {
            CallerAuth::AppService
        } else {
            CallerAuth::FunctionKey
        };
        let router = seams::router(Arc::new(seams::app_state(consumer, auth)));
        trace_event!(
            self.trace,
            "start slot {slot} process {process} boot {} skew {skew}",
            ambient.boot()
        );
        let mut books = self.books();
        let instance = &mut books.instances[slot];
        instance.process = process;
        instance.ambient = Some(ambient);
        instance.router = Some(router);
        instance.registered = Some(registered);
        instance.alive = true;
        instance.starting = false;
        instance.in_flight = 0;
        drop(books);
        self.wake.notify_one();
    }

    /// A clean stop: in-flight work drains, the registration ends.
    async fn stop_instance(&self, slot: usize) {
        let (mut tasks, registered) = {
            let mut books = self.books();
            let instance = &mut books.instances[slot];
            instance.alive = false;
            instance.router = None;
            (
                std::mem::take(&mut instance.tasks),
                instance.registered.take(),
            )
        };
        while tasks.join_next().await.is_some() {}
        if let Some(registered) = registered {
            registered.end().await;
        }
        trace_event!(self.trace, "stop slot {slot}");
    }

    /// A crash: every task of the process is dropped where it waits, its memory is
    /// gone. `host_alive`: the host saw the handler die and abandons its invocations at
    /// once; otherwise the whole instance is gone and their locks run out.
    fn crash(self: &Arc<Self>, slot: usize, host_alive: bool) {
        let mut books = self.books();
        let instance = &mut books.instances[slot];
        if !instance.alive {
            return;
        }
        instance.tasks.abort_all();
        instance.alive = false;
        instance.router = None;
        instance.in_flight = 0;
        instance.registered = None;
        instance.crashed_boot = if host_alive {
            instance.ambient.as_ref().map(Ambient::boot)
        } else {
            None
        };
        let process = instance.process;
        trace_event!(
            self.trace,
            "crash slot {slot} process {process} host_alive {host_alive}"
        );
        if host_alive {
            let held: Vec<(usize, u64)> = books
                .queue
                .iter()
                .enumerate()
                .filter_map(|(i, q)| match q.state {
                    QueueState::Locked { token, instance } if instance == slot => Some((i, token)),
                    _ => None,
                })
                .collect();
            for (i, token) in held {
                self.release(&mut books, i, token, "handler-crashed");
            }
        }
        drop(books);
        let delay = if host_alive {
            self.dice.millis(250, 3_000)
        } else {
            self.dice.millis(5_000, 120_000)
        };
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            sim.start_instance(slot).await;
        });
    }

    /// The lock of `i` ends without a completion: visible again, or dead-lettered when
    /// its deliveries are spent.
    fn release(&self, books: &mut Books, i: usize, token: u64, why: &str) {
        let calm = books.calm;
        let q = &mut books.queue[i];
        if q.state
            != (QueueState::Locked {
                token,
                instance: match q.state {
                    QueueState::Locked { instance, .. } => instance,
                    _ => usize::MAX,
                },
            })
        {
            return;
        }
        if q.delivery_count >= MAX_DELIVERY_COUNT {
            q.state = QueueState::DeadLettered;
            q.dead_lettered_calm = calm && !is_permanent(&q.last_outcome);
            books.dead_lettered += 1;
            trace_event!(
                self.trace,
                "dead-letter {} claim {} after {} deliveries ({why}, last {})",
                q.message_id,
                q.claim.as_deref().unwrap_or("-"),
                q.delivery_count,
                q.last_outcome
            );
        } else {
            q.state = QueueState::Ready;
            books.ready.push_back(i);
        }
    }

    /// Enqueues a copy, unless duplicate detection drops it.
    fn publish(&self, message_id: &str, body: Vec<u8>, claim: Option<String>, kind: CopyKind) {
        let now = Instant::now();
        let wall = world::wall_at(self.start);
        let mut books = self.books();
        if books
            .sent_at
            .get(message_id)
            .is_some_and(|at| now < *at + DUPLICATE_WINDOW)
        {
            trace_event!(self.trace, "broker drops duplicate {message_id}");
            return;
        }
        books.sent_at.insert(message_id.to_owned(), now);
        let i = books.queue.len();
        trace_event!(
            self.trace,
            "publish #{i} {message_id} {kind:?} claim {}",
            claim.as_deref().unwrap_or("-")
        );
        books.queue.push(Queued {
            message_id: message_id.to_owned(),
            body,
            claim,
            kind,
            delivery_count: 0,
            state: QueueState::Ready,
            enqueued_at: wall,
            last_outcome: "-".into(),
            dead_lettered_calm: false,
            redriven: false,
        });
        books.ready.push_back(i);
        drop(books);
        self.wake.notify_one();
    }

    fn claim_of(&self, copy: usize) -> Option<String> {
        let copy = &self.plan.copies[copy];
        copy.claim.map(|c| self.plan.claims[c].claim_id.clone())
    }

    /// The producer: the plan's copies in order; re-sends and conflicting copies of a
    /// MessageId partly after the duplicate-detection window (otherwise dropped).
    async fn producer(self: Arc<Self>) {
        let mut late = Vec::new();
        for &copy in &self.plan.send_order {
            let c = &self.plan.copies[copy];
            if matches!(
                c.kind,
                CopyKind::ProducerResend | CopyKind::ConflictingPayload
            ) && self.dice.hit(0.6)
            {
                late.push(copy);
                continue;
            }
            tokio::time::sleep(self.dice.millis(0, 400)).await;
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
        }
        let wait = (DUPLICATE_WINDOW + Duration::from_secs(60)).saturating_sub(self.elapsed());
        tokio::time::sleep(wait).await;
        for copy in late {
            tokio::time::sleep(self.dice.millis(0, 2_000)).await;
            let c = &self.plan.copies[copy];
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
        }
    }

    /// The dead-letter re-drive: every dead letter sent again under its MessageId.
    fn redrive(&self) {
        let now = Instant::now();
        let letters: Vec<(String, Vec<u8>, Option<String>, CopyKind)> = {
            let mut books = self.books();
            let Books { queue, sent_at, .. } = &mut *books;
            queue
                .iter_mut()
                // As `dead-letters resubmit`: only once the duplicate-detection window of
                // its MessageId has passed (the broker would drop it silently before).
                .filter(|q| {
                    q.state == QueueState::DeadLettered
                        && !q.redriven
                        && sent_at
                            .get(&q.message_id)
                            .is_none_or(|at| *at + DUPLICATE_WINDOW <= now)
                })
                .map(|q| {
                    q.redriven = true;
                    (
                        q.message_id.clone(),
                        q.body.clone(),
                        q.claim.clone(),
                        q.kind,
                    )
                })
                .collect()
        };
        self.books().redriven += letters.len() as u64;
        for (id, body, claim, kind) in letters {
            self.publish(&id, body, claim, kind);
        }
    }

    /// After the retention: a sample of originals sent again (their inbox records are
    /// purged; the payment must still guard).
    fn resend_old(&self) {
        for &copy in &self.plan.send_order {
            let c = &self.plan.copies[copy];
            if c.kind == CopyKind::Original && self.dice.hit(0.2) {
                self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
            }
        }
    }

    /// Until nothing is ready, locked or in flight (bounded).
    async fn drain(&self) {
        let until = Instant::now() + DRAIN_LIMIT;
        loop {
            let busy = {
                let books = self.books();
                !books.ready.is_empty()
                    || !books.locks.is_empty()
                    || books.instances.iter().any(|i| i.in_flight > 0)
            };
            if !busy || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The host's side: hands ready messages to instances with a free call, and ends
    /// locks that ran out.
    async fn dispatcher(self: Arc<Self>) {
        let mut next = 0usize;
        loop {
            let now = Instant::now();
            let mut spawned = Vec::new();
            {
                let mut books = self.books();
                while let Some(&(until, i, token)) = books.locks.iter().next() {
                    if until > now {
                        break;
                    }
                    books.locks.pop_first();
                    if matches!(books.queue[i].state, QueueState::Locked { token: t, .. } if t == token)
                    {
                        trace_event!(self.trace, "lock expired #{i}");
                        self.release(&mut books, i, token, "lock-expired");
                    }
                }
                let slots = books.instances.len();
                for instance in &mut books.instances {
                    while instance.tasks.try_join_next().is_some() {}
                }
                while !books.ready.is_empty() {
                    let free = (0..slots).map(|k| (next + k) % slots).find(|&s| {
                        let inst = &books.instances[s];
                        inst.alive && inst.router.is_some() && inst.in_flight < MAX_CONCURRENT_CALLS
                    });
                    let Some(slot) = free else { break };
                    next = slot + 1;
                    let Some(i) = books.ready.pop_front() else {
                        break;
                    };
                    books.next_token += 1;
                    let token = books.next_token;
                    books.deliveries += 1;
                    let renewal = if self.chaos.fires(Fault::LockLost, "lock") {
                        self.dice.millis(1_000, LOCK.as_millis() as u64)
                    } else {
                        LOCK_RENEWAL
                    };
                    books.locks.insert((now + renewal, i, token));
                    let q = &mut books.queue[i];
                    q.delivery_count += 1;
                    q.state = QueueState::Locked {
                        token,
                        instance: slot,
                    };
                    spawned.push((slot, i, token, q.delivery_count));
                    books.instances[slot].in_flight += 1;
                }
            }
            for (slot, i, token, count) in spawned {
                self.clone().invoke(slot, i, token, count);
            }
            let next_lock = self.books().locks.iter().next().map(|l| l.0);
            // New work wakes it; otherwise the next lock to end, or a minute.
            let sleep_until = next_lock
                .unwrap_or(now + Duration::from_secs(60))
                .min(now + Duration::from_secs(60));
            tokio::select! {
                biased;
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(sleep_until) => {}
            }
        }
    }

    /// One invocation of `/ClaimApproved` on the instance in `slot`.
    fn invoke(self: Arc<Self>, slot: usize, i: usize, token: u64, count: u32) {
        let (request, claim, message_id) = {
            let books = self.books();
            let q = &books.queue[i];
            let lock_token = uuid::Uuid::from_u64_pair(self.seed, token);
            let fields = DeliveryFields {
                body: &q.body,
                message_id: &q.message_id,
                delivery_count: count,
                lock_token,
                sequence_number: i as u64 + 1,
                enqueued_at: q.enqueued_at,
            };
            let body = envelope(&fields, DataType::Binary, "ClaimApproved").to_string();
            let request = Request::post("/ClaimApproved")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("a request");
            (request, q.claim.clone(), q.message_id.clone())
        };
        let timeout = if self.chaos.fires(Fault::FunctionTimeout, &message_id) {
            self.dice.millis(50, 5_000)
        } else {
            FUNCTION_TIMEOUT
        };
        let Some(router) = self.books().instances[slot].router.clone() else {
            return;
        };
        let sim = self.clone();
        let task = async move {
            trace_event!(
                sim.trace,
                "deliver #{i} {message_id} count {count} slot {slot} claim {}",
                claim.as_deref().unwrap_or("-")
            );
            let answered = tokio::time::timeout(timeout, async {
                let response = router.oneshot(request).await.ok()?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                    .await
                    .ok()?;
                Some((status, body))
            })
            .await;
            let (completes, label) = match answered {
                Ok(Some((status, body))) => {
                    let (completes, label) = judge(status, &body);
                    (completes, format!("{label} {}", status.as_u16()))
                }
                Ok(None) => (false, "no-answer".into()),
                Err(_) => (false, "function-timeout".into()),
            };
            trace_event!(
                sim.trace,
                "answer #{i} {message_id} claim {} {label}",
                claim.as_deref().unwrap_or("-")
            );
            if completes {
                sim.check_durable(claim.as_deref(), &message_id).await;
            }
            sim.settle(slot, i, token, completes, label);
        };
        let mut books = self.books();
        books.instances[slot].tasks.spawn(task);
    }

    /// The host's verdict on invocation `token` of message `i`.
    fn settle(&self, slot: usize, i: usize, token: u64, completes: bool, label: String) {
        let mut books = self.books();
        let kind = label.split(' ').next().unwrap_or("-").to_owned();
        *books.outcomes.entry(kind.clone()).or_default() += 1;
        if books.instances[slot].in_flight > 0 {
            books.instances[slot].in_flight -= 1;
        }
        let holds =
            matches!(books.queue[i].state, QueueState::Locked { token: t, .. } if t == token);
        books.queue[i].last_outcome = kind;
        if holds {
            if completes {
                if self.chaos.fires(Fault::CompleteFails, "complete") {
                    // The lock stays until it runs out; the message comes back then.
                    let until = Instant::now() + LOCK;
                    books.locks.insert((until, i, token));
                } else {
                    books.queue[i].state = QueueState::Completed;
                }
            } else {
                self.release(&mut books, i, token, "abandoned");
            }
        }
        drop(books);
        self.wake.notify_one();
    }

    /// Every 2xx stands for a durable record: the message's inbox record completed, and
    /// its claim's payment stored.
    async fn check_durable(&self, claim: Option<&str>, message_id: &str) {
        let Some(claim) = claim else {
            self.checks.fail(Violation::new(
                "2xx-is-durable",
                None,
                format!("message {message_id} without a valid claim was completed"),
            ));
            return;
        };
        let inbox = self.memory.inbox_snapshot();
        let done = inbox.iter().any(|r| {
            r.consumer == CONSUMER
                && r.claim_id.to_string() == claim
                && r.message_id.as_str() == message_id
                && r.status == claims_payments::store::InboxStatus::Completed
        });
        let paid = self
            .memory
            .payments_snapshot()
            .iter()
            .any(|p| p.claim_id.to_string() == claim);
        if !done || !paid {
            self.checks.fail(Violation::new(
                "2xx-is-durable",
                Some(claim),
                format!("message {message_id} completed with inbox record completed: {done}, payment stored: {paid}"),
            ));
        }
    }

    /// Reconcile every 10 minutes (and one purge mid-run), on one live instance.
    async fn timers(self: Arc<Self>) {
        let purge_at = self.dice.millis(60_000, CHAOS_PHASE.as_millis() as u64);
        let mut purged = false;
        let mut tick = tokio::time::interval_at(self.start + RECONCILE_EVERY, RECONCILE_EVERY);
        loop {
            tick.tick().await;
            self.timer("Reconcile").await;
            if !purged && self.elapsed() >= purge_at {
                purged = true;
                self.timer("Purge").await;
            }
        }
    }

    /// One timer invocation (`Reconcile`, `Purge`) on the first live instance.
    async fn timer(&self, function: &str) {
        let router = {
            let books = self.books();
            books
                .instances
                .iter()
                .find(|i| i.alive)
                .and_then(|i| i.router.clone())
        };
        let Some(router) = router else { return };
        let request = Request::post(format!("/{function}"))
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"Data":{"timer":{"IsPastDue":false}},"Metadata":{}}"#,
            ))
            .expect("a request");
        let answered = tokio::time::timeout(FUNCTION_TIMEOUT, router.oneshot(request)).await;
        let status = match answered {
            Ok(Ok(response)) => response.status().as_u16().to_string(),
            _ => "timeout".into(),
        };
        trace_event!(self.trace, "timer {function} {status}");
    }

    /// Process faults: each second of the chaos phase, each live instance may crash.
    async fn crashes(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if !self.chaos.is_on() {
                return;
            }
            if self.bank_dark.load(std::sync::atomic::Ordering::Relaxed) {
                // The bank's long outage is about payouts outliving their keys; the
                // processes sit it out (and a day of per-second crash draws costs time).
                tokio::time::sleep(KEY_WINDOW).await;
                continue;
            }
            let slots = self.books().instances.len();
            for slot in 0..slots {
                if self.chaos.fires(Fault::HandlerCrash, "handler") {
                    self.crash(slot, true);
                } else if self.chaos.fires(Fault::InstanceLost, "instance") {
                    self.crash(slot, false);
                }
            }
        }
    }

    /// The HTTP clients: each intent one Idempotency-Key, reused on every retry.
    async fn http_clients(self: Arc<Self>) {
        let mut clients = JoinSet::new();
        for n in 0..self.options.http_intents {
            tokio::time::sleep(self.dice.millis(0, 5_000)).await;
            clients.spawn(self.clone().http_intent(n));
        }
        while clients.join_next().await.is_some() {}
    }

    async fn http_intent(self: Arc<Self>, n: usize) {
        let caller = Caller(self.dice.range(1, 3));
        let claim = uuid::Uuid::from_u64_pair(self.seed, 1 << 40 | n as u64).to_string();
        let key = format!("intent-{}-{n}", self.seed);
        let amount = format!(
            "{}.{:02}",
            self.dice.range(1, 5_000),
            self.dice.range(0, 99)
        );
        let body = self.payment_body(&claim, &amount);
        let mut submits = JoinSet::new();
        let double = self.chaos.fires(Fault::DoubleSubmit, &key);
        for _ in 0..if double { 2 } else { 1 } {
            submits.spawn(
                self.clone()
                    .submit(caller, claim.clone(), key.clone(), body.clone()),
            );
        }
        if self.signed_in && self.chaos.fires(Fault::OtherCallersKey, &key) {
            // Another caller, the same key string, its own payment: its own answer.
            let other = Caller(caller.0 % 3 + 1);
            let claim = uuid::Uuid::from_u64_pair(self.seed, 2 << 40 | n as u64).to_string();
            let body = self.payment_body(&claim, "77.00");
            submits.spawn(self.clone().submit(other, claim, key.clone(), body));
        }
        while submits.join_next().await.is_some() {}
        if self.dice.hit(0.1) && self.checks.answered(&caller.scoped(&key)) {
            // The same key with another amount, once the key has its answer: refused.
            let changed = body.replace(&format!(r#""amount":"{amount}""#), r#""amount":"1.23""#);
            if let Some((status, _)) = self
                .send_once(caller, &key, &changed, Duration::from_secs(60))
                .await
            {
                if status < 400 {
                    self.checks.fail(Violation::new(
                        "key-reuse-refused",
                        Some(&claim),
                        format!("a changed payload under key {key} answered {status}"),
                    ));
                }
            }
        }
    }

    fn payment_body(&self, claim: &str, amount: &str) -> String {
        format!(
            r#"{{"claimId":"{claim}","amount":"{amount}","currency":"EUR","payee":"NL{:02}SIMB{:010}"}}"#,
            self.dice.range(10, 99),
            self.dice.range(0, 9_999_999_999)
        )
    }

    /// One intent's submission: retried under the same key until a final answer.
    async fn submit(self: Arc<Self>, caller: Caller, claim: String, key: String, body: String) {
        for attempt in 0..12u32 {
            let timeout = if self.chaos.fires(Fault::Disconnect, &key) {
                self.dice.millis(1, 300)
            } else if self.chaos.fires(Fault::ClientTimeout, &key) {
                self.dice.millis(500, 10_000)
            } else {
                Duration::from_secs(100)
            };
            match self.send_once(caller, &key, &body, timeout).await {
                Some((status, answer)) if !matches!(status, 409 | 429 | 500..=599) => {
                    self.checks
                        .http_answer(&caller.scoped(&key), &claim, status, &answer);
                    if (status == 200 || status == 201)
                        && !String::from_utf8_lossy(&answer).contains(&claim)
                    {
                        self.checks.fail(Violation::new(
                            "key-replays-one-answer",
                            Some(&claim),
                            format!(
                                "key {key} of caller {} answered {status} about another claim",
                                caller.0
                            ),
                        ));
                    }
                    if status == 200 || status == 201 {
                        let stored = self
                            .memory
                            .payments_snapshot()
                            .iter()
                            .any(|p| p.claim_id.to_string() == claim);
                        if !stored {
                            self.checks.fail(Violation::new(
                                "2xx-is-durable",
                                Some(&claim),
                                format!(
                                    "POST /api/payments answered {status} and no payment is stored"
                                ),
                            ));
                        }
                    }
                    return;
                }
                _ => {
                    let backoff = Duration::from_millis(250 << attempt.min(6));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
        trace_event!(self.trace, "http gave up key {key} claim {claim}");
    }

    /// One request on a live instance; `None` when the client gave up waiting or the
    /// connection broke (the server's work is then dropped where it waits).
    async fn send_once(
        &self,
        caller: Caller,
        key: &str,
        body: &str,
        timeout: Duration,
    ) -> Option<(u16, Vec<u8>)> {
        let mut request = Request::post("/api/payments")
            .header("content-type", "application/json")
            .header("idempotency-key", key);
        if self.signed_in {
            request = request.header("x-ms-client-principal", caller.principal());
        }
        let request = request
            .body(Body::from(body.to_owned()))
            .expect("a request");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle: AbortHandle = {
            let mut books = self.books();
            books.http_requests += 1;
            let slots = books.instances.len();
            let first = self.dice.range(0, slots as u64 - 1) as usize;
            let slot = (0..slots)
                .map(|k| (first + k) % slots)
                .find(|&s| books.instances[s].alive)?;
            let router = books.instances[slot].router.clone()?;
            books.instances[slot].tasks.spawn(async move {
                let answered = async {
                    let response = router.oneshot(request).await.ok()?;
                    let status = response.status().as_u16();
                    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                        .await
                        .ok()?;
                    Some((status, body.to_vec()))
                }
                .await;
                let _ = tx.send(answered);
            })
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => {
                if let Some((status, body)) = &answer {
                    let detail = if *status >= 400 {
                        String::from_utf8_lossy(&body[..body.len().min(160)]).into_owned()
                    } else {
                        String::new()
                    };
                    trace_event!(self.trace, "http key {key} answered {status} {detail}");
                }
                answer
            }
            _ => {
                handle.abort();
                trace_event!(self.trace, "http key {key} cut");
                None
            }
        }
    }

    async fn final_checks(&self) {
        let books = self.books();
        let queue: Vec<(String, Option<String>, QueueState, String, bool, CopyKind)> = books
            .queue
            .iter()
            // A re-driven dead letter lives on as its copy, judged on its own.
            .filter(|q| !q.redriven || q.dead_lettered_calm)
            .map(|q| {
                (
                    q.message_id.clone(),
                    q.claim.clone(),
                    q.state,
                    q.last_outcome.clone(),
                    q.dead_lettered_calm,
                    q.kind,
                )
            })
            .collect();
        drop(books);
        check::at_end(
            &self.checks,
            &self.memory,
            &self.bank,
            &self.plan,
            queue
                .into_iter()
                .map(|(id, claim, state, last, calm, kind)| check::Ended {
                    message_id: id,
                    claim,
                    completed: state == QueueState::Completed,
                    dead_lettered: state == QueueState::DeadLettered,
                    last_outcome: last,
                    dead_lettered_calm: calm,
                    kind,
                })
                .collect(),
        );
    }

    fn result(&self, instances: usize) -> RunResult {
        let books = self.books();
        RunResult {
            seed: self.seed,
            trace_hash: self.trace.hash(),
            deliveries: books.deliveries,
            http_requests: books.http_requests,
            virtual_time: self.elapsed(),
            violations: self.checks.violations(),
            fired: self.chaos.fired(),
            plan: self.chaos.plan().to_string(),
            instances,
            outcomes: books.outcomes.clone(),
            dead_lettered: books.dead_lettered,
            redriven: books.redriven,
            payouts: self.bank.payouts().len(),
            events: if self.options.keep_trace {
                self.trace.lines_with("")
            } else {
                Vec::new()
            },
            trace: self.trace.clone(),
        }
    }
}

// The check module's view of a message at the end.
use super::check;
