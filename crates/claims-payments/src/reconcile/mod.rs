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
//! examine (too young, leased by a live delivery, beyond its budget or its limit) and
//! the mismatched payments waiting for a person. [`Summary::verdict`] is "settled"
//! only when nothing is open; `claims-payments reconcile` exits 0 then and 3
//! otherwise, `--dry-run` included.
//!
//! `claims-payments reconcile` runs it from the CLI; the `Reconcile` timer function runs
//! it inside `serve`, one run at a time across instances (a run lease in the store).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ambient::Ambient;
use crate::bank::{BankClient, BankPayment, BankStatus, Lookup, PayoutOutcome, SendWindow};
use crate::consumer::{OutcomeKind, Policy};
use crate::idempotency::liveness::Owners;
use crate::idempotency::{self, Created, Lease, Terms};
use crate::message::{ClaimId, MessageId, PayloadHash};
use crate::services::Services;
use crate::store::{
    AttemptId, DynStore, Finalize, InboxKey, InboxOutcome, InboxRecord, InboxStatus, PaymentRecord,
    PaymentStatus, StoreError, Versioned,
};
use crate::telemetry;

/// At most this many payments are listed per run; the rest wait for the next one (and
/// the report says there are more).
pub const MAX_PER_RUN: usize = 500;
/// Mismatched payments are counted up to this many in a report.
const MAX_COUNTED: usize = 10_000;
/// The longest `--older-than` (and minimum age) a run accepts: ten years.
pub(crate) const MAX_MIN_AGE: Duration = Duration::from_secs(10 * 365 * 86_400);

/// How one payment ended in this run (with `--dry-run`: how it would end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Settlement {
    /// The bank holds a matching payment: recorded as paid.
    PaidByLookup,
    /// The bank holds none: paid now under the same key and reference.
    PaidNow,
    /// The bank refused it: recorded as rejected.
    Rejected,
    /// The bank holds something that contradicts the ledger: recorded as `mismatched`,
    /// for a person.
    Mismatch,
    /// A mismatch of its own kind: several paid entries under the one reference.
    DoublePayment,
    /// The bank's answer was not authoritative, or the payout could not finish now.
    StillUnknown,
    /// A live delivery or another run held the message, or settled the payment while
    /// this run looked at it: left to them.
    Skipped,
    /// Not examined: its lease ran out too recently, or a live delivery holds it.
    Waiting,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub(crate) claim_id: String,
    pub(crate) message_id: String,
    pub(crate) before: String,
    pub(crate) result: Settlement,
    pub(crate) after: String,
    pub detail: String,
}

/// The verdict of a run, and the CLI's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Verdict {
    /// Nothing is open: every unsettled payment was settled.
    Settled,
    /// Something is still open: unknown, mismatched, skipped, not examined.
    OpenItemsRemain,
}

/// What a run did, and what is still open after it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nothing was written or paid; the counts say what a real run would do.
    dry_run: bool,
    /// Payments whose message this run asked the bank about.
    pub examined: usize,
    pub paid_by_lookup: usize,
    pub paid_now: usize,
    pub rejected: usize,
    pub still_unknown: usize,
    /// Mismatches found in this run (double payments included).
    pub mismatches: usize,
    /// Of those, several paid entries under the one reference.
    pub double_payments: usize,
    pub skipped: usize,
    /// Listed but not examined: too young, or leased by a live delivery.
    pub waiting: usize,
    /// Listed but not examined because the run's time budget ran out.
    pub(crate) not_reached: usize,
    /// The listing hit [`MAX_PER_RUN`]: more unsettled payments exist than were listed.
    more_beyond_limit: bool,
    /// Mismatched payments in the store after the run, waiting for a person (counted up
    /// to 10,000).
    pub needs_a_person: usize,
    /// Before the run: payments in `needs_reconciliation`, and `in_progress` payments
    /// whose lease ran out longer ago than the minimum age.
    pub needs_reconciliation_before: usize,
    pub orphaned_in_progress_before: usize,
    pub lines: Vec<Line>,
}

