//! The consumer state machine: turns at-least-once deliveries into exactly one payment.
//!
//! Written once, against the [`Store`](crate::store::Store) port. One delivery goes:
//!
//! 1. **Claim**: one atomic store step creates the inbox record (in progress, with our
//!    lease; or already completed in ledger-only mode) and the payment record.
//! 2. If the claim is refused, decide from what exists:
//!    - inbox record owned by this very attempt: our own write, re-sent by the SDK after
//!      an ambiguous timeout. Carry on as a fresh claim;
//!    - different payload hash: **conflict**, never accepted;
//!    - completed: **duplicate**, success, no writes (a write would restart the TTL);
//!    - in progress under a live lease: another attempt works on it; wait, bounded;
//!    - in progress under an expired lease: **take over** with a conditional write;
//!    - payment of another message for this claim: **business duplicate**.
//! 3. **Payout** (bank configured): the stored request under the stored Idempotency-Key.
//! 4. **Finalize**: one conditional step marks payment and inbox final; if our lease was
//!    taken over meanwhile it fails, and we re-read instead of overwriting.
//!
//! Nothing is ever deleted after the bank may have been called. An outcome that cannot
//! be known becomes `needs_reconciliation`, never a second payout.
//!
//! Layout: [`decide`](mod@decide) holds every rule as a pure function, one per observation
//! (what was read -> what can follow it, as its own type); this module does the I/O in
//! one loop (read, decide, act, until an outcome); [`wait`] is the one bounded wait;
//! [`outcome`] is how a delivery ends.

pub mod crash;
pub mod decide;
pub mod outcome;
pub mod wait;

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::ambient::Ambient;
use crate::bank::{BankClient, SendWindow};
use crate::domain::{ClaimApproved, MessageId, PayloadHash, Purpose};
use crate::lease::liveness::Owners;
use crate::lease::{Acquired, Lease, Seen, Terms};
use crate::store::{
    AttemptId, ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, PaymentRecord,
    StoreError, Version, Versioned,
};
use crate::telemetry;

pub use crate::domain::OutcomeKind;
pub use crash::{CrashHook, Step};
use decide::{
    AfterClaim, AfterPayout, Attempt, Corrupt, FirstClaim, OnInbox, OnPayment, OnPayoutOwner,
    OnResume,
};
pub use outcome::Outcome;
use wait::BoundedWait;

/// One delivery of a message, as the broker numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: MessageId,
    /// 1 on the first delivery. 0 when the host did not say.
    pub delivery_count: u32,
}

/// The timing rules of the state machine.
#[derive(Debug, Clone)]
pub struct Policy {
    pub consumer_name: String,
    pub inbox_retention: Duration,
    pub lease: Duration,
    pub inflight_wait: Duration,
    pub retry_budget: Duration,
    pub bank_key_window: Duration,
}

impl Policy {
    /// The lease and retention of this consumer's inbox records.
    pub fn terms(&self) -> Terms {
        Terms {
            lease: self.lease,
            retention: self.inbox_retention,
        }
    }
}

