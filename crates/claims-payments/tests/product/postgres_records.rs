//! Records that went wrong on the way, on a real PostgreSQL server (see
//! `claims_payments_testkit::postgres`; skipped with a SKIP line where there is none):
//! an HTTP key record whose create committed but whose answer was lost, and a payment
//! row edited by hand into something that does not parse.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use claims_payments::seams::payments_api::{CallerAuth, PaymentsApi};
use claims_payments::seams::store::{
    ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreError, StoreResult, Version, Versioned,
};
use claims_payments::{ClaimId, Purpose};
use claims_payments_postgres::{provision, Access, PostgresSettings, PostgresStore};
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::postgres::{available, TestDatabase};
use time::OffsetDateTime;

async fn provisioned() -> (TestDatabase, Arc<PostgresStore>) {
    let db = TestDatabase::create().await;
    let settings = PostgresSettings::from_url(&db.url).unwrap();
    provision(&settings).await.unwrap();
    let store = PostgresStore::connect(&settings, Access::Checked)
        .await
        .unwrap();
    (db, Arc::new(store))
}

/// A proxy that loses answers to committed writes of HTTP key records: the statement
/// reaches the server and commits, and the caller hears `Transient`, as when a connection
/// drops after the commit and before the reply. Each fault is armed once.
struct LosesKeyRecordAnswers {
    inner: DynStore,
    /// The next create's answer.
    create: AtomicBool,
    /// The next read of a key record (the read after a lost answer, too).
    read: AtomicBool,
    /// The next replace that changes a key record's owner (a takeover).
    take_over: AtomicBool,
}

impl LosesKeyRecordAnswers {
    fn new(inner: DynStore) -> Self {
        LosesKeyRecordAnswers {
            inner,
            create: AtomicBool::new(false),
            read: AtomicBool::new(false),
            take_over: AtomicBool::new(false),
        }
    }
}

fn key_record(consumer: &str) -> bool {
    consumer == "payments-api"
}

/// Fires `fault` once: true if it was armed.
fn fire(fault: &AtomicBool) -> bool {
    fault.swap(false, Ordering::SeqCst)
}

fn lost() -> StoreError {
    StoreError::Transient("connection closed before the answer (test proxy)".into())
}

#[async_trait]
impl Store for LosesKeyRecordAnswers {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        self.inner.claim(inbox, payment).await
    }
    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        if key_record(&key.consumer) && fire(&self.read) {
            return Err(lost());
        }
        self.inner.inbox(key).await
    }
    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        self.inner.payment(claim, purpose).await
    }
    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        let answer = self.inner.record_handled(inbox).await?;
        if key_record(&inbox.consumer)
            && matches!(answer, InsertResult::Inserted(_))
            && fire(&self.create)
        {
            return Err(lost());
        }
        Ok(answer)
    }
    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        let before = self.inner.inbox(&inbox.key()).await?;
        let version = self.inner.replace_inbox(inbox, expected).await?;
        let owner_changed = before.is_some_and(|b| b.record.owner != inbox.owner);
        if key_record(&inbox.consumer) && owner_changed && fire(&self.take_over) {
            return Err(lost());
        }
        Ok(version)
    }
    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        self.inner.finalize(write).await
    }
    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        self.inner.list_payments(limit).await
    }
    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        self.inner.unsettled_payments(limit).await
    }
    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        self.inner.count_payments(status, limit).await
    }
    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        self.inner.list_inbox(limit).await
    }
    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        self.inner.purge_expired(now, batch).await
    }
}