impl Summary {
    /// "Settled" only when nothing is left open, in this run or before it.
    pub(crate) fn verdict(&self) -> Verdict {
        let open = self.still_unknown
            + self.mismatches
            + self.skipped
            + self.waiting
            + self.not_reached
            + self.needs_a_person;
        if open == 0 && !self.more_beyond_limit {
            Verdict::Settled
        } else {
            Verdict::OpenItemsRemain
        }
    }

    /// Whether nothing is left open (see [`Summary::verdict`]).
    pub fn all_settled(&self) -> bool {
        self.verdict() == Verdict::Settled
    }

    /// The counts on one line, for people and the timer's answer to the host.
    pub fn counts(&self) -> String {
        format!(
            "{}examined {}: paid by lookup {}, paid now {}, rejected {}, still unknown {}, mismatches {} (double payments {}), skipped {}; not examined: waiting {}, not reached {}{}; mismatched payments waiting for a person {} (before: needs reconciliation {}, orphaned in progress {})",
            if self.dry_run { "dry run, nothing written: " } else { "" },
            self.examined,
            self.paid_by_lookup,
            self.paid_now,
            self.rejected,
            self.still_unknown,
            self.mismatches,
            self.double_payments,
            self.skipped,
            self.waiting,
            self.not_reached,
            if self.more_beyond_limit { ", and more beyond the run's limit" } else { "" },
            self.needs_a_person,
            self.needs_reconciliation_before,
            self.orphaned_in_progress_before,
        )
    }

    fn add(&mut self, line: Line) {
        match line.result {
            Settlement::PaidByLookup => self.paid_by_lookup += 1,
            Settlement::PaidNow => self.paid_now += 1,
            Settlement::Rejected => self.rejected += 1,
            Settlement::Mismatch => self.mismatches += 1,
            Settlement::DoublePayment => {
                self.mismatches += 1;
                self.double_payments += 1;
            }
            Settlement::StillUnknown => self.still_unknown += 1,
            Settlement::Skipped => self.skipped += 1,
            Settlement::Waiting => self.waiting += 1,
        }
        if !matches!(line.result, Settlement::Skipped | Settlement::Waiting) {
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
    store: DynStore,
    bank: BankClient,
    policy: Policy,
    ambient: Ambient,
    owners: Arc<Owners>,
    me: AttemptId,
}

/// What the bank's lookup means for one payment.
enum Finding {
    Paid {
        payment_id: String,
        evidence: String,
    },
    Mismatch {
        evidence: String,
        double_payment: bool,
    },
    Rejected {
        evidence: String,
    },
    NoneHeld,
    Unknown {
        reason: String,
    },
}

/// The message's lease, held by this run: the record as written, its version, and
/// the record as found (to give back unchanged when nothing is settled).
struct Held {
    lease: Lease,
    found: Option<InboxRecord>,
}

/// What settling decided: the result, the payment's new status, its bank id and why.
struct Decision {
    result: Settlement,
    status: PaymentStatus,
    bank_payment_id: Option<String>,
    evidence: String,
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
            let key = self.inbox_key(&payment.record);
            let inbox = store.inbox(&key).await?;
            let p = &payment.record;
            // A live lease of a process that has ended holds nothing (one read, only then).
            let owner_gone = match &inbox {
                Some(i) if i.record.lease_alive(now) => self.owners.check(i.record.owner).await,
                _ => false,
            };
            if p.status == PaymentStatus::NeedsReconciliation {
                summary.needs_reconciliation_before += 1;
            } else if let Some(why) =
                not_orphaned(p, inbox.as_ref(), owner_gone, now, options.min_age)
            {
                summary.add(line(p, Settlement::Waiting, p.status, why));
                continue;
            } else {
                summary.orphaned_in_progress_before += 1;
            }
            let line = self.settle(payment, inbox, options).await?;
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
        }
        summary.needs_a_person = store
            .count_payments(PaymentStatus::Mismatched, MAX_COUNTED)
            .await?;
        if !options.dry_run {
            let c = telemetry::counters();
            c.reconcile_runs.inc();
            c.reconcile_settled
                .add((summary.paid_by_lookup + summary.paid_now + summary.rejected) as u64);
            c.reconcile_unknown
                .add((summary.still_unknown + summary.mismatches) as u64);
        }
        Ok(summary)
    }