#[derive(Debug)]
enum Failure {
    Store(StoreError),
    /// A test hook stopped the attempt as a crash would: no cleanup, no further writes.
    Crashed(Step),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<Corrupt> for Failure {
    fn from(Corrupt(problem): Corrupt) -> Self {
        Failure::Store(StoreError::Permanent(problem))
    }
}

type Flow = Result<Outcome, Failure>;

/// Messages this process saw completed: (payload hash, first outcome).
///
/// A completed inbox record never changes again, so a redelivery of a message in this
/// cache is answered without a store round trip. Anything else (a different payload, a
/// message seen in progress, a miss) goes through the store as usual, where the guard is.
/// Its hasher and shard count come from the [`Ambient`]: random and the machine's on the
/// system, fixed under the simulator (whose runs must not depend on the machine).
type CompletedCache = quick_cache::sync::Cache<
    InboxKey,
    (PayloadHash, Option<OutcomeKind>),
    quick_cache::UnitWeighter,
    foldhash::quality::SeedableRandomState,
>;

/// Enough for the redeliveries of the last few minutes at full speed, a few MiB.
const COMPLETED_CACHE_ENTRIES: usize = 20_000;

/// Share of the cache kept for entries read again. A redelivery follows its first
/// delivery once, minutes later: recency decides, not frequency. quick_cache's default
/// (97%) leaves 3% (600 places) for new entries once the cache is full, so a redelivery
/// more than about 600 completions later missed it; a bench run measured 0.67 store
/// round trips per duplicate "from memory" with the default.
const COMPLETED_CACHE_HOT_SHARE: f64 = 0.05;

fn completed_cache(entries: usize, ambient: &Ambient) -> CompletedCache {
    let mut options = quick_cache::OptionsBuilder::new();
    options
        .estimated_items_capacity(entries)
        .weight_capacity(entries as u64)
        .hot_allocation(COMPLETED_CACHE_HOT_SHARE);
    if let Some(shards) = ambient.cache_shards() {
        options.shards(shards);
    }
    let options = options
        .build()
        // Unreachable (both capacities are set); the default policy is still a cache.
        .unwrap_or_else(|_| {
            quick_cache::OptionsBuilder::new()
                .estimated_items_capacity(entries)
                .weight_capacity(entries as u64)
                .build()
                .expect("both capacities are set")
        });
    CompletedCache::with_options(
        options,
        quick_cache::UnitWeighter,
        ambient.cache_hasher(),
        Default::default(),
    )
}

#[derive(Clone)]
pub struct Consumer {
    store: DynStore,
    bank: Option<BankClient>,
    policy: Policy,
    crash_hook: Option<CrashHook>,
    completed: Arc<CompletedCache>,
    /// Whether the processes behind live leases are still running.
    owners: Arc<Owners>,
    /// The clock, the attempts' randomness and this process's boot.
    ambient: Ambient,
}

impl Consumer {
    /// The consumer of this process, on the system's clock.
    pub fn new(store: DynStore, bank: Option<BankClient>, policy: Policy) -> Self {
        Self::with_ambient(store, bank, policy, Ambient::system())
    }

    /// The consumer of the process `ambient` names (the simulator's instances).
    pub fn with_ambient(
        store: DynStore,
        bank: Option<BankClient>,
        policy: Policy,
        ambient: Ambient,
    ) -> Self {
        let owners = Arc::new(Owners::new(store.clone(), ambient.clone()));
        Self::with_owners(store, bank, policy, ambient, owners)
    }

    /// The consumer on services the composition root built once, sharing their view
    /// of lease owners with the other parts of the process.
    pub fn with_owners(
        store: DynStore,
        bank: Option<BankClient>,
        policy: Policy,
        ambient: Ambient,
        owners: Arc<Owners>,
    ) -> Self {
        Consumer {
            owners,
            store,
            bank,
            policy,
            crash_hook: None,
            completed: Arc::new(completed_cache(COMPLETED_CACHE_ENTRIES, &ambient)),
            ambient,
        }
    }

    fn now(&self) -> OffsetDateTime {
        self.ambient.now()
    }

    /// Simulated crashes for tests: the attempt stops dead at the chosen steps.
    pub fn with_crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }

