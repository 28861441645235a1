//! Reconciliation with the bank: no payment stays unknown, and nobody pays twice.
//!
//! A payment whose outcome cannot be known (`needs_reconciliation`: the key window
//! closed, the bank stayed down) or whose message was dead-lettered mid-payout (an
//! `in_progress` payment whose lease ran out long ago) is settled by asking the bank
//! what it holds under the payment's reference (its Idempotency-Key, carried in every
//! payout request). The lookup is read strictly ([`crate::bank`]): an entry without our
//! reference (compared ignoring letter case, which a bank may normalise) or outside the
//! contract makes the whole answer unusable. Then:
//! - exactly one paid entry, same amount and currency, nothing pending: `paid` with its
//!   payment id (by lookup);
//! - a paid entry with another amount or currency, several paid entries (a double
//!   payment at the bank), or a payout refused as a replay with another body (422):
//!   `mismatched`, with the evidence. A mismatched payment is never paid, settled or
//!   rewritten by any automatic process again (it is not in the set `reconcile`
//!   lists); only a person changes it;
//! - an entry still pending anywhere (even beside a refused one): still unknown;
//! - only refused entries: `rejected`;
//! - none, and the bank said so (a 200 with an empty list): pay now under the same key
//!   and reference, then record it. This is the only way a `needs_reconciliation`
//!   payment is ever paid;
//! - anything else (5xx, 429, timeouts, an unusable answer): still unknown, ask again
//!   on the next run.
//!
//! Every settlement holds the message's lease first (the same conditional write a
//! delivery uses to take over), re-reads the payment under it, and ends with one
//! finalize conditional on both records it read (inbox and payment versions), so it
//! loses cleanly to a live delivery and to another run, and never writes over what
//! they settled. A run that settles nothing gives the inbox record back as it found
//! it, so the payment stays as visible to the next run as it was to this one.
//!
//! A run reports everything still open: what it could not settle, what it did not
//! examine (too young, leased by a live delivery, beyond its budget or its limit), the
//! payments a store error stopped (each left for the next run, while the run goes on
//! with the others) and the mismatched payments waiting for a person. [`Summary::verdict`] is "settled"
//! only when nothing is open; `claims-payments reconcile` exits 0 then and 3
//! otherwise, `--dry-run` included.
//!
//! `claims-payments reconcile` runs it from the CLI; the `Reconcile` timer function runs
//! it inside `serve`, one run at a time across instances (a run lease in the store).
//!
//! By role:
//! - this module: the reconciler and its run (list the unsettled payments, take up the
//!   orphaned ones and those needing reconciliation, settle each, count);
//! - [`orphans`]: when an `in_progress` payment counts as orphaned;
//! - [`settle`]: settling one payment under its message's lease;
//! - [`lookup`]: what the bank's lookup, or a payout sent now, means for a payment;
//! - [`report`]: what a run reports (a line per payment, the summary, its verdict, the
//!   log line);
//! - [`run_lease`]: one run at a time across instances.

pub mod lookup;
pub mod orphans;
pub mod report;
pub mod run_lease;
pub mod settle;

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::ambient::Ambient;
use crate::bank::BankClient;
use crate::consumer::Policy;
use crate::lease::liveness::Owners;
use crate::services::Services;
use crate::store::{
    AttemptId, DynStore, InboxKey, PaymentRecord, PaymentStatus, StoreError, Versioned,
};
use crate::telemetry;

use orphans::not_orphaned;
use report::line;
pub use report::{log_summary, Settlement, Verdict};
pub use report::{RunCounts, Summary};
pub use run_lease::{RunLease, RUN_LEASE_CONSUMER};

/// At most this many payments are listed per run; the rest wait for the next one (and
/// the report says there are more).
pub const MAX_PER_RUN: usize = 500;
/// Mismatched payments are counted up to this many in a report.
const MAX_COUNTED: usize = 10_000;
/// The longest `--older-than` (and minimum age) a run accepts: ten years.
pub const MAX_MIN_AGE: Duration = Duration::from_secs(10 * 365 * 86_400);

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Only `in_progress` payments whose lease ran out longer ago than this.
    pub min_age: Duration,
    pub dry_run: bool,
    /// Stop taking up new payments after this long (the timer stays inside its
    /// function timeout); `None`: examine them all.
    pub budget: Option<Duration>,
}

