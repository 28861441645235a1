//! The real binary as a separate process, driven over HTTP exactly as the Functions
//! host drives it: readiness probe, invocation envelopes, SIGKILL and restart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use claims_payments_testkit::bank::{BankFault, FakeBank};
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::process::free_port;
use claims_payments_testkit::service::{
    claim_body, deliver_one_message_five_times, host_envelope, invoke, outcome, Backend, Handler,
};
use claims_payments_testkit::wait::wait_until;
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_claims-payments");

fn ledger(db: &Path) -> Vec<Value> {
    ledger_on(&[("PAYMENTS_SQLITE_PATH", &db.to_string_lossy())])
}

fn ledger_on(env: &[(&str, &str)]) -> Vec<Value> {
    let out = Command::new(EXE)
        .args(["ledger", "--json"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("payments.db");
    (dir, db)
}

async fn five_deliveries_of_one_message_make_one_ledger_row(backend: Backend) {
    let claim = deliver_one_message_five_times(EXE, &backend.env()).await;
    let rows = ledger_on(&backend.env());
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["claimId"], claim);
    assert_eq!(rows[0]["amount"], "1250.50");
    assert_eq!(rows[0]["currency"], "EUR");
    assert_eq!(rows[0]["status"], "recorded");
    assert_eq!(rows[0]["messageId"], "claim-approved-1");
    assert_eq!(rows[0]["bankPaymentId"], Value::Null);
}

#[tokio::test]
async fn five_deliveries_make_one_ledger_row_on_sqlite() {
    five_deliveries_of_one_message_make_one_ledger_row(Backend::sqlite()).await;
}

#[tokio::test]
async fn default_data_type_double_encoded_body_is_understood() {
    let (_dir, db) = temp_db();
    let handler = Handler::start(EXE, &db, &[]);
    let body = claim_body(&common::new_claim(), "10");
    let envelope = json!({
        "Data": {"msg": serde_json::to_string(&body).unwrap()},
        "Metadata": {"MessageId": "\"m-double\"", "DeliveryCount": "1"}
    });
    let (status, answer) = invoke(&reqwest::Client::new(), &handler, &envelope)
        .await
        .unwrap();
    assert_eq!((status, outcome(&answer)), (200, "recorded"), "{answer}");
}

#[tokio::test]
async fn payouts_go_to_the_bank_once_with_the_idempotency_key() {
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let handler = Handler::start(EXE, &db, &[("BANK_API_URL", url.as_str())]);
    let client = reqwest::Client::new();
    let claim = common::new_claim();
    let body = claim_body(&claim, "300.00");
    let (_, first) = invoke(&client, &handler, &host_envelope(&body, "evt-pay", 1))
        .await
        .unwrap();
    let (_, second) = invoke(&client, &handler, &host_envelope(&body, "evt-pay", 2))
        .await
        .unwrap();
    assert_eq!((outcome(&first), outcome(&second)), ("paid", "duplicate"));
    assert_eq!(bank.effective_payouts(), 1);
    let (key, sent) = &bank.requests()[0];
    assert_eq!(key, &format!("claim-payment-{claim}"));
    let sent: Value = serde_json::from_str(sent).unwrap();
    assert_eq!(
        sent,
        json!({"claimId": claim, "amount": "300.00", "currency": "EUR", "payee": "NL91ABNA0417164300", "reference": format!("claim-payment-{claim}")})
    );
    handler.kill();
    let rows = ledger(&db);
    assert_eq!(rows[0]["status"], "paid");
    assert_eq!(rows[0]["bankPaymentId"], "pay-1");
}

#[tokio::test]
async fn invalid_messages_fail_every_delivery_with_a_named_reason() {
    let (_dir, db) = temp_db();
    let handler = Handler::start(EXE, &db, &[]);
    let client = reqwest::Client::new();
    let body =
        json!({"claimId": common::new_claim(), "amount": "12.345", "currency": "EUR"}).to_string();
    for n in 1..=2 {
        let (status, answer) = invoke(&client, &handler, &host_envelope(&body, "evt-bad", n))
            .await
            .unwrap();
        assert_eq!(status, 422);
        assert_eq!(outcome(&answer), "invalid-message");
        assert!(
            answer["ReturnValue"]["detail"]
                .as_str()
                .unwrap()
                .contains("amount"),
            "{answer}"
        );
    }
    let (status, answer) = invoke(&client, &handler, &json!({"Data": {}, "Metadata": {}}))
        .await
        .unwrap();
    assert_eq!((status, outcome(&answer)), (422, "invalid-message"));
    handler.kill();
    assert!(ledger(&db).is_empty());
}

#[tokio::test]
async fn readiness_unknown_routes_and_oversized_bodies_get_json_answers() {
    let (_dir, db) = temp_db();
    let handler = Handler::start(EXE, &db, &[]);
    let client = reqwest::Client::new();
    let ready = client.get(handler.url("/")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let missing = client
        .post(handler.url("/Other"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let huge = "x".repeat(2 * 1024 * 1024);
    let (status, answer) = invoke(&client, &handler, &json!({"Data": {"msg": huge}}))
        .await
        .unwrap();
    assert_eq!(status, 413);
    assert_eq!(outcome(&answer), "invalid-message");
}

#[test]
fn an_invalid_setting_stops_the_process_before_serving_and_names_it() {
    let out = Command::new(EXE)
        .arg("serve")
        .env(
            "FUNCTIONS_CUSTOMHANDLER_PORT",
            free_port().unwrap().to_string(),
        )
        .env("INBOX_RETENTION_DAYS", "forever")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("INBOX_RETENTION_DAYS"));
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let (_dir, db) = temp_db();
    let handler = Handler::start(EXE, &db, &[]);
    let pid = handler.child.id() as i32;
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let mut handler = handler;
    let status = handler.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The deployed timings (infra/main.bicepparam): a plain SIGKILL of `serve` while the
/// payout is at the bank leaves the inbox record under a live 120 s lease. The host
/// restarts the handler and redelivers at once, DeliveryCount + 1 each time; waiting on
/// the dead lease would spend all ten deliveries in 50 s and dead-letter the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_payout_with_production_timings_is_taken_over_by_the_next_delivery() {
    let bank = FakeBank::start().await;
    // The first request stays at the bank (which pays it later) while the handler dies.
    bank.script([BankFault::Slow(Duration::from_secs(8))]);
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let production = [
        ("BANK_API_URL", url.as_str()),
        ("LEASE_MS", "120000"),
        ("INFLIGHT_WAIT_MS", "15000"),
        ("BANK_TIMEOUT_MS", "5000"),
        ("RETRY_BUDGET_MS", "60000"),
        ("MAX_DELIVERY_COUNT", "10"),
    ];
    let client = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "410.00");
    let handler = Handler::start(EXE, &db, &production);
    let first = tokio::spawn({
        let (client, envelope, url) = (
            client.clone(),
            host_envelope(&body, "evt-kill", 1),
            handler.url("/ClaimApproved"),
        );
        async move { client.post(url).json(&envelope).send().await }
    });
    wait_until(
        Duration::from_secs(30),
        "the payout request reached the bank",
        || !bank.requests().is_empty(),
    )
    .await;
    handler.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the killed handler never answers"
    );

    let handler = Handler::start(EXE, &db, &production);
    let mut answers = Vec::new();
    for count in 2..=10 {
        let (status, answer) = invoke(&client, &handler, &host_envelope(&body, "evt-kill", count))
            .await
            .unwrap();
        answers.push(outcome(&answer).to_owned());
        if status == 200 {
            break;
        }
    }
    assert_eq!(
        answers,
        ["paid"],
        "the first redelivery takes over and pays"
    );
    handler.kill();
    assert_eq!(ledger(&db)[0]["status"], "paid");
    // The killed attempt's request is still at the bank; when it lands, the same key
    // makes it a replay, not a second payout.
    wait_until(Duration::from_secs(30), "the second payout request", || {
        bank.requests().len() >= 2
    })
    .await;
    assert_eq!(bank.effective_payouts(), 1);
}

/// The host restarts a handler that died (SIGKILL mid-payout here) and sends nothing
/// until `GET /` answers. By then the new `serve` has ended the dead attempt's lease, so
/// a copy of the message that proves nothing about that attempt (a producer re-send: a
/// new broker message, DeliveryCount 1) takes the payout over at once. Without that it
/// would meet a live lease, wait `INFLIGHT_WAIT_MS` and answer retry-later, delivery
/// after delivery until the lease ran out, and each further restart would cut one of
/// those waits short: the simulator saw messages dead-lettered that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_serve_ends_the_dead_processes_leases_before_it_is_ready() {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_secs(3))]);
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let settings = [
        ("BANK_API_URL", url.as_str()),
        // The deployed lease and retry budget; a short in-flight wait (the delivery
        // count keeps the start-up check satisfied), so a wait ends quickly.
        ("LEASE_MS", "120000"),
        ("INFLIGHT_WAIT_MS", "1000"),
        ("MAX_DELIVERY_COUNT", "200"),
    ];
    let client = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "615.20");
    let handler = Handler::start(EXE, &db, &settings);
    let first = tokio::spawn({
        let (client, envelope, url) = (
            client.clone(),
            host_envelope(&body, "evt-resent", 1),
            handler.url("/ClaimApproved"),
        );
        async move { client.post(url).json(&envelope).send().await }
    });
    wait_until(
        Duration::from_secs(30),
        "the payout request reached the bank",
        || !bank.requests().is_empty(),
    )
    .await;
    handler.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the killed handler never answers"
    );

    let handler = Handler::start(EXE, &db, &settings);
    let (status, answer) = invoke(&client, &handler, &host_envelope(&body, "evt-resent", 1))
        .await
        .unwrap();
    assert_eq!(
        (status, outcome(&answer)),
        (200, "paid"),
        "the re-sent copy takes over from the dead attempt: {answer}"
    );
    handler.kill();
    assert_eq!(ledger(&db)[0]["status"], "paid");
    assert_eq!(bank.effective_payouts(), 1);
}

