//! Fault layers for the simulator and tests, built on the product's extension points:
//! a store decorator is a [`StoreDecorator`], and the crash after commit wraps the
//! [`ClaimHandler`] behind `POST /ClaimApproved`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use claims_payments::seams::consumer::{Delivery, Outcome};
use claims_payments::seams::functions::claim_approved::ClaimHandler;
use claims_payments::seams::store::{DynStore, Store, StoreCall, StoreDecorator, StoreResult};
use claims_payments::ClaimApproved;
use rand::RngExt;

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

impl StoreDecorator for SlowStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let on_the_message_path = matches!(
            call,
            StoreCall::Claim { .. }
                | StoreCall::Inbox(_)
                | StoreCall::Payment { .. }
                | StoreCall::RecordHandled(_)
                | StoreCall::ReplaceInbox { .. }
                | StoreCall::Finalize(_)
        );
        if on_the_message_path {
            tokio::time::sleep(self.delay).await;
        }
        work.await
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
