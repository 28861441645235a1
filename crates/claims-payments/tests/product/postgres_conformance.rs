//! The conformance suite on the PostgreSQL store, against a real server: a throwaway one
//! started by the testkit (Debian's postgresql-15), or `PAYMENTS_TEST_POSTGRES_URL`. Each
//! test gets a database of its own, migrated by the product's own provisioning.

use std::sync::Arc;

use claims_payments::seams::store::DynStore;
use claims_payments_postgres::{provision, Access, PostgresSettings, PostgresStore};
use claims_payments_testkit::conformance::Keep;
use claims_payments_testkit::postgres::{available, TestDatabase};

async fn make_store() -> (DynStore, Keep) {
    let db = TestDatabase::create().await;
    let settings = PostgresSettings::from_url(&db.url).unwrap();
    provision(&settings).await.unwrap();
    let store = PostgresStore::connect(&settings, Access::Checked)
        .await
        .unwrap();
    (Arc::new(store), Box::new(db))
}

claims_payments_testkit::store_conformance!(make_store, if available);

/// The once-guard's capability on the same store.
mod once_guard {
    use std::sync::Arc;

    use claims_payments_postgres::{provision, Access, PostgresSettings, PostgresStore};
    use claims_payments_testkit::conformance::{DynOnceStore, Keep};
    use claims_payments_testkit::postgres::{available, TestDatabase};

    async fn make_store() -> (DynOnceStore, Keep) {
        let db = TestDatabase::create().await;
        let settings = PostgresSettings::from_url(&db.url).unwrap();
        provision(&settings).await.unwrap();
        let store = PostgresStore::connect(&settings, Access::Checked)
            .await
            .unwrap();
        (Arc::new(store), Box::new(db))
    }

    claims_payments_testkit::once_conformance!(make_store, if available);
}