/// The same for `POST /api/payments`: a request cut by the handler's death leaves its
/// Idempotency-Key leased; the restarted `serve` ends that lease before it is ready, so
/// the client's retry under the same key takes over and pays instead of getting 409
/// `request-in-flight` until the dead request's lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_serve_lets_a_retry_take_over_a_key_the_dead_process_held() {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_secs(3))]);
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let settings = [("BANK_API_URL", url.as_str()), ("LEASE_MS", "120000")];
    let client = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "88.10");
    let handler = Handler::start(EXE, &db, &settings);
    let first = tokio::spawn({
        let (client, body, url) = (client.clone(), body.clone(), handler.url("/api/payments"));
        async move {
            client
                .post(url)
                .header("content-type", "application/json")
                .header("Idempotency-Key", "k-restart")
                .body(body)
                .send()
                .await
        }
    });
    wait_until(
        Duration::from_secs(30),
        "the payout request reached the bank",
        || !bank.requests().is_empty(),
    )
    .await;
    handler.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the killed handler never answers"
    );

    let handler = Handler::start(EXE, &db, &settings);
    let (status, _, answer) = pay(&client, &handler, Some("k-restart"), &body, &[]).await;
    assert!(
        matches!(status, 200 | 201),
        "the retry takes over from the dead request: {status} {answer}"
    );
    handler.kill();
    assert_eq!(ledger(&db)[0]["status"], "paid");
    assert_eq!(bank.effective_payouts(), 1);
}

