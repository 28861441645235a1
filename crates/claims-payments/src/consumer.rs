//! The consumer state machine: turns at-least-once deliveries into exactly one payment.
//!
//! Written once, against the [`Store`] port. One delivery goes:
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

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;

use crate::bank::{BankClient, PayoutOutcome, SendWindow};
use crate::message::{ClaimApproved, MessageId, PayloadHash, Purpose};
use crate::store::{
    AttemptId, ClaimResult, DynStore, InboxKey, InboxRecord, InboxStatus, InsertResult,
    PaymentRecord, PaymentStatus, StoreError, Version, Versioned,
};
use crate::telemetry;

/// How often a waiting delivery re-reads a record another attempt holds.
const POLL_FIRST: Duration = Duration::from_millis(20);
const POLL_MAX: Duration = Duration::from_millis(500);

/// One delivery of a message, as the broker numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: MessageId,
    /// 1 on the first delivery. 0 when the host did not say.
    pub delivery_count: u32,
}

/// How a delivery ended. The label is what logs, answers and counters use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Ledger-only mode: the payment is recorded.
    Recorded,
    /// The bank made the payout.
    Paid { bank_payment_id: String },
    /// The message was handled before; nothing was done now.
    Duplicate { first_outcome: Option<String> },
    /// The claim already has a payment from another message with the same payload.
    BusinessDuplicate { original_message: MessageId },
    /// The bank refused the payout for good; recorded for a person to handle.
    Rejected { reason: String },
    /// The payout's fate cannot be known; recorded for an operator to reconcile.
    NeedsReconciliation { reason: String },
    /// Same MessageId (or same claim) with a different payload. Never accepted.
    Conflict { reason: String },
    /// The message can never be valid.
    InvalidMessage { reason: String },
    /// Transient: the broker should deliver again later.
    RetryLater { reason: String },
    /// The store failed in a way retrying cannot heal (read-only or corrupt database, bad
    /// credentials, missing container): an operator must repair it. Never completed, so
    /// the message is kept (dead-lettered after its deliveries) for a re-drive.
    StoreFailure { reason: String },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Recorded => "recorded",
            Outcome::Paid { .. } => "paid",
            Outcome::Duplicate { .. } => "duplicate",
            Outcome::BusinessDuplicate { .. } => "business-duplicate",
            Outcome::Rejected { .. } => "rejected",
            Outcome::NeedsReconciliation { .. } => "needs-reconciliation",
            Outcome::Conflict { .. } => "conflict",
            Outcome::InvalidMessage { .. } => "invalid-message",
            Outcome::RetryLater { .. } => "retry-later",
            Outcome::StoreFailure { .. } => "store-failure",
        }
    }

    /// Whether the host should complete the message (answer 2xx).
    pub fn completes_message(&self) -> bool {
        !matches!(
            self,
            Outcome::Conflict { .. }
                | Outcome::InvalidMessage { .. }
                | Outcome::RetryLater { .. }
                | Outcome::StoreFailure { .. }
        )
    }

    /// Whether redelivery can never change the answer (the message belongs in the DLQ).
    pub fn is_permanent_failure(&self) -> bool {
        matches!(
            self,
            Outcome::Conflict { .. }
                | Outcome::InvalidMessage { .. }
                | Outcome::StoreFailure { .. }
        )
    }

    pub fn detail(&self) -> Option<String> {
        match self {
            Outcome::Recorded => None,
            Outcome::Paid { bank_payment_id } => Some(format!("bank payment {bank_payment_id}")),
            Outcome::Duplicate { first_outcome } => first_outcome
                .as_ref()
                .map(|o| format!("first outcome: {o}")),
            Outcome::BusinessDuplicate { original_message } => {
                Some(format!("claim already paid by message {original_message}"))
            }
            Outcome::Rejected { reason }
            | Outcome::NeedsReconciliation { reason }
            | Outcome::Conflict { reason }
            | Outcome::InvalidMessage { reason }
            | Outcome::RetryLater { reason }
            | Outcome::StoreFailure { reason } => Some(reason.clone()),
        }
    }

    /// Adds this outcome to the process's counters (`/metrics` and the periodic log line).
    pub fn count(&self) {
        let c = telemetry::counters();
        match self {
            Outcome::Recorded => c.recorded.inc(),
            Outcome::Paid { .. } => c.paid.inc(),
            Outcome::Duplicate { .. } => c.duplicates_skipped.inc(),
            Outcome::BusinessDuplicate { .. } => c.business_duplicates.inc(),
            Outcome::Rejected { .. } => c.rejected.inc(),
            Outcome::NeedsReconciliation { .. } => c.needs_reconciliation.inc(),
            Outcome::Conflict { .. } => c.conflicts.inc(),
            Outcome::InvalidMessage { .. } => c.invalid_messages.inc(),
            Outcome::RetryLater { .. } => c.retry_later.inc(),
            Outcome::StoreFailure { .. } => c.store_failures.inc(),
        }
    }
}

