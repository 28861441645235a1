//! The load generator: message bodies built before a phase, and a closed loop of
//! concurrent requests that times each answer.

use super::*;

pub(super) fn claim_body(n: u64, run: &str) -> Vec<u8> {
    let claim = uuid::Uuid::new_v4();
    format!(
        r#"{{"claimId":"{claim}","amount":"{}.{:02}","currency":"EUR","tenantId":"acme","payee":"NL91ABNA0417164300","approvedAt":"2026-01-01T00:00:00Z","note":"{run}-{n}"}}"#,
        10 + n % 5000,
        n % 100
    )
    .into_bytes()
}

/// `count` new messages with their own MessageIds and claims.
pub(super) fn messages(count: usize, run: &str) -> Vec<Message> {
    (0..count)
        .map(|n| Message {
            sequence_number: n as u64 + 1,
            copy: n,
            message_id: Arc::from(uuid::Uuid::new_v4().to_string()),
            body: Arc::from(claim_body(n as u64, run)),
            enqueued_at: time::OffsetDateTime::now_utc(),
            redrive: false,
        })
        .collect()
}

/// The host envelope of one delivery of `message`.
pub(super) fn envelope_of(n: usize, message: &Message, delivery_count: u32) -> Bytes {
    let delivery = QueueDelivery {
        entry: n,
        lock_token: uuid::Uuid::new_v4(),
        delivery_count,
        message: message.clone(),
    };
    let envelope = driver::envelope(&delivery, DataType::Binary, "ClaimApproved");
    Bytes::from(serde_json::to_vec(&envelope).unwrap_or_default())
}

/// The host envelopes of `count` new messages, for their first and second delivery.
pub(super) fn envelopes(count: usize, run: &str) -> (Vec<Bytes>, Vec<Bytes>) {
    let messages = messages(count, run);
    (
        messages
            .iter()
            .enumerate()
            .map(|(n, m)| envelope_of(n, m, 1))
            .collect(),
        messages
            .iter()
            .enumerate()
            .map(|(n, m)| envelope_of(n, m, 2))
            .collect(),
    )
}

#[derive(Debug, Default)]
pub(super) struct Run {
    pub(super) latencies_us: Vec<u64>,
    pub(super) errors: usize,
    pub(super) unexpected: usize,
    pub(super) wall: Duration,
}

/// Sends every body once, `concurrency` at a time, and times each answer.
pub(super) async fn load(
    client: &reqwest::Client,
    base_url: &str,
    bodies: Arc<Vec<Bytes>>,
    concurrency: usize,
    expected: &'static str,
) -> Run {
    let targets: Vec<(usize, Bytes)> = bodies.iter().map(|b| (0, b.clone())).collect();
    load_to(
        client,
        &[base_url.to_owned()],
        Arc::new(targets),
        concurrency,
        &[expected],
    )
    .await
}

/// How one timed request ended.
pub(super) enum Answered {
    Expected,
    /// A 2xx answer that is not what the phase expects.
    Unexpected,
    /// A transport error or a non-2xx answer.
    Error,
}

/// Sends requests `0..count`, `concurrency` at a time (closed loop), `send(i)` making the
/// i-th, and times each answer.
pub(super) async fn closed_loop<F, Fut>(count: usize, concurrency: usize, send: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answered> + Send,
{
    let send = Arc::new(send);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (send, next) = (send.clone(), next.clone());
        workers.spawn(async move {
            let mut run = Run::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let sent = Instant::now();
                match send(i).await {
                    Answered::Expected => {}
                    Answered::Unexpected => run.unexpected += 1,
                    Answered::Error => run.errors += 1,
                }
                run.latencies_us.push(sent.elapsed().as_micros() as u64);
            }
            run
        });
    }
    let mut total = Run::default();
    while let Some(joined) = workers.join_next().await {
        if let Ok(run) = joined {
            total.latencies_us.extend(run.latencies_us);
            total.errors += run.errors;
            total.unexpected += run.unexpected;
        }
    }
    total.wall = started.elapsed();
    total
}