/// A client that trickles its request headers is cut off, and cannot hold a SIGTERM.
#[test]
fn a_slow_client_is_cut_off_and_cannot_hold_the_shutdown() {
    use std::io::{Read, Write};
    let (_dir, db) = temp_db();
    let mut handler = Handler::start(EXE, &db, &[]);
    let trickle = |port: u16| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .write_all(b"POST /ClaimApproved HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        let mut writer = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            // One header byte a second, until the server hangs up: the slow client is
            // the scenario, not a wait.
            while writer.write_all(b"X").is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        stream
    };
    let mut slow = trickle(handler.port);
    // A safety net for the test itself: without the header timeout the read never ends.
    slow.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut answer = Vec::new();
    let read = slow.read_to_end(&mut answer);
    assert!(
        !matches!(&read, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the server kept a trickling client: {read:?}"
    );

    let _held = trickle(handler.port);
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(handler.child.id() as i32, libc::SIGTERM);
    }
    let status = handler.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Starts `serve` on `db`, which must refuse it; returns its stderr.
fn refused_start(db: &Path, uid: Option<u32>) -> String {
    let path = db.to_string_lossy();
    match Handler::try_start(EXE, &[("PAYMENTS_SQLITE_PATH", path.as_ref())], uid) {
        Ok(handler) => {
            handler.kill();
            panic!(
                "serve started (and would answer GET / ready) on {}",
                db.display()
            );
        }
        Err((status, stderr)) => {
            assert!(!status.success(), "{status}: {stderr}");
            assert!(
                stderr.contains(&db.display().to_string()),
                "the message names the path: {stderr}"
            );
            stderr
        }
    }
}

#[test]
fn serve_refuses_a_file_that_is_not_a_database_and_names_it() {
    let (_dir, db) = temp_db();
    std::fs::write(&db, "claimId,amount\n".repeat(1000)).unwrap();
    let stderr = refused_start(&db, None);
    assert!(stderr.contains("is not a SQLite database"), "{stderr}");
}

/// A database whose pages are damaged: `serve` used to start and fail the messages that
/// touched the damaged pages, for ever. It must refuse to start, naming the file.
#[test]
fn serve_refuses_a_database_with_a_corrupt_page_and_names_it() {
    let (_dir, db) = temp_db();
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE filler (x BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO filler SELECT randomblob(300) FROM n;",
        )
        .unwrap();
    }
    // Garbage over the last page, a leaf of `filler` (rollback journal: all in the file).
    let mut bytes = std::fs::read(&db).unwrap();
    let page = 4096;
    let last = bytes.len() - page;
    bytes[last..].fill(0xA5);
    std::fs::write(&db, bytes).unwrap();

    let stderr = refused_start(&db, None);
    assert!(stderr.contains("is corrupt"), "{stderr}");
    assert!(stderr.contains("quick_check"), "{stderr}");
}

/// The reported case: a database file this (unprivileged) user may only read. SQLite
/// opened it read-only without a word, `serve` answered ready, and every message failed
/// with "attempt to write a readonly database" until it was dead-lettered. Tests run as
/// root, whom permissions do not stop, so as root `serve` runs as `nobody`.
#[test]
fn serve_refuses_a_database_this_user_cannot_write() {
    use std::fs::Permissions;
    use std::os::unix::fs::PermissionsExt;
    let (dir, db) = temp_db();
    // An earlier run's database, killed: its -wal, -shm and lock file are still there.
    Handler::start(EXE, &db, &[]).kill();
    std::fs::set_permissions(&db, Permissions::from_mode(0o444)).unwrap();
    for suffix in ["-wal", "-shm", ".lock"] {
        let mut sidecar = db.as_os_str().to_owned();
        sidecar.push(suffix);
        std::fs::set_permissions(sidecar, Permissions::from_mode(0o666)).unwrap();
    }
    std::fs::set_permissions(dir.path(), Permissions::from_mode(0o777)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        use std::os::unix::process::CommandExt;
        let nobody_can_run_it = Command::new(EXE)
            .arg("--version")
            .uid(65534)
            .gid(65534)
            .output()
            .is_ok_and(|out| out.status.success());
        if !nobody_can_run_it {
            eprintln!("skipped: running as root, and uid 65534 cannot run {EXE}");
            return;
        }
    }

    let stderr = refused_start(&db, root.then_some(65534));
    assert!(stderr.contains("cannot be written"), "{stderr}");
    assert!(stderr.contains("readonly"), "SQLite's own words: {stderr}");
}

/// A mistyped PAYMENTS_SQLITE_PATH used to create an empty database and list
/// `0 payment(s)` with exit 0. Listings and purge must fail, naming the path and the
/// setting, and leave nothing behind.
#[test]
fn listings_and_purge_never_create_a_missing_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("typo.db");
    for args in [
        &["ledger"][..],
        &["ledger", "--json"],
        &["inbox"],
        &["inbox", "--json"],
        &["purge"],
    ] {
        let out = Command::new(EXE)
            .args(args)
            .env("PAYMENTS_SQLITE_PATH", &db)
            .env("RUST_LIB_BACKTRACE", "0")
            .env_remove("PAYMENTS_STORE")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} exited 0: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
        assert!(
            stderr.contains(&db.display().to_string()) && stderr.contains("PAYMENTS_SQLITE_PATH"),
            "{args:?}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?} created {left:?}");
    }
}

/// The embedded store is single-instance: a second `serve` on the same file could answer
/// `duplicate` from the first one's commit before that commit is synced. It is refused;
/// the first keeps serving, and the read-only listings work next to it.
#[tokio::test]
async fn a_second_serve_on_one_database_is_refused_and_the_first_keeps_serving() {
    let (_dir, db) = temp_db();
    let first = Handler::start(EXE, &db, &[]);

    let stderr = refused_start(&db, None);
    assert!(
        stderr.contains("another claims-payments serve") && stderr.contains("holds it"),
        "{stderr}"
    );

    let client = reqwest::Client::new();
    let claim = common::new_claim();
    let (status, answer) = invoke(
        &client,
        &first,
        &host_envelope(&claim_body(&claim, "42.00"), "evt-single", 1),
    )
    .await
    .unwrap();
    assert_eq!((status, outcome(&answer)), (200, "recorded"), "{answer}");

    let rows = ledger(&db);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["claimId"], claim);
    for command in ["ledger", "inbox"] {
        let out = Command::new(EXE)
            .arg(command)
            .env("PAYMENTS_SQLITE_PATH", &db)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("evt-single"));
    }
    first.kill();
}

fn reconcile_cli(db: &Path, bank_url: &str, args: &[&str]) -> (Option<i32>, Value) {
    let out = Command::new(EXE)
        .arg("reconcile")
        .args(["--json", "--older-than", "0s"])
        .args(args)
        .env("PAYMENTS_SQLITE_PATH", db)
        .env("BANK_API_URL", bank_url)
        .env("BANK_KEY_WINDOW_MS", "1000")
        .env("RUST_LIB_BACKTRACE", "0")
        .env_remove("PAYMENTS_STORE")
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code(), report)
}