/// The points between the steps where a process can die. Tests inject crashes there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The claim is committed; nothing else happened yet.
    AfterClaim,
    /// The bank answered; its answer is not stored yet.
    AfterBankCall,
    /// Everything is stored; the host has not been answered yet.
    AfterFinalize,
}

/// Decides whether to simulate a crash at a step. Production code has none.
pub type CrashHook = Arc<dyn Fn(Step) -> bool + Send + Sync>;

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

type Flow = Result<Outcome, Failure>;

/// What one attempt knows about the message it handles.
struct Attempt<'a> {
    msg: &'a ClaimApproved,
    delivery: &'a Delivery,
    id: AttemptId,
    hash: PayloadHash,
    key: InboxKey,
}

impl Attempt<'_> {
    /// Whether this delivery comes after the one that holds the record's lease.
    ///
    /// Service Bus hands a message out again only once the previous delivery's lock is
    /// gone (abandoned, expired, or its process died), numbering it one higher. So a
    /// higher DeliveryCount than the holder recorded means the holder's delivery is
    /// over, and waiting out its lease (minutes, with production settings) would only
    /// spend the remaining deliveries and dead-letter the message. Taking over early is
    /// safe even if the old attempt still runs: the bank request carries the same
    /// Idempotency-Key, and its finalize is conditional on a version it no longer holds.
    /// A count of 0 means the host did not say; then only the lease decides.
    fn supersedes(&self, holder: &InboxRecord) -> bool {
        holder.last_delivery_count > 0 && self.delivery.delivery_count > holder.last_delivery_count
    }
}

/// Messages this process saw completed: (payload hash, first outcome).
///
/// A completed inbox record never changes again, so a redelivery of a message in this
/// cache is answered without a store round trip. Anything else (a different payload, a
/// message seen in progress, a miss) goes through the store as usual, where the guard is.
type CompletedCache = quick_cache::sync::Cache<InboxKey, (PayloadHash, Option<String>)>;

/// Enough for the redeliveries of the last few minutes at full speed, a few MiB.
const COMPLETED_CACHE_ENTRIES: usize = 20_000;

#[derive(Clone)]
pub struct Consumer {
    store: DynStore,
    bank: Option<BankClient>,
    policy: Policy,
    crash_hook: Option<CrashHook>,
    completed: Arc<CompletedCache>,
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

impl Consumer {
    pub fn new(store: DynStore, bank: Option<BankClient>, policy: Policy) -> Self {
        Consumer {
            store,
            bank,
            policy,
            crash_hook: None,
            completed: Arc::new(CompletedCache::new(COMPLETED_CACHE_ENTRIES)),
        }
    }

    /// Simulated crashes for tests: the attempt stops dead at the chosen steps.
    pub fn with_crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The bank client, when payouts are on (reconcile asks the same bank).
    pub fn bank(&self) -> Option<&BankClient> {
        self.bank.as_ref()
    }

    pub fn pays_out(&self) -> bool {
        self.bank.is_some()
    }

    /// Handles one delivery. Never panics on data; every path ends in an outcome.
    pub async fn handle(&self, msg: &ClaimApproved, delivery: &Delivery) -> Outcome {
        let key = self.inbox_key(msg, delivery);
        let hash = msg.payload_hash();
        if let Some((seen_hash, first_outcome)) = self.completed.get(&key) {
            if seen_hash == hash {
                let outcome = Outcome::Duplicate { first_outcome };
                outcome.count();
                return outcome;
            }
        }
        let outcome = match self.process(msg, delivery, key.clone(), hash.clone()).await {
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
                Outcome::Duplicate { first_outcome } => first_outcome.clone(),
                other => Some(other.label().to_owned()),
            };
            self.completed.insert(key, (hash, first));
        }
        outcome.count();
        outcome
    }

    fn crash_point(&self, step: Step) -> Result<(), Failure> {
        match &self.crash_hook {
            Some(hook) if hook(step) => Err(Failure::Crashed(step)),
            _ => Ok(()),
        }
    }

