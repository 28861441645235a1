//! The store's faults, as a decorator over the in-memory model: every call takes a few
//! virtual milliseconds (so a crash can land between any two of them), and the run's
//! store faults fire here: lost answers to committed writes, throttling with and without
//! a hint, calls slower than a lease, failing reads, outage and read-only windows.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use claims_payments::seams::store::{
    DynStore, Store, StoreCall, StoreDecorator, StoreError, StoreResult,
};
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

/// The chaos plan's name of each call, and whether it writes.
fn operation(call: &StoreCall<'_>) -> (&'static str, bool) {
    match call {
        StoreCall::Claim { .. } => ("claim", true),
        StoreCall::Inbox(_) => ("inbox", false),
        StoreCall::Payment { .. } => ("payment", false),
        StoreCall::RecordHandled(_) => ("record_handled", true),
        StoreCall::ReplaceInbox { .. } => ("replace_inbox", true),
        StoreCall::Finalize(_) => ("finalize", true),
        StoreCall::ListPayments { .. } => ("list_payments", false),
        StoreCall::UnsettledPayments { .. } => ("unsettled_payments", false),
        StoreCall::CountPayments { .. } => ("count_payments", false),
        StoreCall::ListInbox { .. } => ("list_inbox", false),
        StoreCall::PurgeExpired { .. } => ("purge_expired", true),
    }
}

impl StoreDecorator for FaultyStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let (op, write) = operation(&call);
        self.enter(op, write).await?;
        let result = work.await;
        if write {
            self.leave(op, result)
        } else {
            result
        }
    }
}
