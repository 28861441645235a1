//! Telemetry of the real binary, received by a local Application Insights ingestion
//! endpoint (testkit::ingestion): one trace per delivery from the host's traceparent (or
//! the producer's Diagnostic-Id) through the store to the bank, metrics with their
//! dimensions, no secret; the same over OTLP (testkit::otlp); the Reconcile timer as a
//! request of its own; an unreachable endpoint that changes no answer; sampling (every
//! failure whole, successes at the configured share, each item with its sample rate);
//! metrics that count everything whatever the sampling; and hostile endpoints (a
//! redirect, an endless answer, a full queue, failing uploads) that cost bounded work.

use std::path::PathBuf;
use std::time::Duration;

use claims_payments_testkit::bank::BankFault;
use claims_payments_testkit::bank::FakeBank;
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::ingestion::{operation_id, property, Ingestion};
use claims_payments_testkit::otlp::{Otlp, SpanKind};
use claims_payments_testkit::process::free_port;
use claims_payments_testkit::service::{claim_body, host_envelope, outcome, Handler};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_claims-payments");
const BANK_KEY: &str = "bank-credential-7f3e9c1d-never-in-telemetry";
const PAYEE: &str = "NL91ABNA0417164300";

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("payments.db");
    (dir, db)
}

/// POSTs an envelope as the host does, with `traceparent` when given.
async fn deliver(handler: &Handler, envelope: &Value, traceparent: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(handler.url("/ClaimApproved"))
        .header("Content-Type", "application/json; charset=utf-8")
        .header(
            "X-Azure-Functions-InvocationId",
            uuid::Uuid::new_v4().to_string(),
        )
        .body(envelope.to_string());
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// SIGTERM, and the exit: `serve` flushes what its exporters hold before it exits.
async fn stop(handler: Handler) {
    let mut handler = handler;
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(handler.child.id() as i32, libc::SIGTERM);
    }
    let status = tokio::task::spawn_blocking(move || handler.child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

fn items_of<'a>(items: &'a [Value], base_type: &str, trace: &str) -> Vec<&'a Value> {
    items
        .iter()
        .filter(|i| i["data"]["baseType"] == base_type && operation_id(i) == trace)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_delivery_is_one_trace_from_the_host_through_the_store_to_the_bank() {
    let ingestion = Ingestion::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let connection_string = ingestion.connection_string();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("BANK_API_KEY", BANK_KEY),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &connection_string),
        ],
    );
    let claim = common::new_claim();
    let body = claim_body(&claim, "300.00");

    // The host forwards the producer's trace context as traceparent.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let host_span = "00f067aa0ba902b7";
    let (status, first) = deliver(
        &handler,
        &host_envelope(&body, "evt-otel", 1),
        Some(&format!("00-{trace}-{host_span}-01")),
    )
    .await;
    assert_eq!((status, outcome(&first)), (200, "paid"));

    // Without a traceparent header, the producer's Diagnostic-Id is the parent.
    let sent_trace = "0af7651916cd43dd8448eb211c80319c";
    let sent_span = "b7ad6b7169203331";
    let mut redelivery = host_envelope(&body, "evt-otel", 2);
    redelivery["Metadata"]["ApplicationProperties"] =
        json!({"Diagnostic-Id": format!("00-{sent_trace}-{sent_span}-01")});
    let (status, second) = deliver(&handler, &redelivery, None).await;
    assert_eq!((status, outcome(&second)), (200, "duplicate"));

    stop(handler).await;
    let items = ingestion.items();

    // The invocation: one request under the host's trace, its parent the host's span.
    let requests = items_of(&items, "RequestData", trace);
    assert_eq!(requests.len(), 1, "{items:#?}");
    let request = requests[0];
    assert_eq!(request["tags"]["ai.operation.parentId"], host_span);
    assert_eq!(request["data"]["baseData"]["name"], "ClaimApproved");
    assert_eq!(request["data"]["baseData"]["responseCode"], "200");
    assert_eq!(request["data"]["baseData"]["success"], true);
    assert_eq!(property(request, "claimId"), claim.as_str());
    assert_eq!(property(request, "messageId"), "evt-otel");
    assert_eq!(property(request, "deliveryCount"), "1");
    assert_eq!(property(request, "outcome"), "paid");
    assert_eq!(property(request, "bankAnswer"), "success");
    let request_id = request["data"]["baseData"]["id"].as_str().unwrap();

    // Its dependencies: the bank call and the store calls, under the same trace and
    // parented on the request.
    let dependencies = items_of(&items, "RemoteDependencyData", trace);
    let bank_calls: Vec<_> = dependencies
        .iter()
        .filter(|d| property(d, "bank.operation") == "payout")
        .collect();
    assert_eq!(bank_calls.len(), 1, "{dependencies:#?}");
    let bank_call = bank_calls[0];
    assert_eq!(bank_call["data"]["baseData"]["type"], "HTTP");
    assert_eq!(bank_call["data"]["baseData"]["resultCode"], "201");
    assert_eq!(bank_call["tags"]["ai.operation.parentId"], request_id);
    let store_calls: Vec<&str> = dependencies
        .iter()
        .filter(|d| d["data"]["baseData"]["type"] == "sqlite")
        .map(|d| d["data"]["baseData"]["name"].as_str().unwrap_or(""))
        .collect();
    assert!(store_calls.contains(&"sqlite claim"), "{store_calls:?}");
    assert!(store_calls.contains(&"sqlite finalize"), "{store_calls:?}");
    for call in dependencies
        .iter()
        .filter(|d| d["data"]["baseData"]["type"] == "sqlite")
    {
        assert_eq!(
            call["tags"]["ai.operation.parentId"], request_id,
            "{call:#}"
        );
        // The exporter leaves `success` out when it is true.
        let success = call["data"]["baseData"]["success"].as_bool();
        assert_ne!(success, Some(false), "{call:#}");
        assert_eq!(property(call, "store.result"), "ok");
        assert_eq!(property(call, "claimId"), claim.as_str());
        assert!(
            property(call, "db.operation.name")
                .as_str()
                .is_some_and(|name| !name.is_empty()),
            "{call:#}"
        );
    }

    // The bank saw the same trace, parented on the bank call's span.
    let traceparents = bank.traceparents();
    assert_eq!(traceparents.len(), 1);
    let bank_span = bank_call["data"]["baseData"]["id"].as_str().unwrap();
    assert_eq!(
        traceparents[0].as_deref(),
        Some(format!("00-{trace}-{bank_span}-01").as_str())
    );

    // The redelivery: a request under the producer's trace, no bank call.
    let requests = items_of(&items, "RequestData", sent_trace);
    assert_eq!(requests.len(), 1, "{items:#?}");
    assert_eq!(requests[0]["tags"]["ai.operation.parentId"], sent_span);
    assert_eq!(property(requests[0], "outcome"), "duplicate");
    assert_eq!(property(requests[0], "deliveryCount"), "2");
    assert!(items_of(&items, "RemoteDependencyData", sent_trace)
        .iter()
        .all(|d| d["data"]["baseData"]["type"] != "HTTP"));

    // Metrics, with their dimensions.
    let outcomes = ingestion.metric("claims_payments.outcomes");
    let count = |label: &str| -> f64 {
        outcomes
            .iter()
            .filter(|(_, p)| p["outcome"] == label)
            .map(|(v, _)| v)
            .sum()
    };
    assert_eq!(
        (count("paid"), count("duplicate")),
        (1.0, 1.0),
        "{outcomes:?}"
    );
    let latency = ingestion.metric("claims_payments.bank.duration");
    assert!(
        latency
            .iter()
            .any(|(_, p)| p["operation"] == "payout" && p["answer"] == "success"),
        "{latency:?}"
    );
    let answers = ingestion.metric("claims_payments.http.answers");
    assert!(
        answers
            .iter()
            .any(|(v, p)| p["route"] == "/ClaimApproved" && p["status"] == "200" && *v >= 2.0),
        "{answers:?}"
    );

    // Never a secret, never the payee's account.
    let text = ingestion.text();
    assert!(
        !text.contains(BANK_KEY),
        "the bank credential reached telemetry"
    );
    assert!(!text.contains(PAYEE), "the payee account reached telemetry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_changes_no_answer() {
    // A port nobody listens on.
    let dead = format!(
        "InstrumentationKey=5e1d7c3a-0b4f-4c8e-9a2d-6f7e8d9c0b1a;IngestionEndpoint=http://127.0.0.1:{}/",
        free_port().unwrap()
    );
    let bank = FakeBank::start().await;
    let bank_url = bank.url();
    let (_dir_a, db_a) = temp_db();
    let (_dir_b, db_b) = temp_db();
    let plain = Handler::start(EXE, &db_a, &[("BANK_API_URL", bank_url.as_str())]);
    let exporting = Handler::start(
        EXE,
        &db_b,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &dead),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let claim = common::new_claim();
    let body = claim_body(&claim, "42.00");
    let bad = r#"{"claimId":"not-a-uuid","amount":"1","currency":"EUR"}"#;
    let mut answers = Vec::new();
    for handler in [&plain, &exporting] {
        let mut seen = Vec::new();
        for (body, id, count) in [
            (&body[..], "m-1", 1),
            (&body[..], "m-1", 2),
            (bad, "m-2", 1),
        ] {
            let (status, answer) = deliver(handler, &host_envelope(body, id, count), None).await;
            seen.push((status, outcome(&answer).to_owned()));
        }
        answers.push(seen);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0], (200, "paid".to_owned()));
    assert_eq!(answers[0][2], (422, "invalid-message".to_owned()));

    // The exporter tried, failed, and counted it; the service kept answering.
    let metrics_url = exporting.url("/metrics");
    let failures = || async {
        reqwest::get(&metrics_url)
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["telemetryExportFailures"]
            .as_u64()
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while failures().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed export counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, again) = deliver(&exporting, &host_envelope(&body, "m-1", 3), None).await;
    assert_eq!((status, outcome(&again)), (200, "duplicate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_one_delivery_is_one_trace_from_the_host_to_the_bank() {
    let otlp = Otlp::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let endpoint = otlp.endpoint();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("BANK_API_KEY", BANK_KEY),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ],
    );
    let claim = common::new_claim();
    let body = claim_body(&claim, "310.00");
    let trace = "5ce0e9a56015fec5aadfa328ae398115";
    let host_span = "ab7f2a9c1d3e4f50";
    let (status, answer) = deliver(
        &handler,
        &host_envelope(&body, "evt-otlp", 1),
        Some(&format!("00-{trace}-{host_span}-01")),
    )
    .await;
    assert_eq!((status, outcome(&answer)), (200, "paid"));
    stop(handler).await;

    // OTLP over HTTP, protobuf: the receiver decoded every upload.
    let content_types = otlp.content_types();
    assert!(
        !content_types.is_empty(),
        "nothing reached the OTLP endpoint"
    );
    assert!(
        content_types.iter().all(|c| c == "application/x-protobuf"),
        "{content_types:?}"
    );

    // The invocation: one server span under the host's trace, its parent the host's span.
    let spans = otlp.spans_of(trace);
    let servers: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server)
        .collect();
    assert_eq!(servers.len(), 1, "{spans:#?}");
    let request = servers[0];
    assert_eq!(request.name, "ClaimApproved");
    assert_eq!(request.parent_span_id, host_span);
    assert_eq!(request.service_name, "claims-payments");
    assert_eq!(request.attribute("claimId"), claim.as_str());
    assert_eq!(request.attribute("messageId"), "evt-otlp");
    assert_eq!(request.attribute("deliveryCount"), "1");
    assert_eq!(request.attribute("outcome"), "paid");

    // The bank call: a client span of the request, and the bank saw its trace and span.
    let bank_calls: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client && s.attribute("bank.operation") == "payout")
        .collect();
    assert_eq!(bank_calls.len(), 1, "{spans:#?}");
    let bank_call = bank_calls[0];
    assert_eq!(bank_call.parent_span_id, request.span_id);
    assert_eq!(bank_call.attribute("bank.answer"), "success");
    // HTTP's semantic conventions, and never the query or credentials in the URL.
    let (host, port) = bank_url
        .trim_start_matches("http://")
        .split_once(':')
        .unwrap();
    assert_eq!(bank_call.name, "POST /payments");
    for (key, value) in [
        ("http.request.method", "POST"),
        ("server.address", host),
        ("server.port", port),
        ("url.full", &format!("{bank_url}/payments")),
        ("http.response.status_code", "201"),
    ] {
        assert_eq!(bank_call.attribute(key), value, "{key}: {bank_call:#?}");
    }
    assert_eq!(
        bank.traceparents(),
        vec![Some(format!("00-{trace}-{}-01", bank_call.span_id))]
    );
    // The store calls too, under the same request.
    assert!(
        spans.iter().any(|s| s.kind == SpanKind::Client
            && s.attribute("db.system.name") == "sqlite"
            && s.parent_span_id == request.span_id),
        "{spans:#?}"
    );

    // Metrics, with their dimensions.
    let paid: f64 = otlp
        .metric("claims_payments.outcomes")
        .iter()
        .filter(|p| p.attributes.get("outcome").map(String::as_str) == Some("paid"))
        .map(|p| p.value)
        .sum();
    assert_eq!(paid, 1.0);

    let text = otlp.text();
    assert!(!text.contains(BANK_KEY), "the bank credential reached OTLP");
    assert!(!text.contains(PAYEE), "the payee account reached OTLP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_timer_is_a_request_with_its_outcome_and_the_bank_lookup_under_it() {
    let ingestion = Ingestion::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let connection_string = ingestion.connection_string();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("BANK_KEY_WINDOW_MS", "1000"),
            ("BANK_TIMEOUT_MS", "200"),
            ("RETRY_BUDGET_MS", "5000"),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &connection_string),
        ],
    );
    // A payout whose fate is unknown: the bank is down until the key window closes.
    bank.always(Some(BankFault::Unavailable));
    let body = claim_body(&common::new_claim(), "77.00");
    let (status, answer) = deliver(&handler, &host_envelope(&body, "evt-rec", 1), None).await;
    assert_eq!((status, outcome(&answer)), (200, "needs-reconciliation"));
    bank.always(None);

    // The timer, as the host invokes it, with the host's trace context.
    let trace = "7d3f1b2c4e5a69788a9b0c1d2e3f4a5b";
    let host_span = "1a2b3c4d5e6f7081";
    let timer = json!({
        "Data": {"timer": {"Schedule": {"AdjustForDST": true}, "IsPastDue": false}},
        "Metadata": {"sys": {"MethodName": "Reconcile"}}
    });
    let answer: Value = reqwest::Client::new()
        .post(handler.url("/Reconcile"))
        .header("traceparent", format!("00-{trace}-{host_span}-01"))
        .json(&timer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["ReturnValue"]["outcome"], "reconciled", "{answer}");
    stop(handler).await;
    let items = ingestion.items();

    // One request for the run, named after the function, with the summary's outcome.
    let requests = items_of(&items, "RequestData", trace);
    assert_eq!(requests.len(), 1, "{items:#?}");
    let request = requests[0];
    assert_eq!(request["data"]["baseData"]["name"], "Reconcile");
    assert_eq!(request["tags"]["ai.operation.parentId"], host_span);
    assert_eq!(request["data"]["baseData"]["responseCode"], "200");
    assert_eq!(request["data"]["baseData"]["success"], true);
    assert_eq!(property(request, "outcome"), "reconciled");
    assert_eq!(property(request, "faas.trigger"), "timer");
    let request_id = request["data"]["baseData"]["id"].as_str().unwrap();

    // The bank lookup and the payout it settled with are its dependencies.
    let dependencies = items_of(&items, "RemoteDependencyData", trace);
    for operation in ["lookup", "payout"] {
        let calls: Vec<_> = dependencies
            .iter()
            .filter(|d| property(d, "bank.operation") == operation)
            .collect();
        assert_eq!(calls.len(), 1, "{operation}: {dependencies:#?}");
        assert_eq!(calls[0]["tags"]["ai.operation.parentId"], request_id);
    }

    // And the run's results, with their dimension.
    let results = ingestion.metric("claims_payments.reconcile.results");
    assert!(
        results
            .iter()
            .any(|(v, p)| p["result"] == "paid-now" && *v >= 1.0),
        "{results:?}"
    );
}

