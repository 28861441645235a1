//! The fake Functions host: takes messages from the simulated Service Bus queue and
//! invokes the custom handler over the real protocol.
//!
//! Per delivery it POSTs `/<FunctionName>` with the host's envelope
//! (`{"Data":{"msg":...},"Metadata":{...}}`, Metadata values JSON-encoded the way the
//! host encodes them: strings as `"\"abc\""`, numbers as `"3"`), then judges the
//! answer the way the host does: only a 2xx with a JSON content type and a JSON object
//! body is a success and completes the message; anything else (a non-2xx, a non-JSON
//! or untyped body, an empty body, a reset connection, a timeout) fails the invocation
//! and abandons the message. A timeout past functionTimeout also restarts the handler,
//! as the host does.
//!
//! Chaos the driver controls, decided per (message copy, delivery) from the seed:
//! a lock that expires while the handler still works (the message goes to a second
//! worker, and the first one's completion is refused), and a SIGKILL of the handler
//! at a random moment during an invocation.
//!
//! With several handler instances ([`Instances`]) each delivery goes to one of the
//! live instances (see [`Host`]); kills and timeout restarts hit the instance that
//! has the invocation, and the statistics are kept per instance too.
//!
//! ## While the handler restarts
//! What the real host does when the handler process exits (azure-functions-host,
//! snapshot 89dc438, Oct 2024; `src/WebJobs.Script/...`):
//! - `Workers/ProcessManagement/WorkerProcess.cs` `OnProcessExited`: exit code 0 only
//!   closes the process (no restart), 200 asks for a restart, any other code (a
//!   SIGKILL too) goes to `HttpWorkerProcess.HandleWorkerProcessExitError`, which
//!   publishes an `HttpWorkerErrorEvent`.
//! - `Workers/Http/HttpFunctionInvocationDispatcher.cs` `WorkerError` →
//!   `DisposeAndRestartWorkerChannel`: `State = WorkerProcessRestarting`, the channel is
//!   disposed, and `InitializeHttpWorkerChannelAsync` starts a new process on the same
//!   port (`HttpWorkerOptionsSetup` picks it once per host) and sets `Initialized` only
//!   after `DefaultHttpWorkerService.IsWorkerReady` got an HTTP answer to `GET /`
//!   (polled every 25 ms, `InitializationTimeout` 30 s). The third such error without a
//!   30-minute gap stops the host instead (see `process::HostRestartLimit`).
//!   `InvokeAsync` only forwards to the channel: nothing is queued or retried there.
//! - `Description/Workers/WorkerFunctionInvoker.cs` `InvokeCore`: an invocation that
//!   starts while the dispatcher is not `Initialized` waits in
//!   `DelayUntilFunctionDispatcherInitializedOrShutdown` (polling every 25 ms, at most
//!   `(ErrorEventsThreshold + 1) × InitializationTimeout` = 120 s, then the host stops).
//!   Its message stays locked meanwhile (the Service Bus extension renews the lock), so
//!   holding it costs no delivery. The check runs once, before the POST.
//! - `Workers/Http/DefaultHttpWorkerService.cs` `ProcessDefaultInvocationRequest`: an
//!   exception of the POST (the connection reset by the dying process, or refused
//!   because the request left before the exit was handled) is set on the invocation's
//!   result: the invocation fails, with no retry.
//! - azure-sdk-for-net `sdk/servicebus/Microsoft.Azure.WebJobs.Extensions.ServiceBus/
//!   src/Primitives/MessageProcessor.cs` `CompleteProcessingMessageAsync` rethrows a
//!   failed result, so the processor abandons the message: it comes back at once with
//!   DeliveryCount + 1, and is dead-lettered after MaxDeliveryCount.
//!
//! So a handler that dies costs every invocation in flight in it one delivery, which
//! no host setting avoids, and the host holds everything that arrives until the new
//! process answers `GET /`. The driver does the same: `Host::assign` sends nothing to
//! an instance while it restarts (waiting at most [`HOLD_WHILE_RESTARTING`]), and a
//! worker whose invocation failed at the transport level waits until the supervisor
//! has seen the exit ([`Handler::transport_failed`]) before it abandons, as the host's
//! state has flipped by the time Service Bus hands the message out again. What a
//! restart must not do is make those deliveries add up: `serve` ends the leases the
//! dead process held before it answers `GET /` (SQLite), so redeliveries take over
//! instead of waiting out a dead attempt's lease while further restarts cut the waits.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Notify;
use uuid::Uuid;