/// The operator's command and the timer function, on the real binary: a payout left
/// unknown when the bank's key window closed is settled by asking the bank, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_from_the_cli_and_the_timer_settles_an_unknown_payout() {
    let bank = FakeBank::start().await;
    bank.always(Some(BankFault::Unavailable));
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let env = [
        ("BANK_API_URL", url.as_str()),
        ("BANK_KEY_WINDOW_MS", "1000"),
        ("BANK_TIMEOUT_MS", "200"),
        ("RETRY_BUDGET_MS", "5000"),
    ];
    let handler = Handler::start(EXE, &db, &env);
    let client = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "88.00");
    let (_, answer) = invoke(&client, &handler, &host_envelope(&body, "evt-rec", 1))
        .await
        .unwrap();
    assert_eq!(outcome(&answer), "needs-reconciliation");
    bank.always(None);

    // A dry run asks the bank and changes nothing; its verdict is a real run's.
    let (code, dry) = reconcile_cli(&db, &url, &["--dry-run"]);
    assert_eq!((code, &dry["dryRun"]), (Some(0), &json!(true)), "{dry}");
    assert_eq!(dry["lines"][0]["result"], "paid-now", "{dry}");
    assert_eq!(ledger(&db)[0]["status"], "needs_reconciliation");
    assert_eq!(bank.effective_payouts(), 0);
    bank.fail_lookups(1);
    let (code, dry) = reconcile_cli(&db, &url, &["--dry-run"]);
    assert_eq!(
        (code, dry["stillUnknown"].as_u64()),
        (Some(3), Some(1)),
        "a dry run that would leave a payment unknown says so: {dry}"
    );

    // The lookup fails: still unknown, exit 3 (open items), nothing paid.
    bank.fail_lookups(1);
    let (code, report) = reconcile_cli(&db, &url, &[]);
    assert_eq!(
        (code, report["stillUnknown"].as_u64()),
        (Some(3), Some(1)),
        "{report}"
    );
    assert_eq!(bank.effective_payouts(), 0);

    // The timer function, as the host invokes it.
    let timer = json!({
        "Data": {"timer": {"Schedule": {"AdjustForDST": true}, "IsPastDue": false}},
        "Metadata": {"sys": {"MethodName": "Reconcile"}}
    });
    let answer: Value = client
        .post(handler.url("/Reconcile"))
        .json(&timer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["ReturnValue"]["outcome"], "reconciled", "{answer}");
    // The counts a tool acts on, beside the line people read.
    assert_eq!(
        answer["ReturnValue"]["reconcile"],
        json!({"examined": 1, "paidByLookup": 0, "paidNow": 1, "rejected": 0, "stillUnknown": 0,
               "notReached": 0, "moreBeyondLimit": false}),
        "{answer}"
    );
    handler.kill();
    let rows = ledger(&db);
    assert_eq!(rows[0]["status"], "paid", "{rows:?}");
    assert_eq!(bank.effective_payouts(), 1);

    // Nothing left: exit 0, and never paid again.
    let (code, report) = reconcile_cli(&db, &url, &[]);
    assert_eq!(
        (code, report["examined"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );
    assert_eq!(bank.effective_payouts(), 1);
}

/// `reconcile`'s exit codes tell "cannot run" (1) and "usage" (2) from "open items
/// remain" (3), and a duration past the calendar is a usage error, not a panic.
#[test]
fn reconcile_exit_codes_tell_cannot_run_from_usage_from_open_items() {
    let (_dir, db) = temp_db();
    let run = |args: &[&str], env: &[(&str, &str)], db: &Path| {
        let out = Command::new(EXE)
            .arg("reconcile")
            .args(args)
            .env_remove("PAYMENTS_STORE")
            .env_remove("BANK_API_URL")
            .env("PAYMENTS_SQLITE_PATH", db)
            .envs(env.iter().copied())
            .env("RUST_LIB_BACKTRACE", "0")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Cannot run: no database yet, and no bank configured.
    let bank = [("BANK_API_URL", "http://127.0.0.1:9/")];
    let (code, err) = run(&[], &bank, &db);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("payments.db") || err.contains("database"),
        "{err}"
    );
    let (code, err) = run(&[], &[], &db);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("BANK_API_URL"), "{err}");
    // Usage: durations past what a date can hold are refused by name, never a panic.
    for age in ["500000y", "18446744073709551615s", "soon"] {
        let (code, err) = run(&["--older-than", age], &bank, &db);
        assert_eq!(code, Some(2), "{age}: {err}");
        assert!(
            err.contains("--older-than") && !err.contains("panicked"),
            "{age}: {err}"
        );
    }
}

