//! The simulator's fake Functions host speaks the real custom-handler protocol and
//! settles messages the way the host and Service Bus do. Each test drives an
//! in-process fake handler whose behaviour depends on the MessageId.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine;
use claims_payments::seams::functions::envelope::{BodyEncoding, Invocation};
use claims_payments_dev::sim::driver::{DataType, FixedHandler, Handler, Host, HostSettings};
use claims_payments_dev::sim::process::{Endpoint, KillReason};
use claims_payments_dev::sim::queue::{Queue, Settled};
use indicatif::ProgressBar;

#[derive(Default)]
struct Fake {
    requests: Mutex<Vec<(HeaderMap, Bytes)>>,
    calls: Mutex<HashMap<String, u32>>,
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
}

fn paid() -> Response {
    (
        StatusCode::OK,
        axum::Json(
            serde_json::json!({"Outputs": {}, "Logs": [], "ReturnValue": {"outcome": "paid"}}),
        ),
    )
        .into_response()
}

fn retry_later() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({"Outputs": {}, "Logs": [], "ReturnValue": {"outcome": "retry-later", "detail": "busy"}})),
    )
        .into_response()
}

async fn invoke(State(fake): State<Arc<Fake>>, headers: HeaderMap, bytes: Bytes) -> Response {
    fake.requests.lock().unwrap().push((headers, bytes.clone()));
    let invocation = Invocation::decode(&bytes).expect("the driver's envelope decodes");
    let id = invocation.message_id.as_str().to_owned();
    let call = {
        let mut calls = fake.calls.lock().unwrap();
        let n = calls.entry(id.clone()).or_default();
        *n += 1;
        *n
    };
    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let response = match id.as_str() {
        "text" => (StatusCode::OK, "ok").into_response(),
        "empty" => Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::empty())
            .unwrap(),
        "unavailable" => retry_later(),
        "cut" => {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"{\"Outputs\":")),
                Err(std::io::Error::other("handler died mid-answer")),
            ];
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap()
        }
        "flaky" if invocation.delivery_count < 3 => retry_later(),
        "poison-until-redrive" if call <= 3 => retry_later(),
        "slow" => {
            // The scenario: a handler that takes its time.
            tokio::time::sleep(Duration::from_millis(300)).await;
            paid()
        }
        _ => paid(),
    };
    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

async fn start_fake() -> (Arc<Fake>, String) {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/ClaimApproved", post(invoke))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, url)
}

fn host(queue: &Arc<Queue>, url: &str, settings: HostSettings) -> Arc<Host> {
    let handler: Arc<dyn Handler> = Arc::new(FixedHandler(url.to_owned()));
    Host::new(queue.clone(), handler, settings, ProgressBar::hidden()).unwrap()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

const BODY: &[u8] =
    br#"{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"1.50","currency":"EUR"}"#;

#[tokio::test]
async fn the_envelope_is_the_hosts_and_the_service_decoder_reads_it() {
    for data_type in [DataType::Binary, DataType::String] {
        let (fake, url) = start_fake().await;
        let queue = Arc::new(Queue::new(10));
        let odd_id = "claims/7/approved?attempt=1#7 ✓";
        queue.send(0, "plain", BODY, false);
        queue.send(1, odd_id, BODY, false);
        let settings = HostSettings {
            concurrency: 2,
            data_type,
            ..HostSettings::default()
        };
        host(&queue, &url, settings)
            .run_until_settled(soon())
            .await
            .unwrap();

        let requests = fake.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 2);
        for (headers, bytes) in &requests {
            assert_eq!(headers["content-type"], "application/json; charset=utf-8");
            let invocation_id = headers["x-azure-functions-invocationid"].to_str().unwrap();
            assert!(uuid::Uuid::try_parse(invocation_id).is_ok());
            assert!(headers["user-agent"]
                .to_str()
                .unwrap()
                .starts_with("Azure-Functions-Host/"));

            let envelope: serde_json::Value = serde_json::from_slice(bytes).unwrap();
            let meta = &envelope["Metadata"];
            let id = serde_json::from_str::<String>(meta["MessageId"].as_str().unwrap()).unwrap();
            assert!(id == "plain" || id == odd_id);
            assert_eq!(meta["DeliveryCount"], "1", "numbers arrive as strings");
            let token =
                serde_json::from_str::<String>(meta["LockToken"].as_str().unwrap()).unwrap();
            assert!(uuid::Uuid::try_parse(&token).is_ok());
            assert_eq!(meta["sys"]["MethodName"], "ClaimApproved");
            let msg = envelope["Data"]["msg"].as_str().unwrap();
            let invocation = Invocation::decode(bytes).unwrap();
            assert_eq!(invocation.body.as_bytes(), BODY);
            assert_eq!(invocation.message_id.as_str(), id);
            assert_eq!(invocation.delivery_count, 1);
            match data_type {
                DataType::Binary => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(msg)
                        .unwrap();
                    assert_eq!(raw, BODY);
                    assert_eq!(invocation.encoding, BodyEncoding::Base64);
                }
                DataType::String => {
                    let once: String = serde_json::from_str(msg).unwrap();
                    assert_eq!(once.as_bytes(), BODY);
                    assert_eq!(invocation.encoding, BodyEncoding::DoubleString);
                }
            }
        }
    }
}

