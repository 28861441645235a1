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