async fn pay(
    client: &reqwest::Client,
    handler: &Handler,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = client
        .post(handler.url("/api/payments"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

fn problem_type(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["type"]
        .as_str()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_owned()
}

/// Every answer of the HTTP payments API, on the real binary and the same store and
/// bank as the message path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_api_answers_as_its_contract_says() {
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let handler = Handler::start(EXE, &db, &[("BANK_API_URL", url.as_str())]);
    let c = reqwest::Client::new();
    let claim = common::new_claim();
    let body = claim_body(&claim, "250.00");

    // First request: 201, Location, the payment resource, one payout.
    let (s1, h1, b1) = pay(&c, &handler, Some("k-1"), &body, &[]).await;
    assert_eq!(s1, 201, "{b1}");
    assert_eq!(h1["location"], format!("/api/payments/{claim}").as_str());
    let resource: Value = serde_json::from_str(&b1).unwrap();
    assert_eq!(
        (resource["status"].as_str(), resource["amount"].as_str()),
        (Some("paid"), Some("250.00"))
    );
    assert_eq!(bank.effective_payouts(), 1);

    // Same key, same payload: the stored answer byte for byte, replayed, no bank call.
    let calls = bank.requests().len();
    let (s2, h2, b2) = pay(&c, &handler, Some("\"k-1\""), &body, &[]).await;
    assert_eq!((s2, b2.as_str()), (201, b1.as_str()));
    assert_eq!(h2["idempotent-replayed"], "true");
    assert_eq!(bank.requests().len(), calls);

    // Same key, another payload: 422.
    let (s3, _, b3) = pay(
        &c,
        &handler,
        Some("k-1"),
        &claim_body(&claim, "251.00"),
        &[],
    )
    .await;
    assert_eq!(
        (s3, problem_type(&b3).as_str()),
        (422, "idempotency-key-reused"),
        "{b3}"
    );

    // A new key for the same claim and payload: 200 with the existing payment.
    let (s4, _, b4) = pay(&c, &handler, Some("k-2"), &body, &[]).await;
    assert_eq!(s4, 200, "{b4}");
    // A new key, the same claim, another amount: 409, the claim already has a payment.
    let (s5, _, b5) = pay(
        &c,
        &handler,
        Some("k-3"),
        &claim_body(&claim, "999.00"),
        &[],
    )
    .await;
    assert_eq!(
        (s5, problem_type(&b5).as_str()),
        (409, "claim-already-paid"),
        "{b5}"
    );
    assert_eq!(bank.effective_payouts(), 1);

    // Missing or malformed key, invalid body, oversized body.
    let (s, h, b) = pay(&c, &handler, None, &body, &[]).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (400, "idempotency-key-missing")
    );
    assert_eq!(h["content-type"], "application/problem+json");
    let (s, _, b) = pay(&c, &handler, Some("\"open"), &body, &[]).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (400, "idempotency-key-invalid")
    );
    let (s, _, b) = pay(
        &c,
        &handler,
        Some("k-4"),
        r#"{"claimId":"x","amount":"1","currency":"EUR"}"#,
        &[],
    )
    .await;
    assert_eq!((s, problem_type(&b).as_str()), (400, "invalid-body"));
    assert!(b.contains("claimId"), "the problem names the field: {b}");
    // The server answers 413 as soon as the limit is passed and closes the connection,
    // which a client still sending may see as a reset instead of the answer.
    // Its own client: the connection it used is closed after the 413, and must not go
    // back to the pool the other requests share.
    let oversized = reqwest::Client::new()
        .post(handler.url("/api/payments"))
        .header("content-type", "application/json")
        .header("Idempotency-Key", "k-5")
        .body("x".repeat(2 * 1024 * 1024))
        .send()
        .await;
    if let Ok(response) = oversized {
        assert_eq!(response.status().as_u16(), 413);
    }

    // Keys are scoped: another tenant's identical key is a new request, not a replay.
    let other = common::new_claim();
    let tenant_body = |t: &str| {
        json!({"claimId": other, "amount": "5.00", "currency": "EUR", "payee": "NL91ABNA0417164300", "tenantId": t}).to_string()
    };
    let (sa, _, _) = pay(&c, &handler, Some("shared"), &tenant_body("acme"), &[]).await;
    let (sb, hb, bb) = pay(&c, &handler, Some("shared"), &tenant_body("globex"), &[]).await;
    assert_eq!(sa, 201);
    assert!(
        hb.get("idempotent-replayed").is_none(),
        "another scope never replays: {bb}"
    );
    assert_ne!(sb, 422, "another scope's key never blocks: {bb}");

    // GET the payment; unknown and malformed claims.
    let get = |path: String| {
        let c = c.clone();
        async move { c.get(path).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        get(handler.url(&format!("/api/payments/{claim}"))).await,
        200
    );
    assert_eq!(
        get(handler.url(&format!("/api/payments/{}", common::new_claim()))).await,
        404
    );
    assert_eq!(get(handler.url("/api/payments/not-a-uuid")).await, 400);
}

/// The bank is down: 503 with Retry-After, the key stays usable, and the retry under
/// the same key pays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_api_answers_503_and_the_retry_pays_once() {
    let bank = FakeBank::start().await;
    bank.always(Some(BankFault::Unavailable));
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", url.as_str()),
            ("BANK_TIMEOUT_MS", "200"),
            ("RETRY_BUDGET_MS", "600"),
        ],
    );
    let c = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "12.00");
    let (s, h, b) = pay(&c, &handler, Some("retry-me"), &body, &[]).await;
    assert_eq!((s, problem_type(&b).as_str()), (503, "unavailable"), "{b}");
    assert!(h.contains_key("retry-after"));
    bank.always(None);
    let (s, h, b) = pay(&c, &handler, Some("retry-me"), &body, &[]).await;
    assert_eq!(s, 201, "{b}");
    assert!(h.get("idempotent-replayed").is_none());
    assert_eq!(bank.effective_payouts(), 1);
    let keys: std::collections::BTreeSet<String> =
        bank.requests().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys.len(),
        1,
        "every attempt under the same bank Idempotency-Key"
    );
}

