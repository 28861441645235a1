//! The conformance suite on the embedded SQLite store.

use std::time::Duration;

use claims_payments::seams::store::DynStore;
use claims_payments_sqlite::SqliteStore;
use claims_payments_testkit::conformance::Keep;
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::records::records;
use claims_payments_testkit::sync_gate::{SyncGate, SyncPause};
use claims_payments_testkit::wait::wait_until;

async fn make_store() -> (DynStore, Keep) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("payments.db")).unwrap();
    (store, Box::new(dir))
}

claims_payments_testkit::store_conformance!(make_store);

/// The once-guard's capability on the same store.
mod once_guard {
    use claims_payments_sqlite::SqliteStore;
    use claims_payments_testkit::conformance::{DynOnceStore, Keep};

    async fn make_store() -> (DynOnceStore, Keep) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("payments.db")).unwrap();
        (store, Box::new(dir))
    }

    claims_payments_testkit::once_conformance!(make_store);
}

/// A claim whose group the writer has committed (visible to any connection) while the
/// syncer is held back, so the commit is not yet durable.
struct CommittedNotSynced {
    dir: tempfile::TempDir,
    store: std::sync::Arc<SqliteStore>,
    key: claims_payments::seams::store::InboxKey,
    pause: SyncPause,
    claim: tokio::task::JoinHandle<
        claims_payments::seams::store::StoreResult<claims_payments::seams::store::ClaimResult>,
    >,
}

impl CommittedNotSynced {
    async fn start(message_id: &str) -> Self {
        use claims_payments::seams::store::{AttemptId, Store};

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payments.db");
        let gate = SyncGate::new();
        let store = SqliteStore::open_with_sync_hook(&path, gate.clone()).unwrap();
        let (inbox, payment) = records(&common::new_claim(), message_id, AttemptId::new());
        let key = inbox.key();
        let pause = gate.pause();
        let claim = tokio::spawn({
            let store = store.clone();
            async move { store.claim(&inbox, &payment).await }
        });
        let observer = rusqlite::Connection::open(&path).unwrap();
        wait_until(Duration::from_secs(10), "the claim is committed", || {
            observer
                .query_row(
                    "SELECT count(*) FROM inbox WHERE message_id = ?1",
                    [message_id],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap()
                > 0
        })
        .await;
        CommittedNotSynced {
            dir,
            store,
            key,
            pause,
            claim,
        }
    }
}

/// Pipelined group commit: the writer commits a group and moves on while the syncer
/// flushes the WAL. Neither the claim nor a read that sees the claimed rows may be
/// answered before that flush; otherwise a power cut could undo what an answer (and the
/// host's completion of the message) relied on. The sync is held back with a test gate and
/// the commit is observed through a separate connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_before_the_commit_it_relies_on_is_synced() {
    use claims_payments::seams::store::{ClaimResult, Store};

    let held = CommittedNotSynced::start("m-sync").await;
    let read = tokio::spawn({
        let (store, key) = (held.store.clone(), held.key.clone());
        async move { store.inbox(&key).await }
    });
    // Without the guard both answers arrive within microseconds of the commit. Kept as
    // a sleep: it is the window in which nothing may happen, there is no event to await.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !held.claim.is_finished(),
        "the claim was answered before its commit was synced"
    );
    assert!(
        !read.is_finished(),
        "a read was answered from a commit not yet synced"
    );

    drop(held.pause);
    let claimed = held.claim.await.unwrap().unwrap();
    assert!(
        matches!(claimed, ClaimResult::Claimed { .. }),
        "{claimed:?}"
    );
    let stored = read.await.unwrap().unwrap().expect("the claimed inbox row");
    assert_eq!(stored.record.message_id.as_str(), "m-sync");
}