    async fn process(
        &self,
        msg: &ClaimApproved,
        delivery: &Delivery,
        key: InboxKey,
        hash: PayloadHash,
    ) -> Flow {
        if self.bank.is_some() && msg.payee.is_none() {
            return Ok(Outcome::InvalidMessage {
                reason: "payee: is missing, and payouts are enabled (BANK_API_URL is set)".into(),
            });
        }
        let attempt = Attempt {
            msg,
            delivery,
            id: AttemptId::new(),
            hash,
            key,
        };
        let now = now();
        let inbox = self.new_inbox(&attempt, now);
        let payment = self.new_payment(&attempt, now);
        match self.store.claim(&inbox, &payment).await? {
            ClaimResult::Claimed { inbox_version } => {
                self.after_claim(&attempt, inbox, inbox_version, payment)
                    .await
            }
            ClaimResult::InboxExists(seen) => self.resolve_seen(&attempt, seen).await,
            ClaimResult::PaymentExists(existing) => {
                self.business_duplicate(&attempt, existing).await
            }
        }
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
        let a = Attempt {
            msg,
            delivery,
            id: attempt,
            hash: msg.payload_hash(),
            key: self.inbox_key(msg, delivery),
        };
        (self.new_inbox(&a, now), self.new_payment(&a, now))
    }

    /// The inbox key of `delivery` for this consumer.
    pub fn inbox_key(&self, msg: &ClaimApproved, delivery: &Delivery) -> InboxKey {
        InboxKey {
            consumer: self.policy.consumer_name.clone(),
            claim_id: msg.claim_id,
            message_id: delivery.message_id.clone(),
        }
    }

    fn new_inbox(&self, a: &Attempt<'_>, now: OffsetDateTime) -> InboxRecord {
        let ledger_only = self.bank.is_none();
        InboxRecord {
            consumer: a.key.consumer.clone(),
            claim_id: a.msg.claim_id,
            message_id: a.delivery.message_id.clone(),
            payload_hash: a.hash.clone(),
            status: if ledger_only {
                InboxStatus::Completed
            } else {
                InboxStatus::InProgress
            },
            outcome: ledger_only.then(|| Outcome::Recorded.label().to_owned()),
            owner: a.id,
            lease_until: (!ledger_only).then(|| now + self.policy.lease),
            first_delivery_count: a.delivery.delivery_count,
            last_delivery_count: a.delivery.delivery_count,
            created_at: now,
            updated_at: now,
            expires_at: now + self.policy.inbox_retention,
        }
    }