    fn inbox_key(&self, payment: &PaymentRecord) -> InboxKey {
        InboxKey {
            consumer: self.policy.consumer_name.clone(),
            claim_id: payment.claim_id,
            message_id: payment.message_id.clone(),
        }
    }

    async fn settle(
        &self,
        listed: Versioned<PaymentRecord>,
        inbox: Option<Versioned<InboxRecord>>,
        options: Options,
    ) -> Result<Line, StoreError> {
        if options.dry_run {
            // The same decision a real run makes, without the lease, the payout or a write.
            let p = &listed.record;
            let decision = match self.ask(p).await {
                Finding::NoneHeld => match payable_request(p) {
                    Ok(_) => Decision {
                        result: Settlement::PaidNow,
                        status: PaymentStatus::Paid,
                        bank_payment_id: None,
                        evidence: "the bank holds nothing under the reference: would pay now"
                            .into(),
                    },
                    Err(reason) => Decision::unknown(reason.to_string()),
                },
                finding => Decision::from_finding(finding),
            };
            return Ok(line(
                p,
                decision.result,
                decision.status,
                format!("dry run, nothing written: {}", decision.evidence),
            ));
        }
        let Some(held) = self.hold(&listed.record, inbox).await? else {
            return Ok(line(
                &listed.record,
                Settlement::Skipped,
                listed.record.status,
                "a live delivery or another reconcile run holds the message".into(),
            ));
        };
        // Under the lease, the payment as it is now, not as the listing saw it: another
        // run or a delivery may have settled it since.
        let store = &self.store;
        let payment = store
            .payment(listed.record.claim_id, listed.record.purpose)
            .await?
            .ok_or_else(|| {
                StoreError::Permanent(format!(
                    "the payment of claim {} vanished during reconciliation",
                    listed.record.claim_id
                ))
            })?;
        let p = &payment.record;
        if !matches!(
            p.status,
            PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation
        ) {
            self.release(&held).await;
            return Ok(line(
                p,
                Settlement::Skipped,
                p.status,
                format!(
                    "settled meanwhile by another run or a delivery (now {})",
                    p.status.as_str()
                ),
            ));
        }
        let decision = match self.ask(p).await {
            Finding::NoneHeld => self.pay_now(p).await,
            finding => Decision::from_finding(finding),
        };
        if decision.result == Settlement::StillUnknown {
            self.release(&held).await;
            return Ok(line(
                p,
                Settlement::StillUnknown,
                p.status,
                decision.evidence,
            ));
        }
        let now = self.ambient.now();
        let how = match decision.result {
            Settlement::PaidByLookup => "paid by lookup",
            Settlement::PaidNow => "paid now",
            Settlement::Rejected => "rejected",
            _ => "mismatch: needs a person",
        };
        let reason = format!("reconciled at {now} ({how}): {}", decision.evidence);
        let final_payment = PaymentRecord {
            status: decision.status,
            bank_payment_id: decision.bank_payment_id.or(p.bank_payment_id.clone()),
            status_reason: Some(reason.clone()),
            updated_at: now,
            ..p.clone()
        };
        let outcome = match decision.status {
            PaymentStatus::Paid => OutcomeKind::Paid,
            PaymentStatus::Rejected => OutcomeKind::Rejected,
            _ => OutcomeKind::NeedsReconciliation,
        };
        let final_inbox = idempotency::completed(&held.lease.record, outcome.into(), now);
        match store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &held.lease.version,
                payment: &final_payment,
                payment_version: Some(&payment.version),
            })
            .await
        {
            Ok(()) => Ok(line(p, decision.result, decision.status, reason)),
            // A redelivery took the message over, or the payment changed, meanwhile;
            // they finish it. Nothing was lost: our bank call, if any, was under the
            // same key too.
            Err(StoreError::PreconditionFailed) => Ok(line(
                p,
                Settlement::Skipped,
                p.status,
                "a live delivery or another run changed the records meanwhile; it settles them"
                    .into(),
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
    ) -> Result<Option<Held>, StoreError> {
        let store = self.store.as_ref();
        let policy = &self.policy;
        let now = self.ambient.now();
        match inbox {
            Some(seen) => {
                // Not a broker delivery: the lease decides (count 0), unless its
                // process has ended.
                let gone = self.owners.check(seen.record.owner).await;
                if !idempotency::holder(&seen.record, self.me, 0, gone, now).may_take_over() {
                    return Ok(None);
                }
                let taken = idempotency::taken_over(&seen.record, self.me, 0, policy.terms(), now);
                Ok(Lease::take_over(store, &seen, taken)
                    .await?
                    .map(|lease| Held {
                        lease,
                        found: Some(seen.record),
                    }))
            }
            None => {
                // The inbox record expired (retention); the payment is the evidence.
                let key = InboxKey {
                    consumer: policy.consumer_name.clone(),
                    claim_id: p.claim_id,
                    message_id: p.message_id.clone(),
                };
                let record = idempotency::new_record(
                    &key,
                    &p.payload_hash,
                    self.me,
                    0,
                    policy.terms(),
                    now,
                    None,
                );
                Ok(match Lease::create(store, record).await? {
                    Created::Held(lease) => Some(Held { lease, found: None }),
                    Created::Exists(_) => None,
                })
            }
        }
    }

    /// Gives the lease back as the message was found (or, for a record this run
    /// created, as idle as the payment was), so the next run or delivery may try at
    /// once and the payment looks no younger than before: a release must not hide it
    /// from the next run.
    async fn release(&self, held: &Held) {
        let record = &held.lease.record;
        let released = match &held.found {
            Some(found) => found.clone(),
            None => InboxRecord {
                lease_until: Some(self.ambient.now().min(record.created_at)),
                ..record.clone()
            },
        };
        held.lease.give_back(self.store.as_ref(), released).await;
    }

    async fn ask(&self, p: &PaymentRecord) -> Finding {
        match self.bank.lookup(&p.idempotency_key).await {
            Lookup::Holds(held) => judge(p, &held),
            Lookup::Unknown { reason } => Finding::Unknown { reason },
        }
    }

    /// The bank holds nothing under the reference: pay now, under the same key and the
    /// same stored bytes.
    async fn pay_now(&self, p: &PaymentRecord) -> Decision {
        let body = match payable_request(p) {
            Ok(body) => body,
            Err(reason) => return Decision::unknown(reason.to_string()),
        };
        let policy = &self.policy;
        // An authoritative "none" means the bank holds nothing under this reference:
        // this request starts a new key window.
        let window = SendWindow::new(
            policy.retry_budget,
            self.ambient.now(),
            policy.bank_key_window,
        );
        match self.bank.pay(&p.idempotency_key, body, window).await {
            PayoutOutcome::Paid { payment_id } => Decision {
                result: Settlement::PaidNow,
                status: PaymentStatus::Paid,
                evidence: format!("bank held nothing under the reference; paid now as {payment_id}"),
                bank_payment_id: Some(payment_id),
            },
            PayoutOutcome::Rejected { reason, .. } => Decision {
                result: Settlement::Rejected,
                status: PaymentStatus::Rejected,
                bank_payment_id: None,
                evidence: format!("bank held nothing; the new request was refused: {reason}"),
            },
            PayoutOutcome::KeyMismatch { reason } => Decision {
                result: Settlement::Mismatch,
                status: PaymentStatus::Mismatched,
                bank_payment_id: None,
                evidence: format!("bank held nothing under the reference, yet refused the key: {reason}; never sent again, check by hand"),
            },
            PayoutOutcome::KeyWindowClosed { last_error, .. }
            | PayoutOutcome::GaveUp { last_error, .. } => {
                Decision::unknown(format!("paying now did not finish: {last_error}"))
            }
            PayoutOutcome::ServiceFault { reason, .. } => Decision::unknown(reason),
        }
    }
}

impl Decision {
    fn unknown(reason: String) -> Self {
        Decision {
            result: Settlement::StillUnknown,
            status: PaymentStatus::NeedsReconciliation,
            bank_payment_id: None,
            evidence: reason,
        }
    }

    /// Every finding but `NoneHeld`, which needs a payout first.
    fn from_finding(finding: Finding) -> Self {
        match finding {
            Finding::Paid {
                payment_id,
                evidence,
            } => Decision {
                result: Settlement::PaidByLookup,
                status: PaymentStatus::Paid,
                bank_payment_id: Some(payment_id),
                evidence,
            },
            Finding::Mismatch {
                evidence,
                double_payment,
            } => Decision {
                result: if double_payment {
                    Settlement::DoublePayment
                } else {
                    Settlement::Mismatch
                },
                status: PaymentStatus::Mismatched,
                bank_payment_id: None,
                evidence,
            },
            Finding::Rejected { evidence } => Decision {
                result: Settlement::Rejected,
                status: PaymentStatus::Rejected,
                bank_payment_id: None,
                evidence,
            },
            Finding::Unknown { reason } => Decision::unknown(reason),
            Finding::NoneHeld => Decision::unknown("the bank holds nothing yet".into()),
        }
    }
}

/// What the entries the bank holds under our reference mean for `p`. Pure.
fn judge(p: &PaymentRecord, held: &[BankPayment]) -> Finding {
    let describe = |b: &BankPayment| {
        format!(
            "{} ({} {} {})",
            b.payment_id, b.status, b.amount, b.currency
        )
    };
    let paid: Vec<&BankPayment> = held
        .iter()
        .filter(|b| b.status == BankStatus::Paid)
        .collect();
    let pending: Vec<&BankPayment> = held
        .iter()
        .filter(|b| b.status == BankStatus::Pending)
        .collect();
    if paid.len() > 1 {
        let list: Vec<String> = paid.iter().map(|b| describe(b)).collect();
        return Finding::Mismatch {
            evidence: format!(
                "double payment at the bank: {} paid entries under the one reference ({}); never settled automatically, check by hand",
                paid.len(),
                list.join("; ")
            ),
            double_payment: true,
        };
    }
    if let Some(paid) = paid.first() {
        if !same_amount(p, paid) {
            return Finding::Mismatch {
                evidence: format!(
                    "bank holds payment {}, but the ledger says {}; never paid again, check by hand",
                    describe(paid),
                    p.money
                ),
                double_payment: false,
            };
        }
        if let Some(other) = pending.first() {
            return Finding::Unknown {
                reason: format!(
                    "bank holds payment {} as paid and {} still pending under the same reference; asked again once it is final",
                    paid.payment_id, other.payment_id
                ),
            };
        }
        return Finding::Paid {
            payment_id: paid.payment_id.clone(),
            evidence: format!("bank holds payment {}", describe(paid)),
        };
    }
    // Pending anywhere: it may still pay, whatever else the bank lists.
    if let Some(pending) = pending.first() {
        return Finding::Unknown {
            reason: format!("bank holds payment {}, not final yet", describe(pending)),
        };
    }
    if let Some(refused) = held.first() {
        return Finding::Rejected {
            evidence: format!("bank holds payment {}", describe(refused)),
        };
    }
    Finding::NoneHeld
}

fn line(p: &PaymentRecord, result: Settlement, after: PaymentStatus, detail: String) -> Line {
    Line {
        claim_id: p.claim_id.to_string(),
        message_id: p.message_id.to_string(),
        before: p.status.as_str().to_owned(),
        result,
        after: after.as_str().to_owned(),
        detail,
    }
}

/// Why an `in_progress` payment is not orphaned yet (`None`: it is). Orphaned: its
/// message's lease ran out longer ago than `min_age` (or its inbox record is gone and
/// the payment was last touched that long ago; or the lease's process has ended,
/// `owner_gone`, and the record was last written that long ago). An age past the
/// calendar's end is simply never reached.
fn not_orphaned(
    p: &PaymentRecord,
    inbox: Option<&Versioned<InboxRecord>>,
    owner_gone: bool,
    now: OffsetDateTime,
    min_age: Duration,
) -> Option<String> {
    if let Some(i) = inbox.filter(|i| i.record.lease_alive(now)) {
        if !owner_gone {
            return Some(format!(
                "a delivery holds the message until {}",
                i.record.lease_until.unwrap_or(now)
            ));
        }
    }
    let idle_since = match inbox {
        Some(i) if owner_gone => i.record.updated_at,
        Some(i) if i.record.status == InboxStatus::InProgress => {
            i.record.lease_until.unwrap_or(i.record.updated_at)
        }
        Some(i) => i.record.updated_at,
        None => p.updated_at,
    };
    let ripe = time::Duration::try_from(min_age)
        .ok()
        .and_then(|age| idle_since.checked_add(age));
    match ripe {
        Some(ripe) if ripe <= now => None,
        Some(ripe) => Some(format!("idle since {idle_since}; examined from {ripe}")),
        None => Some(format!(
            "idle since {idle_since}; the minimum age is never reached"
        )),
    }
}

fn same_amount(p: &PaymentRecord, held: &BankPayment) -> bool {
    held.amount == p.money.amount() && p.money.currency().code() == held.currency
}

/// Why reconciliation may not send a payout that the bank says it never received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum CannotPayNow {
    #[error("no stored payout request")]
    NoStoredRequest,
    #[error("the stored request predates bank references, so the lookup cannot rule out an earlier payout; check the bank by hand")]
    PredatesReferences,
}

