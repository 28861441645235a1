//! The conformance suite on the Cosmos DB adapter: every test gets its own in-process
//! emulator with the service's container definition provisioned.

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::store::DynStore;
use claims_payments_dev::emulator::InProcessEmulator;
use claims_payments_testkit::conformance::Keep;

/// The inbox documents' `ttl`; the in-process emulator does not expire documents anyway.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

async fn make_store() -> (DynStore, Keep) {
    let emulator = InProcessEmulator::new().unwrap();
    emulator.provision("payments", "payments").await.unwrap();
    let store = emulator
        .store("payments", "payments", RETENTION, Vec::new())
        .await
        .unwrap();
    (Arc::new(store), Box::new(emulator))
}

claims_payments_testkit::store_conformance!(make_store);

/// The once-guard's capability on the same store.
mod once_guard {
    use std::sync::Arc;

    use claims_payments_dev::emulator::InProcessEmulator;
    use claims_payments_testkit::conformance::{DynOnceStore, Keep};

    use super::RETENTION;

    async fn make_store() -> (DynOnceStore, Keep) {
        let emulator = InProcessEmulator::new().unwrap();
        emulator.provision("payments", "payments").await.unwrap();
        let store = emulator
            .store("payments", "payments", RETENTION, Vec::new())
            .await
            .unwrap();
        (Arc::new(store), Box::new(emulator))
    }

    claims_payments_testkit::once_conformance!(make_store);
}
