//! Processes that are not dead, on the real binary and a real PostgreSQL server: one
//! paused past its registration's TTL (a VM frozen for host maintenance, a throttled
//! container) and one that drains after SIGTERM while the next one starts on its port.
//! Neither may be taken for dead once it is known to run: its live payouts stay its own.
//!
//! The bank here holds each new payout until the test lets it go (or until a second
//! request under its key arrives: the bank then finishes it, as a real one would), so
//! every step waits for an event, never for a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use claims_payments_testkit::fixtures::new_claim;
use claims_payments_testkit::postgres::{available, TestDatabase};
use claims_payments_testkit::process::{free_port, probe, ServeSpec};
use claims_payments_testkit::service::{claim_body, host_envelope, outcome};
use claims_payments_testkit::wait::wait_until;
use serde_json::{json, Value};
use tokio::sync::Notify;

const EXE: &str = env!("CARGO_BIN_EXE_claims-payments");
/// Bounds a broken test; a passing one waits exactly as long as each event takes.
const BOUND: Duration = Duration::from_secs(60);

/// A payout key at the bank: held (until let go), or paid.
enum Key {
    Held(Arc<Notify>),
    Paid(String),
}

#[derive(Default)]
struct Books {
    keys: HashMap<String, Key>,
    /// Every payout request: (claimId, status answered; 0 while held).
    requests: Vec<(String, u16)>,
    /// The claim each key pays.
    claims: HashMap<String, String>,
}

/// A bank that holds every new payout until [`GateBank::release`] (or a second request
/// under the same key, which it answers 409 "in progress" while it finishes the first).
#[derive(Clone, Default)]
struct GateBank {
    books: Arc<Mutex<Books>>,
}

