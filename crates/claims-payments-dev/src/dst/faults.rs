//! The run's fault plan, drawn from its seed as FoundationDB's BUGGIFY does: each fault
//! kind is switched on for a run with probability [`ACTIVE`], and an active kind fires at
//! a rate of its own, drawn from its range. Most runs therefore exercise a few kinds
//! hard, and rare combinations get their turn across seeds.

use std::collections::BTreeMap;
use std::fmt;

use super::world::Dice;

/// The chance that a fault kind is active in a run.
const ACTIVE: f64 = 0.4;

/// Every kind of fault the simulator injects, by the edge it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    // The store.
    /// A write commits and its answer is lost (claim, record_handled, replace, finalize).
    StoreWriteUnknown,
    /// Throttled without a hint: the call fails at once, nothing written.
    StoreThrottled,
    /// Throttled with a hint: the adapter waits it out and the call succeeds late.
    StoreThrottledHint,
    /// A call that takes longer than a lease before it answers.
    StoreSlowBeyondLease,
    /// A read that fails.
    StoreReadFails,
    /// A window in which no call reaches the store.
    StoreOutage,
    /// A window in which writes are refused (a failover's read-only primary).
    StoreReadOnly,
    // The bank.
    /// 500/503/429 before the payout is made.
    BankFailsBefore,
    /// The payout is made and the answer is an error or cut off.
    BankFailsAfter,
    /// The payout is made and no answer arrives within the request's timeout.
    BankAnswerLost,
    /// The bank takes long over a payout and answers 409 to the same key meanwhile.
    BankSlowProcessing,
    /// A lookup that does not yet show a payout of the last seconds.
    BankLookupLags,
    /// A lookup that fails or answers something unusable.
    BankLookupFails,
    /// A success without a usable paymentId, an oversized answer, a redirect.
    BankHostileAnswer,
    /// The bank cannot be reached for longer than its key window: payouts left unfinished
    /// meet a bank that forgot their keys.
    BankDarkPastKeyWindow,
    // The broker and the host.
    /// The message's lock runs out while its invocation still works.
    LockLost,
    /// A 2xx whose completion does not reach the broker.
    CompleteFails,
    /// The host's functionTimeout cuts an invocation.
    FunctionTimeout,
    // Processes.
    /// The handler process dies (its in-flight work dropped) and the host restarts it.
    HandlerCrash,
    /// The whole instance goes away: its locks run out, and it comes back later.
    InstanceLost,
    /// Instances' clocks differ (bounded).
    ClockSkew,
    // HTTP clients.
    /// A client gives up waiting and retries with the same key.
    ClientTimeout,
    /// A client sends the same request twice at once.
    DoubleSubmit,
    /// A client disconnects mid-request.
    Disconnect,
    /// Another caller sends its own payment under a key string a first caller used
    /// (signed-in callers: keys are scoped by caller).
    OtherCallersKey,
    // Processes, again.
    /// The process stops running for tens of seconds (a VM frozen for maintenance, a
    /// throttled container), longer than its registration lasts, then runs on with the
    /// leases it held.
    ProcessPaused,
    /// The process dies in the middle of a `Reconcile` run (between its lookups, payouts
    /// and writes), and the host restarts it.
    ReconcileCrash,
}

impl Fault {
    pub const ALL: [Fault; 27] = [
        Fault::StoreWriteUnknown,
        Fault::StoreThrottled,
        Fault::StoreThrottledHint,
        Fault::StoreSlowBeyondLease,
        Fault::StoreReadFails,
        Fault::StoreOutage,
        Fault::StoreReadOnly,
        Fault::BankFailsBefore,
        Fault::BankFailsAfter,
        Fault::BankAnswerLost,
        Fault::BankSlowProcessing,
        Fault::BankLookupLags,
        Fault::BankLookupFails,
        Fault::BankHostileAnswer,
        Fault::BankDarkPastKeyWindow,
        Fault::LockLost,
        Fault::CompleteFails,
        Fault::FunctionTimeout,
        Fault::HandlerCrash,
        Fault::InstanceLost,
        Fault::ClockSkew,
        Fault::ClientTimeout,
        Fault::DoubleSubmit,
        Fault::Disconnect,
        Fault::OtherCallersKey,
        Fault::ProcessPaused,
        Fault::ReconcileCrash,
    ];

    /// The range its rate is drawn from, per opportunity (a call, a delivery, a second
    /// of a process's life, ...).
    fn rate_range(self) -> (f64, f64) {
        match self {
            Fault::StoreOutage | Fault::StoreReadOnly => (0.002, 0.01),
            Fault::StoreSlowBeyondLease => (0.001, 0.01),
            Fault::HandlerCrash | Fault::InstanceLost => (0.002, 0.02),
            Fault::ProcessPaused => (0.002, 0.01),
            Fault::ReconcileCrash => (0.05, 0.3),
            Fault::ClockSkew | Fault::BankDarkPastKeyWindow => (1.0, 1.0),
            Fault::FunctionTimeout | Fault::LockLost | Fault::CompleteFails => (0.005, 0.05),
            _ => (0.01, 0.15),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Which faults a run injects, and how often.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    rates: BTreeMap<Fault, f64>,
}

impl FaultPlan {
    /// Drawn from `dice`: each kind active with [`ACTIVE`], its rate from its range.
    pub fn draw(dice: &Dice) -> Self {
        let mut rates = BTreeMap::new();
        for fault in Fault::ALL {
            if dice.hit(ACTIVE) {
                let (lo, hi) = fault.rate_range();
                rates.insert(fault, lo + (hi - lo) * dice.unit());
            }
        }
        FaultPlan { rates }
    }

    /// Every kind at its highest rate (a stress run).
    pub fn all() -> Self {
        FaultPlan {
            rates: Fault::ALL.iter().map(|f| (*f, f.rate_range().1)).collect(),
        }
    }

    pub fn none() -> Self {
        FaultPlan::default()
    }

    pub fn rate(&self, fault: Fault) -> f64 {
        self.rates.get(&fault).copied().unwrap_or(0.0)
    }

    pub fn active(&self) -> impl Iterator<Item = (Fault, f64)> + '_ {
        self.rates.iter().map(|(f, r)| (*f, *r))
    }
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rates.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        for (fault, rate) in &self.rates {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{fault} {:.3}", rate)?;
        }
        Ok(())
    }
}
