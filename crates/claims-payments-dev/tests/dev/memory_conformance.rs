//! The conformance suite on the in-memory store, the deterministic simulator's store:
//! every test gets a fresh, empty one.

use std::sync::Arc;

use claims_payments::seams::store::DynStore;
use claims_payments_dev::memory_store::MemoryStore;
use claims_payments_testkit::conformance::Keep;

async fn make_store() -> (DynStore, Keep) {
    (Arc::new(MemoryStore::new()), Box::new(()))
}

claims_payments_testkit::store_conformance!(make_store);
