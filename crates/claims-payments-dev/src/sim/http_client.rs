//! HTTP clients that retry, mixed with the Service Bus deliveries: `POST /api/payments`
//! for some of the same claims the messages pay (a "Pay now" button pressed while the
//! approval is on its way), with an Idempotency-Key per intent.
//!
//! Each intent retries as the web client does (network errors, 409 in flight and 503,
//! honouring `Retry-After`, the same key throughout), sometimes double-submits, and,
//! once it has its answer, checks the contract: a replay gives the stored answer byte
//! for byte, the same key with another body is 422, and the same key from another
//! scope (another `tenantId`) is never a replay. Claims paid over HTTP are in the plan,
//! so the verdict (one payout per claim, ledger = bank) covers both paths.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::chance;
use super::process::Supervisor;
use super::scenario::{CopyKind, Plan};

/// What the HTTP clients saw.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpStats {
    pub intents: usize,
    pub requests: usize,
    /// Answers by status (`transport` for no answer).
    pub answers: BTreeMap<String, usize>,
    pub double_submits: usize,
    pub replays_checked: usize,
    pub key_reuses_checked: usize,
    pub cross_scope_checked: usize,
    /// Of those, answers replayed from that scope's own earlier send, whose answer a
    /// kill had cut off (the contract allows it; the check tells it from a leak).
    pub cross_scope_own_replays: usize,
    /// Intents that ended with a payment (201, 202, or 200 for a claim paid before).
    pub succeeded: usize,
    /// Answers that break the contract; any is a failed verdict.
    pub violations: Vec<String>,
}

struct Intent {
    claim_id: String,
    key: String,
    body: String,
}

/// Picks the intents: claims with a single valid payload, at `share`.
fn intents(plan: &Plan, share: f64, seed: u64) -> Vec<Intent> {
    plan.claims
        .iter()
        .enumerate()
        .filter(|(_, c)| c.payloads.len() == 1)
        .filter(|(_, c)| chance::hit(share, seed, "http-intent", c.claim_id.as_bytes(), 0))
        .filter_map(|(ci, c)| {
            let copy = plan.copies.iter().find(|copy| {
                copy.claim == Some(ci) && copy.kind != CopyKind::Invalid && copy.payload == 0
            })?;
            let body = String::from_utf8(copy.body.clone()).ok()?;
            let key = format!(
                "{:016x}{:016x}",
                chance::bits(seed, "http-key", c.claim_id.as_bytes(), 0),
                chance::bits(seed, "http-key", c.claim_id.as_bytes(), 1)
            );
            Some(Intent {
                claim_id: c.claim_id.clone(),
                key,
                body,
            })
        })
        .collect()
}

/// Sends every intent (a few at a time) while the deliveries go on; returns what was seen.
pub async fn run(
    supervisors: Vec<Arc<Supervisor>>,
    plan: &Plan,
    share: f64,
    seed: u64,
    concurrency: usize,
) -> HttpStats {
    let stats = Arc::new(Mutex::new(HttpStats::default()));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(90))
        .build()
        .expect("an HTTP client");
    // Last-sent claims first, so some are paid over HTTP before their message arrives.
    let mut intents = intents(plan, share, seed);
    intents.reverse();
    if let Ok(mut s) = stats.lock() {
        s.intents = intents.len();
    }
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::new();
    for intent in intents {
        let (client, supervisor, stats, semaphore) = (
            client.clone(),
            Instances(supervisors.clone()),
            stats.clone(),
            semaphore.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let Ok(_permit) = semaphore.acquire_owned().await else {
                return;
            };
            one_intent(&client, &supervisor, &intent, seed, &stats).await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let stats = stats.lock().map(|s| s.clone()).unwrap_or_default();
    stats
}

/// The `serve` instances, asked in turn (a client behind a load balancer).
#[derive(Clone)]
struct Instances(Vec<Arc<Supervisor>>);

impl Instances {
    async fn base_url(&self) -> Option<String> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = self.0.len().max(1);
        let supervisor = self.0.get(NEXT.fetch_add(1, Ordering::Relaxed) % n)?;
        let endpoint = supervisor.endpoint(Duration::from_secs(30)).await.ok()?;
        Some(endpoint.base_url.to_string())
    }
}