    /// Handles one delivery. Never panics on data; every path ends in an outcome.
    pub async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        self.handle_noting(msg, delivery, false).await.0
    }

    /// As [`Self::handle`], with the claim's payment as the attempt last wrote or read
    /// it (`None` when it did not touch it, e.g. a duplicate answered from memory).
    pub async fn handle_with_payment(
        &self,
        msg: &ClaimApproved,
        delivery: &Delivery,
    ) -> (Outcome, Option<PaymentRecord>) {
        self.handle_noting(msg, delivery, true).await
    }

    async fn handle_noting(
        &self,
        msg: &ClaimApproved,
        delivery: &Delivery,
        note_payment: bool,
    ) -> (Outcome, Option<PaymentRecord>) {
        let key = self.inbox_key(msg, delivery);
        let hash = msg.payload_hash();
        if let Some((seen_hash, first_outcome)) = self.completed.get(&key) {
            if seen_hash == hash {
                let outcome = Outcome::Duplicate { first_outcome };
                outcome.count();
                return (outcome, None);
            }
        }
        let gone = self.owners.view();
        let attempt = Attempt {
            msg,
            delivery,
            id: self.ambient.attempt_id(),
            hash: hash.clone(),
            key: key.clone(),
            payment_seen: note_payment.then(Default::default),
            gone: &gone,
        };
        let outcome = match self.process(&attempt).await {
            Ok(outcome) => outcome,
            Err(Failure::Crashed(step)) => Outcome::RetryLater {
                reason: format!("simulated crash {step:?}"),
            },
            Err(Failure::Store(e @ StoreError::Permanent(_))) => {
                tracing::error!(claimId = %msg.claim_id, messageId = %delivery.message_id, storeError = "permanent", error = %e, "store failed; retrying cannot help until an operator repairs the store");
                Outcome::StoreFailure {
                    reason: e.to_string(),
                }
            }
            Err(Failure::Store(e)) => {
                tracing::error!(claimId = %msg.claim_id, messageId = %delivery.message_id, storeError = "transient", error = %e, "store failed");
                Outcome::RetryLater {
                    reason: e.to_string(),
                }
            }
        };
        if outcome.completes_message() {
            let first = match &outcome {
                Outcome::Duplicate { first_outcome } => *first_outcome,
                other => Some(other.kind()),
            };
            self.completed.insert(key, (hash, first));
        }
        outcome.count();
        let payment = attempt
            .payment_seen
            .and_then(|seen| seen.into_inner().ok().flatten());
        (outcome, payment)
    }

    fn crash_point(&self, step: Step) -> Result<(), Failure> {
        match &self.crash_hook {
            Some(hook) if hook(step) => Err(Failure::Crashed(step)),
            _ => Ok(()),
        }
    }

    async fn process(&self, attempt: &Attempt<'_>) -> Flow {
        // Before anything is stamped with this clock (the payout's `created_at`, which
        // anchors the key window, and leases): a clock beyond the bound starts nothing.
        if let Some(bank) = &self.bank {
            if let Err(reason) = bank.check_clock(&attempt.msg.idempotency_key()).await {
                return Ok(Outcome::RetryLater { reason });
            }
        }
        let now = self.now();
        let FirstClaim { inbox, payment } =
            match decide::first_claim(attempt, &self.policy, self.bank.is_some(), now) {
                Ok(claim) => claim,
                Err(invalid) => return Ok(invalid),
            };
        let start = match self.store.claim(&inbox, &payment).await? {
            ClaimResult::Claimed { inbox_version } => {
                attempt.saw(&payment);
                self.crash_point(Step::AfterClaim)?;
                match decide::after_claim(&inbox) {
                    AfterClaim::Recorded => return Ok(Outcome::Recorded),
                    AfterClaim::PayOut => State::Payout(inbox, inbox_version, payment),
                }
            }
            ClaimResult::InboxExists(seen) => State::Seen(seen, self.attempt_wait()),
            ClaimResult::PaymentExists(existing) => {
                attempt.saw(&existing.record);
                State::Payment(
                    existing.record,
                    BoundedWait::for_payout(self.policy.inflight_wait),
                )
            }
        };
        self.run(attempt, start).await
    }

    /// The records a first attempt of `delivery` claims: its inbox record, owned by
    /// `attempt`, and the payment. Baselines and tests use it to write exactly what the
    /// guard writes.
    pub fn first_records(
        &self,
        msg: &ClaimApproved,
        delivery: &Delivery,
        attempt: AttemptId,
        now: OffsetDateTime,
    ) -> (InboxRecord, PaymentRecord) {
        let gone = self.owners.view();
        let a = Attempt {
            msg,
            delivery,
            id: attempt,
            hash: msg.payload_hash(),
            key: self.inbox_key(msg, delivery),
            payment_seen: None,
            gone: &gone,
        };
        let FirstClaim { inbox, payment } =
            decide::first_records(&a, &self.policy, self.bank.is_some(), now);
        (inbox, payment)
    }

    /// The inbox key of `delivery` for this consumer.
    pub fn inbox_key(&self, msg: &ClaimApproved, delivery: &Delivery) -> InboxKey {
        InboxKey {
            consumer: self.policy.consumer_name.clone(),
            claim_id: msg.claim_id,
            message_id: delivery.message_id.clone(),
        }
    }

    fn attempt_wait(&self) -> BoundedWait {
        BoundedWait::for_attempt(self.policy.inflight_wait)
    }

    /// The loop: read, decide, act, until an outcome.
    async fn run(&self, a: &Attempt<'_>, mut state: State) -> Flow {
        // Set while we finish another message's orphaned payout: its outcome is not this
        // delivery's answer. Unless it must stop us, we go back to waiting for the payment.
        let mut return_to: Option<State> = None;
        loop {
            // A claim's own way first (pay out, resume), then what a refused claim found.
            let progress = match state {
                State::Payout(inbox, version, payment) => {
                    self.payout(a, inbox, version, payment).await?
                }
                State::Resume(inbox, version) => self.resume(a, inbox, version).await?,
                State::Seen(seen, wait) => self.on_inbox(a, seen, wait).await?,
                State::Payment(payment, wait) => self.on_payment(a, payment, wait).await?,
                State::AwaitPayout(payment, wait) => self.await_payout(a, payment, wait).await?,
            };
            state = match progress {
                Progress::Next(next) => next,
                Progress::Adopt { finish, then } => {
                    return_to = Some(then);
                    finish
                }
                Progress::Done(outcome) => match return_to.take() {
                    Some(then) if !matches!(outcome, Outcome::RetryLater { .. }) => then,
                    _ => return Ok(outcome),
                },
                // Our finalize lost to a takeover: the new owner finishes the payout. An
                // adopted payout was another message's, so this delivery has no inbox
                // record to look at: it goes back to waiting for the payment.
                Progress::Deferred => match return_to.take() {
                    Some(then) => then,
                    None => State::Seen(self.reread_inbox(a).await?, self.attempt_wait()),
                },
            };
        }
    }

    /// This message's inbox record exists: ours, a duplicate, a conflict, or held by
    /// another attempt (wait for it, or take it over).
    async fn on_inbox(
        &self,
        a: &Attempt<'_>,
        seen: Versioned<InboxRecord>,
        mut wait: BoundedWait,
    ) -> Advance {
        match decide::on_inbox(a, &seen.record) {
            OnInbox::Finish(outcome) => return Ok(Progress::Done(outcome)),
            OnInbox::AnswerFromPayment => {
                telemetry::counters().own_write_recognised.inc();
                return Ok(Progress::Next(State::Resume(seen.record, seen.version)));
            }
            OnInbox::Resume => {
                telemetry::counters().own_write_recognised.inc();
                tracing::info!(claimId = %a.msg.claim_id, messageId = %a.delivery.message_id, "own committed write recognised after a re-sent request");
                return Ok(Progress::Next(State::Resume(seen.record, seen.version)));
            }
            OnInbox::TakeLease => match self.acquire(a, &seen).await? {
                Acquired::Held { lease, .. } => {
                    return Ok(Progress::Next(State::Resume(lease.record, lease.version)));
                }
                Acquired::Live(lease_until) => {
                    if !wait.pause().await {
                        return Ok(Progress::Done(Outcome::RetryLater {
                            reason: format!(
                                "another attempt is processing this message (lease until {lease_until})"
                            ),
                        }));
                    }
                }
                Acquired::Lost => {}
            },
        }
        // Waited for a live attempt, or lost the race to take it over: look again.
        Ok(Progress::Next(State::Seen(
            self.reread_inbox(a).await?,
            wait,
        )))
    }

    /// The claim already has a payment and this message has no inbox record.
    async fn on_payment(
        &self,
        a: &Attempt<'_>,
        payment: PaymentRecord,
        wait: BoundedWait,
    ) -> Advance {
        Ok(
            match decide::on_payment(a, &payment, &self.policy, self.now()) {
                OnPayment::Finish(outcome) => Progress::Done(outcome),
                OnPayment::FinishBusinessDuplicate { inbox, outcome } => {
                    match self.store.record_handled(&inbox).await? {
                        InsertResult::Inserted(_) => Progress::Done(outcome),
                        InsertResult::AlreadyExists(seen) => {
                            Progress::Next(State::Seen(*seen, self.attempt_wait()))
                        }
                    }
                }
                OnPayment::ReclaimPayout { inbox } => {
                    match self.store.record_handled(&inbox).await? {
                        InsertResult::Inserted(version) => {
                            Progress::Next(State::Resume(inbox, version))
                        }
                        InsertResult::AlreadyExists(seen) => {
                            Progress::Next(State::Seen(*seen, self.attempt_wait()))
                        }
                    }
                }
                OnPayment::InspectPayoutOwner { owner } => {
                    let owner = self.store.inbox(&owner).await?;
                    match decide::on_payout_owner(a, owner) {
                        OnPayoutOwner::AdoptIfOrphaned { seen } => {
                            match self.acquire(a, &seen).await? {
                                Acquired::Held { lease, .. } => Progress::Adopt {
                                    finish: State::Resume(lease.record, lease.version),
                                    then: State::AwaitPayout(payment, wait),
                                },
                                Acquired::Live(_) | Acquired::Lost => {
                                    Progress::Next(State::AwaitPayout(payment, wait))
                                }
                            }
                        }
                        OnPayoutOwner::WaitForPayout => {
                            Progress::Next(State::AwaitPayout(payment, wait))
                        }
                    }
                }
            },
        )
    }

    /// Another message's payout of this claim is in progress: wait, then look again.
    async fn await_payout(
        &self,
        a: &Attempt<'_>,
        payment: PaymentRecord,
        mut wait: BoundedWait,
    ) -> Advance {
        if !wait.pause().await {
            return Ok(Progress::Done(Outcome::RetryLater {
                reason: format!(
                    "claim {} has a payout in progress from message {}",
                    a.msg.claim_id, payment.message_id
                ),
            }));
        }
        let payment = self
            .read_payment(a)
            .await?
            .ok_or_else(|| StoreError::Permanent("a payment disappeared".into()))?
            .record;
        Ok(Progress::Next(State::Payment(payment, wait)))
    }

    /// The claim's payment as the store holds it now, noted as seen.
    async fn read_payment(
        &self,
        a: &Attempt<'_>,
    ) -> Result<Option<Versioned<PaymentRecord>>, Failure> {
        let payment = self.store.payment(a.msg.claim_id, Purpose::Payout).await?;
        if let Some(p) = &payment {
            a.saw(&p.record);
        }
        Ok(payment)
    }

    /// This message's inbox record, read again (after a wait, or a lost race).
    async fn reread_inbox(&self, a: &Attempt<'_>) -> Result<Versioned<InboxRecord>, Failure> {
        self.store.inbox(&a.key).await?.ok_or_else(|| {
            Failure::Store(StoreError::Transient(
                "the inbox record disappeared while in use; the next delivery starts over".into(),
            ))
        })
    }

    /// Continues a message whose record is ours (we hold its lease, or our own completed
    /// write came back), from where its records say.
    async fn resume(&self, a: &Attempt<'_>, inbox: InboxRecord, version: Version) -> Advance {
        let payment = self.read_payment(a).await?;
        match decide::on_resume(a, &inbox, payment, &self.policy, self.now())? {
            OnResume::Finish(outcome) => Ok(Progress::Done(outcome)),
            OnResume::PayOut { payment } => {
                Ok(Progress::Next(State::Payout(inbox, version, payment)))
            }
            OnResume::CompleteInbox {
                inbox,
                payment,
                outcome,
            } => {
                self.store
                    .finalize(Finalize {
                        inbox: &inbox,
                        inbox_version: &version,
                        payment: &payment.record,
                        payment_version: Some(&payment.version),
                    })
                    .await?;
                Ok(Progress::Done(outcome))
            }
        }
    }

    /// Calls the bank under the stored key and request, then finalizes.
    async fn payout(
        &self,
        a: &Attempt<'_>,
        inbox: InboxRecord,
        version: Version,
        payment: PaymentRecord,
    ) -> Advance {
        let retry_later = |reason| Ok(Progress::Done(Outcome::RetryLater { reason }));
        let Some(bank) = &self.bank else {
            self.release(&inbox, &version).await;
            return retry_later(format!(
                "claim {} has a payout in progress but BANK_API_URL is not set",
                a.msg.claim_id
            ));
        };
        let Some(body) = payment.payout_request.clone() else {
            return Err(StoreError::Permanent(format!(
                "payment for claim {} has no stored payout request",
                a.msg.claim_id
            ))
            .into());
        };
        let window = SendWindow::new(
            self.policy.retry_budget,
            payment.created_at,
            self.policy.bank_key_window,
        );
        let answer = bank.pay(&payment.idempotency_key, &body, window).await;
        self.crash_point(Step::AfterBankCall)?;

        let now = self.now();
        let (final_inbox, final_payment, outcome) =
            match decide::after_payout(a, &inbox, payment, answer, &self.policy, now) {
                AfterPayout::Finalize {
                    inbox,
                    payment,
                    outcome,
                } => (inbox, payment, outcome),
                AfterPayout::Release { reason } => {
                    self.release(&inbox, &version).await;
                    return retry_later(reason);
                }
            };
        match self
            .store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &version,
                payment: &final_payment,
                payment_version: None,
            })
            .await
        {
            Ok(()) => {
                a.saw(&final_payment);
                self.crash_point(Step::AfterFinalize)?;
                Ok(Progress::Done(outcome))
            }
            Err(StoreError::PreconditionFailed) => {
                // Our lease was taken over; the new owner pays under the same key and
                // finishes. Judge the message by what is stored now.
                tracing::warn!(claimId = %a.msg.claim_id, messageId = %a.delivery.message_id, leaseOf = %inbox.message_id, "lease lost before finalize; deferring to the new owner");
                a.lost_sight_of_payment();
                Ok(Progress::Deferred)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives up our lease so the next delivery can take over immediately (best effort).
    async fn release(&self, inbox: &InboxRecord, version: &Version) {
        let lease = Lease {
            record: inbox.clone(),
            version: version.clone(),
        };
        lease.release(self.store.as_ref(), self.now()).await;
    }

    /// Takes the lease of `seen` (this message's record, or another message's orphaned
    /// payout) if the takeover rule lets this attempt: its process's end asked only of a
    /// lease that would otherwise hold us off, and noted for the rest of the attempt.
    async fn acquire(
        &self,
        a: &Attempt<'_>,
        seen: &Versioned<InboxRecord>,
    ) -> Result<Acquired, Failure> {
        let now = self.now();
        let owners = self.owners.seen_by(a.gone);
        let take = |record: &InboxRecord| a.taking_over(record, &self.policy, now);
        let bid = a.bid(&seen.record, now);
        let acquired =
            Lease::acquire(self.store.as_ref(), Seen::Record(seen), bid, &owners, take).await?;
        if let Acquired::Held { from, .. } = &acquired {
            telemetry::counters().takeovers.inc();
            tracing::info!(
                claimId = %a.msg.claim_id,
                messageId = %a.delivery.message_id,
                deliveryCount = a.delivery.delivery_count,
                leaseOf = %seen.record.message_id,
                previousOwner = %seen.record.owner,
                previousDeliveryCount = seen.record.last_delivery_count,
                reason = from.as_str(),
                "took over the lease of an earlier attempt"
            );
        }
        Ok(acquired)
    }
}

/// Where one attempt stands between two store reads.
enum State {
    /// We hold the lease and the payout is owed: call the bank and finalize.
    Payout(InboxRecord, Version, PaymentRecord),
    /// This message's record is ours (we hold its lease, or completed it): read the
    /// payment and continue from it.
    Resume(InboxRecord, Version),
    /// This message's inbox record, to judge. The wait bounds how long a live holder
    /// is waited for; it starts when the flow first looks at the record.
    Seen(Versioned<InboxRecord>, BoundedWait),
    /// The claim's payment (this message has no inbox record), to judge.
    Payment(PaymentRecord, BoundedWait),
    /// Another message's payout of the claim is in progress: wait, then re-read it.
    AwaitPayout(PaymentRecord, BoundedWait),
}

/// What one step of the loop produced.
// One value per attempt, moved from step to step: boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
enum Progress {
    Next(State),
    Done(Outcome),
    /// We took another message's orphaned payout over: run `finish` to its end, then
    /// continue with `then` unless it ended in retry-later.
    Adopt {
        finish: State,
        then: State,
    },
    /// Our payout's finalize lost to a takeover: the new owner finishes it. Look at
    /// this message's inbox record again, or, when the payout was adopted from another
    /// message, go back to waiting for the payment.
    Deferred,
}

type Advance = Result<Progress, Failure>;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> InboxKey {
        InboxKey {
            consumer: "payments".into(),
            claim_id: crate::domain::ClaimId::random(),
            message_id: crate::domain::MessageId::parse(&format!("m-{n}")).unwrap(),
        }
    }

    /// Once the cache is full, the messages completed last are still remembered: the
    /// ones a redelivery would ask about.
    #[test]
    fn a_full_cache_remembers_the_latest_completed_messages() {
        let cache = completed_cache(2_000, &Ambient::system());
        let hash = crate::domain::ClaimApproved::parse(
            r#"{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"1.00","currency":"EUR"}"#,
        )
        .unwrap()
        .payload_hash();
        // Fill it, with every entry read once (a redelivery answered from memory).
        for n in 0..2_000 {
            let k = key(n);
            cache.insert(k.clone(), (hash.clone(), None));
            assert!(cache.get(&k).is_some());
        }
        let latest: Vec<InboxKey> = (2_000..3_000).map(key).collect();
        for k in &latest {
            cache.insert(k.clone(), (hash.clone(), None));
        }
        let remembered = latest.iter().filter(|k| cache.get(*k).is_some()).count();
        assert_eq!(remembered, latest.len());
    }

    /// Under an injected ambient the cache is laid out by the seed alone: the same shard
    /// count on every machine, and the same shard for each key.
    #[test]
    fn an_injected_ambient_lays_the_cache_out_alike_on_every_machine() {
        struct Seeded(std::sync::Mutex<u64>);
        impl crate::ambient::Entropy for Seeded {
            fn fill(&self, bytes: &mut [u8]) {
                let mut state = self.0.lock().unwrap();
                for b in bytes {
                    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    *b = (*state >> 56) as u8;
                }
            }
        }
        struct Epoch;
        impl crate::ambient::WallClock for Epoch {
            fn now(&self) -> OffsetDateTime {
                OffsetDateTime::UNIX_EPOCH
            }
        }
        let injected = || {
            Ambient::new(
                Arc::new(Epoch),
                Arc::new(Seeded(std::sync::Mutex::new(7))),
                crate::ambient::Boot::numbered(1),
            )
        };
        let (a, b) = (
            completed_cache(COMPLETED_CACHE_ENTRIES, &injected()),
            completed_cache(COMPLETED_CACHE_ENTRIES, &injected()),
        );
        assert_eq!(a.num_shards(), 16);
        let keys: Vec<InboxKey> = (0..64).map(key).collect();
        let shards = |c: &CompletedCache| keys.iter().map(|k| c.shard_index(k)).collect::<Vec<_>>();
        assert_eq!(shards(&a), shards(&b));
        assert!(
            shards(&a).iter().any(|&s| s != shards(&a)[0]),
            "keys spread over shards"
        );
    }
}