#[tokio::test]
async fn only_a_json_2xx_completes_and_failures_dead_letter_after_max_delivery_count() {
    let (fake, url) = start_fake().await;
    let queue = Arc::new(Queue::new(3));
    let ids = ["ok", "text", "empty", "unavailable", "cut", "flaky"];
    for (i, id) in ids.iter().enumerate() {
        queue.send(i, id, BODY, false);
    }
    let h = host(
        &queue,
        &url,
        HostSettings {
            concurrency: 3,
            ..HostSettings::default()
        },
    );
    h.run_until_settled(soon()).await.unwrap();

    let settled: HashMap<String, (u32, Settled)> = queue
        .entries()
        .into_iter()
        .map(|e| {
            (
                e.message.message_id.to_string(),
                (e.delivery_count, e.settled.unwrap()),
            )
        })
        .collect();
    let completed = |id: &str| match &settled[id] {
        (n, Settled::Completed { label, .. }) => Some((*n, label.clone())),
        _ => None,
    };
    let dead = |id: &str| match &settled[id] {
        (n, Settled::DeadLettered { last, .. }) => Some((*n, last.kind.clone())),
        _ => None,
    };
    assert_eq!(completed("ok"), Some((1, "paid".into())));
    assert_eq!(completed("flaky"), Some((3, "paid".into())));
    assert_eq!(
        dead("text"),
        Some((3, "200 without a JSON content type".into()))
    );
    assert_eq!(dead("empty"), Some((3, "200 with an empty body".into())));
    assert_eq!(dead("unavailable"), Some((3, "503 retry-later".into())));
    let (n, kind) = dead("cut").unwrap();
    assert_eq!(n, 3);
    assert!(kind.starts_with("transport:"), "{kind}");

    let stats = h.stats();
    assert_eq!(stats.deliveries, 1 + 3 + 3 + 3 + 3 + 3);
    assert_eq!(stats.completed, 2);
    assert_eq!(stats.dead_lettered, 4);
    assert_eq!(stats.outcomes["retry-later"], 3 + 2);
    assert_eq!(fake.calls.lock().unwrap()["text"], 3);
}

#[tokio::test]
async fn an_expired_lock_hands_the_message_to_a_second_worker_while_the_first_still_works() {
    let (fake, url) = start_fake().await;
    let queue = Arc::new(Queue::new(3));
    queue.send(0, "slow", BODY, false);
    let h = host(
        &queue,
        &url,
        HostSettings {
            concurrency: 3,
            lock_expiry_rate: 1.0,
            lock_expiry_max_ms: 0,
            ..HostSettings::default()
        },
    );
    h.run_until_settled(soon()).await.unwrap();

    // Every delivery lost its lock at once, so all three ran side by side and each
    // late "paid" answer was refused; the broker dead-lettered the message.
    assert_eq!(fake.calls.lock().unwrap()["slow"], 3);
    assert!(fake.max_in_flight.load(Ordering::SeqCst) >= 2);
    let stats = h.stats();
    assert_eq!(stats.lock_expiries, 3);
    assert_eq!(stats.lock_lost, 3);
    assert_eq!(stats.completed, 0);
    let entry = &queue.entries()[0];
    assert!(
        matches!(&entry.settled, Some(Settled::DeadLettered { last, .. }) if last.kind == "lock expired")
    );
}

#[tokio::test]
async fn a_redrive_sends_dead_letters_again_from_delivery_count_one() {
    let (fake, url) = start_fake().await;
    let queue = Arc::new(Queue::new(3));
    queue.send(0, "poison-until-redrive", BODY, false);
    queue.send(1, "unavailable", BODY, false);
    let h = host(&queue, &url, HostSettings::default());
    h.run_until_settled(soon()).await.unwrap();
    assert_eq!(queue.redrive_dead_letters(), 2);
    h.run_until_settled(soon()).await.unwrap();

    let entries = queue.entries();
    assert_eq!(entries.len(), 4);
    let redriven: Vec<_> = entries.iter().filter(|e| e.message.redrive).collect();
    let recovered = redriven
        .iter()
        .find(|e| &*e.message.message_id == "poison-until-redrive")
        .unwrap();
    assert!(matches!(
        recovered.settled,
        Some(Settled::Completed {
            delivery_count: 1,
            ..
        })
    ));
    let again = redriven
        .iter()
        .find(|e| &*e.message.message_id == "unavailable")
        .unwrap();
    assert!(matches!(
        again.settled,
        Some(Settled::DeadLettered {
            delivery_count: 3,
            ..
        })
    ));
    assert_eq!(fake.calls.lock().unwrap()["unavailable"], 6);
}

/// Several in-process fakes as the instances of one app (they cannot be killed).
struct FixedInstances(Vec<String>);

#[async_trait::async_trait]
impl Handler for FixedInstances {
    fn instances(&self) -> usize {
        self.0.len()
    }

