//! What a run reports: a line per payment it examined, the summary with its counts and
//! verdict ("settled" only when nothing is open), and the one log line the alerts query.

use serde::{Deserialize, Serialize};

use crate::store::{PaymentRecord, PaymentStatus};

/// How one payment ended in this run (with `--dry-run`: how it would end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Settlement {
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
    /// A store error stopped it (reading its records, holding its lease, writing the
    /// settlement): left as it was for the next run.
    StoreError,
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

/// The verdict of a run, and the CLI's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
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
    pub(super) dry_run: bool,
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
    pub not_reached: usize,
    /// Payments a store error stopped, left for the next run (and a failed count of the
    /// mismatched payments).
    #[serde(default)]
    pub store_errors: usize,
    /// The listing hit [`MAX_PER_RUN`]: more unsettled payments exist than were listed.
    pub(super) more_beyond_limit: bool,
    /// Mismatched payments in the store after the run, waiting for a person (counted up
    /// to 10,000).
    pub needs_a_person: usize,
    /// Before the run: payments in `needs_reconciliation`, and `in_progress` payments
    /// whose lease ran out longer ago than the minimum age.
    pub needs_reconciliation_before: usize,
    pub orphaned_in_progress_before: usize,
    pub lines: Vec<Line>,
}

/// What a run settled and whether work is left, as numbers: the timer's answer carries
/// them (`ReturnValue.reconcile`) for a tool that acts on a run without reading its text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunCounts {
    pub examined: usize,
    pub paid_by_lookup: usize,
    pub paid_now: usize,
    pub rejected: usize,
    pub still_unknown: usize,
    pub not_reached: usize,
    pub more_beyond_limit: bool,
}

impl RunCounts {
    /// Payments the run settled: paid (by lookup or now) or rejected.
    pub fn settled(&self) -> usize {
        self.paid_by_lookup + self.paid_now + self.rejected
    }

    /// Whether a run right after this one has payments to take up that this one left:
    /// its time budget ran out, or the listing hit [`MAX_PER_RUN`](super::MAX_PER_RUN).
    pub fn more_left(&self) -> bool {
        self.more_beyond_limit || self.not_reached > 0
    }
}

impl Summary {
    /// "Settled" only when nothing is left open, in this run or before it.
    pub fn verdict(&self) -> Verdict {
        let open = self.still_unknown
            + self.mismatches
            + self.skipped
            + self.waiting
            + self.not_reached
            + self.store_errors
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

    /// The counts a tool acts on (see [`RunCounts`]).
    pub fn run_counts(&self) -> RunCounts {
        RunCounts {
            examined: self.examined,
            paid_by_lookup: self.paid_by_lookup,
            paid_now: self.paid_now,
            rejected: self.rejected,
            still_unknown: self.still_unknown,
            not_reached: self.not_reached,
            more_beyond_limit: self.more_beyond_limit,
        }
    }

    /// The counts on one line, for people and the timer's answer to the host.
    pub fn counts(&self) -> String {
        format!(
            "{}examined {}: paid by lookup {}, paid now {}, rejected {}, still unknown {}, mismatches {} (double payments {}), skipped {}; store errors {}; not examined: waiting {}, not reached {}{}; mismatched payments waiting for a person {} (before: needs reconciliation {}, orphaned in progress {})",
            if self.dry_run { "dry run, nothing written: " } else { "" },
            self.examined,
            self.paid_by_lookup,
            self.paid_now,
            self.rejected,
            self.still_unknown,
            self.mismatches,
            self.double_payments,
            self.skipped,
            self.store_errors,
            self.waiting,
            self.not_reached,
            if self.more_beyond_limit { ", and more beyond the run's limit" } else { "" },
            self.needs_a_person,
            self.needs_reconciliation_before,
            self.orphaned_in_progress_before,
        )
    }

    pub(super) fn add(&mut self, line: Line) {
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
            Settlement::StoreError => self.store_errors += 1,
        }
        if !matches!(
            line.result,
            Settlement::Skipped | Settlement::Waiting | Settlement::StoreError
        ) {
            self.examined += 1;
        }
        self.lines.push(line);
    }
}

pub(super) fn line(
    p: &PaymentRecord,
    result: Settlement,
    after: PaymentStatus,
    detail: String,
) -> Line {
    Line {
        claim_id: p.claim_id.to_string(),
        message_id: p.message_id.to_string(),
        before: p.status.as_str().to_owned(),
        result,
        after: after.as_str().to_owned(),
        detail,
    }
}

/// Logs a run's summary as one structured line (`reconcile finished`), the line the
/// alerts query.
pub fn log_summary(summary: &Summary, trigger: &'static str) {
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
        storeErrors = summary.store_errors,
        waiting = summary.waiting,
        notReached = summary.not_reached,
        moreBeyondLimit = summary.more_beyond_limit,
        needsAPerson = summary.needs_a_person,
        needsReconciliationBefore = summary.needs_reconciliation_before,
        orphanedInProgress = summary.orphaned_in_progress_before,
        "reconcile finished"
    );
}
