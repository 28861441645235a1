//! Reconciliation with the bank: no payment stays unknown, and nobody pays twice.
//!
//! A payment whose outcome cannot be known (`needs_reconciliation`: the key window
//! closed, the bank answered 422) or whose message was dead-lettered mid-payout (an
//! `in_progress` payment whose lease ran out long ago) is settled by asking the bank
//! what it holds under the payment's reference (its Idempotency-Key, carried in every
//! payout request):
//! - the bank holds a matching payment: `paid` with its payment id (by lookup);
//! - it holds one with another amount or currency: `needs_reconciliation` with the
//!   evidence, never paid again (a mismatch);
//! - it refused it: `rejected`;
//! - it holds none, and said so (a 200 with an empty list): pay now under the same key
//!   and reference, then record it. This is the only way a `needs_reconciliation`
//!   payment is ever paid;
//! - anything else (5xx, 429, timeouts, a payment still pending): still unknown, ask
//!   again on the next run.
//!
//! Every settlement holds the message's lease first (the same conditional write a
//! delivery uses to take over), and ends with the same conditional finalize, so it loses
//! safely to a live delivery of the same message and to another reconcile run. The
//! evidence (when, how, the bank's answer) goes into the payment's `status_reason`.
//!
//! `claims-payments reconcile` runs it from the CLI; the `Reconcile` timer function runs
//! it inside `serve`, one run at a time across instances (a run lease in the store).

use std::time::Duration;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::bank::{BankClient, Lookup, PayoutOutcome, SendWindow};
use crate::consumer::{Consumer, OutcomeKind};
use crate::message::{ClaimId, MessageId, PayloadHash};
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, InsertResult, PaymentRecord,
    PaymentStatus, StoreError, Version, Versioned,
};
use crate::telemetry;

/// At most this many payments are examined per run; the rest wait for the next one.
pub(crate) const MAX_PER_RUN: usize = 500;

/// How one payment ended in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Settlement {
    /// The bank holds a matching payment: recorded as paid.
    PaidByLookup,
    /// The bank holds none: paid now under the same key and reference.
    PaidNow,
    /// The bank refused it: recorded as rejected.
    Rejected,
    /// The bank holds a payment under the reference with another amount or currency.
    Mismatch,
    /// The bank's answer was not authoritative, or the payout could not finish now.
    StillUnknown,
    /// A live delivery (or another run) holds the message, or its lease ran out too
    /// recently: left alone.
    Skipped,
    /// `--dry-run`: what would be done, nothing written, nothing paid.
    WouldSettle,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub claim_id: String,
    pub message_id: String,
    pub before: String,
    pub result: Settlement,
    pub after: String,
    pub detail: String,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub examined: usize,
    pub paid_by_lookup: usize,
    pub paid_now: usize,
    pub rejected: usize,
    pub still_unknown: usize,
    pub mismatches: usize,
    pub skipped: usize,
    /// Before the run: payments in `needs_reconciliation`, and `in_progress` payments
    /// whose lease ran out longer ago than the minimum age.
    pub needs_reconciliation_before: usize,
    pub orphaned_in_progress_before: usize,
    pub lines: Vec<Line>,
}

impl Summary {
    /// Whether nothing examined is left unknown (the CLI's exit code).
    pub fn all_settled(&self) -> bool {
        self.still_unknown == 0 && self.mismatches == 0
    }

    fn add(&mut self, line: Line) {
        match line.result {
            Settlement::PaidByLookup => self.paid_by_lookup += 1,
            Settlement::PaidNow => self.paid_now += 1,
            Settlement::Rejected => self.rejected += 1,
            Settlement::Mismatch => self.mismatches += 1,
            Settlement::StillUnknown => self.still_unknown += 1,
            Settlement::Skipped | Settlement::WouldSettle => self.skipped += 1,
        }
        if line.result != Settlement::Skipped {
            self.examined += 1;
        }
        self.lines.push(line);
    }
}

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

pub struct Reconciler {
    consumer: Consumer,
    bank: BankClient,
    me: AttemptId,
}

/// What the bank's lookup means for one payment.
enum Verdict {
    Paid {
        payment_id: String,
        evidence: String,
    },
    Mismatch {
        evidence: String,
    },
    Rejected {
        evidence: String,
    },
    NoneHeld,
    Unknown {
        reason: String,
    },
}