use super::chance;
use super::process::{Endpoint, KillReason, Supervisor};
use super::queue::{Abandoned, Failure, Queue, QueueDelivery};

/// The host version the driver claims to be, in headers and the User-Agent.
pub const HOST_VERSION: &str = "4.1037.0.0";

/// How long the host holds an invocation while the handler restarts:
/// `(ErrorEventsThreshold + 1) × InitializationTimeout` = 4 × 30 s (see the module
/// documentation). Past it the real host stops; the simulation fails.
pub const HOLD_WHILE_RESTARTING: Duration = Duration::from_secs(120);

/// What the driver invokes: one or more handler instances (separate processes on one
/// store) that compete for the queue's messages. Instances are numbered from 0.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// How many instances there are.
    fn instances(&self) -> usize {
        1
    }
    /// The live endpoint of `instance` now, None while it restarts.
    fn ready(&self, instance: usize) -> Option<Endpoint>;
    /// Why `instance` is gone for good (it could not be restarted), if it is.
    fn failure(&self, _instance: usize) -> Option<String> {
        None
    }
    /// The live endpoint of `instance`, waiting (bounded) while it restarts.
    async fn endpoint(&self, instance: usize) -> anyhow::Result<Endpoint>;
    /// SIGKILLs `generation` of `instance`; false if this handler cannot be killed.
    fn kill(&self, instance: usize, generation: u64, reason: KillReason) -> bool;
    /// Called after an invocation failed at the transport level. Waits (briefly) until
    /// a dead `generation` has been noticed, so that, as with the real host, a crash
    /// costs each in-flight message one delivery instead of a burst of refused
    /// connections in the milliseconds before the exit is seen.
    async fn transport_failed(&self, instance: usize, generation: u64);
}

#[async_trait]
impl Handler for Supervisor {
    fn ready(&self, _instance: usize) -> Option<Endpoint> {
        Supervisor::ready(self)
    }

    fn failure(&self, _instance: usize) -> Option<String> {
        Supervisor::failure(self)
    }

    async fn endpoint(&self, _instance: usize) -> anyhow::Result<Endpoint> {
        Supervisor::endpoint(self, HOLD_WHILE_RESTARTING).await
    }

    fn kill(&self, _instance: usize, generation: u64, reason: KillReason) -> bool {
        Supervisor::kill(self, generation, reason);
        true
    }

    async fn transport_failed(&self, _instance: usize, generation: u64) {
        self.wait_until_replaced(
            generation,
            Duration::from_millis(250),
            HOLD_WHILE_RESTARTING,
        )
        .await;
    }
}

/// Several supervised instances, each restarted on its own when it dies, like the
/// instances of a scaled-out Function App.
pub struct Instances(pub Vec<Arc<Supervisor>>);

impl Instances {
    fn get(&self, instance: usize) -> anyhow::Result<&Supervisor> {
        self.0
            .get(instance)
            .map(|s| &**s)
            .with_context(|| format!("there is no instance {instance}"))
    }
}

#[async_trait]
impl Handler for Instances {
    fn instances(&self) -> usize {
        self.0.len()
    }

    fn ready(&self, instance: usize) -> Option<Endpoint> {
        self.0.get(instance).and_then(|s| s.ready())
    }

    fn failure(&self, instance: usize) -> Option<String> {
        self.0.get(instance).and_then(|s| s.failure())
    }

    async fn endpoint(&self, instance: usize) -> anyhow::Result<Endpoint> {
        self.get(instance)?
            .endpoint(HOLD_WHILE_RESTARTING)
            .await
            .with_context(|| format!("instance {}", instance + 1))
    }

    fn kill(&self, instance: usize, generation: u64, reason: KillReason) -> bool {
        match self.0.get(instance) {
            Some(s) => {
                s.kill(generation, reason);
                true
            }
            None => false,
        }
    }

