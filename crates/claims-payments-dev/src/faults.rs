//! Fault layers for the simulator and tests, built on the product's extension points:
//! a store decorator is a [`Store`], and the crash after commit wraps the
//! [`ClaimHandler`] behind `POST /ClaimApproved`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use claims_payments::seams::consumer::{Delivery, Outcome};
use claims_payments::seams::functions::claim_approved::ClaimHandler;
use claims_payments::seams::store::{
    ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreResult, Version, Versioned,
};
use claims_payments::{ClaimApproved, ClaimId, Purpose};
use rand::RngExt;
use time::OffsetDateTime;

/// A store that answers every call of the message path late (`PAYMENTS_FAULT_STORE_DELAY_MS`).
pub struct SlowStore {
    inner: DynStore,
    delay: Duration,
}

impl SlowStore {
    pub fn new(inner: DynStore, delay: Duration) -> Self {
        SlowStore { inner, delay }
    }
}

#[async_trait]
impl Store for SlowStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        tokio::time::sleep(self.delay).await;
        self.inner.claim(inbox, payment).await
    }
    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        tokio::time::sleep(self.delay).await;
        self.inner.inbox(key).await
    }
    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        tokio::time::sleep(self.delay).await;
        self.inner.payment(claim, purpose).await
    }
    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        tokio::time::sleep(self.delay).await;
        self.inner.record_handled(inbox).await
    }
    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        tokio::time::sleep(self.delay).await;
        self.inner.replace_inbox(inbox, expected).await
    }
    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        tokio::time::sleep(self.delay).await;
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
    fn expires_by_itself(&self) -> bool {
        self.inner.expires_by_itself()
    }
    async fn failed(&self) -> String {
        self.inner.failed().await
    }
}

/// Dies like a killed process, with the given probability, after the work of an
/// invocation is committed and before the host is answered
/// (`PAYMENTS_FAULT_CRASH_AFTER_COMMIT`): the host then redelivers a message that is done.
pub struct CrashAfterCommit {
    pub inner: Arc<dyn ClaimHandler>,
    pub probability: f64,
}

#[async_trait]
impl ClaimHandler for CrashAfterCommit {
    async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        let outcome = self.inner.handle(msg, delivery).await;
        if outcome.completes_message() && rand::rng().random_bool(self.probability) {
            tracing::warn!("fault injection: SIGKILL after commit, before answering");
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        outcome
    }
}
