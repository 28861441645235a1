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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use base64::Engine;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::{json, Value};
use time::macros::format_description;
use time::OffsetDateTime;
use uuid::Uuid;

use super::chance;
use super::process::{Endpoint, KillReason, Supervisor};
use super::queue::{Abandoned, Delivery, Failure, Queue};

/// The host version the driver claims to be, in headers and the User-Agent.
pub const HOST_VERSION: &str = "4.1037.0.0";

/// What the driver invokes.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The live handler (waiting, bounded, while it restarts).
    async fn endpoint(&self) -> anyhow::Result<Endpoint>;
    /// SIGKILLs `generation`; false if this handler cannot be killed.
    fn kill(&self, generation: u64, reason: KillReason) -> bool;
    /// Called after an invocation failed at the transport level. Waits (briefly) until
    /// a dead `generation` has been noticed, so that, as with the real host, a crash
    /// costs each in-flight message one delivery instead of a burst of refused
    /// connections in the milliseconds before the exit is seen.
    async fn transport_failed(&self, generation: u64);
}

#[async_trait]
impl Handler for Supervisor {
    async fn endpoint(&self) -> anyhow::Result<Endpoint> {
        Supervisor::endpoint(self, Duration::from_secs(30)).await
    }

    fn kill(&self, generation: u64, reason: KillReason) -> bool {
        Supervisor::kill(self, generation, reason);
        true
    }

    async fn transport_failed(&self, generation: u64) {
        self.wait_until_replaced(generation, Duration::from_millis(250))
            .await;
    }
}

/// A handler already listening at a URL (an in-process test handler). It cannot be
/// killed, so kill chaos and timeout restarts do not apply.
pub struct FixedHandler(pub String);

#[async_trait]
impl Handler for FixedHandler {
    async fn endpoint(&self) -> anyhow::Result<Endpoint> {
        Ok(Endpoint {
            generation: 1,
            base_url: Arc::from(self.0.trim_end_matches('/')),
        })
    }

    fn kill(&self, _generation: u64, _reason: KillReason) -> bool {
        false
    }

    async fn transport_failed(&self, _generation: u64) {}
}

/// How the trigger hands the body over (`dataType` in function.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataType {
    /// `"dataType": "binary"` (ours): the body bytes as one base64 string.
    Binary,
    /// No dataType: the body as a UTF-8 string, JSON-encoded a second time.
    String,
}

#[derive(Debug, Clone)]
pub struct HostSettings {
    /// The function folder name; the host POSTs to `/<name>`.
    pub function_name: String,
    /// Concurrent invocations (maxConcurrentCalls).
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
    /// Every answer's `outcome` label (success or not), by label.
    pub outcomes: BTreeMap<String, u64>,
    /// Every failed delivery, by failure kind.
    pub failures: BTreeMap<String, u64>,
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

fn host_time(t: OffsetDateTime) -> String {
    t.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second]"
    ))
    .unwrap_or_default()
}

fn host_time_offset(t: OffsetDateTime) -> String {
    format!("{}+00:00", host_time(t))
}

fn utc_now_7() -> String {
    OffsetDateTime::now_utc()
        .format(format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:7]Z"
        ))
        .unwrap_or_default()
}

/// A JSON text inside a JSON string: how the host encodes string and number metadata.
fn encoded(value: impl Serialize) -> Value {
    Value::String(serde_json::to_string(&value).unwrap_or_default())
}