/// The same key while the first request is still at the bank: 409 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_api_answers_409_while_the_key_is_in_flight() {
    let bank = FakeBank::start().await;
    bank.script([BankFault::Slow(Duration::from_millis(1500))]);
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let handler = Handler::start(EXE, &db, &[("BANK_API_URL", url.as_str())]);
    let c = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "44.00");
    let first = {
        let (c, url, body) = (c.clone(), handler.url("/api/payments"), body.clone());
        tokio::spawn(async move {
            c.post(url)
                .header("Idempotency-Key", "dbl")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    wait_until(
        Duration::from_secs(30),
        "the first request reached the bank",
        || !bank.requests().is_empty(),
    )
    .await;
    let (s, h, b) = pay(&c, &handler, Some("dbl"), &body, &[]).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (409, "request-in-flight"),
        "{b}"
    );
    assert!(h.contains_key("retry-after"));
    assert_eq!(first.await.unwrap(), 201);
    let (s, h, _) = pay(&c, &handler, Some("dbl"), &body, &[]).await;
    assert_eq!(
        (s, h["idempotent-replayed"].to_str().unwrap()),
        (201, "true")
    );
    assert_eq!(bank.effective_payouts(), 1);
}

/// A bank of the test's own, for what the fake bank does not do: it answers every payout
/// with `status` (settable) and, for an error, a body that echoes the request's
/// `Authorization` header (as a careless bank or proxy does); a 2xx is a payment. Each
/// payout waits at `gate` until the test lets it through (open from the start unless
/// the test holds it).
struct EchoBank {
    url: String,
    status: Arc<AtomicU16>,
    arrived: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for EchoBank {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl EchoBank {
    async fn start(status: u16, held: bool) -> EchoBank {
        use axum::http::{HeaderMap, StatusCode};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let status = Arc::new(AtomicU16::new(status));
        let arrived = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let permits = if held {
            0
        } else {
            tokio::sync::Semaphore::MAX_PERMITS
        };
        let gate = Arc::new(tokio::sync::Semaphore::new(permits));
        let (s, a, d, g) = (
            status.clone(),
            arrived.clone(),
            answered.clone(),
            gate.clone(),
        );
        let app = axum::Router::new().route(
            "/payments",
            axum::routing::post(move |headers: HeaderMap| {
                let (s, a, d, g) = (s.clone(), a.clone(), d.clone(), g.clone());
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    let _pass = g.acquire().await.unwrap();
                    d.fetch_add(1, Ordering::SeqCst);
                    let status = StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap();
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let body = if status.is_success() {
                        json!({"paymentId": "p-echo-1"}).to_string()
                    } else {
                        format!("bank error; you sent Authorization: {auth}")
                    };
                    (status, body)
                }
            }),
        );
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        EchoBank {
            url,
            status,
            arrived,
            answered,
            gate,
            server,
        }
    }
}

/// The key records of the HTTP API, as `inbox --json` lists them.
fn key_records(db: &Path) -> Vec<Value> {
    let out = Command::new(EXE)
        .args(["inbox", "--json"])
        .env("PAYMENTS_SQLITE_PATH", db)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["consumer"] == "payments-api")
        .collect()
}

/// The bank's error body never reaches an HTTP client (it may carry our credential). The bank here
/// echoes our `Authorization: Bearer <BANK_API_KEY>` in every error; whatever the bank
/// answers (unavailable, refused, unknowable, refusing our credential), neither the POST
/// nor the GET answer carries the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_of_the_payments_api_carries_the_banks_words() {
    const SECRET: &str = "sk-live-7c1e0f3a9b-do-not-leak";
    let bank = EchoBank::start(503, false).await;
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank.url.as_str()),
            ("BANK_API_KEY", SECRET),
            ("BANK_TIMEOUT_MS", "200"),
            ("RETRY_BUDGET_MS", "600"),
        ],
    );
    let c = reqwest::Client::new();
    for (status, expected) in [(503, 503), (400, 201), (422, 202), (401, 503)] {
        bank.status.store(status, Ordering::SeqCst);
        let claim = common::new_claim();
        let body = claim_body(&claim, "10.00");
        let (s, h, b) = pay(&c, &handler, Some(&format!("leak-{status}")), &body, &[]).await;
        assert_eq!(s, expected, "bank {status}: {b}");
        assert!(
            !b.contains(SECRET) && !format!("{h:?}").contains(SECRET),
            "bank {status}: the answer carries the bank's body: {b}"
        );
        let got = c
            .get(handler.url(&format!("/api/payments/{claim}")))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !got.contains(SECRET),
            "bank {status}: GET carries it: {got}"
        );
    }
    assert!(bank.arrived.load(Ordering::SeqCst) >= 4);
}

/// A client that goes away while the bank holds its payout does not
/// cut the payment short. The work runs on its own task, finishes when the bank answers
/// and stores the answer, so the client's retry gets it at once instead of 409 until
/// the lease (set far beyond the wait here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_payout_gets_the_stored_answer_on_retry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bank = EchoBank::start(200, true).await;
    let (_dir, db) = temp_db();
    let handler = Handler::start(
        EXE,
        &db,
        &[
            ("BANK_API_URL", bank.url.as_str()),
            // A lease far longer than any wait below: only a finished payment can end
            // the 409s within them.
            ("LEASE_MS", "600000"),
            ("INFLIGHT_WAIT_MS", "70000"),
        ],
    );
    let claim = common::new_claim();
    let body = claim_body(&claim, "77.00");
    let addr = format!("127.0.0.1:{}", handler.port);
    // A client written by hand, so the test decides when it goes away.
    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "POST /api/payments HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nIdempotency-Key: gone\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the payout reached the bank",
        || bank.arrived.load(Ordering::SeqCst) == 1,
    )
    .await;
    // The client goes away (FIN), and the server closes the connection: from then on
    // the request's future is gone. Bounded, for a broken server only.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the server answered a client that had gone: {:?}",
        String::from_utf8_lossy(&rest)
    );
    // Only now does the bank pay.
    bank.gate.add_permits(1);
    wait_until(
        Duration::from_secs(60),
        "the payment finished and its answer is stored under the key",
        || key_records(&db).iter().any(|r| r["status"] == "completed"),
    )
    .await;
    let c = reqwest::Client::new();
    let (s, h, b) = pay(&c, &handler, Some("gone"), &body, &[]).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(h["idempotent-replayed"], "true");
    let resource: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (
            resource["status"].as_str(),
            resource["bankPaymentId"].as_str()
        ),
        (Some("paid"), Some("p-echo-1"))
    );
    assert_eq!(bank.answered.load(Ordering::SeqCst), 1, "one payout");
}

fn principal(oid: &str, roles: &[&str]) -> String {
    use base64::Engine;
    let mut claims = vec![
        json!({"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier", "val": oid}),
        json!({"typ": "http://schemas.microsoft.com/identity/claims/tenantid", "val": "72f988bf-86f1-41af-91ab-2d7cd011db47"}),
        json!({"typ": "name", "val": format!("{oid}@example.com")}),
    ];
    for role in roles {
        claims.push(json!({"typ": "roles", "val": role}));
    }
    let principal = json!({
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
        "claims": claims,
    });
    base64::engine::general_purpose::STANDARD.encode(principal.to_string())
}

