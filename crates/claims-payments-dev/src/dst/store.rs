//! The store's faults, as a decorator over the in-memory model: every call takes a few
//! virtual milliseconds (so a crash can land between any two of them), and the run's
//! store faults fire here: lost answers to committed writes, throttling with and without
//! a hint, calls slower than a lease, failing reads, outage and read-only windows.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use claims_payments::seams::store::{
    ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreError, StoreResult, Version, Versioned,
};
use claims_payments::{ClaimId, Purpose};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::chaos::Chaos;
use super::faults::Fault;

pub struct FaultyStore {
    inner: DynStore,
    chaos: Chaos,
    lease: Duration,
    /// (until, writes only): no call, or no write, reaches the store before `until`.
    window: Mutex<Option<(Instant, bool)>>,
}

impl FaultyStore {
    pub fn new(inner: DynStore, chaos: Chaos, lease: Duration) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            chaos,
            lease,
            window: Mutex::new(None),
        })
    }

    /// Before every call: latency, and whether a window refuses it.
    async fn enter(&self, op: &'static str, write: bool) -> StoreResult<()> {
        let dice = self.chaos.dice();
        tokio::time::sleep(dice.millis(1, 5)).await;
        let now = Instant::now();
        {
            let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
            // A window ends when it runs out, or when the run turns calm.
            if window.is_some_and(|(until, _)| until <= now) || !self.chaos.is_on() {
                *window = None;
            }
            if window.is_none() {
                if self.chaos.fires(Fault::StoreOutage, op) {
                    *window = Some((now + dice.millis(500, 30_000), false));
                } else if self.chaos.fires(Fault::StoreReadOnly, op) {
                    *window = Some((now + dice.millis(500, 30_000), true));
                }
            }
            match *window {
                Some((_, false)) => {
                    return Err(StoreError::Transient(format!(
                        "{op}: the store cannot be reached"
                    )))
                }
                Some((_, true)) if write => {
                    return Err(StoreError::Transient(format!(
                        "{op}: the server is read-only (failover)"
                    )))
                }
                _ => {}
            }
        }
        if !write {
            if self.chaos.fires(Fault::StoreReadFails, op) {
                return Err(StoreError::Transient(format!("{op}: read timed out")));
            }
            return Ok(());
        }
        if self.chaos.fires(Fault::StoreThrottled, op) {
            return Err(StoreError::Transient(format!("{op}: throttled (429)")));
        }
        if self.chaos.fires(Fault::StoreThrottledHint, op) {
            tokio::time::sleep(dice.millis(10, 2_000)).await;
        }
        if self.chaos.fires(Fault::StoreSlowBeyondLease, op) {
            tokio::time::sleep(self.lease + dice.millis(1, 30_000)).await;
        }
        Ok(())
    }

    /// After a write committed: its answer may be lost.
    fn leave<T>(&self, op: &'static str, result: StoreResult<T>) -> StoreResult<T> {
        if result.is_ok() && self.chaos.fires(Fault::StoreWriteUnknown, op) {
            return Err(StoreError::Transient(format!(
                "{op}: timed out; the write may have committed"
            )));
        }
        result
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        self.enter("claim", true).await?;
        let result = self.inner.claim(inbox, payment).await;
        self.leave("claim", result)
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        self.enter("inbox", false).await?;
        self.inner.inbox(key).await
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        self.enter("payment", false).await?;
        self.inner.payment(claim, purpose).await
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        self.enter("record_handled", true).await?;
        let result = self.inner.record_handled(inbox).await;
        self.leave("record_handled", result)
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        self.enter("replace_inbox", true).await?;
        let result = self.inner.replace_inbox(inbox, expected).await;
        self.leave("replace_inbox", result)
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        self.enter("finalize", true).await?;
        let result = self.inner.finalize(write).await;
        self.leave("finalize", result)
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        self.enter("list_payments", false).await?;
        self.inner.list_payments(limit).await
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        self.enter("unsettled_payments", false).await?;
        self.inner.unsettled_payments(limit).await
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        self.enter("count_payments", false).await?;
        self.inner.count_payments(status, limit).await
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        self.enter("list_inbox", false).await?;
        self.inner.list_inbox(limit).await
    }

    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        self.enter("purge_expired", true).await?;
        let result = self.inner.purge_expired(now, batch).await;
        self.leave("purge_expired", result)
    }
}
