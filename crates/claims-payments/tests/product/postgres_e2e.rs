//! The real binary on PostgreSQL, as operators and the Functions host use it: `serve`
//! refuses an unprovisioned database, `provision` migrates it, five deliveries of one
//! message make one payment, `ledger` and `purge` work, a delivery rides out a server
//! that is briefly gone, and no log or error shows the database password.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use claims_payments_testkit::postgres::{available, can_start_servers, PgServer, TestDatabase};
use claims_payments_testkit::process::{free_port, probe_blocking};
use claims_payments_testkit::service::{
    claim_body, deliver_one_message_five_times, host_envelope, outcome, Handler,
};
use serde_json::Value;

const EXE: &str = env!("CARGO_BIN_EXE_claims-payments");

fn env_for(db: &TestDatabase) -> Vec<(&'static str, String)> {
    vec![
        ("PAYMENTS_STORE", "postgres".to_owned()),
        ("PAYMENTS_POSTGRES_URL", db.url.clone()),
    ]
}

fn run(args: &[&str], env: &[(&'static str, String)]) -> Output {
    let mut cmd = Command::new(EXE);
    cmd.args(args).stdin(Stdio::null());
    for key in claims_payments_testkit::process::controlled_env() {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The password in the test database's URI.
fn password(db: &TestDatabase) -> String {
    reqwest::Url::parse(&db.url)
        .unwrap()
        .password()
        .expect("the test server uses a password")
        .to_owned()
}

/// Starts `serve` with `env`, its JSON log written to `log_path`, and waits until it
/// answers; returns the child and its port.
fn serve_logging_to(
    log_path: &std::path::Path,
    env: &[(&'static str, String)],
) -> (std::process::Child, u16) {
    let log = std::fs::File::create(log_path).unwrap();
    let port = free_port().unwrap();
    let mut cmd = Command::new(EXE);
    for key in claims_payments_testkit::process::controlled_env() {
        cmd.env_remove(key);
    }
    let mut child = cmd
        .arg("serve")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env("LOG_FORMAT", "json")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    // A bound for a broken start, not a speed check.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !probe_blocking(port) {
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        assert!(Instant::now() < deadline, "serve did not become ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

#[tokio::test]
async fn five_deliveries_make_one_ledger_row_on_postgres() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let env = env_for(&db);
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let secret = password(&db);

    // Before provisioning, serve refuses to start and says what to run.
    let (status, stderr) = Handler::try_start(EXE, &borrowed, None)
        .err()
        .expect("serve refuses a database without the schema");
    assert!(!status.success());
    assert!(stderr.contains("claims-payments provision"), "{stderr}");
    assert!(!stderr.contains(&secret), "the password leaked: {stderr}");

    let out = run(&["provision"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("migrated to version 2"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains(&secret), "{}", text(&out));

    let claim = deliver_one_message_five_times(EXE, &borrowed).await;

    let out = run(&["ledger", "--json"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["claimId"], claim);
    assert_eq!(rows[0]["amount"], "1250.50");
    assert_eq!(rows[0]["status"], "recorded");
    assert_eq!(rows[0]["messageId"], "claim-approved-1");

    let out = run(&["inbox", "--json"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);

    // Nothing has expired yet: the purge removes nothing and keeps the record.
    let out = run(&["purge"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("purged 0 expired inbox record(s)"),
        "{}",
        text(&out)
    );
}

/// Everything `serve` logs from start to stop, on a provisioned database: it names the
/// store and how it logged in, never the password.
#[tokio::test]
async fn serve_logs_its_store_but_never_the_password() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let env = env_for(&db);
    let secret = password(&db);
    assert!(run(&["provision"], &env).status.success());

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("serve.log");
    let (mut child, _) = serve_logging_to(&log_path, &env);
    // SIGTERM: a graceful stop logs the counters too.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(logs.contains("connected to PostgreSQL"), "{logs}");
    assert!(logs.contains("\"store\":\"postgres\""), "{logs}");
    assert!(!logs.contains(&secret), "the password leaked: {logs}");
}

/// The `Purge` timer function on the product's router, in-process: it applies the
/// retention on PostgreSQL (it is the only thing that does: `serve` never purges on its
/// own) and answers the host with what it removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_timer_function_removes_expired_inbox_records() {
    use claims_payments::seams::configuration::Settings;
    use claims_payments::seams::startup::Composition;
    use claims_payments::seams::store::{AttemptId, DynStore, InboxRecord};
    use claims_payments_postgres::{Access, PostgresSettings, PostgresStore};
    use claims_payments_testkit::records::records;

    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let env = env_for(&db);
    assert!(run(&["provision"], &env).status.success());
    let store: DynStore = std::sync::Arc::new(
        PostgresStore::connect(
            &PostgresSettings::from_url(&db.url).unwrap(),
            Access::Checked,
        )
        .await
        .unwrap(),
    );
    let claim = claims_payments_testkit::fixtures::new_claim();
    let (live, payment) = records(&claim, "m-live", AttemptId::new());
    store.claim(&live, &payment).await.unwrap();
    let (old, _) = records(&claim, "m-old", AttemptId::new());
    let expired = InboxRecord {
        expires_at: time::OffsetDateTime::now_utc() - time::Duration::days(1),
        ..old
    };
    store.record_handled(&expired).await.unwrap();

    let settings = Settings::from_lookup(|_| None).unwrap();
    let application = Composition::new(
        &settings,
        store.clone(),
        claims_payments::seams::Seams::default(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(application.serve(listener, std::future::pending()));
    let timer = serde_json::json!({"Data": {"timer": {"IsPastDue": false}}, "Metadata": {}});
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/Purge"))
        .json(&timer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["ReturnValue"]["outcome"], "purged", "{answer}");
    assert_eq!(
        answer["ReturnValue"]["detail"], "removed 1 expired inbox record(s)",
        "{answer}"
    );
    let left: Vec<String> = store
        .list_inbox(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().message_id.to_string())
        .collect();
    assert_eq!(left, [live.message_id.to_string()]);
}

/// A failover, as the service meets it: the server is gone while a delivery comes in,
/// then back. With the deployed outage wait (`PAYMENTS_POSTGRES_OUTAGE_WAIT_MS`, default
/// 30 s) the delivery keeps trying to connect and ends `recorded` once the server is
/// back, instead of answering `retry-later` at once and spending one of the message's
/// ten deliveries per try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_waits_out_a_server_that_is_briefly_gone() {
    if !available() || !can_start_servers() {
        return;
    }
    let server = PgServer::start().unwrap();
    let env = vec![
        ("PAYMENTS_STORE", "postgres".to_owned()),
        ("PAYMENTS_POSTGRES_URL", server.url("postgres")),
    ];
    assert!(run(&["provision"], &env).status.success());
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("serve.log");
    let (mut child, port) = serve_logging_to(&log_path, &env);

    let server = tokio::task::spawn_blocking(move || {
        server.stop_immediate().unwrap();
        server
    })
    .await
    .unwrap();
    let claim = claims_payments_testkit::fixtures::new_claim();
    let envelope = host_envelope(&claim_body(&claim, "75.00"), "m-outage", 1);
    let delivery = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/ClaimApproved"))
            .header("Content-Type", "application/json; charset=utf-8")
            .body(envelope.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    });
    // The delivery is inside its wait: it said so in the log (a bound for a broken test).
    claims_payments_testkit::wait::wait_until(
        Duration::from_secs(60),
        "the service logs that PostgreSQL cannot be reached",
        || {
            delivery.is_finished()
                || std::fs::read_to_string(&log_path)
                    .unwrap_or_default()
                    .contains("PostgreSQL cannot be reached; trying again")
        },
    )
    .await;
    assert!(
        !delivery.is_finished(),
        "the delivery was answered while the server was gone: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let server = tokio::task::spawn_blocking(move || {
        server.start_again().unwrap();
        server
    })
    .await
    .unwrap();

    let (status, answer) = delivery.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(outcome(&answer), "recorded", "{answer}");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let logs = std::fs::read_to_string(&log_path).unwrap();
    // The wait is counted: the counters logged at the stop say how often it tried again.
    let waits = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["message"] == "counters")
        .filter_map(|l| l["storeOutageWaits"].as_u64())
        .next_back();
    assert!(matches!(waits, Some(n) if n >= 1), "{logs}");
    assert!(!logs.contains(server.password()), "the password leaked");
}

/// `serve` and `ledger` with a role that lacks the documented `SELECT` on
/// `refinery_schema_history` exit 1 naming the SQLSTATE, the server's message and the
/// missing grant, never "db error" alone, and never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_ledger_name_a_missing_grant_on_the_schema_history() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    assert!(run(&["provision"], &env_for(&db)).status.success());
    let role = format!("app_{}", uuid::Uuid::new_v4().simple());
    let secret = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let admin = claims_payments_testkit::postgres::connect(&db.url)
        .await
        .unwrap();
    // docs/deploy.md's grants (4.6, steps 2 and 3), less the history's SELECT.
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{secret}'; \
             GRANT CONNECT ON DATABASE {db} TO {role}; \
             GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; \
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}; \
             REVOKE ALL ON refinery_schema_history FROM {role};",
            db = db.name
        ))
        .await
        .unwrap();
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(&role).unwrap();
    url.set_password(Some(&secret)).unwrap();
    let env = vec![
        ("PAYMENTS_STORE", "postgres".to_owned()),
        ("PAYMENTS_POSTGRES_URL", url.to_string()),
        (
            "FUNCTIONS_CUSTOMHANDLER_PORT",
            free_port().unwrap().to_string(),
        ),
    ];
    for command in ["serve", "ledger"] {
        let out = run(&[command], &env);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{command}: {said}");
        for needle in [
            "SQLSTATE 42501",
            "permission denied for table refinery_schema_history",
            "GRANT SELECT ON refinery_schema_history",
        ] {
            assert!(
                said.contains(needle),
                "{command}: {needle:?} missing from: {said}"
            );
        }
        assert!(
            !said.contains(&secret),
            "{command}: the password leaked: {said}"
        );
    }
}

/// Two instances on one database, as the function app scales out. Instance A dies
/// mid-payout; the host restarts it on its port, and the new process ends the dead
/// one's registration before it answers. A copy of the message that proves nothing about
/// the dead attempt (a producer re-send: a new broker message, DeliveryCount 1) then
/// reaches instance B, which takes the payout over at once because the lease's process
/// has ended. Without the registration it would meet a live lease (120 s), wait
/// `INFLIGHT_WAIT_MS` and answer retry-later, delivery after delivery: what dead-lettered
/// messages in `simulate --instances 4`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_takes_over_at_once_from_a_process_that_died_mid_payout() {
    use claims_payments_testkit::bank::{BankFault, FakeBank};
    use claims_payments_testkit::service::invoke;
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let mut env = env_for(&db);
    assert!(run(&["provision"], &env).status.success());
    let bank = FakeBank::start().await;
    // The first request stays at the bank (which pays it later) while A dies.
    bank.script([BankFault::Slow(Duration::from_secs(3))]);
    env.extend([
        ("BANK_API_URL", bank.url()),
        // The deployed lease; a short in-flight wait so that a wait ends quickly.
        ("LEASE_MS", "120000".to_owned()),
        ("INFLIGHT_WAIT_MS", "1000".to_owned()),
        ("MAX_DELIVERY_COUNT", "200".to_owned()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let client = reqwest::Client::new();
    let body = claim_body(&claims_payments_testkit::fixtures::new_claim(), "615.20");
    let a = Handler::start_on(EXE, &env);
    let b = Handler::start_on(EXE, &env);
    let first = tokio::spawn({
        let (client, envelope, url) = (
            client.clone(),
            host_envelope(&body, "evt-resent", 1),
            a.url("/ClaimApproved"),
        );
        async move { client.post(url).json(&envelope).send().await }
    });
    let a = die_mid_payout_and_restart(a, first, &bank, &env).await;

    let (status, answer) = invoke(&client, &b, &host_envelope(&body, "evt-resent", 1))
        .await
        .unwrap();
    assert_eq!(
        (status, outcome(&answer)),
        (200, "paid"),
        "the other instance takes over from the dead attempt: {answer}"
    );
    drop((a, b));
    assert_eq!(bank.effective_payouts(), 1);
}

/// The same for `POST /api/payments`: the request that held the Idempotency-Key died with
/// its process; once the host restarted that process, the client's retry, answered by the
/// other instance, takes the key over and pays instead of getting 409 `request-in-flight`
/// until the dead request's lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_takes_over_a_key_a_dead_process_held() {
    use claims_payments_testkit::bank::{BankFault, FakeBank};
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let mut env = env_for(&db);
    assert!(run(&["provision"], &env).status.success());
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_secs(3))]);
    env.extend([
        ("BANK_API_URL", bank.url()),
        ("LEASE_MS", "120000".to_owned()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let client = reqwest::Client::new();
    let body = claim_body(&claims_payments_testkit::fixtures::new_claim(), "88.10");
    let post = |handler: &Handler| {
        client
            .post(handler.url("/api/payments"))
            .header("content-type", "application/json")
            .header("Idempotency-Key", "k-instances")
            .body(body.clone())
            .send()
    };
    let a = Handler::start_on(EXE, &env);
    let b = Handler::start_on(EXE, &env);
    let first = tokio::spawn(post(&a));
    let a = die_mid_payout_and_restart(a, first, &bank, &env).await;

    let answer = post(&b).await.unwrap();
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    assert!(
        matches!(status, 200 | 201),
        "the retry takes over from the dead request: {status} {text}"
    );
    drop((a, b));
    assert_eq!(bank.effective_payouts(), 1);
}

/// Waits until `first` (a request to `a`) reached the bank, kills `a` (SIGKILL, the request
/// never answered) and restarts it on its port, as the Functions host does.
async fn die_mid_payout_and_restart<T: std::fmt::Debug>(
    a: Handler,
    first: tokio::task::JoinHandle<Result<T, reqwest::Error>>,
    bank: &claims_payments_testkit::bank::FakeBank,
    env: &[(&str, &str)],
) -> Handler {
    claims_payments_testkit::wait::wait_until(
        Duration::from_secs(30),
        "the payout request reached the bank",
        || !bank.requests().is_empty(),
    )
    .await;
    let port = a.port;
    a.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the killed handler never answers"
    );
    Handler::restart_on(EXE, env, port)
}