/// Under `HTTP_AUTH=appservice` every route follows the caller model:
/// a signed-in principal (401 `caller-unknown`), app roles `Payments.Pay` for POST and
/// `Payments.Read` for reading any payment (403 `forbidden`), a payer reads only what it
/// created, and one principal's keys and payments are not another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_app_service_auth_every_route_knows_the_caller() {
    let (_dir, db) = temp_db();
    let handler = Handler::start(EXE, &db, &[("HTTP_AUTH", "appservice")]);
    let c = reqwest::Client::new();
    let alice = principal("11111111-1111-1111-1111-111111111111", &["Payments.Pay"]);
    let bob = principal("22222222-2222-2222-2222-222222222222", &["Payments.Pay"]);
    let auditor = principal("33333333-3333-3333-3333-333333333333", &["Payments.Read"]);
    let nobody = principal("44444444-4444-4444-4444-444444444444", &[]);
    let as_ = |p: &str| vec![("X-MS-CLIENT-PRINCIPAL", p.to_owned())];
    fn with<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        h.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
    let get = |claim: String, h: Vec<(&'static str, String)>| {
        let c = c.clone();
        let url = handler.url(&format!("/api/payments/{claim}"));
        async move {
            let mut r = c.get(url);
            for (k, v) in h {
                r = r.header(k, v);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let claim = common::new_claim();
    let body = claim_body(&claim, "300.00");

    // No principal: 401 on both routes, nothing written.
    let (s, _, b) = pay(&c, &handler, Some("a-1"), &body, &[]).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (401, "caller-unknown"),
        "{b}"
    );
    let (s, b) = get(claim.clone(), vec![]).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (401, "caller-unknown"),
        "{b}"
    );
    // A malformed principal: 401 with a reason, the header never echoed.
    let (s, _, b) = pay(
        &c,
        &handler,
        Some("a-1"),
        &body,
        &[("X-MS-CLIENT-PRINCIPAL", "eyJub3QiOiJqc29u")],
    )
    .await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (401, "caller-unknown"),
        "{b}"
    );
    assert!(!b.contains("eyJub3Qi"), "{b}");
    // Signed in without the role: 403.
    let (s, _, b) = pay(&c, &handler, Some("a-1"), &body, &with(&as_(&nobody))).await;
    assert_eq!((s, problem_type(&b).as_str()), (403, "forbidden"), "{b}");
    let (s, b) = get(claim.clone(), as_(&nobody)).await;
    assert_eq!((s, problem_type(&b).as_str()), (403, "forbidden"), "{b}");
    assert!(ledger(&db).is_empty());

    // Alice pays; her own retry replays; she reads her payment.
    let (s, _, b_alice) = pay(&c, &handler, Some("a-1"), &body, &with(&as_(&alice))).await;
    assert_eq!(s, 201, "{b_alice}");
    let (s, h, b) = pay(&c, &handler, Some("a-1"), &body, &with(&as_(&alice))).await;
    assert_eq!((s, b.as_str()), (201, b_alice.as_str()));
    assert_eq!(h["idempotent-replayed"], "true");
    // X-MS-CLIENT-PRINCIPAL-ID agreeing with the principal is fine; disagreeing is 401.
    let mut agreeing = as_(&alice);
    agreeing.push((
        "X-MS-CLIENT-PRINCIPAL-ID",
        "11111111-1111-1111-1111-111111111111".into(),
    ));
    assert_eq!(get(claim.clone(), agreeing).await.0, 200);
    let mut disagreeing = as_(&alice);
    disagreeing.push((
        "X-MS-CLIENT-PRINCIPAL-ID",
        "22222222-2222-2222-2222-222222222222".into(),
    ));
    assert_eq!(get(claim.clone(), disagreeing).await.0, 401);
    // A new key of her own for the same payment: as for any caller, the existing payment.
    let (s, _, b) = pay(&c, &handler, Some("a-2"), &body, &with(&as_(&alice))).await;
    assert_eq!(s, 200, "{b}");

    // Bob, with Alice's key: his own key, not a replay of hers; and with a key of his
    // own: the claim is paid by someone else, 409 without any of that payment.
    for key in ["a-1", "b-1"] {
        let (s, h, b) = pay(&c, &handler, Some(key), &body, &with(&as_(&bob))).await;
        assert_eq!(
            (s, problem_type(&b).as_str()),
            (409, "claim-already-paid"),
            "{key}: {b}"
        );
        assert!(h.get("idempotent-replayed").is_none());
        assert!(h.get("location").is_none());
        assert!(
            !b.contains("300.00") && !b.contains(&claim),
            "no details: {b}"
        );
    }
    // Bob may not read Alice's payment: to him it does not exist.
    let (s, b) = get(claim.clone(), as_(&bob)).await;
    assert_eq!(
        (s, problem_type(&b).as_str()),
        (404, "payment-not-found"),
        "{b}"
    );
    // The auditor (Payments.Read) reads every payment, but may not pay.
    assert_eq!(get(claim.clone(), as_(&auditor)).await.0, 200);
    let other = claim_body(&common::new_claim(), "1.00");
    let (s, _, b) = pay(&c, &handler, Some("r-1"), &other, &with(&as_(&auditor))).await;
    assert_eq!((s, problem_type(&b).as_str()), (403, "forbidden"), "{b}");

    // Bob's own payment is his to read, and only his (and the auditor's).
    let bobs = common::new_claim();
    let (s, _, b) = pay(
        &c,
        &handler,
        Some("b-2"),
        &claim_body(&bobs, "2.00"),
        &with(&as_(&bob)),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(get(bobs.clone(), as_(&bob)).await.0, 200);
    assert_eq!(get(bobs.clone(), as_(&alice)).await.0, 404);
    assert_eq!(get(bobs, as_(&auditor)).await.0, 200);
    assert_eq!(ledger(&db).len(), 2);
}