/// An ingestion endpoint that accepts connections and never answers: every upload hangs
/// until the exporter's timeout. Returns the connection string and how many connections
/// it has taken.
async fn hanging_endpoint() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    (
        format!(
            "InstrumentationKey=5e1d7c3a-0b4f-4c8e-9a2d-6f7e8d9c0b1a;IngestionEndpoint=http://{addr}/"
        ),
        accepted,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_answers_adds_no_latency() {
    let (hanging, accepted) = hanging_endpoint().await;
    let bank = FakeBank::start().await;
    let bank_url = bank.url();
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &hanging),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    // A first delivery, then wait until its telemetry's upload hangs on the endpoint.
    let body = claim_body(&common::new_claim(), "10.00");
    let (status, answer) = deliver(&handler, &host_envelope(&body, "m-0", 1), None).await;
    assert_eq!((status, outcome(&answer)), (200, "paid"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while accepted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "no upload was tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // While it hangs (the exporter waits 10 s for an answer), every delivery answers at
    // once: the export is off the request path.
    let mut slowest = Duration::ZERO;
    for i in 1..=20 {
        let body = claim_body(&common::new_claim(), "10.00");
        let started = std::time::Instant::now();
        let (status, answer) =
            deliver(&handler, &host_envelope(&body, &format!("m-{i}"), 1), None).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!((status, outcome(&answer)), (200, "paid"));
    }
    eprintln!("slowest delivery while the endpoint hung: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(3),
        "a delivery waited {slowest:?} while the telemetry endpoint hung"
    );
    handler.kill();
}

/// A fresh random trace id, as 32 lowercase hex digits.
fn random_trace() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Whether the sampling keeps a plain success of `trace` at `percent` (the Application
/// Insights score of the trace id; the same rule the host's SDK applies).
fn in_share(trace: &str, percent: f64) -> bool {
    claims_payments::seams::telemetry::sampling::keeps_share(
        opentelemetry::trace::TraceId::from_hex(trace).unwrap(),
        percent,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_exported_whole_and_successes_at_the_configured_rate() {
    const PERCENT: f64 = 20.0;
    const SUCCESSES: usize = 120;
    let ingestion = Ingestion::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let connection_string = ingestion.connection_string();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("BANK_KEY_WINDOW_MS", "1000"),
            ("BANK_TIMEOUT_MS", "200"),
            ("RETRY_BUDGET_MS", "5000"),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &connection_string),
            ("TELEMETRY_SAMPLE_PERCENT", "20"),
        ],
    );
    // Plain successes whose callers did not sample them (flag 00): the share decides.
    let mut successes = Vec::new();
    for i in 0..SUCCESSES {
        let trace = random_trace();
        let body = claim_body(&common::new_claim(), "12.00");
        let (status, answer) = deliver(
            &handler,
            &host_envelope(&body, &format!("ok-{i}"), 1),
            Some(&format!("00-{trace}-00f067aa0ba902b7-00")),
        )
        .await;
        assert_eq!((status, outcome(&answer)), (200, "paid"));
        successes.push(trace);
    }
    // A success a caller sampled (flag 01) outside the share: kept, so its trace is whole.
    let caller_sampled = std::iter::repeat_with(random_trace)
        .find(|t| !in_share(t, PERCENT))
        .unwrap();
    let body = claim_body(&common::new_claim(), "13.00");
    let (status, _) = deliver(
        &handler,
        &host_envelope(&body, "ok-sampled-by-caller", 1),
        Some(&format!("00-{caller_sampled}-00f067aa0ba902b7-01")),
    )
    .await;
    assert_eq!(status, 200);

    // Failures, all outside the share and unsampled by their callers: invalid messages,
    // and a payout the bank never answered (store and bank dependencies, failed).
    let outside = || {
        std::iter::repeat_with(random_trace)
            .find(|t| !in_share(t, PERCENT))
            .unwrap()
    };
    let mut invalid = Vec::new();
    for i in 0..5 {
        let trace = outside();
        let (status, answer) = deliver(
            &handler,
            &host_envelope(r#"{"claimId":"not-a-uuid"}"#, &format!("bad-{i}"), 1),
            Some(&format!("00-{trace}-00f067aa0ba902b7-00")),
        )
        .await;
        assert_eq!((status, outcome(&answer)), (422, "invalid-message"));
        invalid.push(trace);
    }
    bank.always(Some(BankFault::Unavailable));
    let unknown = outside();
    let body = claim_body(&common::new_claim(), "14.00");
    let (status, answer) = deliver(
        &handler,
        &host_envelope(&body, "unknown-fate", 1),
        Some(&format!("00-{unknown}-00f067aa0ba902b7-00")),
    )
    .await;
    assert_eq!((status, outcome(&answer)), (200, "needs-reconciliation"));
    bank.always(None);
    stop(handler).await;
    let items = ingestion.items();

    // Every item of a trace carries the trace's sample rate.
    let rates_of = |trace: &str| -> Vec<f64> {
        items
            .iter()
            .filter(|i| operation_id(i) == trace && i["data"]["baseType"] != "MetricData")
            .map(|i| i["sampleRate"].as_f64().unwrap_or(f64::NAN))
            .collect()
    };
    // The failures: each exported, whole, at rate 100.
    for trace in &invalid {
        let requests = items_of(&items, "RequestData", trace);
        assert_eq!(requests.len(), 1, "invalid message {trace} not exported");
        assert_eq!(property(requests[0], "outcome"), "invalid-message");
        assert!(
            rates_of(trace).iter().all(|r| *r == 100.0),
            "{:?}",
            rates_of(trace)
        );
    }
    let requests = items_of(&items, "RequestData", &unknown);
    assert_eq!(requests.len(), 1, "the unknown payout was not exported");
    let dependencies = items_of(&items, "RemoteDependencyData", &unknown);
    assert!(
        dependencies
            .iter()
            .any(|d| property(d, "bank.operation") == "payout"),
        "{dependencies:#?}"
    );
    assert!(
        dependencies
            .iter()
            .any(|d| d["data"]["baseData"]["name"] == "sqlite claim"),
        "{dependencies:#?}"
    );
    assert!(rates_of(&unknown).iter().all(|r| *r == 100.0));

    // The successes: exactly those the trace-id rule keeps, each whole, at rate 20.
    let expected: Vec<&String> = successes.iter().filter(|t| in_share(t, PERCENT)).collect();
    let exported: Vec<&String> = successes
        .iter()
        .filter(|t| !items_of(&items, "RequestData", t).is_empty())
        .collect();
    assert!(
        exported == expected,
        "{} successes exported, {} expected by the trace-id rule",
        exported.len(),
        expected.len()
    );
    for trace in &exported {
        assert!(
            !items_of(&items, "RemoteDependencyData", trace).is_empty(),
            "a sampled success lost its dependencies"
        );
        assert!(rates_of(trace).iter().all(|r| *r == PERCENT));
    }
    // And their number is what a 20% share of 120 gives: within four standard deviations
    // of the binomial (n p = 24, sd = 4.4), a bound the rate alone sets.
    let n = SUCCESSES as f64;
    let p = PERCENT / 100.0;
    let sd = (n * p * (1.0 - p)).sqrt();
    let kept = exported.len() as f64;
    assert!(
        (kept - n * p).abs() <= 4.0 * sd,
        "{kept} of {n} successes exported at {PERCENT}%"
    );
    assert_eq!(items_of(&items, "RequestData", &caller_sampled).len(), 1);
    assert!(rates_of(&caller_sampled).iter().all(|r| *r == PERCENT));
}

fn store_count(db: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_counts_equal_store_counts_whatever_the_sampling() {
    let ingestion = Ingestion::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let connection_string = ingestion.connection_string();
    // No success is sampled: the metrics must still count every one.
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &connection_string),
            ("TELEMETRY_SAMPLE_PERCENT", "0"),
        ],
    );
    let mut answered = std::collections::BTreeMap::<String, f64>::new();
    let mut bodies = Vec::new();
    for i in 0..25 {
        let body = claim_body(&common::new_claim(), "21.00");
        let (_, answer) =
            deliver(&handler, &host_envelope(&body, &format!("m-{i}"), 1), None).await;
        *answered.entry(outcome(&answer).to_owned()).or_default() += 1.0;
        bodies.push(body);
    }
    for (i, body) in bodies.iter().enumerate().take(10) {
        let (_, answer) = deliver(&handler, &host_envelope(body, &format!("m-{i}"), 2), None).await;
        *answered.entry(outcome(&answer).to_owned()).or_default() += 1.0;
    }
    bank.always(Some(BankFault::Reject));
    for i in 0..4 {
        let body = claim_body(&common::new_claim(), "22.00");
        let (_, answer) =
            deliver(&handler, &host_envelope(&body, &format!("r-{i}"), 1), None).await;
        *answered.entry(outcome(&answer).to_owned()).or_default() += 1.0;
    }
    bank.always(None);
    for i in 0..3 {
        let (_, answer) =
            deliver(&handler, &host_envelope("{}", &format!("bad-{i}"), 1), None).await;
        *answered.entry(outcome(&answer).to_owned()).or_default() += 1.0;
    }
    stop(handler).await;

    let outcomes = ingestion.metric("claims_payments.outcomes");
    let mut counted = std::collections::BTreeMap::<String, f64>::new();
    for (value, properties) in &outcomes {
        let label = properties["outcome"].as_str().unwrap_or("").to_owned();
        *counted.entry(label).or_default() += value;
    }
    assert_eq!(counted, answered, "metrics against the answers");
    // And against the store: payments paid and rejected, messages recorded.
    let paid = store_count(&db, "SELECT COUNT(*) FROM payments WHERE status = 'paid'");
    let rejected = store_count(
        &db,
        "SELECT COUNT(*) FROM payments WHERE status = 'rejected'",
    );
    // (The inbox also holds this process's own liveness row: messages only.)
    let inbox = store_count(&db, "SELECT COUNT(*) FROM inbox WHERE status = 'completed'");
    assert_eq!(counted.get("paid").copied(), Some(paid as f64));
    assert_eq!(counted.get("rejected").copied(), Some(rejected as f64));
    assert_eq!(
        counted.get("paid").copied().unwrap_or(0.0)
            + counted.get("rejected").copied().unwrap_or(0.0),
        inbox as f64
    );
    // While no success's trace was exported (failures' were: the rejections).
    let requests = ingestion.of_type("RequestData");
    assert!(
        requests.iter().all(
            |r| !["paid", "duplicate"].contains(&property(r, "outcome").as_str().unwrap_or(""))
        ),
        "a success was exported at 0%"
    );
    assert_eq!(requests.len(), 4 + 3, "{requests:#?}");
}

/// A loopback HTTP endpoint that answers every request with `answer` (raw HTTP/1.1 bytes
/// after the request is read) and counts the requests and the bytes it managed to write.
async fn raw_endpoint(
    answer: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    body_bytes: usize,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let written = std::sync::Arc::new(AtomicUsize::new(0));
    let (r, w) = (requests.clone(), written.clone());
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (r, w, answer) = (r.clone(), w.clone(), answer.clone());
            tokio::spawn(async move {
                // Read the request's head and body (Content-Length), then answer.
                let mut seen = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                r.fetch_add(1, Ordering::SeqCst);
                if socket.write_all(&answer()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 * 1024];
                let mut left = body_bytes;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if socket.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    w.fetch_add(n, Ordering::SeqCst);
                    left -= n;
                }
            });
        }
    });
    (
        format!(
            "InstrumentationKey=5e1d7c3a-0b4f-4c8e-9a2d-6f7e8d9c0b1a;IngestionEndpoint=http://{addr}/"
        ),
        requests,
        written,
    )
}

