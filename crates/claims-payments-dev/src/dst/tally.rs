//! What the `Reconcile` timer runs of a run settled, while faults fired and after: a
//! run's result and the totals of many, printed by `dst`.

use claims_payments::seams::reconcile::RunCounts;

/// What the `Reconcile` timer runs of one run settled, while faults fired (`chaos`) and
/// after, from the summaries they answered; and the runs a crash or a function timeout
/// cut before they answered.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReconcileTally {
    pub chaos: Settled,
    pub calm: Settled,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Settled {
    pub runs: u64,
    pub cut: u64,
    pub paid_now: u64,
    pub paid_by_lookup: u64,
    pub rejected: u64,
    pub still_unknown: u64,
}

impl ReconcileTally {
    fn phase(&mut self, chaos: bool) -> &mut Settled {
        if chaos {
            &mut self.chaos
        } else {
            &mut self.calm
        }
    }

    /// A run's answer: its counts, if it finished (a skipped or failed run counts as a
    /// run that settled nothing). How many payments it settled.
    pub(super) fn count(&mut self, chaos: bool, counts: Option<&RunCounts>) -> u64 {
        let counts = counts.copied().unwrap_or_default();
        let n = |v: usize| v as u64;
        let phase = self.phase(chaos);
        phase.runs += 1;
        phase.paid_now += n(counts.paid_now);
        phase.paid_by_lookup += n(counts.paid_by_lookup);
        phase.rejected += n(counts.rejected);
        phase.still_unknown += n(counts.still_unknown);
        n(counts.settled())
    }

    /// A run cut before it answered.
    pub(super) fn cut(&mut self, chaos: bool) {
        let phase = self.phase(chaos);
        phase.runs += 1;
        phase.cut += 1;
    }

    pub fn add(&mut self, other: &ReconcileTally) {
        for (mine, theirs) in [
            (&mut self.chaos, &other.chaos),
            (&mut self.calm, &other.calm),
        ] {
            mine.runs += theirs.runs;
            mine.cut += theirs.cut;
            mine.paid_now += theirs.paid_now;
            mine.paid_by_lookup += theirs.paid_by_lookup;
            mine.rejected += theirs.rejected;
            mine.still_unknown += theirs.still_unknown;
        }
    }
}

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} runs ({} cut by a crash or timeout), pay-now {}, paid by lookup {}, rejected {}, still unknown {}",
            self.runs, self.cut, self.paid_now, self.paid_by_lookup, self.rejected, self.still_unknown
        )
    }
}

impl std::fmt::Display for ReconcileTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "while faults fire {}; calm {}", self.chaos, self.calm)
    }
}