/// The answer to the key record's committed create is lost. The request
/// re-reads the record, recognises its own (same owner) and pays: 201 on the first try,
/// not a 503 followed by 409 `request-in-flight` for a whole lease; the retry with the
/// same key replays the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_to_the_key_records_create_still_pays_on_the_first_try() {
    if !available() {
        return;
    }
    let (_db, postgres) = provisioned().await;
    let proxy = Arc::new(LosesKeyRecordAnswers::new(postgres));
    proxy.create.store(true, Ordering::SeqCst);
    let store: DynStore = proxy.clone();
    let services = common::ledger_services(store.clone());
    let api = PaymentsApi::new(
        services.consumer(),
        &services,
        CallerAuth::FunctionKey,
        std::time::Duration::from_secs(3600),
    );
    let claim = common::new_claim();
    let body = format!(r#"{{"claimId":"{claim}","amount":"12.00","currency":"EUR"}}"#);
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("idempotency-key", "lost-answer-1".parse().unwrap());

    let first = api.post(&headers, body.as_bytes()).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed);
    assert!(
        !proxy.create.load(Ordering::SeqCst),
        "the proxy lost one answer"
    );

    let retry = api.post(&headers, body.as_bytes()).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed, "the retry replays the stored answer");
    assert_eq!(retry.body, first.body);
    let payments = store.list_payments(10).await.unwrap();
    assert_eq!(payments.len(), 1, "one payment");
}

/// The same after a takeover: a request that cannot even read the record after the lost
/// answer to its create answers 503, and its lease (1 s here) holds the key; the retry
/// after the lease takes the record over, the answer to that replace is lost too, and
/// the retry recognises its own takeover and pays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_to_a_key_records_takeover_still_pays() {
    if !available() {
        return;
    }
    let (_db, postgres) = provisioned().await;
    let proxy = Arc::new(LosesKeyRecordAnswers::new(postgres.clone()));
    let store: DynStore = proxy.clone();
    let services = common::ledger_services(store.clone());
    let api = PaymentsApi::new(
        services.consumer(),
        &services,
        CallerAuth::FunctionKey,
        std::time::Duration::from_secs(3600),
    );
    let claim = common::new_claim();
    let body = format!(r#"{{"claimId":"{claim}","amount":"12.00","currency":"EUR"}}"#);
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("idempotency-key", "lost-answer-2".parse().unwrap());

    proxy.create.store(true, Ordering::SeqCst);
    proxy.read.store(true, Ordering::SeqCst);
    let first = api.post(&headers, body.as_bytes()).await;
    assert_eq!(first.status, 503, "{first:?}");
    let held = postgres.list_inbox(10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    let until = held[0]
        .as_ref()
        .unwrap()
        .lease_until
        .expect("in progress under the lease");
    // The lease runs out (1 s in the test policy); no takeover before it.
    let left = until - OffsetDateTime::now_utc();
    if left.is_positive() {
        tokio::time::sleep(left.unsigned_abs() + std::time::Duration::from_millis(50)).await;
    }

    proxy.take_over.store(true, Ordering::SeqCst);
    let retry = api.post(&headers, body.as_bytes()).await;
    assert!(
        !proxy.take_over.load(Ordering::SeqCst),
        "the takeover's answer was lost"
    );
    assert_eq!(retry.status, 201, "{retry:?}");
    let again = api.post(&headers, body.as_bytes()).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    assert_eq!(again.body, retry.body);
    assert_eq!(store.list_payments(10).await.unwrap().len(), 1);
}

/// On PostgreSQL, payment rows whose amount was edited by hand (SQL) to
/// `80.5` (EUR) are named by `ledger` with claim and column, the rest is listed, the exit
/// code is 4, and the consumer answers `store-failure` for those claims without paying
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_payment_row_is_named_and_the_rest_of_the_ledger_is_listed_on_postgres() {
    if !available() {
        return;
    }
    let (db, store) = provisioned().await;
    let admin = claims_payments_testkit::postgres::connect(&db.url)
        .await
        .unwrap();
    let admin = &admin;
    claims_payments_testkit::corrupt_rows::corrupt_payments_are_named_and_never_paid_again(
        env!("CARGO_BIN_EXE_claims-payments"),
        &[
            ("PAYMENTS_STORE", "postgres"),
            ("PAYMENTS_POSTGRES_URL", &db.url),
        ],
        store,
        |claim| async move {
            let claim = uuid::Uuid::parse_str(&claim).unwrap();
            let changed = admin
                .execute(
                    "UPDATE payments SET amount = $1 WHERE claim_id = $2",
                    &[
                        &claims_payments_testkit::corrupt_rows::NON_CANONICAL_AMOUNT,
                        &claim,
                    ],
                )
                .await
                .unwrap();
            assert_eq!(changed, 1);
        },
    )
    .await;
}