    fn new_payment(&self, a: &Attempt<'_>, now: OffsetDateTime) -> PaymentRecord {
        let ledger_only = self.bank.is_none();
        PaymentRecord {
            claim_id: a.msg.claim_id,
            purpose: Purpose::Payout,
            tenant_id: a.msg.tenant.as_ref().map(|t| t.as_str().to_owned()),
            amount: a.msg.money.amount_string(),
            currency: a.msg.money.currency().code().to_owned(),
            payee: a.msg.payee.as_ref().map(|p| p.as_str().to_owned()),
            payload_hash: a.hash.clone(),
            message_id: a.delivery.message_id.clone(),
            idempotency_key: a.msg.idempotency_key(),
            payout_request: (!ledger_only).then(|| a.msg.payout_request_body()),
            status: if ledger_only {
                PaymentStatus::Recorded
            } else {
                PaymentStatus::InProgress
            },
            bank_payment_id: None,
            status_reason: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// A record stamped as touched by this attempt now.
    fn touched(&self, a: &Attempt<'_>, record: &InboxRecord, now: OffsetDateTime) -> InboxRecord {
        InboxRecord {
            last_delivery_count: a.delivery.delivery_count.max(record.last_delivery_count),
            updated_at: now,
            // Cosmos counts TTL from the last write; keep both stores' retention the same.
            expires_at: now + self.policy.inbox_retention,
            ..record.clone()
        }
    }

    async fn after_claim(
        &self,
        a: &Attempt<'_>,
        inbox: InboxRecord,
        version: Version,
        payment: PaymentRecord,
    ) -> Flow {
        self.crash_point(Step::AfterClaim)?;
        if inbox.status == InboxStatus::Completed {
            return Ok(Outcome::Recorded);
        }
        self.payout(a, inbox, version, payment).await
    }

    async fn resolve_seen(&self, a: &Attempt<'_>, mut seen: Versioned<InboxRecord>) -> Flow {
        let wait_until = Instant::now() + self.policy.inflight_wait;
        let mut poll = POLL_FIRST;
        let mut waited = false;
        loop {
            let record = &seen.record;
            if record.owner == a.id {
                // Our own committed write, reported as a conflict (409) or a stale ETag
                // (412) because the SDK re-sent it after an ambiguous timeout.
                telemetry::counters().own_write_recognised.inc();
                if record.status == InboxStatus::Completed {
                    let payment = self
                        .store
                        .payment(a.msg.claim_id, Purpose::Payout)
                        .await?
                        .ok_or_else(|| {
                            StoreError::Permanent("completed message without a payment".into())
                        })?;
                    return Ok(outcome_of(&payment.record));
                }
                tracing::info!(claimId = %a.msg.claim_id, messageId = %a.delivery.message_id, "own committed write recognised after a re-sent request");
                return self.resume(a, record.clone(), seen.version.clone()).await;
            }
            if record.payload_hash != a.hash {
                return Ok(Outcome::Conflict {
                    reason: format!(
                        "MessageId {} was first received with a different payload for claim {}; this delivery is refused",
                        a.delivery.message_id, a.msg.claim_id
                    ),
                });
            }
            let now = now();
            match record.status {
                InboxStatus::Completed => {
                    return Ok(Outcome::Duplicate {
                        first_outcome: record.outcome.clone(),
                    })
                }
                InboxStatus::InProgress if record.lease_alive(now) && !a.supersedes(record) => {
                    let left = wait_until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Outcome::RetryLater {
                            reason: format!(
                                "another attempt is processing this message (lease until {})",
                                record
                                    .lease_until
                                    .map(|t| t.to_string())
                                    .unwrap_or_default()
                            ),
                        });
                    }
                    if !waited {
                        waited = true;
                        telemetry::counters().lease_waits.inc();
                    }
                    tokio::time::sleep(poll.min(left)).await;
                    poll = (poll * 2).min(POLL_MAX);
                    seen = self.reread_inbox(a).await?;
                }
                InboxStatus::InProgress => match self.take_over(a, &seen, true).await? {
                    Some((taken, version)) => return self.resume(a, taken, version).await,
                    None => seen = self.reread_inbox(a).await?,
                },
            }
        }
    }

    async fn reread_inbox(&self, a: &Attempt<'_>) -> Result<Versioned<InboxRecord>, Failure> {
        self.store.inbox(&a.key).await?.ok_or_else(|| {
            Failure::Store(StoreError::Transient(
                "the inbox record disappeared while in use; the next delivery starts over".into(),
            ))
        })
    }

    /// Continues a message whose lease we now hold, from where its records say.
    async fn resume(&self, a: &Attempt<'_>, inbox: InboxRecord, version: Version) -> Flow {
        let payment = self
            .store
            .payment(a.msg.claim_id, Purpose::Payout)
            .await?
            .ok_or_else(|| {
                StoreError::Permanent(format!(
                    "claim {} has an in-progress inbox record but no payment",
                    a.msg.claim_id
                ))
            })?
            .record;
        if payment.status == PaymentStatus::InProgress {
            return self.payout(a, inbox, version, payment).await;
        }
        // The payment is already final (finalize is atomic, so only a manual repair gets
        // here): complete the inbox to match it.
        let outcome = outcome_of(&payment);
        let now = now();
        let done = InboxRecord {
            status: InboxStatus::Completed,
            outcome: Some(outcome.label().to_owned()),
            lease_until: None,
            ..self.touched(a, &inbox, now)
        };
        self.store.finalize(&done, &version, &payment).await?;
        Ok(outcome)
    }