impl Reconciler {
    /// `None` in ledger-only mode: without a bank there is nothing to ask.
    pub fn new(consumer: Consumer) -> Option<Self> {
        let bank = consumer.bank()?.clone();
        Some(Reconciler {
            consumer,
            bank,
            me: AttemptId::new(),
        })
    }

    pub async fn run(&self, options: Options) -> Result<Summary, StoreError> {
        let store = self.consumer.store();
        let now = OffsetDateTime::now_utc();
        let deadline = options.budget.map(|b| std::time::Instant::now() + b);
        let mut summary = Summary::default();
        for payment in store.unsettled_payments(MAX_PER_RUN).await? {
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                break;
            }
            let key = self.inbox_key(&payment.record);
            let inbox = store.inbox(&key).await?;
            let before = payment.record.status;
            if before == PaymentStatus::NeedsReconciliation {
                summary.needs_reconciliation_before += 1;
            } else if orphaned(&payment.record, inbox.as_ref(), now, options.min_age) {
                summary.orphaned_in_progress_before += 1;
            } else {
                continue; // a delivery is (or was recently) working on it
            }
            let line = self.settle(payment, inbox, options).await?;
            tracing::info!(
                claimId = %line.claim_id,
                messageId = %line.message_id,
                before = %line.before,
                result = ?line.result,
                after = %line.after,
                detail = %line.detail,
                "reconciled a payment"
            );
            summary.add(line);
        }
        let c = telemetry::counters();
        c.reconcile_runs.inc();
        c.reconcile_settled
            .add((summary.paid_by_lookup + summary.paid_now + summary.rejected) as u64);
        c.reconcile_unknown
            .add((summary.still_unknown + summary.mismatches) as u64);
        Ok(summary)
    }

    fn inbox_key(&self, payment: &PaymentRecord) -> InboxKey {
        InboxKey {
            consumer: self.consumer.policy().consumer_name.clone(),
            claim_id: payment.claim_id,
            message_id: payment.message_id.clone(),
        }
    }

    async fn settle(
        &self,
        payment: Versioned<PaymentRecord>,
        inbox: Option<Versioned<InboxRecord>>,
        options: Options,
    ) -> Result<Line, StoreError> {
        let p = payment.record;
        let line = |result: Settlement, after: PaymentStatus, detail: String| Line {
            claim_id: p.claim_id.to_string(),
            message_id: p.message_id.to_string(),
            before: p.status.as_str().to_owned(),
            result,
            after: after.as_str().to_owned(),
            detail,
        };
        if options.dry_run {
            let verdict = self.ask(&p).await;
            return Ok(line(
                Settlement::WouldSettle,
                p.status,
                format!("dry run: {}", verdict.describe()),
            ));
        }
        let Some((held, version)) = self.hold(&p, inbox).await? else {
            return Ok(line(
                Settlement::Skipped,
                p.status,
                "a live delivery or another reconcile run holds the message".into(),
            ));
        };
        let (result, status, bank_payment_id, evidence) = match self.ask(&p).await {
            Verdict::Paid {
                payment_id,
                evidence,
            } => (
                Settlement::PaidByLookup,
                PaymentStatus::Paid,
                Some(payment_id),
                evidence,
            ),
            Verdict::Mismatch { evidence } => (
                Settlement::Mismatch,
                PaymentStatus::NeedsReconciliation,
                None,
                evidence,
            ),
            Verdict::Rejected { evidence } => (
                Settlement::Rejected,
                PaymentStatus::Rejected,
                None,
                evidence,
            ),
            Verdict::Unknown { reason } => {
                self.release(&held, &version).await;
                return Ok(line(Settlement::StillUnknown, p.status, reason));
            }
            Verdict::NoneHeld => match self.pay_now(&p).await {
                Ok((result, status, id, evidence)) => (result, status, id, evidence),
                Err(reason) => {
                    self.release(&held, &version).await;
                    return Ok(line(Settlement::StillUnknown, p.status, reason));
                }
            },
        };
        let now = OffsetDateTime::now_utc();
        let how = match result {
            Settlement::PaidByLookup => "paid by lookup",
            Settlement::PaidNow => "paid now",
            Settlement::Rejected => "rejected",
            _ => "mismatch",
        };
        let reason = format!("reconciled at {now} ({how}): {evidence}");
        let final_payment = PaymentRecord {
            status,
            bank_payment_id: bank_payment_id.or(p.bank_payment_id.clone()),
            status_reason: Some(reason.clone()),
            updated_at: now,
            ..p.clone()
        };
        let outcome = match status {
            PaymentStatus::Paid => OutcomeKind::Paid,
            PaymentStatus::Rejected => OutcomeKind::Rejected,
            _ => OutcomeKind::NeedsReconciliation,
        };
        let final_inbox = InboxRecord {
            status: InboxStatus::Completed,
            outcome: Some(outcome.into()),
            lease_until: None,
            updated_at: now,
            ..held
        };
        match self
            .consumer
            .store()
            .finalize(&final_inbox, &version, &final_payment)
            .await
        {
            Ok(()) => Ok(line(result, status, reason)),
            // A redelivery took the message over meanwhile; it finishes under the same
            // key. Nothing was lost: our bank call, if any, was under the same key too.
            Err(StoreError::PreconditionFailed) => Ok(line(
                Settlement::Skipped,
                p.status,
                "a live delivery took the message over; it settles it".into(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Takes the message's lease with a conditional write, as a delivery would: over
    /// an existing inbox record (its version), or by creating one if it expired.
    /// `None`: someone else moved first.
    async fn hold(
        &self,
        p: &PaymentRecord,
        inbox: Option<Versioned<InboxRecord>>,
    ) -> Result<Option<(InboxRecord, Version)>, StoreError> {
        let store = self.consumer.store();
        let policy = self.consumer.policy();
        let now = OffsetDateTime::now_utc();
        match inbox {
            Some(seen) => {
                if seen.record.lease_alive(now) && seen.record.owner != self.me {
                    return Ok(None);
                }
                let held = InboxRecord {
                    status: InboxStatus::InProgress,
                    outcome: None,
                    owner: self.me,
                    lease_until: Some(now + policy.lease),
                    updated_at: now,
                    expires_at: now + policy.inbox_retention,
                    ..seen.record
                };
                match store.replace_inbox(&held, &seen.version).await {
                    Ok(version) => Ok(Some((held, version))),
                    Err(StoreError::PreconditionFailed) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            None => {
                // The inbox record expired (retention); the payment is the evidence.
                let held = InboxRecord {
                    consumer: policy.consumer_name.clone(),
                    claim_id: p.claim_id,
                    message_id: p.message_id.clone(),
                    payload_hash: p.payload_hash.clone(),
                    status: InboxStatus::InProgress,
                    outcome: None,
                    owner: self.me,
                    lease_until: Some(now + policy.lease),
                    first_delivery_count: 0,
                    last_delivery_count: 0,
                    created_at: now,
                    updated_at: now,
                    expires_at: now + policy.inbox_retention,
                };
                match store.record_handled(&held).await? {
                    InsertResult::Inserted(version) => Ok(Some((held, version))),
                    InsertResult::AlreadyExists(_) => Ok(None),
                }
            }
        }
    }

    /// Gives the lease back so the next run (or delivery) may try at once.
    async fn release(&self, held: &InboxRecord, version: &Version) {
        let now = OffsetDateTime::now_utc();
        let released = InboxRecord {
            lease_until: Some(now),
            updated_at: now,
            ..held.clone()
        };
        if let Err(e) = self
            .consumer
            .store()
            .replace_inbox(&released, version)
            .await
        {
            tracing::warn!(claimId = %held.claim_id, error = %e, "could not release the reconcile lease; it will expire");
        }
    }

    async fn ask(&self, p: &PaymentRecord) -> Verdict {
        let held = match self.bank.lookup(&p.idempotency_key).await {
            Lookup::Holds(held) => held,
            Lookup::Unknown { reason } => return Verdict::Unknown { reason },
        };
        if let Some(paid) = held.iter().find(|b| b.is_paid()) {
            let evidence = format!(
                "bank holds payment {} ({} {} {})",
                paid.payment_id, paid.status, paid.amount, paid.currency
            );
            return if same_amount(p, &paid.amount, &paid.currency) {
                Verdict::Paid {
                    payment_id: paid.payment_id.clone(),
                    evidence,
                }
            } else {
                Verdict::Mismatch {
                    evidence: format!(
                        "{evidence}, but the ledger says {}; never paid again, check by hand",
                        p.money
                    ),
                }
            };
        }
        if let Some(refused) = held.iter().find(|b| b.is_rejected()) {
            return Verdict::Rejected {
                evidence: format!(
                    "bank holds payment {} as {}",
                    refused.payment_id, refused.status
                ),
            };
        }
        if let Some(pending) = held.first() {
            return Verdict::Unknown {
                reason: format!(
                    "bank holds payment {} as {:?}, not final yet",
                    pending.payment_id, pending.status
                ),
            };
        }
        Verdict::NoneHeld
    }

    /// The bank holds nothing under the reference: pay now, under the same key and the
    /// same stored bytes. Only a request that carries the reference may be sent: for an
    /// older one the lookup could not have seen a payment made without it.
    async fn pay_now(
        &self,
        p: &PaymentRecord,
    ) -> Result<(Settlement, PaymentStatus, Option<String>, String), String> {
        let Some(body) = p.payout_request.as_deref() else {
            return Err("no stored payout request".into());
        };
        if !carries_reference(body, p.idempotency_key.as_str()) {
            return Err(
                "the stored request predates bank references, so the lookup cannot rule out an earlier payout; check the bank by hand".into(),
            );
        }
        let policy = self.consumer.policy();
        // An authoritative "none" means the bank holds nothing under this reference:
        // this request starts a new key window.
        let window = SendWindow::new(
            policy.retry_budget,
            OffsetDateTime::now_utc(),
            policy.bank_key_window,
        );
        match self.bank.pay(&p.idempotency_key, body, window).await {
            PayoutOutcome::Paid { payment_id } => Ok((
                Settlement::PaidNow,
                PaymentStatus::Paid,
                Some(payment_id.clone()),
                format!("bank held nothing under the reference; paid now as {payment_id}"),
            )),
            PayoutOutcome::Rejected { reason, .. } => Ok((
                Settlement::Rejected,
                PaymentStatus::Rejected,
                None,
                format!("bank held nothing; the new request was refused: {reason}"),
            )),
            PayoutOutcome::KeyMismatch { reason } => Ok((
                Settlement::Mismatch,
                PaymentStatus::NeedsReconciliation,
                None,
                reason,
            )),
            PayoutOutcome::KeyWindowClosed { last_error, .. }
            | PayoutOutcome::GaveUp { last_error, .. } => {
                Err(format!("paying now did not finish: {last_error}"))
            }
            PayoutOutcome::ServiceFault { reason, .. } => Err(reason),
        }
    }
}

impl Verdict {
    fn describe(&self) -> String {
        match self {
            Verdict::Paid { evidence, .. } => format!("would mark paid: {evidence}"),
            Verdict::Mismatch { evidence } => format!("mismatch: {evidence}"),
            Verdict::Rejected { evidence } => format!("would mark rejected: {evidence}"),
            Verdict::NoneHeld => "the bank holds nothing under the reference: would pay now".into(),
            Verdict::Unknown { reason } => format!("still unknown: {reason}"),
        }
    }
}

/// An `in_progress` payment whose message nobody works on any more: its lease ran out
/// longer ago than `min_age` (or its inbox record is gone and it was last touched
/// that long ago).
fn orphaned(
    p: &PaymentRecord,
    inbox: Option<&Versioned<InboxRecord>>,
    now: OffsetDateTime,
    min_age: Duration,
) -> bool {
    let idle_since = match inbox {
        Some(i) if i.record.status == InboxStatus::InProgress => {
            i.record.lease_until.unwrap_or(i.record.updated_at)
        }
        Some(i) => i.record.updated_at,
        None => p.updated_at,
    };
    idle_since + min_age <= now
}

fn same_amount(p: &PaymentRecord, amount: &str, currency: &str) -> bool {
    let parse = |s: &str| s.trim().parse::<Decimal>().ok().map(|d| d.normalize());
    parse(amount) == Some(p.money.amount()) && p.money.currency().code() == currency
}

fn carries_reference(body: &str, key: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("reference")
                .and_then(|r| r.as_str())
                .map(|r| r == key)
        })
        .unwrap_or(false)
}

/// The run lease: one reconcile run at a time across instances. An inbox record of the
/// pseudo-consumer `reconcile-run` under a fixed claim id, taken and given back with the
/// same conditional writes as a message's lease.
pub struct RunLease {
    record: InboxRecord,
    version: Version,
}

const RUN_LEASE_CLAIM: &str = "5e3c0f1a-7d2b-4c69-9f41-2a8e6b0d9c17";

impl RunLease {
    /// Takes the run lease for `length`, or `None` when another run holds it.
    pub async fn take(consumer: &Consumer, length: Duration) -> Result<Option<Self>, StoreError> {
        let store = consumer.store();
        let claim_id = ClaimId::parse(RUN_LEASE_CLAIM)
            .map_err(|e| StoreError::Permanent(format!("run lease claim id: {e}")))?;
        let message_id = MessageId::parse("reconcile-run")
            .map_err(|e| StoreError::Permanent(format!("run lease id: {e}")))?;
        let key = InboxKey {
            consumer: "reconcile-run".into(),
            claim_id,
            message_id: message_id.clone(),
        };
        let now = OffsetDateTime::now_utc();
        let me = AttemptId::new();
        let retention = consumer.policy().inbox_retention;
        match store.inbox(&key).await? {
            Some(seen) if seen.record.lease_alive(now) => Ok(None),
            Some(seen) => {
                let record = InboxRecord {
                    status: InboxStatus::InProgress,
                    owner: me,
                    lease_until: Some(now + length),
                    updated_at: now,
                    expires_at: now + retention,
                    ..seen.record
                };
                match store.replace_inbox(&record, &seen.version).await {
                    Ok(version) => Ok(Some(RunLease { record, version })),
                    Err(StoreError::PreconditionFailed) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            None => {
                let record = InboxRecord {
                    consumer: key.consumer,
                    claim_id,
                    message_id,
                    payload_hash: PayloadHash::from_stored("reconcile-run".into()),
                    status: InboxStatus::InProgress,
                    outcome: None,
                    owner: me,
                    lease_until: Some(now + length),
                    first_delivery_count: 0,
                    last_delivery_count: 0,
                    created_at: now,
                    updated_at: now,
                    expires_at: now + retention,
                };
                match store.record_handled(&record).await? {
                    InsertResult::Inserted(version) => Ok(Some(RunLease { record, version })),
                    InsertResult::AlreadyExists(_) => Ok(None),
                }
            }
        }
    }

    /// Gives the run lease back. Best effort: otherwise it expires.
    pub async fn release(self, consumer: &Consumer) {
        let now = OffsetDateTime::now_utc();
        let done = InboxRecord {
            status: InboxStatus::Completed,
            outcome: Some(InboxOutcome::RunReleased),
            lease_until: None,
            updated_at: now,
            ..self.record
        };
        if let Err(e) = consumer.store().replace_inbox(&done, &self.version).await {
            tracing::warn!(error = %e, "could not release the reconcile run lease; it will expire");
        }
    }
}

/// Renders the report for people: one line per payment, then the summary.
pub fn render_text(summary: &Summary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for l in &summary.lines {
        let _ = writeln!(
            o,
            "{}  {}  {} -> {}  {:?}: {}",
            crate::cli::printable(&l.claim_id),
            crate::cli::printable(&l.message_id),
            l.before,
            l.after,
            l.result,
            crate::cli::printable(&l.detail)
        );
    }
    let _ = writeln!(
        o,
        "examined {}: paid by lookup {}, paid now {}, rejected {}, still unknown {}, mismatches {}, skipped {} (before: needs reconciliation {}, orphaned in progress {})",
        summary.examined,
        summary.paid_by_lookup,
        summary.paid_now,
        summary.rejected,
        summary.still_unknown,
        summary.mismatches,
        summary.skipped,
        summary.needs_reconciliation_before,
        summary.orphaned_in_progress_before
    );
    o
}

/// Logs a run's summary as one structured line (`reconcile finished`), the line the
/// alerts query.
pub fn log_summary(summary: &Summary, trigger: &'static str) {
    tracing::info!(
        trigger,
        examined = summary.examined,
        paidByLookup = summary.paid_by_lookup,
        paidNow = summary.paid_now,
        rejected = summary.rejected,
        stillUnknown = summary.still_unknown,
        mismatches = summary.mismatches,
        skipped = summary.skipped,
        needsReconciliationBefore = summary.needs_reconciliation_before,
        orphanedInProgress = summary.orphaned_in_progress_before,
        "reconcile finished"
    );
}