    fn ready(&self, instance: usize) -> Option<Endpoint> {
        Some(Endpoint {
            generation: 1,
            base_url: Arc::from(self.0[instance].as_str()),
        })
    }

    async fn endpoint(&self, instance: usize) -> anyhow::Result<Endpoint> {
        Ok(self.ready(instance).unwrap())
    }

    fn kill(&self, _instance: usize, _generation: u64, _reason: KillReason) -> bool {
        false
    }

    async fn transport_failed(&self, _instance: usize, _generation: u64) {}
}

async fn start_fakes(n: usize) -> (Vec<Arc<Fake>>, Arc<dyn Handler>) {
    let mut fakes = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..n {
        let (fake, url) = start_fake().await;
        fakes.push(fake);
        urls.push(url);
    }
    (fakes, Arc::new(FixedInstances(urls)))
}

#[tokio::test]
async fn deliveries_spread_over_the_instances_within_each_ones_concurrency() {
    let (fakes, handler) = start_fakes(3).await;
    let queue = Arc::new(Queue::new(3));
    for i in 0..60 {
        queue.send(i, &format!("ok-{i}"), BODY, false);
    }
    let settings = HostSettings {
        concurrency: 2,
        seed: 5,
        ..HostSettings::default()
    };
    let h = Host::new(queue.clone(), handler, settings, ProgressBar::hidden()).unwrap();
    h.run_until_settled(soon()).await.unwrap();
    let stats = h.stats();
    assert_eq!((stats.deliveries, stats.completed), (60, 60));
    assert_eq!(stats.instances.len(), 3);
    for (i, fake) in fakes.iter().enumerate() {
        let per = &stats.instances[i];
        assert!(per.deliveries > 0, "instance {i} got nothing: {stats:?}");
        assert_eq!(per.outcomes["paid"], per.deliveries);
        assert_eq!(fake.requests.lock().unwrap().len() as u64, per.deliveries);
        // maxConcurrentCalls holds per instance.
        assert!(fake.max_in_flight.load(Ordering::SeqCst) <= 2);
    }
    assert_eq!(stats.cross_instance_redeliveries, 0);
}

#[tokio::test]
async fn a_message_whose_lock_expired_goes_to_an_instance_not_yet_working_on_it() {
    let (fakes, handler) = start_fakes(3).await;
    let queue = Arc::new(Queue::new(3));
    queue.send(0, "slow", BODY, false);
    let settings = HostSettings {
        concurrency: 3,
        lock_expiry_rate: 1.0,
        lock_expiry_max_ms: 0,
        ..HostSettings::default()
    };
    let h = Host::new(queue.clone(), handler, settings, ProgressBar::hidden()).unwrap();
    h.run_until_settled(soon()).await.unwrap();
    // Every delivery lost its lock at once; each redelivery reached another instance
    // while the earlier ones were still working.
    for fake in &fakes {
        assert_eq!(fake.calls.lock().unwrap()["slow"], 1);
    }
    let stats = h.stats();
    assert_eq!(stats.lock_expiries, 3);
    assert_eq!(stats.cross_instance_redeliveries, 2);
    let per: Vec<_> = stats
        .instances
        .iter()
        .map(|i| (i.deliveries, i.lock_expiries, i.lock_lost))
        .collect();
    assert_eq!(per, vec![(1, 1, 1); 3]);
}

/// The host stops sending to the handler in the exit event itself (see the driver's
/// docs); the simulator must too, even before the supervisor has reaped the dead
/// process. On this single-threaded runtime the supervisor cannot run between the kill
/// and the check, so without that the dead process would still look ready.
#[tokio::test]
async fn a_handler_that_exited_gets_nothing_before_its_supervisor_notices() {
    use claims_payments_dev::sim::driver::HOLD_WHILE_RESTARTING;
    use claims_payments_dev::sim::process::Supervisor;
    use claims_payments_testkit::process::{ServeSpec, TempDir};

    let dir = TempDir::new("sim-exited").unwrap();
    let spec = ServeSpec::new(env!("CARGO_BIN_EXE_claims-payments-dev")).env(
        "PAYMENTS_SQLITE_PATH",
        dir.path().join("payments.db").to_string_lossy(),
    );
    let supervisor = Supervisor::start(spec, 5).await.unwrap();
    let first = supervisor.endpoint(HOLD_WHILE_RESTARTING).await.unwrap();
    let pid = supervisor
        .stats
        .current_pid
        .load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: kill(2) on our own child has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    // Blocking, so the supervisor's task does not run: wait until the kernel reports
    // the process as exited, without reaping it (its threads are gone, not only its
    // main thread).
    let exited = || {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter; WNOWAIT reaps nothing.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) == 0
                && info.si_pid() == pid as libc::pid_t
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !exited() {
        assert!(Instant::now() < deadline, "the killed handler did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(supervisor.ready(), None, "an exited handler is not ready");
    let next = supervisor.endpoint(HOLD_WHILE_RESTARTING).await.unwrap();
    assert_eq!((first.generation, next.generation), (1, 2));
    supervisor.stop().await;
}
