//! The conformance suite on the embedded SQLite store.

mod common;
#[macro_use]
mod conformance;

use claims_payments::store::sqlite::SqliteStore;
use claims_payments::store::DynStore;

async fn make_store() -> (DynStore, conformance::Keep) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("payments.db")).unwrap();
    (store, Box::new(dir))
}

store_conformance!(make_store);

/// A claim whose group the writer has committed (visible to any connection) while the
/// syncer is held back, so the commit is not yet durable.
#[cfg(feature = "dev-tools")]
struct CommittedNotSynced {
    dir: tempfile::TempDir,
    store: std::sync::Arc<SqliteStore>,
    key: claims_payments::store::InboxKey,
    pause: claims_payments::store::sqlite::SyncPause,
    claim: tokio::task::JoinHandle<
        claims_payments::store::StoreResult<claims_payments::store::ClaimResult>,
    >,
}

#[cfg(feature = "dev-tools")]
impl CommittedNotSynced {
    async fn start(message_id: &str) -> Self {
        use claims_payments::store::{AttemptId, Store};

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payments.db");
        let store = SqliteStore::open(&path).unwrap();
        let (inbox, payment) =
            conformance::records(&common::new_claim(), message_id, AttemptId::new());
        let key = inbox.key();
        let pause = store.pause_syncs();
        let claim = tokio::spawn({
            let store = store.clone();
            async move { store.claim(&inbox, &payment).await }
        });
        let observer = rusqlite::Connection::open(&path).unwrap();
        while observer
            .query_row(
                "SELECT count(*) FROM inbox WHERE message_id = ?1",
                [message_id],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
            == 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
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
#[cfg(feature = "dev-tools")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_before_the_commit_it_relies_on_is_synced() {
    use claims_payments::store::{ClaimResult, Store};

    let held = CommittedNotSynced::start("m-sync").await;
    let read = tokio::spawn({
        let (store, key) = (held.store.clone(), held.key.clone());
        async move { store.inbox(&key).await }
    });
    // Without the guard both answers arrive within microseconds of the commit.
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
/// as a failed sync (which exits the process), and the committed row must survive.
#[cfg(feature = "dev-tools")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_with_a_group_still_to_sync_keeps_the_commit() {
    use claims_payments::store::Store;

    let held = CommittedNotSynced::start("m-dropped").await;
    held.claim.abort();
    assert!(held.claim.await.unwrap_err().is_cancelled());
    drop(held.store);
    // Every connection closes (the checkpointer's within one round), which deletes the WAL.
    let wal = held.dir.path().join("payments.db-wal");
    while wal.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(held.pause);

    let reopened = SqliteStore::open(held.dir.path().join("payments.db")).unwrap();
    let stored = reopened
        .inbox(&held.key)
        .await
        .unwrap()
        .expect("the committed claim");
    assert_eq!(stored.record.message_id.as_str(), "m-dropped");
}