/// Sends every `(instance, body)` once to `base_urls[instance]`, `concurrency` at a time
/// in all, and times each answer; an answer whose outcome is not in `accepted` counts as
/// unexpected.
pub(super) async fn load_to(
    client: &reqwest::Client,
    base_urls: &[String],
    targets: Arc<Vec<(usize, Bytes)>>,
    concurrency: usize,
    accepted: &[&'static str],
) -> Run {
    let urls: Arc<Vec<String>> = Arc::new(
        base_urls
            .iter()
            .map(|u| format!("{u}/ClaimApproved"))
            .collect(),
    );
    let needles: Arc<Vec<Vec<u8>>> = Arc::new(
        accepted
            .iter()
            .map(|e| format!("\"outcome\":\"{e}\"").into_bytes())
            .collect(),
    );
    let client = client.clone();
    closed_loop(targets.len(), concurrency, move |i| {
        let (client, urls, targets, needles) = (
            client.clone(),
            urls.clone(),
            targets.clone(),
            needles.clone(),
        );
        async move {
            let (instance, body) = &targets[i];
            let Some(url) = urls.get(*instance) else {
                return Answered::Error;
            };
            let answer = client
                .post(url)
                .header("content-type", "application/json; charset=utf-8")
                .header(
                    "x-azure-functions-invocationid",
                    uuid::Uuid::new_v4().to_string(),
                )
                .body(body.clone())
                .send()
                .await;
            let Ok(response) = answer else {
                return Answered::Error;
            };
            let ok = response.status().is_success();
            match response.bytes().await {
                Ok(bytes) if ok => {
                    let known = needles
                        .iter()
                        .any(|needle| bytes.windows(needle.len()).any(|w| w == &needle[..]));
                    if known {
                        Answered::Expected
                    } else {
                        Answered::Unexpected
                    }
                }
                _ => Answered::Error,
            }
        }
    })
    .await
}

/// One `POST /api/payments`: its Idempotency-Key and body.
pub(super) type PaymentRequest = (String, Bytes);

/// `count` payment requests for new claims, each with its own key.
pub(super) fn payment_requests(count: usize, run: &str) -> Vec<PaymentRequest> {
    (0..count)
        .map(|n| {
            (
                uuid::Uuid::new_v4().to_string(),
                Bytes::from(claim_body(n as u64, run)),
            )
        })
        .collect()
}

/// Sends every payment request once, `concurrency` at a time. A first request must be
/// answered 201; a replay (the same key and body again) 201 with `Idempotent-Replayed: true`.
pub(super) async fn load_payments(
    client: &reqwest::Client,
    base_url: &str,
    requests: Arc<Vec<PaymentRequest>>,
    concurrency: usize,
    replay: bool,
) -> Run {
    let url = Arc::new(format!("{base_url}/api/payments"));
    let client = client.clone();
    closed_loop(requests.len(), concurrency, move |i| {
        let (client, url, requests) = (client.clone(), url.clone(), requests.clone());
        async move {
            let (key, body) = &requests[i];
            let answer = client
                .post(url.as_str())
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(body.clone())
                .send()
                .await;
            let Ok(response) = answer else {
                return Answered::Error;
            };
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let created = response.status() == reqwest::StatusCode::CREATED;
            match response.bytes().await {
                Ok(_) if created && replayed == replay => Answered::Expected,
                Ok(_) if created => Answered::Unexpected,
                _ => Answered::Error,
            }
        }
    })
    .await
}

pub(super) fn percentile_ms(sorted_us: &[u64], p: usize) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = (sorted_us.len() * p)
        .div_ceil(100)
        .clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

pub(super) fn http_client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .pool_max_idle_per_host(concurrency.max(1))
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the load generator's HTTP client")
}