/// A caller may give up on a write (its invocation was cancelled) and the store may be
/// dropped before the syncer reaches that group. SQLite then deletes the WAL on its last
/// close, after checkpointing it; the syncer must take that as nothing left to flush, not
/// as a failed sync (which stops the store), and the committed row must survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_with_a_group_still_to_sync_keeps_the_commit() {
    use claims_payments::seams::store::Store;

    let held = CommittedNotSynced::start("m-dropped").await;
    held.claim.abort();
    assert!(held.claim.await.unwrap_err().is_cancelled());
    drop(held.store);
    // Every connection closes (the checkpointer's within one round), which deletes the WAL.
    let wal = held.dir.path().join("payments.db-wal");
    wait_until(Duration::from_secs(10), "the WAL is deleted", || {
        !wal.exists()
    })
    .await;
    drop(held.pause);

    let reopened = SqliteStore::open(held.dir.path().join("payments.db")).unwrap();
    let stored = reopened
        .inbox(&held.key)
        .await
        .unwrap()
        .expect("the committed claim");
    assert_eq!(stored.record.message_id.as_str(), "m-dropped");
}

/// Log lines written while a test runs on the current thread.
#[derive(Clone, Default)]
struct CapturedLogs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A store failure that retrying cannot heal (here the adapter's own: a database this
/// process may only read, so every write is refused) is answered `store-failure` with a
/// 500, never `retry-later`, and logged as an error with `storeError = "permanent"`. The
/// message is not completed, so it is kept for a re-drive once the store is repaired.
/// A current-thread runtime, so the thread's log capture sees the server's tasks.
#[tokio::test(flavor = "current_thread")]
async fn a_permanent_store_failure_is_answered_and_logged_as_permanent() {
    use claims_payments::seams::configuration::Settings;
    use claims_payments::seams::startup::Composition;
    use claims_payments::seams::Seams;
    use claims_payments_sqlite::Access;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    drop(SqliteStore::open(&path).unwrap());
    let store = SqliteStore::open_as(&path, Access::ReadOnly).unwrap();

    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // The application as the default settings wire it, on the read-only store: served
    // without the process's lifecycle, since such a store cannot even register it.
    let settings = Settings::from_lookup(|_| None).unwrap();
    let application = Composition::new(&settings, store, Seams::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(application.serve(listener, std::future::pending()));

    let body = format!(
        r#"{{"claimId":"{}","amount":"10.00","currency":"EUR"}}"#,
        common::new_claim()
    );
    let envelope = serde_json::json!({
        "Data": {"msg": serde_json::to_string(&body).unwrap()},
        "Metadata": {"MessageId": "\"m-store-failure\"", "DeliveryCount": "1"}
    });
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/ClaimApproved"))
        .json(&envelope)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        (status, answer["ReturnValue"]["outcome"].as_str()),
        (500, Some("store-failure")),
        "{answer}"
    );

    let lines = logs.lines();
    let failed = lines
        .iter()
        .find(|l| l["fields"]["storeError"].is_string())
        .unwrap_or_else(|| panic!("no storeError log line in {lines:#?}"));
    assert_eq!(failed["level"], "ERROR", "{failed}");
    assert_eq!(failed["fields"]["storeError"], "permanent", "{failed}");
    assert_eq!(failed["fields"]["messageId"], "m-store-failure", "{failed}");
    assert!(
        failed["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("read-only"),
        "the log names the cause: {failed}"
    );
}

/// After a failed WAL sync no retry can prove the pages durable: the writes waiting on
/// that sync are refused as permanent (so their messages are not completed), every later
/// write is refused, and the store reports itself failed, which stops the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_refuses_its_writes_and_fails_the_store() {
    use claims_payments::seams::store::{AttemptId, Store, StoreError};

    let dir = tempfile::tempdir().unwrap();
    let gate = SyncGate::new();
    let store =
        SqliteStore::open_with_sync_hook(dir.path().join("payments.db"), gate.clone()).unwrap();
    gate.fail_next();
    let (inbox, payment) = records(&common::new_claim(), "m-1", AttemptId::new());
    let refused = store.claim(&inbox, &payment).await;
    assert!(
        matches!(refused, Err(StoreError::Permanent(ref reason)) if reason.contains("WAL sync failed")),
        "{refused:?}"
    );
    let reason = tokio::time::timeout(std::time::Duration::from_secs(10), store.failed())
        .await
        .expect("the store reports its failure");
    assert!(reason.contains("injected fdatasync failure"), "{reason}");
    let (inbox, payment) = records(&common::new_claim(), "m-2", AttemptId::new());
    assert!(matches!(
        store.claim(&inbox, &payment).await,
        Err(StoreError::Permanent(_))
    ));
}

/// The server acts on a failed store: `serve` stops and returns an error (the binary
/// then exits non-zero and the host restarts it), instead of answering from a store
/// that can no longer make anything durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_stops_the_server_with_an_error() {
    use claims_payments::seams::configuration::Settings;
    use claims_payments::seams::startup::serve;
    use claims_payments::seams::store::{AttemptId, DynStore, Store};
    use claims_payments::seams::Seams;

    let dir = tempfile::tempdir().unwrap();
    let gate = SyncGate::new();
    let store =
        SqliteStore::open_with_sync_hook(dir.path().join("hooked.db"), gate.clone()).unwrap();
    let configured = dir.path().join("payments.db");
    let settings = Settings::from_lookup(|name| match name {
        "PAYMENTS_SQLITE_PATH" => Some(configured.to_string_lossy().into_owned()),
        "FUNCTIONS_CUSTOMHANDLER_PORT" => Some("0".into()),
        _ => None,
    })
    .unwrap();
    let served: DynStore = store.clone();
    let server = tokio::spawn(serve(
        settings,
        Seams {
            store_layer: Some(Box::new(move |_opened| served)),
            ..Seams::default()
        },
    ));

    // Once the server has registered its process (its last write before it serves), the
    // next sync fails: the claim's.
    // A bound for a broken start, not a speed check.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !store
        .list_inbox(10)
        .await
        .is_ok_and(|rows| rows.iter().flatten().any(|r| r.consumer == "process"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "serve never registered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    gate.fail_next();
    let (inbox, payment) = records(&common::new_claim(), "m-1", AttemptId::new());
    assert!(store.claim(&inbox, &payment).await.is_err());
    // A guard against hanging if the server ignored the failure, not a speed check.
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(60), server)
        .await
        .expect("the server stops once its store failed")
        .unwrap();
    let error = stopped.expect_err("a failed store is an error").to_string();
    assert!(error.contains("store failed"), "{error}");
    assert!(error.contains("WAL sync failed"), "{error}");
}

/// Counts the purges that reach the store, and says when the server's background tasks
/// have started (`serve` watches `failed()` from the last task it spawns).
struct PurgeCounter {
    inner: DynStore,
    purges: std::sync::atomic::AtomicUsize,
    watched: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl claims_payments::seams::store::Store for PurgeCounter {
    async fn claim(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
        payment: &claims_payments::seams::store::PaymentRecord,
    ) -> claims_payments::seams::store::StoreResult<claims_payments::seams::store::ClaimResult>
    {
        self.inner.claim(inbox, payment).await
    }
    async fn inbox(
        &self,
        key: &claims_payments::seams::store::InboxKey,
    ) -> claims_payments::seams::store::StoreResult<
        Option<
            claims_payments::seams::store::Versioned<claims_payments::seams::store::InboxRecord>,
        >,
    > {
        self.inner.inbox(key).await
    }
    async fn payment(
        &self,
        claim: claims_payments::ClaimId,
        purpose: claims_payments::Purpose,
    ) -> claims_payments::seams::store::StoreResult<
        Option<
            claims_payments::seams::store::Versioned<claims_payments::seams::store::PaymentRecord>,
        >,
    > {
        self.inner.payment(claim, purpose).await
    }
    async fn record_handled(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
    ) -> claims_payments::seams::store::StoreResult<claims_payments::seams::store::InsertResult>
    {
        self.inner.record_handled(inbox).await
    }
    async fn replace_inbox(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
        expected: &claims_payments::seams::store::Version,
    ) -> claims_payments::seams::store::StoreResult<claims_payments::seams::store::Version> {
        self.inner.replace_inbox(inbox, expected).await
    }
    async fn finalize(
        &self,
        write: claims_payments::seams::store::Finalize<'_>,
    ) -> claims_payments::seams::store::StoreResult<()> {
        self.inner.finalize(write).await
    }
    async fn list_payments(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Listed<claims_payments::seams::store::PaymentRecord>>,
    > {
        self.inner.list_payments(limit).await
    }
    async fn unsettled_payments(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Versioned<claims_payments::seams::store::PaymentRecord>>,
    > {
        self.inner.unsettled_payments(limit).await
    }
    async fn count_payments(
        &self,
        status: claims_payments::seams::store::PaymentStatus,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<usize> {
        self.inner.count_payments(status, limit).await
    }
    async fn list_inbox(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Listed<claims_payments::seams::store::InboxRecord>>,
    > {
        self.inner.list_inbox(limit).await
    }
    async fn purge_expired(
        &self,
        now: time::OffsetDateTime,
        batch: usize,
    ) -> claims_payments::seams::store::StoreResult<u64> {
        self.purges
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.purge_expired(now, batch).await
    }
    async fn failed(&self) -> String {
        self.watched.notify_one();
        self.inner.failed().await
    }
}

/// The `Purge` timer (`PURGE_SCHEDULE`) is the retention's only owner: `serve` starts no
/// purge of its own. Once `serve` has spawned its background tasks (the store-failure
/// watcher is the last it spawns), a timer set after them fires only after every timer
/// they set before it, and yielding lets every task woken so runs: a purge started with
/// the server (the hourly one that was here ran its first round at once) would have been
/// counted. The order of timers is what counts, not how long anything takes; that nothing
/// else in the product calls the purge (a later first round) is checked from the source
/// (`tests/product/architecture.rs`).
#[tokio::test(flavor = "current_thread")]
async fn serve_never_purges_on_its_own() {
    use claims_payments::seams::configuration::Settings;
    use claims_payments::seams::startup::serve;
    use claims_payments::seams::Seams;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    let settings = Settings::from_lookup(|name| match name {
        "PAYMENTS_SQLITE_PATH" => Some(path.to_string_lossy().into_owned()),
        "FUNCTIONS_CUSTOMHANDLER_PORT" => Some("0".into()),
        _ => None,
    })
    .unwrap();
    let counter = Arc::new(PurgeCounter {
        inner: SqliteStore::open(dir.path().join("counted.db")).unwrap(),
        purges: Default::default(),
        watched: tokio::sync::Notify::new(),
    });
    let served: DynStore = counter.clone();
    let server = tokio::spawn(serve(
        settings,
        Seams {
            store_layer: Some(Box::new(move |_opened| served)),
            ..Seams::default()
        },
    ));
    counter.watched.notified().await;
    // Due after every timer the server's tasks set on their first run.
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!server.is_finished(), "serve is running");
    assert_eq!(
        counter.purges.load(Ordering::SeqCst),
        0,
        "serve purged on its own; only the Purge timer may"
    );
    server.abort();
}

/// The application as `serve` builds it, on a free port: it reports the port it holds,
/// and by the time it answers there, it has registered its process (so its attempts'
/// leases count as live from the first one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_answers_on_the_port_it_reports_once_registered() {
    use claims_payments::seams::configuration::Settings;
    use claims_payments::seams::startup::Application;
    use claims_payments::seams::Seams;
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    let settings = Settings::from_lookup(|name| match name {
        "PAYMENTS_SQLITE_PATH" => Some(path.to_string_lossy().into_owned()),
        "FUNCTIONS_CUSTOMHANDLER_PORT" => Some("0".into()),
        _ => None,
    })
    .unwrap();
    let served: Arc<Mutex<Option<DynStore>>> = Arc::default();
    let slot = served.clone();
    let application = Application::build(
        settings,
        Seams {
            store_layer: Some(Box::new(move |opened: DynStore| {
                *slot.lock().unwrap() = Some(opened.clone());
                opened
            })),
            ..Seams::default()
        },
    )
    .await
    .unwrap();
    let port = application.port();
    assert_ne!(
        port, 0,
        "port 0 asks for a free port; the one held is reported"
    );
    let server = tokio::spawn(application.run_until_stopped());

    let ready = reqwest::get(format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let store = served
        .lock()
        .unwrap()
        .clone()
        .expect("the store the parts use");
    let registrations = store
        .list_inbox(10)
        .await
        .unwrap()
        .into_iter()
        .flatten()
        .filter(|r| r.consumer == "process")
        .count();
    assert_eq!(registrations, 1, "registered before the first answer");
    assert!(!server.is_finished(), "still serving");
    server.abort();
}