/// Loose HTTP input is refused before anything is stored: what is stored is what a retry
/// is compared with, so it must mean one thing only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_api_refuses_loose_input() {
    let bank = FakeBank::start().await;
    let (_dir, db) = temp_db();
    let url = bank.url().to_string();
    let handler = Handler::start(EXE, &db, &[("BANK_API_URL", url.as_str())]);
    let c = reqwest::Client::new();
    let claim = common::new_claim();
    let body = claim_body(&claim, "20.00");

    // Keys that are something else once read as a Structured Field.
    for key in ["a, b", "abc;x=1", ":YWJj:", "\"a\", \"b\""] {
        let (s, _, b) = pay(&c, &handler, Some(key), &body, &[]).await;
        assert_eq!(
            (s, problem_type(&b).as_str()),
            (400, "idempotency-key-invalid"),
            "{key}: {b}"
        );
    }
    // Two header lines are refused as such.
    let two = c
        .post(handler.url("/api/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(two.status().as_u16(), 400);

    // No 400 is stored: a corrected request under the same key is a first request,
    // whether the body failed to parse or the payment could not be made as sent.
    let no_payee = json!({"claimId": claim, "amount": "20.00", "currency": "EUR"}).to_string();
    let negative = claim_body(&claim, "-20.00");
    for (key, wrong) in [("fix-payee", no_payee), ("fix-amount", negative)] {
        let (s, _, b) = pay(&c, &handler, Some(key), &wrong, &[]).await;
        assert_eq!(
            (s, problem_type(&b).as_str()),
            (400, "invalid-body"),
            "{key}: {b}"
        );
    }
    let (s, _, b) = pay(&c, &handler, Some("fix-payee"), &body, &[]).await;
    assert_eq!(s, 201, "{b}");
    let (s, _, b) = pay(&c, &handler, Some("fix-amount"), &body, &[]).await;
    assert_eq!(s, 200, "the same payment again, under another key: {b}");
    assert_eq!(bank.effective_payouts(), 1);

    // A JSON array is not the object the contract asks for (serde would read it
    // positionally: claimId, amount, currency, tenantId, payee, approvedAt).
    let array = json!([
        common::new_claim(),
        "5.00",
        "EUR",
        "acme",
        "NL91ABNA0417164300",
        "2026-12-01T10:15:30Z"
    ])
    .to_string();
    let (s, _, b) = pay(&c, &handler, Some("arr"), &array, &[]).await;
    assert_eq!((s, problem_type(&b).as_str()), (400, "invalid-body"), "{b}");

    // Other media types and content codings: 415.
    let fresh = claim_body(&common::new_claim(), "6.00");
    for (name, value) in [("content-type", "text/plain"), ("content-encoding", "gzip")] {
        let r = c
            .post(handler.url("/api/payments"))
            .header("idempotency-key", format!("media-{name}"))
            .header("content-type", "application/json")
            .header(name, value)
            .body(fresh.clone())
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let b = r.text().await.unwrap();
        assert_eq!(
            (s, problem_type(&b).as_str()),
            (415, "unsupported-media-type"),
            "{name}: {b}"
        );
    }
    assert_eq!(
        ledger(&db).len(),
        1,
        "nothing but the one payment was written"
    );

    // 404s speak of their own route.
    for path in ["/api/payments/", "/api/payment", "/api/payments/x/y"] {
        let r = c.get(handler.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{path}"
        );
        let b = r.text().await.unwrap();
        assert!(
            b.contains("/api/payments") && !b.contains("ClaimApproved"),
            "{path}: {b}"
        );
    }
    let r = c.get(handler.url("/NoSuchFunction")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.text().await.unwrap().contains("ClaimApproved"));
}

/// On SQLite, payment rows whose amount was edited by hand to `80.5`
/// (EUR) are named by `ledger` with claim and column, the rest is listed, the exit code is
/// 4, and the consumer answers `store-failure` for those claims without paying again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_payment_row_is_named_and_the_rest_of_the_ledger_is_listed_on_sqlite() {
    let (_dir, db) = temp_db();
    let store: claims_payments::seams::store::DynStore =
        claims_payments_sqlite::SqliteStore::open(&db).unwrap();
    let path = db.to_string_lossy().into_owned();
    let edit = db.clone();
    claims_payments_testkit::corrupt_rows::corrupt_payments_are_named_and_never_paid_again(
        EXE,
        &[("PAYMENTS_SQLITE_PATH", &path)],
        store,
        |claim| {
            let edit = edit.clone();
            async move {
                let conn = rusqlite::Connection::open(&edit).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                let changed = conn
                    .execute(
                        "UPDATE payments SET amount = ?1 WHERE claim_id = ?2",
                        rusqlite::params![
                            claims_payments_testkit::corrupt_rows::NON_CANONICAL_AMOUNT,
                            claim
                        ],
                    )
                    .unwrap();
                assert_eq!(changed, 1);
            }
        },
    )
    .await;
}

/// A `serve` on `port` over `db`, its JSON log in `log`, its restart state in `state_dir`
/// (TMPDIR), ready.
fn serve_at(db: &Path, port: u16, state_dir: &Path, log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(EXE);
    for key in claims_payments_testkit::process::controlled_env() {
        cmd.env_remove(key);
    }
    let mut child = cmd
        .arg("serve")
        .env("PAYMENTS_SQLITE_PATH", db)
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env("TMPDIR", state_dir)
        .env("LOG_FORMAT", "json")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    // A bound for a broken start, not a speed check.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !claims_payments_testkit::process::probe_blocking(port) {
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not become ready"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// The host restarts a handler that died on the same port. The first restart after a
/// crash answers at once (and ends the dead process's registration); a second crash
/// within a minute is a crash loop, and the next start holds back before it answers (the
/// host holds the invocations meanwhile, at no delivery's cost); a clean stop ends the
/// loop, and the start after it holds nothing.
#[test]
fn a_crash_loop_holds_the_next_start_back_and_a_clean_stop_ends_it() {
    let (dir, db) = temp_db();
    let port = free_port().unwrap();
    let log = |n: u32| dir.path().join(format!("serve-{n}.log"));
    let read = |n: u32| std::fs::read_to_string(log(n)).unwrap();
    let kill = |mut child: std::process::Child| {
        child.kill().unwrap();
        child.wait().unwrap();
    };
    kill(serve_at(&db, port, dir.path(), &log(1)));
    let second = serve_at(&db, port, dir.path(), &log(2));
    assert!(read(2).contains("did not stop cleanly"), "{}", read(2));
    assert!(
        !read(2).contains("holding back"),
        "one crash is no loop: {}",
        read(2)
    );
    kill(second);
    let third = serve_at(&db, port, dir.path(), &log(3));
    assert!(
        read(3).contains("holding back before answering") && read(3).contains("\"holdMs\":250"),
        "the second crash within a minute holds the start back: {}",
        read(3)
    );
    // SIGTERM: a clean stop.
    unsafe {
        libc::kill(third.id() as i32, libc::SIGTERM);
    }
    let status = { third }.wait().unwrap();
    assert!(status.success(), "{status}");
    let fourth = serve_at(&db, port, dir.path(), &log(4));
    assert!(
        !read(4).contains("holding back") && !read(4).contains("did not stop cleanly"),
        "{}",
        read(4)
    );
    kill(fourth);
}
