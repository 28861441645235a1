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

/// Pipelined group commit: the writer commits a group and moves on while the syncer
/// flushes the WAL. Neither the claim nor a read that sees the claimed rows may be
/// answered before that flush; otherwise a power cut could undo what an answer (and the
/// host's completion of the message) relied on. The sync is held back with a test gate and
/// the commit is observed through a separate connection.
#[cfg(feature = "dev-tools")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_before_the_commit_it_relies_on_is_synced() {
    use std::time::Duration;

    use claims_payments::store::{AttemptId, ClaimResult, Store};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    let store = SqliteStore::open(&path).unwrap();
    let (inbox, payment) = conformance::records(&common::new_claim(), "m-sync", AttemptId::new());
    let key = inbox.key();

    let gate = store.pause_syncs();
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&inbox, &payment).await }
    });
    let observer = rusqlite::Connection::open(&path).unwrap();
    loop {
        let committed: i64 = observer
            .query_row(
                "SELECT count(*) FROM inbox WHERE message_id = 'm-sync'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if committed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let read = tokio::spawn({
        let store = store.clone();
        async move { store.inbox(&key).await }
    });
    // Without the guard both answers arrive within microseconds of the commit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !claim.is_finished(),
        "the claim was answered before its commit was synced"
    );
    assert!(
        !read.is_finished(),
        "a read was answered from a commit not yet synced"
    );

    drop(gate);
    let claimed = claim.await.unwrap().unwrap();
    assert!(
        matches!(claimed, ClaimResult::Claimed { .. }),
        "{claimed:?}"
    );
    let stored = read.await.unwrap().unwrap().expect("the claimed inbox row");
    assert_eq!(stored.record.message_id.as_str(), "m-sync");
}