    async fn transport_failed(&self, instance: usize, generation: u64) {
        if let Some(s) = self.0.get(instance) {
            s.wait_until_replaced(
                generation,
                Duration::from_millis(250),
                HOLD_WHILE_RESTARTING,
            )
            .await;
        }
    }
}

/// A handler already listening at a URL (an in-process test handler). It cannot be
/// killed, so kill chaos and timeout restarts do not apply.
pub struct FixedHandler(pub String);

impl FixedHandler {
    fn fixed(&self) -> Endpoint {
        Endpoint {
            generation: 1,
            base_url: Arc::from(self.0.trim_end_matches('/')),
        }
    }
}

#[async_trait]
impl Handler for FixedHandler {
    fn ready(&self, _instance: usize) -> Option<Endpoint> {
        Some(self.fixed())
    }

    async fn endpoint(&self, _instance: usize) -> anyhow::Result<Endpoint> {
        Ok(self.fixed())
    }

    fn kill(&self, _instance: usize, _generation: u64, _reason: KillReason) -> bool {
        false
    }

    async fn transport_failed(&self, _instance: usize, _generation: u64) {}
}

pub use claims_payments_testkit::host::DataType;
use claims_payments_testkit::host::{self, DeliveryFields};

#[derive(Debug, Clone)]
pub struct HostSettings {
    /// The function folder name; the host POSTs to `/<name>`.
    pub function_name: String,
    /// Concurrent invocations per instance (maxConcurrentCalls).
    pub concurrency: usize,
    pub data_type: DataType,
    pub function_timeout: Duration,
    pub lock_expiry_rate: f64,
    /// An expiring lock expires this many ms (uniform 0..=max) after the POST went out.
    pub lock_expiry_max_ms: u64,
    pub kill_rate: f64,
    /// A chaos kill hits this many ms (uniform 0..=max) after the POST went out.
    pub kill_max_delay_ms: u64,
    pub seed: u64,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            function_name: "ClaimApproved".to_owned(),
            concurrency: 16,
            data_type: DataType::Binary,
            function_timeout: Duration::from_secs(30),
            lock_expiry_rate: 0.0,
            lock_expiry_max_ms: 20,
            kill_rate: 0.0,
            kill_max_delay_ms: 20,
            seed: 0,
        }
    }
}

/// What the host saw.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostStats {
    pub deliveries: u64,
    pub completed: u64,
    /// Failed deliveries (each one abandoned, or dead-lettered when it was the last).
    pub failed: u64,
    pub dead_lettered: u64,
    pub lock_expiries: u64,
    /// Answers that came after the lock was lost (their completion was refused).
    pub lock_lost: u64,
    pub chaos_kills_requested: u64,
    pub function_timeouts: u64,
    /// Deliveries made while another instance still worked on an earlier delivery of
    /// the same message (its lock had expired): competing consumers on one message.
    pub cross_instance_redeliveries: u64,
    /// Every answer's `outcome` label (success or not), by label.
    pub outcomes: BTreeMap<String, u64>,
    /// Every failed delivery, by failure kind.
    pub failures: BTreeMap<String, u64>,
    /// The same, per handler instance (one entry per instance).
    pub instances: Vec<InstanceStats>,
}

/// What the host saw of one handler instance.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStats {
    pub deliveries: u64,
    pub completed: u64,
    pub failed: u64,
    /// Locks that expired while this instance worked on the delivery.
    pub lock_expiries: u64,
    /// Answers of this instance that came after the lock was lost.
    pub lock_lost: u64,
    /// Deliveries to this instance while another instance still worked on an earlier
    /// delivery of the same message.
    pub cross_instance_redeliveries: u64,
    pub chaos_kills_requested: u64,
    pub function_timeouts: u64,
    pub outcomes: BTreeMap<String, u64>,
}

/// The host's verdict on one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 2xx, JSON, an object: the message is completed.
    Success { status: u16, label: String },
    /// Anything else: the message is abandoned. `label` is the outcome the body
    /// named, if it named one (the host ignores it; the report uses it).
    Failure {
        failure: Failure,
        label: Option<String>,
    },
}

