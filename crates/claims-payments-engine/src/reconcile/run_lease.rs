//! The run lease: one reconcile run at a time across instances, held in the store like
//! a message's lease.

use std::time::Duration;

use crate::domain::{ClaimId, MessageId, PayloadHash};
use crate::lease::{self, Acquired, Bid, Lease, Seen, Terms};
use crate::store::{InboxKey, InboxOutcome, StoreError};

use super::Reconciler;

/// The run lease: one reconcile run at a time across instances. An inbox record of the
/// pseudo-consumer `reconcile-run` under a fixed claim id, taken and given back with the
/// same conditional writes as a message's lease.
pub struct RunLease(Lease);

const RUN_LEASE_CLAIM: &str = "5e3c0f1a-7d2b-4c69-9f41-2a8e6b0d9c17";
/// The pseudo-consumer of the run lease (never a consumer name: see `configuration`).
pub const RUN_LEASE_CONSUMER: &str = "reconcile-run";

impl RunLease {
    /// Takes the run lease for `length`, or `None` when another run holds it.
    pub async fn take(run: &Reconciler, length: Duration) -> Result<Option<Self>, StoreError> {
        let store = &run.store;
        let claim_id = ClaimId::parse(RUN_LEASE_CLAIM)
            .map_err(|e| StoreError::Permanent(format!("run lease claim id: {e}")))?;
        let message_id = MessageId::parse("reconcile-run")
            .map_err(|e| StoreError::Permanent(format!("run lease id: {e}")))?;
        let key = InboxKey {
            consumer: RUN_LEASE_CONSUMER.into(),
            claim_id,
            message_id: message_id.clone(),
        };
        let now = run.ambient.now();
        let me = run.ambient.attempt_id();
        let terms = Terms {
            lease: length,
            retention: run.policy.inbox_retention,
        };
        let store = store.as_ref();
        let found = store.inbox(&key).await?;
        let seen = match &found {
            Some(seen) => Seen::Record(seen),
            None => {
                let hash = PayloadHash::from_stored("reconcile-run".into());
                Seen::Nothing(lease::new_record(&key, &hash, me, 0, terms, now, None))
            }
        };
        // Not a broker delivery: the lease decides (count 0), unless its process ended.
        let bid = Bid {
            me,
            delivery: 0,
            now,
        };
        let take = |record: &_| lease::taken_over(record, me, 0, terms, now);
        Ok(
            match Lease::acquire(store, seen, bid, run.owners.as_ref(), take).await? {
                Acquired::Held { lease, .. } => Some(RunLease(lease)),
                Acquired::Live(_) | Acquired::Lost => None,
            },
        )
    }

    /// Gives the run lease back. Best effort: otherwise it expires.
    pub async fn release(self, run: &Reconciler) {
        if let Err(e) = self
            .0
            .complete(
                run.store.as_ref(),
                InboxOutcome::RunReleased,
                run.ambient.now(),
            )
            .await
        {
            tracing::warn!(error = %e, "could not release the reconcile run lease; it will expire");
        }
    }
}