/// The invocation envelope the host POSTs for one Service Bus delivery.
pub fn envelope(delivery: &Delivery, data_type: DataType, function_name: &str) -> Value {
    let message = &delivery.message;
    let msg = match data_type {
        DataType::Binary => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(&message.body))
        }
        DataType::String => encoded(String::from_utf8_lossy(&message.body)),
    };
    let application_properties = json!({"eventType": "ClaimApproved"});
    json!({
        "Data": { "msg": msg },
        "Metadata": {
            "MessageReceiver": {},
            "MessageSession": {},
            "MessageActions": {},
            "SessionActions": {},
            "ReceiveActions": {},
            "Client": {
                "FullyQualifiedNamespace": "sb-claims-sim.servicebus.windows.net",
                "IsClosed": false,
                "TransportType": 0,
                "Identifier": "sb-claims-sim-receiver"
            },
            "DeliveryCount": encoded(delivery.delivery_count),
            "LockToken": encoded(delivery.lock_token.to_string()),
            "ExpiresAtUtc": "9999-12-31T23:59:59",
            "ExpiresAt": "9999-12-31T23:59:59+00:00",
            "EnqueuedTimeUtc": host_time(message.enqueued_at),
            "EnqueuedTime": host_time_offset(message.enqueued_at),
            "MessageId": encoded(&*message.message_id),
            "ContentType": encoded("application/json"),
            "SequenceNumber": encoded(message.sequence_number),
            "Subject": encoded("ClaimApproved"),
            "Label": encoded("ClaimApproved"),
            "ApplicationProperties": application_properties.clone(),
            "UserProperties": application_properties,
            "sys": {
                "MethodName": function_name,
                "UtcNow": utc_now_7(),
                "RandGuid": Uuid::new_v4().to_string()
            }
        }
    })
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
    delivery: &Delivery,
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

/// The host: workers that receive, invoke and settle until the queue is empty.
pub struct Host {
    queue: Arc<Queue>,
    handler: Arc<dyn Handler>,
    settings: HostSettings,
    client: reqwest::Client,
    stats: Mutex<HostStats>,
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
        let client = host_client(settings.concurrency)?;
        Ok(Arc::new(Host {
            queue,
            handler,
            settings,
            client,
            stats: Mutex::new(HostStats::default()),
            progress,
            stopped: AtomicBool::new(false),
        }))
    }

    fn stats_mut(&self) -> MutexGuard<'_, HostStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> HostStats {
        self.stats_mut().clone()
    }

    /// Stops pending chaos timers (lock expiries, kills) from acting.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Runs `concurrency` workers until every message is settled.
    pub async fn run_until_settled(self: &Arc<Self>, deadline: Instant) -> anyhow::Result<()> {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.concurrency.max(1) {
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
            let endpoint = self.handler.endpoint().await?;
            self.stats_mut().deliveries += 1;
            self.schedule_chaos(&delivery, &endpoint);
            let answer = invoke(&self.client, &endpoint, &delivery, &self.settings).await;
            if let Answer::Failure { failure, .. } = &answer {
                if failure.kind.starts_with("transport:") {
                    self.handler.transport_failed(endpoint.generation).await;
                }
            }
            self.settle(&delivery, &endpoint, answer);
        }
    }

    fn schedule_chaos(self: &Arc<Self>, delivery: &Delivery, endpoint: &Endpoint) {
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
                    host.stats_mut().lock_expiries += 1;
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
                    && host.handler.kill(generation, KillReason::Chaos)
                {
                    host.stats_mut().chaos_kills_requested += 1;
                }
            });
        }
    }

    fn settle(&self, delivery: &Delivery, endpoint: &Endpoint, answer: Answer) {
        match answer {
            Answer::Success { label, .. } => {
                let settled = self.queue.complete(delivery, &label);
                let mut stats = self.stats_mut();
                *stats.outcomes.entry(label).or_default() += 1;
                match settled {
                    Ok(()) => {
                        stats.completed += 1;
                        self.progress.inc(1);
                    }
                    Err(_) => stats.lock_lost += 1,
                }
            }
            Answer::Failure { failure, label } => {
                if failure.kind == "function timeout" {
                    // The host restarts the worker process after a function timeout.
                    self.handler
                        .kill(endpoint.generation, KillReason::FunctionTimeout);
                }
                let kind = failure.kind.clone();
                let settled = self.queue.abandon(delivery, failure);
                let mut stats = self.stats_mut();
                if let Some(label) = label {
                    *stats.outcomes.entry(label).or_default() += 1;
                }
                if kind == "function timeout" {
                    stats.function_timeouts += 1;
                }
                *stats.failures.entry(kind).or_default() += 1;
                match settled {
                    Ok(Abandoned::Redelivered) => stats.failed += 1,
                    Ok(Abandoned::DeadLettered) => {
                        stats.failed += 1;
                        stats.dead_lettered += 1;
                        self.progress.inc(1);
                    }
                    Err(_) => stats.lock_lost += 1,
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