async fn counter(handler: &Handler, name: &str) -> u64 {
    reqwest::get(handler.url("/metrics"))
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()[name]
        .as_u64()
        .unwrap_or(0)
}

/// Waits (bounded) until the handler's counter `name` is above zero.
async fn until_counted(handler: &Handler, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while counter(handler, name).await == 0 {
        assert!(std::time::Instant::now() < deadline, "{name} never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirecting_endpoint_is_not_followed() {
    // The redirect's target: a real ingestion endpoint, which must receive nothing.
    let elsewhere = Ingestion::start().await;
    let target = elsewhere.connection_string();
    let location = target
        .split("IngestionEndpoint=")
        .nth(1)
        .unwrap()
        .to_owned()
        + "v2/track";
    let (redirecting, requests, _) = raw_endpoint(
        move || {
            format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n")
                .into_bytes()
        },
        0,
    )
    .await;
    let bank = FakeBank::start().await;
    let bank_url = bank.url();
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &redirecting),
            ("TELEMETRY_SAMPLE_PERCENT", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let body = claim_body(&common::new_claim(), "10.00");
    let (status, answer) = deliver(&handler, &host_envelope(&body, "m-r", 1), None).await;
    assert_eq!((status, outcome(&answer)), (200, "paid"));
    until_counted(&handler, "telemetryExportFailures").await;
    handler.kill();
    assert!(requests.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert_eq!(elsewhere.posts(), 0, "the upload followed the redirect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_read_no_further_than_its_bound() {
    // 256 MiB of answer to every upload; reading stops at the bound (64 KiB), so what
    // the endpoint can write is that plus the sockets' buffers.
    const ANSWER: usize = 256 * 1024 * 1024;
    let (huge, requests, written) = raw_endpoint(
        || format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {ANSWER}\r\n\r\n").into_bytes(),
        ANSWER,
    )
    .await;
    let bank = FakeBank::start().await;
    let bank_url = bank.url();
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &huge),
            ("TELEMETRY_SAMPLE_PERCENT", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let body = claim_body(&common::new_claim(), "10.00");
    let (status, answer) = deliver(&handler, &host_envelope(&body, "m-h", 1), None).await;
    assert_eq!((status, outcome(&answer)), (200, "paid"));
    until_counted(&handler, "telemetryExportFailures").await;
    let uploads = requests.load(std::sync::atomic::Ordering::SeqCst).max(1);
    handler.kill();
    let per_upload = written.load(std::sync::atomic::Ordering::SeqCst) / uploads;
    eprintln!("{per_upload} bytes of answer written per upload");
    assert!(
        per_upload < 32 * 1024 * 1024,
        "{per_upload} bytes of a hostile answer read per upload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_and_every_delivery_is_answered() {
    // An endpoint that never answers holds the one export in flight; at 100% every
    // delivery adds its spans until the queue is full.
    let (hanging, _) = hanging_endpoint().await;
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &hanging),
            ("TELEMETRY_SAMPLE_PERCENT", "100"),
        ],
    );
    let mut delivered = 0;
    while counter(&handler, "telemetryDropped").await == 0 {
        assert!(delivered < 20_000, "the queue never filled");
        for _ in 0..100 {
            let body = claim_body(&common::new_claim(), "10.00");
            let (status, answer) = deliver(
                &handler,
                &host_envelope(&body, &format!("q-{delivered}"), 1),
                None,
            )
            .await;
            assert_eq!((status, outcome(&answer)), (200, "recorded"));
            delivered += 1;
        }
    }
    eprintln!(
        "{delivered} deliveries, {} spans dropped",
        counter(&handler, "telemetryDropped").await
    );
    handler.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_uploads_are_logged_at_most_once_a_minute() {
    use claims_payments_testkit::process::{ServeProcess, ServeSpec};
    let (failing, requests, _) = raw_endpoint(
        || b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".to_vec(),
        0,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let mut spec = ServeSpec::new(PathBuf::from(EXE))
        .env(
            "PAYMENTS_SQLITE_PATH",
            dir.path().join("p.db").to_string_lossy(),
        )
        .env("LOG_FORMAT", "json")
        .env("APPLICATIONINSIGHTS_CONNECTION_STRING", &failing)
        .env("TELEMETRY_SAMPLE_PERCENT", "100")
        .env("OTEL_BSP_SCHEDULE_DELAY", "20");
    spec.log = Some(log.clone());
    let started = std::time::Instant::now();
    let process = ServeProcess::start(&spec).await.unwrap();
    let client = reqwest::Client::new();
    // Several exports, each retried by the exporter: many failed uploads.
    for i in 0..10 {
        let body = claim_body(&common::new_claim(), "10.00");
        let _ = client
            .post(process.url("/ClaimApproved"))
            .header("Content-Type", "application/json")
            .body(host_envelope(&body, &format!("f-{i}"), 1).to_string())
            .send()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The endpoint counts an upload when it has read it; the handler counts it failed
    // when the answer arrives, a moment later: wait for the handler's count.
    let failures = || async {
        client
            .get(process.url("/metrics"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["telemetryExportFailures"]
            .as_u64()
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while requests.load(std::sync::atomic::Ordering::SeqCst) < 5 || failures().await < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "too few uploads tried"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failures = failures().await;
    process.stop().await;
    let minutes = started.elapsed().as_secs() / 60;
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("telemetry is being lost"))
        .count() as u64;
    eprintln!("{failures} failed uploads, {lines} log lines in {minutes} whole minutes");
    assert!(failures >= 5, "{failures}");
    assert!(lines >= 1, "the loss was never logged");
    assert!(
        lines <= 1 + minutes,
        "{lines} log lines for {failures} failed uploads"
    );
    assert!(
        !text.contains("5e1d7c3a-0b4f-4c8e-9a2d-6f7e8d9c0b1a"),
        "the instrumentation key was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_connection_drops_mid_payout_still_ends_counted_and_recorded() {
    let ingestion = Ingestion::start().await;
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let bank_url = bank.url();
    let connection_string = ingestion.connection_string();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank_url.as_str()),
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", &connection_string),
            ("TELEMETRY_SAMPLE_PERCENT", "0"),
        ],
    );
    // The bank holds the payout while the host gives up on the invocation.
    bank.script([BankFault::Slow(Duration::from_millis(1500))]);
    let body = claim_body(&common::new_claim(), "55.00");
    let envelope = host_envelope(&body, "m-dropped", 1);
    let url = handler.url("/ClaimApproved");
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("Content-Type", "application/json; charset=utf-8")
            .body(envelope.to_string())
            .send()
            .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while bank.traceparents().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the payout never reached the bank"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The connection goes away mid-payout.
    request.abort();
    let _ = request.await;

    // The payout still ends: counted, recorded, and the redelivery finds it done.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counter(&handler, "paid").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped delivery was never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, again) = deliver(&handler, &host_envelope(&body, "m-dropped", 2), None).await;
    assert_eq!((status, outcome(&again)), (200, "duplicate"));
    assert_eq!(bank.effective_payouts(), 1);
    stop(handler).await;
    let paid: f64 = ingestion
        .metric("claims_payments.outcomes")
        .iter()
        .filter(|(_, p)| p["outcome"] == "paid")
        .map(|(v, _)| v)
        .sum();
    assert_eq!(paid, 1.0, "the outcome metric missed the dropped delivery");
}