    async fn payout(
        &self,
        a: &Attempt<'_>,
        inbox: InboxRecord,
        version: Version,
        payment: PaymentRecord,
    ) -> Flow {
        let Some(bank) = &self.bank else {
            self.release(&inbox, &version).await;
            return Ok(Outcome::RetryLater {
                reason: format!(
                    "claim {} has a payout in progress but BANK_API_URL is not set",
                    a.msg.claim_id
                ),
            });
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
        let result = bank.pay(&payment.idempotency_key, &body, window).await;
        self.crash_point(Step::AfterBankCall)?;

        let (status, bank_payment_id, reason, outcome) = match result {
            PayoutOutcome::Paid { payment_id } => (
                PaymentStatus::Paid,
                Some(payment_id.clone()),
                None,
                Outcome::Paid {
                    bank_payment_id: payment_id,
                },
            ),
            PayoutOutcome::Rejected { reason, .. } => (
                PaymentStatus::Rejected,
                None,
                Some(reason.clone()),
                Outcome::Rejected { reason },
            ),
            PayoutOutcome::KeyMismatch { reason } => (
                PaymentStatus::NeedsReconciliation,
                None,
                Some(reason.clone()),
                Outcome::NeedsReconciliation { reason },
            ),
            PayoutOutcome::KeyWindowClosed {
                attempts,
                last_error,
            } => {
                // Resending now could pay twice: the bank may have forgotten the key.
                let reason = format!(
                    "payout first requested at {}, and the bank's Idempotency-Key window ({}h) closes before another request could leave ({attempts} sent now{}); check the bank before paying",
                    payment.created_at,
                    self.policy.bank_key_window.as_secs() / 3600,
                    if last_error.is_empty() { String::new() } else { format!(", last: {last_error}") },
                );
                (
                    PaymentStatus::NeedsReconciliation,
                    None,
                    Some(reason.clone()),
                    Outcome::NeedsReconciliation { reason },
                )
            }
            PayoutOutcome::ServiceFault { status, reason } => {
                // Our own fault (credential, URL): not a verdict on the payment. Keep
                // the message on the queue and let the next delivery go at once.
                self.release(&inbox, &version).await;
                return Ok(Outcome::RetryLater {
                    reason: format!("bank refused the service's request ({status}): {reason}"),
                });
            }
            PayoutOutcome::GaveUp {
                attempts,
                last_error,
            } => {
                // Let the next delivery take over at once instead of waiting out our lease.
                self.release(&inbox, &version).await;
                return Ok(Outcome::RetryLater {
                    reason: format!("bank unavailable after {attempts} attempts: {last_error}"),
                });
            }
        };
        let now = now();
        let final_payment = PaymentRecord {
            status,
            bank_payment_id,
            status_reason: reason,
            updated_at: now,
            ..payment
        };
        let final_inbox = InboxRecord {
            status: InboxStatus::Completed,
            outcome: Some(outcome.label().to_owned()),
            lease_until: None,
            ..self.touched(a, &inbox, now)
        };
        match self
            .store
            .finalize(&final_inbox, &version, &final_payment)
            .await
        {
            Ok(()) => {
                self.crash_point(Step::AfterFinalize)?;
                Ok(outcome)
            }
            Err(StoreError::PreconditionFailed) => {
                // Our lease was taken over; the new owner pays under the same key and
                // finishes. Judge the message by what is stored now.
                tracing::warn!(claimId = %a.msg.claim_id, messageId = %a.delivery.message_id, "lease lost before finalize; deferring to the new owner");
                let seen = self.reread_inbox(a).await?;
                Box::pin(self.resolve_seen(a, seen)).await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives up our lease so the next delivery can take over immediately. Best effort:
    /// if it fails, the lease simply runs out.
    async fn release(&self, inbox: &InboxRecord, version: &Version) {
        let released = InboxRecord {
            lease_until: Some(now()),
            updated_at: now(),
            ..inbox.clone()
        };
        if let Err(e) = self.store.replace_inbox(&released, version).await {
            tracing::warn!(claimId = %inbox.claim_id, messageId = %inbox.message_id, error = %e, "could not release the lease; it will expire");
        }
    }

    /// A payout owed by another message whose attempt died (expired lease) would wait
    /// for that message's redelivery, which may never come (it may be dead-lettered).
    /// Take its lease over and finish the payout under the same key. Returns an outcome
    /// only when this delivery must stop (the payout could not finish now).
    async fn adopt_orphaned_payout(
        &self,
        a: &Attempt<'_>,
        payment: &PaymentRecord,
    ) -> Result<Option<Outcome>, Failure> {
        let owner_key = InboxKey {
            message_id: payment.message_id.clone(),
            ..a.key.clone()
        };
        let now = now();
        let Some(owner) = self.store.inbox(&owner_key).await? else {
            return Ok(None);
        };
        if owner.record.status != InboxStatus::InProgress || owner.record.lease_alive(now) {
            return Ok(None);
        }
        match self.take_over(a, &owner, false).await? {
            Some((taken, version)) => match Box::pin(self.resume(a, taken, version)).await? {
                outcome @ Outcome::RetryLater { .. } => Ok(Some(outcome)),
                _ => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// Takes an expired lease over with a write conditional on the version we read.
    /// `None`: another attempt moved first. `own_message`: the record is this delivery's
    /// own, so its delivery count is recorded too.
    async fn take_over(
        &self,
        a: &Attempt<'_>,
        seen: &Versioned<InboxRecord>,
        own_message: bool,
    ) -> Result<Option<(InboxRecord, Version)>, Failure> {
        let now = now();
        let base = if own_message {
            self.touched(a, &seen.record, now)
        } else {
            InboxRecord {
                updated_at: now,
                expires_at: now + self.policy.inbox_retention,
                ..seen.record.clone()
            }
        };
        let taken = InboxRecord {
            owner: a.id,
            lease_until: Some(now + self.policy.lease),
            ..base
        };
        match self.store.replace_inbox(&taken, &seen.version).await {
            Ok(version) => {
                telemetry::counters().takeovers.inc();
                let reason = if seen.record.lease_alive(now) {
                    "later-delivery"
                } else {
                    "lease-expired"
                };
                tracing::info!(
                    claimId = %a.msg.claim_id,
                    messageId = %a.delivery.message_id,
                    deliveryCount = a.delivery.delivery_count,
                    leaseOf = %seen.record.message_id,
                    previousOwner = %seen.record.owner,
                    previousDeliveryCount = seen.record.last_delivery_count,
                    reason,
                    "took over the lease of an earlier attempt"
                );
                Ok(Some((taken, version)))
            }
            Err(StoreError::PreconditionFailed) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn business_duplicate(
        &self,
        a: &Attempt<'_>,
        existing: Versioned<PaymentRecord>,
    ) -> Flow {
        let wait_until = Instant::now() + self.policy.inflight_wait;
        let mut poll = POLL_FIRST;
        let mut payment = existing.record;
        loop {
            if payment.payload_hash != a.hash {
                return Ok(Outcome::Conflict {
                    reason: format!(
                        "claim {} already has a payment from message {} with a different amount, currency, tenant or payee",
                        a.msg.claim_id, payment.message_id
                    ),
                });
            }
            let same_message = payment.message_id == a.delivery.message_id;
            let now = now();
            if payment.status.is_terminal() || same_message {
                let in_progress = !payment.status.is_terminal();
                let outcome = if same_message {
                    // Our own message, back after its inbox record expired.
                    Outcome::Duplicate {
                        first_outcome: Some(outcome_of(&payment).label().to_owned()),
                    }
                } else {
                    Outcome::BusinessDuplicate {
                        original_message: payment.message_id.clone(),
                    }
                };
                let mut inbox = self.new_inbox(a, now);
                if in_progress {
                    // Our payout is owed and nobody holds it: hold it again and resume.
                    inbox.status = InboxStatus::InProgress;
                    inbox.outcome = None;
                    inbox.lease_until = Some(now + self.policy.lease);
                } else {
                    inbox.status = InboxStatus::Completed;
                    inbox.outcome = Some(outcome.label().to_owned());
                    inbox.lease_until = None;
                }
                return match self.store.record_handled(&inbox).await? {
                    InsertResult::Inserted(version) if in_progress => {
                        self.resume(a, inbox, version).await
                    }
                    InsertResult::Inserted(_) => Ok(outcome),
                    InsertResult::AlreadyExists(seen) => {
                        Box::pin(self.resolve_seen(a, *seen)).await
                    }
                };
            }
            if let Some(stopped) = self.adopt_orphaned_payout(a, &payment).await? {
                return Ok(stopped);
            }
            let left = wait_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Outcome::RetryLater {
                    reason: format!(
                        "claim {} has a payout in progress from message {}",
                        a.msg.claim_id, payment.message_id
                    ),
                });
            }
            tokio::time::sleep(poll.min(left)).await;
            poll = (poll * 2).min(POLL_MAX);
            payment = self
                .store
                .payment(a.msg.claim_id, Purpose::Payout)
                .await?
                .ok_or_else(|| StoreError::Permanent("a payment disappeared".into()))?
                .record;
        }
    }
}

/// The outcome a final payment stands for.
fn outcome_of(payment: &PaymentRecord) -> Outcome {
    let reason = payment.status_reason.clone().unwrap_or_default();
    match payment.status {
        PaymentStatus::Recorded => Outcome::Recorded,
        PaymentStatus::Paid => Outcome::Paid {
            bank_payment_id: payment.bank_payment_id.clone().unwrap_or_default(),
        },
        PaymentStatus::Rejected => Outcome::Rejected { reason },
        PaymentStatus::NeedsReconciliation | PaymentStatus::InProgress => {
            Outcome::NeedsReconciliation { reason }
        }
    }
}