struct Reply {
    status: u16,
    body: String,
    replayed: bool,
    retry_after: Option<u64>,
    /// Earlier sends of this key and body by the same `until_final` that got no answer
    /// (a serve killed mid-request): one of them may have been processed, so a replay
    /// of its stored answer is then correct.
    unanswered_before: usize,
}

async fn post(
    client: &reqwest::Client,
    supervisor: &Instances,
    key: &str,
    body: &str,
    stats: &Mutex<HttpStats>,
) -> Option<Reply> {
    let base_url = supervisor.base_url().await?;
    let result = client
        .post(format!("{base_url}/api/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await;
    let reply = match result {
        Ok(r) => {
            let status = r.status().as_u16();
            let replayed = r.headers().contains_key("idempotent-replayed");
            let retry_after = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            let body = r.text().await.unwrap_or_default();
            Some(Reply {
                status,
                body,
                replayed,
                retry_after,
                unanswered_before: 0,
            })
        }
        Err(_) => None,
    };
    if let Ok(mut s) = stats.lock() {
        s.requests += 1;
        let label = reply
            .as_ref()
            .map_or("transport".to_owned(), |r| r.status.to_string());
        *s.answers.entry(label).or_default() += 1;
    }
    reply
}

/// Retries like the web client until a final answer, for at most [`PATIENCE`] (a
/// request cut by a crash holds its key until its lease runs out: 409 meanwhile).
async fn until_final(
    client: &reqwest::Client,
    supervisor: &Instances,
    key: &str,
    body: &str,
    stats: &Mutex<HttpStats>,
) -> Option<Reply> {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    let mut unanswered = 0;
    while tokio::time::Instant::now() < give_up {
        match post(client, supervisor, key, body, stats).await {
            Some(r) if matches!(r.status, 409 | 503) && retryable(&r) => {
                let wait = r.retry_after.unwrap_or(1).min(2);
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            Some(r) => {
                return Some(Reply {
                    unanswered_before: unanswered,
                    ..r
                })
            }
            None => {
                unanswered += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}

/// Longer than the deployed lease (120 s), which a crashed request holds its key for.
const PATIENCE: Duration = Duration::from_secs(180);

fn retryable(r: &Reply) -> bool {
    r.status == 503 || r.body.contains("request-in-flight")
}

async fn one_intent(
    client: &reqwest::Client,
    supervisor: &Instances,
    intent: &Intent,
    seed: u64,
    stats: &Mutex<HttpStats>,
) {
    let violation = |text: String| {
        if let Ok(mut s) = stats.lock() {
            s.violations
                .push(format!("claim {}: {text}", intent.claim_id));
        }
    };
    let c = intent.claim_id.as_bytes();
    let first = if chance::hit(0.3, seed, "http-double", c, 0) {
        if let Ok(mut s) = stats.lock() {
            s.double_submits += 1;
        }
        let (a, b) = tokio::join!(
            until_final(client, supervisor, &intent.key, &intent.body, stats),
            until_final(client, supervisor, &intent.key, &intent.body, stats),
        );
        if let (Some(a), Some(b)) = (&a, &b) {
            if a.status != b.status || a.body != b.body {
                violation(format!(
                    "a double submit got two different answers: {} and {}",
                    a.status, b.status
                ));
            }
        }
        a.or(b)
    } else {
        until_final(client, supervisor, &intent.key, &intent.body, stats).await
    };
    let Some(first) = first else {
        violation("no final answer within the client's patience".into());
        return;
    };
    if !matches!(first.status, 200..=202) {
        violation(format!(
            "a valid payment was answered {}: {}",
            first.status, first.body
        ));
        return;
    }
    if let Ok(mut s) = stats.lock() {
        s.succeeded += 1;
    }
    // A replay: the stored answer, byte for byte.
    if chance::hit(0.5, seed, "http-replay", c, 0) {
        if let Some(r) = until_final(client, supervisor, &intent.key, &intent.body, stats).await {
            if let Ok(mut s) = stats.lock() {
                s.replays_checked += 1;
            }
            if !r.replayed || r.status != first.status || r.body != first.body {
                violation(format!(
                    "a retry after completion was not the stored answer (status {}, replayed {})",
                    r.status, r.replayed
                ));
            }
        }
    }
    let Ok(original) = serde_json::from_str::<serde_json::Value>(&intent.body) else {
        return;
    };
    // The same key with another body: 422, never a payment. A 503 "try again" (the store
    // was unreachable: a PostgreSQL restart) is retried as a client would; the final
    // answer must be 422.
    if chance::hit(0.3, seed, "http-reuse", c, 0) {
        let mut other = original.clone();
        other["amount"] = serde_json::Value::String("1.00".into());
        if let Some(r) =
            until_final(client, supervisor, &intent.key, &other.to_string(), stats).await
        {
            if let Ok(mut s) = stats.lock() {
                s.key_reuses_checked += 1;
            }
            if r.status != 422 {
                let body: String = r.body.chars().take(160).collect();
                violation(format!(
                    "a key reused with another body was answered {}: {body}",
                    r.status
                ));
            }
        }
    }
    // The same key from another scope (tenant): that scope's own request, never 422.
    if chance::hit(0.3, seed, "http-scope", c, 0) {
        let mut other = original;
        other["tenantId"] = serde_json::Value::String("another-tenant".into());
        if let Some(r) =
            until_final(client, supervisor, &intent.key, &other.to_string(), stats).await
        {
            let found = cross_scope_violation(&first, &r);
            if let Ok(mut s) = stats.lock() {
                s.cross_scope_checked += 1;
                s.cross_scope_own_replays += usize::from(r.replayed && found.is_none());
            }
            if let Some(text) = found {
                violation(text);
            }
        }
    }
}

/// The same key sent from another scope must be a request of that scope's own: never
/// 422, never the first scope's stored answer, and a replay only of an answer this
/// scope's own earlier send (lost to a kill) left behind.
fn cross_scope_violation(first_scope: &Reply, other_scope: &Reply) -> Option<String> {
    let leaked = other_scope.replayed
        && (other_scope.unanswered_before == 0
            || (other_scope.status == first_scope.status && other_scope.body == first_scope.body));
    (leaked || other_scope.status == 422).then(|| {
        format!(
            "another scope's identical key was answered {} (replayed {}, after {} unanswered sends)",
            other_scope.status, other_scope.replayed, other_scope.unanswered_before
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str, replayed: bool, unanswered_before: usize) -> Reply {
        Reply {
            status,
            body: body.into(),
            replayed,
            retry_after: None,
            unanswered_before,
        }
    }

    #[test]
    fn another_scope_may_replay_only_its_own_lost_answer() {
        let first = reply(201, r#"{"status":"paid"}"#, false, 0);
        let own_conflict = r#"{"type":"claim-already-paid"}"#;
        // Its own request: a fresh answer, or its own answer replayed after a lost one.
        assert!(cross_scope_violation(&first, &reply(409, own_conflict, false, 0)).is_none());
        assert!(cross_scope_violation(&first, &reply(409, own_conflict, true, 1)).is_none());
        // A replay before this scope ever had an answer stored, the first scope's
        // answer, or 422: the scopes are not apart.
        assert!(cross_scope_violation(&first, &reply(409, own_conflict, true, 0)).is_some());
        assert!(cross_scope_violation(&first, &reply(201, &first.body, true, 2)).is_some());
        assert!(cross_scope_violation(&first, &reply(422, "{}", false, 0)).is_some());
    }
}