/// The invocation envelope the host POSTs for one Service Bus delivery.
pub fn envelope(delivery: &QueueDelivery, data_type: DataType, function_name: &str) -> Value {
    let message = &delivery.message;
    let fields = DeliveryFields {
        body: &message.body,
        message_id: &message.message_id,
        delivery_count: delivery.delivery_count,
        lock_token: delivery.lock_token,
        sequence_number: message.sequence_number,
        enqueued_at: message.enqueued_at,
    };
    host::envelope(&fields, data_type, function_name)
}

fn is_json_media_type(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|ct| ct.split(';').next())
        .map(|essence| {
            let essence = essence.trim().to_ascii_lowercase();
            essence == "application/json" || essence == "text/json"
        })
        .unwrap_or(false)
}

/// Judges an HTTP answer the way the host does.
pub fn judge(status: u16, content_type: Option<&str>, body: &[u8]) -> Answer {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.pointer(&format!("/ReturnValue/{name}")))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let label = field("outcome");
    let detail = field("detail").unwrap_or_default();
    let fail = |kind: String, detail: String| Answer::Failure {
        failure: Failure { kind, detail },
        label: label.clone(),
    };
    if !(200..300).contains(&status) {
        let kind = match &label {
            Some(l) => format!("{status} {l}"),
            None => format!("{status}"),
        };
        let detail = if detail.is_empty() {
            String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned()
        } else {
            detail
        };
        return fail(kind, detail);
    }
    if !is_json_media_type(content_type) {
        return fail(
            format!("{status} without a JSON content type"),
            format!("content-type {content_type:?}: the host cannot read the answer"),
        );
    }
    match parsed {
        Some(Value::Object(_)) => Answer::Success {
            status,
            label: label.unwrap_or_else(|| "unlabelled".to_owned()),
        },
        Some(Value::Null) | None if body.iter().all(u8::is_ascii_whitespace) => fail(
            format!("{status} with an empty body"),
            "the host would wait for functionTimeout; always answer at least {}".to_owned(),
        ),
        Some(other) => fail(
            format!("{status} with a JSON body that is not an object"),
            other.to_string().chars().take(200).collect(),
        ),
        None => fail(
            format!("{status} with a body that is not JSON"),
            String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        ),
    }
}

fn transport_failure(error: &reqwest::Error) -> Failure {
    let kind = if error.is_timeout() {
        "function timeout"
    } else if error.is_connect() {
        "transport: connection refused"
    } else if error.is_body() || error.is_decode() {
        "transport: answer cut off"
    } else {
        "transport: connection closed"
    };
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        source = s.source();
    }
    Failure {
        kind: kind.to_owned(),
        detail,
    }
}

/// The HTTP client the host uses: loopback, no proxy, HTTP/1.1.
pub fn host_client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .pool_max_idle_per_host(concurrency.max(1))
        .user_agent(format!("Azure-Functions-Host/{HOST_VERSION}"))
        .build()
        .context("cannot build the host's HTTP client")
}

/// Sends one invocation and judges the answer.
pub async fn invoke(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    delivery: &QueueDelivery,
    settings: &HostSettings,
) -> Answer {
    let envelope = envelope(delivery, settings.data_type, &settings.function_name);
    let body = serde_json::to_vec(&envelope).unwrap_or_default();
    let request = client
        .post(format!("{}/{}", endpoint.base_url, settings.function_name))
        .header("content-type", "application/json; charset=utf-8")
        .header("x-azure-functions-invocationid", Uuid::new_v4().to_string())
        .header("x-azure-functions-hostversion", HOST_VERSION)
        .timeout(settings.function_timeout)
        .body(body);
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            return Answer::Failure {
                failure: transport_failure(&e),
                label: None,
            }
        }
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match response.bytes().await {
        Ok(bytes) => judge(status, content_type.as_deref(), &bytes),
        Err(e) => Answer::Failure {
            failure: transport_failure(&e),
            label: None,
        },
    }
}