impl GateBank {
    async fn start(&self) -> String {
        let app = axum::Router::new()
            .route("/payments", axum::routing::post(pay))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// How many payout requests the bank got for `claim`.
    fn requests_for(&self, claim: &str) -> usize {
        let books = self.books.lock().unwrap();
        books.requests.iter().filter(|(c, _)| c == claim).count()
    }

    /// Lets the held payout of `claim` finish (paid).
    fn release(&self, claim: &str) {
        let books = self.books.lock().unwrap();
        for (key, state) in &books.keys {
            if let (Some(c), Key::Held(go)) = (books.claims.get(key), state) {
                if c == claim {
                    go.notify_one();
                }
            }
        }
    }

    /// Payments made (one per key at most, by construction) for `claim`.
    fn paid_for(&self, claim: &str) -> usize {
        let books = self.books.lock().unwrap();
        books
            .keys
            .iter()
            .filter(|(k, s)| {
                matches!(s, Key::Paid(_)) && books.claims.get(*k).is_some_and(|c| c == claim)
            })
            .count()
    }
}

async fn pay(
    State(bank): State<GateBank>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let claim = body["claimId"].as_str().unwrap_or_default().to_owned();
    let held = {
        let mut books = bank.books.lock().unwrap();
        books.claims.insert(key.clone(), claim.clone());
        let (answer, held) = match books.keys.get(&key) {
            None => {
                let go = Arc::new(Notify::new());
                books.keys.insert(key.clone(), Key::Held(go.clone()));
                (0, Some(go))
            }
            Some(Key::Held(go)) => {
                go.notify_one();
                (409, None)
            }
            Some(Key::Paid(_)) => (200, None),
        };
        books.requests.push((claim, answer));
        if answer == 409 {
            return (StatusCode::CONFLICT, Json(json!({"code": "in-progress"})));
        }
        held
    };
    if let Some(go) = held {
        go.notified().await;
        let id = format!("pay-{}", uuid::Uuid::new_v4().simple());
        let mut books = bank.books.lock().unwrap();
        books.keys.insert(key, Key::Paid(id.clone()));
        return (StatusCode::CREATED, Json(json!({"paymentId": id})));
    }
    let books = bank.books.lock().unwrap();
    match books.keys.get(&key) {
        Some(Key::Paid(id)) => (StatusCode::OK, Json(json!({"paymentId": id}))),
        _ => (StatusCode::CONFLICT, Json(json!({"code": "in-progress"}))),
    }
}

/// One `claims-payments serve` process, its JSON log in a file; SIGKILLed when dropped.
struct Serve {
    child: Child,
    port: u16,
    log: PathBuf,
    /// From spawn to the first answer on `GET /`.
    startup: Duration,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `serve` on `port` (a free one if `None`) and waits until it answers.
    async fn start(env: &[(&str, String)], log: PathBuf, port: Option<u16>) -> Serve {
        let port = port.unwrap_or_else(|| free_port().unwrap());
        let spec = ServeSpec {
            log: Some(log.clone()),
            ..ServeSpec::new(EXE)
        }
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LOG_FORMAT", "json")
        .env("RUST_LIB_BACKTRACE", "0");
        let (mut command, _) = spec.command(port).unwrap();
        let started = Instant::now();
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + BOUND;
        while !probe(port).await {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "serve exited with {status}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "serve did not become ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Serve {
            child,
            port,
            log,
            startup: started.elapsed(),
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Waits (bounded) for the process to exit.
    async fn exited(&mut self) -> ExitStatus {
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "serve did not exit");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn logs(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// The restart state file of `port` in `tmp`: (boot, clean).
fn state_of(tmp: &Path, port: u16) -> (String, bool) {
    let suffix = format!("-{port}.json");
    let path = std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(&suffix))
        .expect("the state file of the port");
    let state: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    (
        state["boot"].as_str().unwrap().to_owned(),
        state["clean"].as_bool().unwrap(),
    )
}

/// The registration of `boot`: (version, whether its lease is live).
async fn registration(db: &tokio_postgres::Client, boot: &str) -> (i64, bool) {
    // A registration's key is the boot's 6 bytes in a version-8 UUID.
    let id = format!("{}-{}-8000-8000-000000000000", &boot[..8], &boot[8..]);
    let row = db
        .query_one(
            "SELECT version, lease_until > now() FROM inbox \
             WHERE consumer = 'process' AND claim_id::text = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// POSTs one delivery of `body` (MessageId `message`, DeliveryCount 1) to `serve`.
async fn deliver(url: String, body: String, message: &'static str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json; charset=utf-8")
        .body(host_envelope(&body, message, 1).to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// A provisioned database, the gate bank and the settings of every process: the
/// deployed lease, and bank timeouts that outlast any payout the test holds; a short
/// in-flight wait, so a delivery that meets a live lease answers retry-later soon.
async fn setup(tmp: &Path) -> (TestDatabase, GateBank, Vec<(&'static str, String)>) {
    let db = TestDatabase::create().await;
    let bank = GateBank::default();
    let url = bank.start().await;
    let env = vec![
        ("PAYMENTS_STORE", "postgres".to_owned()),
        ("PAYMENTS_POSTGRES_URL", db.url.clone()),
        ("BANK_API_URL", url),
        ("BANK_TIMEOUT_MS", "60000".to_owned()),
        ("RETRY_BUDGET_MS", "60000".to_owned()),
        ("LEASE_MS", "300000".to_owned()),
        ("INFLIGHT_WAIT_MS", "1000".to_owned()),
        ("MAX_DELIVERY_COUNT", "2000".to_owned()),
        ("TMPDIR", tmp.to_string_lossy().into_owned()),
    ];
    let mut provision = std::process::Command::new(EXE);
    for key in claims_payments_testkit::process::controlled_env() {
        provision.env_remove(key);
    }
    let out = provision
        .arg("provision")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (db, bank, env)
}

/// Process A is stopped (SIGSTOP) while it pays two claims, for longer than its
/// registration lasts (the test ages the registration in the database instead of
/// waiting out its 30 s). Process B meets A's payout of claim 1, finds A ended and takes
/// it over: right, A could be dead. Then A runs again and renews its registration: from
/// then on B must take A for alive. A copy of claim 2's message at B waits for A's lease
/// and answers retry-later, without a second request to the bank, and A pays claim 2 on
/// its own lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_process_that_renews_its_registration_keeps_its_payouts() {
    if !available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (db, bank, env) = setup(tmp.path()).await;
    let admin = claims_payments_testkit::postgres::connect(&db.url)
        .await
        .unwrap();
    let a = Serve::start(&env, tmp.path().join("a.log"), None).await;
    let (a_boot, _) = state_of(tmp.path(), a.port);
    let b = Serve::start(&env, tmp.path().join("b.log"), None).await;
    let (claim1, claim2) = (new_claim(), new_claim());
    let (body1, body2) = (claim_body(&claim1, "410.00"), claim_body(&claim2, "520.00"));
    let _first1 = tokio::spawn(deliver(a.url("/ClaimApproved"), body1.clone(), "evt-1"));
    let first2 = tokio::spawn(deliver(a.url("/ClaimApproved"), body2.clone(), "evt-2"));
    wait_until(BOUND, "A's payouts reached the bank", || {
        bank.requests_for(&claim1) == 1 && bank.requests_for(&claim2) == 1
    })
    .await;

    a.signal(libc::SIGSTOP);
    let (aged, live) = registration(&admin, &a_boot).await;
    assert!(live, "A registered");
    // What 30 s of pause do to the record; its version stays, as time alone changes it.
    admin
        .execute(
            "UPDATE inbox SET lease_until = now() - interval '1 second' \
             WHERE consumer = 'process' AND claim_id::text = $1",
            &[&format!(
                "{}-{}-8000-8000-000000000000",
                &a_boot[..8],
                &a_boot[8..]
            )],
        )
        .await
        .unwrap();
    let (status, answer) = deliver(b.url("/ClaimApproved"), body1, "evt-1").await;
    assert_eq!(
        (status, outcome(&answer)),
        (200, "paid"),
        "B takes over from a process whose registration ran out: {answer}"
    );

    a.signal(libc::SIGCONT);
    // A renews within RENEW_EVERY (10 s) of running again.
    let deadline = Instant::now() + BOUND;
    loop {
        let (version, live) = registration(&admin, &a_boot).await;
        if live && version != aged {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A did not renew its registration"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, answer) = deliver(b.url("/ClaimApproved"), body2, "evt-2").await;
    assert_eq!(
        outcome(&answer),
        "retry-later",
        "B waits for the live payout of a process that renewed: {status} {answer}"
    );
    assert_eq!(
        bank.requests_for(&claim2),
        1,
        "no second request under claim 2's key"
    );
    bank.release(&claim2);
    let (status, answer) = first2.await.unwrap();
    assert_eq!(
        (status, outcome(&answer)),
        (200, "paid"),
        "A finishes claim 2 on its own lease: {answer}"
    );
    assert!(
        !a.logs().iter().any(
            |l| l["message"].as_str().unwrap_or("").contains("lease lost")
                && l.to_string().contains(&claim2)
        ),
        "A did not lose claim 2's lease"
    );
    assert_eq!((bank.paid_for(&claim1), bank.paid_for(&claim2)), (1, 1));
}

/// Process A drains after SIGTERM with a payout in flight; its port is free, and the
/// host starts B on it. B must leave A alone: A's registration stays live (A still
/// renews it), a copy of the message at B waits for A's lease instead of taking it
/// over, and A finishes the payout and exits 0 without writing its clean stop over B's
/// state. When B is then killed, the next start C finds B crashed and ends B's
/// registration at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_during_a_drain_leaves_the_draining_process_alone() {
    if !available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (db, bank, env) = setup(tmp.path()).await;
    let admin = claims_payments_testkit::postgres::connect(&db.url)
        .await
        .unwrap();
    let mut a = Serve::start(&env, tmp.path().join("a.log"), None).await;
    let port = a.port;
    let (a_boot, _) = state_of(tmp.path(), port);
    let claim = new_claim();
    let body = claim_body(&claim, "615.20");
    let first = tokio::spawn(deliver(a.url("/ClaimApproved"), body.clone(), "evt-drain"));
    wait_until(BOUND, "A's payout reached the bank", || {
        bank.requests_for(&claim) == 1
    })
    .await;

    a.signal(libc::SIGTERM);
    let deadline = Instant::now() + BOUND;
    while probe(port).await {
        assert!(Instant::now() < deadline, "A kept its port");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(a.child.try_wait().unwrap().is_none(), "A drains");
    let mut b = Serve::start(&env, tmp.path().join("b.log"), Some(port)).await;
    eprintln!(
        "B answered {:?} after its start, while A drained",
        b.startup
    );
    let (b_boot, _) = state_of(tmp.path(), port);
    assert_ne!(b_boot, a_boot);
    assert!(
        registration(&admin, &a_boot).await.1,
        "B left the registration of the draining A live"
    );
    let (status, answer) = deliver(b.url("/ClaimApproved"), body, "evt-drain").await;
    assert_eq!(
        outcome(&answer),
        "retry-later",
        "B waits for the payout A still makes: {status} {answer}"
    );
    assert_eq!(
        bank.requests_for(&claim),
        1,
        "no second request under the key"
    );

    bank.release(&claim);
    let (status, answer) = first.await.unwrap();
    assert_eq!((status, outcome(&answer)), (200, "paid"), "{answer}");
    assert!(a.exited().await.success(), "A drained and stopped cleanly");
    assert!(!registration(&admin, &a_boot).await.1, "A ended its own");
    assert_eq!(
        state_of(tmp.path(), port),
        (b_boot.clone(), false),
        "A left B's state as it was"
    );

    b.signal(libc::SIGKILL);
    b.exited().await;
    let c = Serve::start(&env, tmp.path().join("c.log"), Some(port)).await;
    let found = c.logs().into_iter().any(|l| {
        l["previousBoot"] == b_boot.as_str()
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("did not stop cleanly"))
    });
    assert!(found, "C reports B's crash: {:?}", c.logs());
    assert!(
        !registration(&admin, &b_boot).await.1,
        "C ended the registration of the killed B"
    );
    assert_eq!(bank.paid_for(&claim), 1);
}

/// As above, but A is killed while it drains, after B started: A never ends its own
/// registration, and B, which waits for A to exit, ends it then, so A's leases are
/// taken over at once rather than when its registration runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_while_it_drains_is_ended_by_the_start_that_waited_for_it() {
    if !available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (db, bank, env) = setup(tmp.path()).await;
    let admin = claims_payments_testkit::postgres::connect(&db.url)
        .await
        .unwrap();
    let mut a = Serve::start(&env, tmp.path().join("a.log"), None).await;
    let port = a.port;
    let (a_boot, _) = state_of(tmp.path(), port);
    let claim = new_claim();
    // Never answered: A is killed with it in flight.
    let envelope = host_envelope(&claim_body(&claim, "12.00"), "evt-killed", 1).to_string();
    let request = reqwest::Client::new()
        .post(a.url("/ClaimApproved"))
        .header("Content-Type", "application/json; charset=utf-8")
        .body(envelope)
        .send();
    tokio::spawn(async move { request.await.is_err() });
    wait_until(BOUND, "A's payout reached the bank", || {
        bank.requests_for(&claim) == 1
    })
    .await;
    a.signal(libc::SIGTERM);
    let deadline = Instant::now() + BOUND;
    while probe(port).await {
        assert!(Instant::now() < deadline, "A kept its port");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = Serve::start(&env, tmp.path().join("b.log"), Some(port)).await;
    let (version, live) = registration(&admin, &a_boot).await;
    assert!(live, "B left the draining A alone");

    a.signal(libc::SIGKILL);
    a.exited().await;
    // Ended, not run out: running out leaves the version as it was. B logs why after the
    // write commits, so the log line is waited for too, not read once.
    let said_why = || {
        b.logs().iter().any(|l| {
            l["previousBoot"] == a_boot.as_str()
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("exited without a clean stop"))
        })
    };
    let deadline = Instant::now() + BOUND;
    loop {
        let (now_version, live) = registration(&admin, &a_boot).await;
        if !live && now_version != version && said_why() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B did not end the registration of the killed A, or did not say why: {:?}",
            b.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