/// Settles what is unknown or orphaned by asking the bank, on the process's services.
pub struct Reconciler {
    store: DynStore,
    bank: BankClient,
    policy: Policy,
    ambient: Ambient,
    owners: Arc<Owners>,
    me: AttemptId,
}

impl Reconciler {
    /// `None` in ledger-only mode: without a bank there is nothing to ask.
    pub fn new(services: &Services) -> Option<Self> {
        let bank = services.bank.clone()?;
        Some(Reconciler {
            me: services.ambient.attempt_id(),
            store: services.store.clone(),
            bank,
            policy: services.policy.clone(),
            ambient: services.ambient.clone(),
            owners: services.owners.clone(),
        })
    }

    /// One run: every unsettled payment this run may take up, settled or reported open.
    pub async fn run(&self, options: Options) -> Result<Summary, StoreError> {
        let store = &self.store;
        let now = self.ambient.now();
        let deadline = options.budget.map(|b| tokio::time::Instant::now() + b);
        let mut summary = Summary {
            dry_run: options.dry_run,
            ..Summary::default()
        };
        let listed = store.unsettled_payments(MAX_PER_RUN).await?;
        summary.more_beyond_limit = listed.len() >= MAX_PER_RUN;
        let total = listed.len();
        for (n, payment) in listed.into_iter().enumerate() {
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                summary.not_reached = total - n;
                break;
            }
            // A store error on one payment is that payment's: it is reported open and
            // left for the next run, and the run goes on with the others, so a flaky
            // store still works a backlog through.
            let record = payment.record.clone();
            if let Err(e) = self.take_up(payment, now, options, &mut summary).await {
                tracing::warn!(
                    claimId = %record.claim_id,
                    messageId = %record.message_id,
                    error = %e,
                    "reconcile: a store error on this payment; left for the next run"
                );
                summary.add(line(
                    &record,
                    Settlement::StoreError,
                    record.status,
                    format!("store error, left for the next run: {e}"),
                ));
            }
        }
        match store
            .count_payments(PaymentStatus::Mismatched, MAX_COUNTED)
            .await
        {
            Ok(n) => summary.needs_a_person = n,
            Err(e) => {
                tracing::warn!(error = %e, "reconcile: could not count the mismatched payments");
                summary.store_errors += 1;
            }
        }
        if !options.dry_run {
            let c = telemetry::counters();
            c.reconcile_runs.inc();
            c.reconcile_settled
                .add((summary.paid_by_lookup + summary.paid_now + summary.rejected) as u64);
            c.reconcile_unknown
                .add((summary.still_unknown + summary.mismatches + summary.store_errors) as u64);
        }
        Ok(summary)
    }

    /// Examines one listed payment: reports it waiting, or settles it.
    async fn take_up(
        &self,
        payment: Versioned<PaymentRecord>,
        now: OffsetDateTime,
        options: Options,
        summary: &mut Summary,
    ) -> Result<(), StoreError> {
        let key = self.inbox_key(&payment.record);
        let inbox = self.store.inbox(&key).await?;
        let p = &payment.record;
        // A live lease of a process that has ended holds nothing (one read, only then;
        // taking the lease below knows it from `gone` without a second).
        let gone = self.owners.view();
        let owner_gone = match &inbox {
            Some(i) if i.record.lease_alive(now) => {
                self.owners.check_for(i.record.owner, &gone).await
            }
            _ => false,
        };
        if p.status == PaymentStatus::NeedsReconciliation {
            summary.needs_reconciliation_before += 1;
        } else if let Some(why) = not_orphaned(p, inbox.as_ref(), owner_gone, now, options.min_age)
        {
            summary.add(line(p, Settlement::Waiting, p.status, why));
            return Ok(());
        } else {
            summary.orphaned_in_progress_before += 1;
        }
        let line = self.settle(payment, inbox, &gone, options).await?;
        tracing::info!(
            claimId = %line.claim_id,
            messageId = %line.message_id,
            before = %line.before,
            result = ?line.result,
            after = %line.after,
            detail = %line.detail,
            dryRun = options.dry_run,
            "reconciled a payment"
        );
        summary.add(line);
        Ok(())
    }

    fn inbox_key(&self, payment: &PaymentRecord) -> InboxKey {
        InboxKey {
            consumer: self.policy.consumer_name.clone(),
            claim_id: payment.claim_id,
            message_id: payment.message_id.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