/// Which instance works on what: the host's side of spreading deliveries.
#[derive(Debug, Default)]
struct Dispatch {
    /// Invocations in flight, per instance.
    in_flight: Vec<usize>,
    /// The instances that hold a delivery of a queue entry in flight (more than one
    /// after a lock expiry), by entry.
    holders: HashMap<usize, Vec<usize>>,
}

/// The host: workers that receive, invoke and settle until the queue is empty. With
/// several handler instances it is the hosts of a scaled-out app together: each
/// instance takes at most `concurrency` invocations at a time, and a message goes to
/// one of the live instances with a free slot, chosen from the seed; a message whose
/// lock expired while an instance still works on it goes to another instance when
/// one can take it (that is what a competing consumer sees: the message reappears on
/// the queue and whoever receives next gets it, while the first is still busy).
pub struct Host {
    queue: Arc<Queue>,
    handler: Arc<dyn Handler>,
    settings: HostSettings,
    client: reqwest::Client,
    stats: Mutex<HostStats>,
    dispatch: Mutex<Dispatch>,
    /// Notified when an invocation ends (a slot frees up).
    slot_freed: Notify,
    progress: ProgressBar,
    /// Set when the run ends, so pending chaos timers do nothing.
    stopped: AtomicBool,
}

impl Host {
    pub fn new(
        queue: Arc<Queue>,
        handler: Arc<dyn Handler>,
        settings: HostSettings,
        progress: ProgressBar,
    ) -> anyhow::Result<Arc<Host>> {
        let instances = handler.instances().max(1);
        let client = host_client(settings.concurrency * instances)?;
        Ok(Arc::new(Host {
            queue,
            handler,
            settings,
            client,
            stats: Mutex::new(HostStats {
                instances: vec![InstanceStats::default(); instances],
                ..HostStats::default()
            }),
            dispatch: Mutex::new(Dispatch {
                in_flight: vec![0; instances],
                holders: HashMap::new(),
            }),
            slot_freed: Notify::new(),
            progress,
            stopped: AtomicBool::new(false),
        }))
    }

    fn stats_mut(&self) -> MutexGuard<'_, HostStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dispatch_mut(&self) -> MutexGuard<'_, Dispatch> {
        self.dispatch.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> HostStats {
        self.stats_mut().clone()
    }

    /// Stops pending chaos timers (lock expiries, kills) from acting.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn instances(&self) -> usize {
        self.handler.instances().max(1)
    }

    /// Runs `concurrency` workers per instance until every message is settled.
    pub async fn run_until_settled(self: &Arc<Self>, deadline: Instant) -> anyhow::Result<()> {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.concurrency.max(1) * self.instances() {
            let host = self.clone();
            workers.spawn(async move { host.worker(deadline).await });
        }
        let mut result = Ok(());
        while let Some(joined) = workers.join_next().await {
            let outcome = joined.map_err(anyhow::Error::from).and_then(|r| r);
            if let Err(e) = outcome {
                if result.is_ok() {
                    result = Err(e);
                }
                workers.abort_all();
            }
        }
        result
    }

    async fn worker(self: Arc<Self>, deadline: Instant) -> anyhow::Result<()> {
        loop {
            let delivery = match self.queue.receive(deadline).await {
                Ok(Some(d)) => d,
                Ok(None) => return Ok(()),
                Err(_) => anyhow::bail!(
                    "the run did not settle before its deadline: {} messages still active",
                    self.queue.active()
                ),
            };
            let (instance, endpoint) = self.assign(&delivery).await?;
            self.schedule_chaos(&delivery, instance, &endpoint);
            let answer = invoke(&self.client, &endpoint, &delivery, &self.settings).await;
            if let Answer::Failure { failure, .. } = &answer {
                if failure.kind.starts_with("transport:") {
                    self.handler
                        .transport_failed(instance, endpoint.generation)
                        .await;
                }
            }
            self.settle(&delivery, instance, &endpoint, answer);
            self.release(&delivery, instance);
        }
    }