/// The stored request, if it may be sent now: only one that carries the reference,
/// since for an older one the lookup could not have seen a payment made without it.
fn payable_request(p: &PaymentRecord) -> Result<&str, CannotPayNow> {
    let Some(body) = p.payout_request.as_deref() else {
        return Err(CannotPayNow::NoStoredRequest);
    };
    if !carries_reference(body, p.idempotency_key.as_str()) {
        return Err(CannotPayNow::PredatesReferences);
    }
    Ok(body)
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
pub(crate) struct RunLease(Lease);

const RUN_LEASE_CLAIM: &str = "5e3c0f1a-7d2b-4c69-9f41-2a8e6b0d9c17";
/// The pseudo-consumer of the run lease (never a consumer name: see `config`).
pub(crate) const RUN_LEASE_CONSUMER: &str = "reconcile-run";

impl RunLease {
    /// Takes the run lease for `length`, or `None` when another run holds it.
    pub(crate) async fn take(
        run: &Reconciler,
        length: Duration,
    ) -> Result<Option<Self>, StoreError> {
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
        let seen = match store.inbox(&key).await? {
            Some(seen) => seen,
            None => {
                let hash = PayloadHash::from_stored("reconcile-run".into());
                let record = idempotency::new_record(&key, &hash, me, 0, terms, now, None);
                return Ok(match Lease::create(store, record).await? {
                    Created::Held(lease) => Some(RunLease(lease)),
                    Created::Exists(_) => None,
                });
            }
        };
        let gone = run.owners.check(seen.record.owner).await;
        if !idempotency::holder(&seen.record, me, 0, gone, now).may_take_over() {
            return Ok(None);
        }
        let taken = idempotency::taken_over(&seen.record, me, 0, terms, now);
        Ok(Lease::take_over(store, &seen, taken).await?.map(RunLease))
    }

    /// Gives the run lease back. Best effort: otherwise it expires.
    pub(crate) async fn release(self, run: &Reconciler) {
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

/// Logs a run's summary as one structured line (`reconcile finished`), the line the
/// alerts query.
pub(crate) fn log_summary(summary: &Summary, trigger: &'static str) {
    tracing::info!(
        trigger,
        dryRun = summary.dry_run,
        verdict = ?summary.verdict(),
        examined = summary.examined,
        paidByLookup = summary.paid_by_lookup,
        paidNow = summary.paid_now,
        rejected = summary.rejected,
        stillUnknown = summary.still_unknown,
        mismatches = summary.mismatches,
        doublePayments = summary.double_payments,
        skipped = summary.skipped,
        waiting = summary.waiting,
        notReached = summary.not_reached,
        moreBeyondLimit = summary.more_beyond_limit,
        needsAPerson = summary.needs_a_person,
        needsReconciliationBefore = summary.needs_reconciliation_before,
        orphanedInProgress = summary.orphaned_in_progress_before,
        "reconcile finished"
    );
}

#[cfg(test)]
mod tests;