    /// Picks the instance for `delivery` and takes one of its slots: among the live
    /// instances with a free slot, preferring those not already working on this
    /// message, one chosen from the seed. Waits while none can take it.
    async fn assign(&self, delivery: &QueueDelivery) -> anyhow::Result<(usize, Endpoint)> {
        let n = self.instances();
        let cap = self.settings.concurrency.max(1);
        let key = format!(
            "{}/{}",
            delivery.message.copy,
            u8::from(delivery.message.redrive)
        );
        let count = u64::from(delivery.delivery_count);
        loop {
            // An instance that cannot be restarted fails the run, even while others
            // could carry on: the run would no longer be what it claims to be.
            if let Some((i, why)) = (0..n).find_map(|i| self.handler.failure(i).map(|w| (i, w))) {
                anyhow::bail!("instance {}: the handler cannot be restarted: {why}", i + 1);
            }
            let freed = self.slot_freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut d = self.dispatch_mut();
                let holders = d.holders.get(&delivery.entry).cloned().unwrap_or_default();
                let open: Vec<(usize, Endpoint)> = (0..n)
                    .filter(|&i| d.in_flight[i] < cap)
                    .filter_map(|i| self.handler.ready(i).map(|e| (i, e)))
                    .collect();
                let elsewhere: Vec<(usize, Endpoint)> = open
                    .iter()
                    .filter(|(i, _)| !holders.contains(i))
                    .cloned()
                    .collect();
                let pool = if elsewhere.is_empty() {
                    open
                } else {
                    elsewhere
                };
                if !pool.is_empty() {
                    let pick = chance::upto(
                        pool.len() as u64 - 1,
                        self.settings.seed,
                        "instance",
                        key.as_bytes(),
                        count,
                    ) as usize;
                    let (instance, endpoint) = pool[pick].clone();
                    d.in_flight[instance] += 1;
                    let cross = holders.iter().any(|&h| h != instance);
                    d.holders.entry(delivery.entry).or_default().push(instance);
                    drop(d);
                    let mut stats = self.stats_mut();
                    stats.deliveries += 1;
                    let per = &mut stats.instances[instance];
                    per.deliveries += 1;
                    if cross {
                        per.cross_instance_redeliveries += 1;
                        stats.cross_instance_redeliveries += 1;
                    }
                    return Ok((instance, endpoint));
                }
            }
            if (0..n).any(|i| self.handler.ready(i).is_some()) {
                // Every live instance is busy: wait for a slot (or a restart).
                let _ = tokio::time::timeout(Duration::from_millis(20), freed).await;
            } else {
                // None is live: wait (bounded) for one to come back; an instance that
                // cannot be restarted fails the run here.
                let instance = chance::upto(
                    n as u64 - 1,
                    self.settings.seed,
                    "instance-wait",
                    key.as_bytes(),
                    count,
                ) as usize;
                self.handler.endpoint(instance).await?;
            }
        }
    }

    fn release(&self, delivery: &QueueDelivery, instance: usize) {
        let mut d = self.dispatch_mut();
        d.in_flight[instance] = d.in_flight[instance].saturating_sub(1);
        if let Some(holders) = d.holders.get_mut(&delivery.entry) {
            if let Some(at) = holders.iter().position(|&h| h == instance) {
                holders.swap_remove(at);
            }
            if holders.is_empty() {
                d.holders.remove(&delivery.entry);
            }
        }
        drop(d);
        self.slot_freed.notify_waiters();
    }

    fn schedule_chaos(
        self: &Arc<Self>,
        delivery: &QueueDelivery,
        instance: usize,
        endpoint: &Endpoint,
    ) {
        let s = &self.settings;
        let key = format!(
            "{}/{}",
            delivery.message.copy,
            u8::from(delivery.message.redrive)
        );
        let n = u64::from(delivery.delivery_count);
        if chance::hit(s.lock_expiry_rate, s.seed, "lock-expiry", key.as_bytes(), n) {
            let after = chance::upto(
                s.lock_expiry_max_ms,
                s.seed,
                "lock-expiry-at",
                key.as_bytes(),
                n,
            );
            let host = self.clone();
            let delivery = delivery.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                if !host.stopped.load(Ordering::Relaxed) && host.queue.expire_lock(&delivery) {
                    let mut stats = host.stats_mut();
                    stats.lock_expiries += 1;
                    stats.instances[instance].lock_expiries += 1;
                }
            });
        }
        if chance::hit(s.kill_rate, s.seed, "kill", key.as_bytes(), n) {
            let after = chance::upto(s.kill_max_delay_ms, s.seed, "kill-at", key.as_bytes(), n);
            let host = self.clone();
            let generation = endpoint.generation;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                if !host.stopped.load(Ordering::Relaxed)
                    && host.handler.kill(instance, generation, KillReason::Chaos)
                {
                    let mut stats = host.stats_mut();
                    stats.chaos_kills_requested += 1;
                    stats.instances[instance].chaos_kills_requested += 1;
                }
            });
        }
    }

    fn settle(
        &self,
        delivery: &QueueDelivery,
        instance: usize,
        endpoint: &Endpoint,
        answer: Answer,
    ) {
        match answer {
            Answer::Success { label, .. } => {
                let settled = self.queue.complete(delivery, &label);
                let mut stats = self.stats_mut();
                *stats.outcomes.entry(label.clone()).or_default() += 1;
                *stats.instances[instance].outcomes.entry(label).or_default() += 1;
                match settled {
                    Ok(()) => {
                        stats.completed += 1;
                        stats.instances[instance].completed += 1;
                        self.progress.inc(1);
                    }
                    Err(_) => {
                        stats.lock_lost += 1;
                        stats.instances[instance].lock_lost += 1;
                    }
                }
            }
            Answer::Failure { failure, label } => {
                if failure.kind == "function timeout" {
                    // The host restarts the worker process after a function timeout.
                    self.handler
                        .kill(instance, endpoint.generation, KillReason::FunctionTimeout);
                }
                let kind = failure.kind.clone();
                let settled = self.queue.abandon(delivery, failure);
                let mut stats = self.stats_mut();
                if let Some(label) = label {
                    *stats.outcomes.entry(label.clone()).or_default() += 1;
                    *stats.instances[instance].outcomes.entry(label).or_default() += 1;
                }
                if kind == "function timeout" {
                    stats.function_timeouts += 1;
                    stats.instances[instance].function_timeouts += 1;
                }
                *stats.failures.entry(kind).or_default() += 1;
                match settled {
                    Ok(Abandoned::Redelivered) => {
                        stats.failed += 1;
                        stats.instances[instance].failed += 1;
                    }
                    Ok(Abandoned::DeadLettered) => {
                        stats.failed += 1;
                        stats.instances[instance].failed += 1;
                        stats.dead_lettered += 1;
                        self.progress.inc(1);
                    }
                    Err(_) => {
                        stats.lock_lost += 1;
                        stats.instances[instance].lock_lost += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_like_the_host() {
        let ok = br#"{"Outputs":{},"Logs":[],"ReturnValue":{"outcome":"paid"}}"#;
        assert_eq!(
            judge(200, Some("application/json; charset=utf-8"), ok),
            Answer::Success {
                status: 200,
                label: "paid".into()
            }
        );
        assert!(
            matches!(judge(200, Some("application/json"), b"{}"), Answer::Success { label, .. } if label == "unlabelled")
        );
        let kind = |a: Answer| match a {
            Answer::Failure { failure, .. } => failure.kind,
            Answer::Success { .. } => "success".into(),
        };
        assert_eq!(
            kind(judge(
                503,
                Some("application/json"),
                br#"{"ReturnValue":{"outcome":"retry-later"}}"#
            )),
            "503 retry-later"
        );
        assert_eq!(
            kind(judge(200, Some("text/plain"), ok)),
            "200 without a JSON content type"
        );
        assert_eq!(
            kind(judge(200, None, ok)),
            "200 without a JSON content type"
        );
        assert_eq!(
            kind(judge(200, Some("application/json"), b"")),
            "200 with an empty body"
        );
        assert_eq!(
            kind(judge(200, Some("application/json"), b"not json")),
            "200 with a body that is not JSON"
        );
        assert_eq!(
            kind(judge(200, Some("application/json"), b"[1]")),
            "200 with a JSON body that is not an object"
        );
        assert_eq!(kind(judge(500, None, b"boom")), "500");
    }
}
