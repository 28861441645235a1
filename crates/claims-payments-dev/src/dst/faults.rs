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
    /// A call that meets a window waits as its adapter does (up to its bound) before it
    /// fails, or goes through when the window ends meanwhile.
    StoreWaits,
    /// A write applied twice (its answer lost, the request re-sent): the second answer
    /// is the caller's.
    StoreWriteTwice,
    /// A write whose caller is told it failed, and which commits later.
    StoreCommitsAfterFailure,
    /// A point read answered from the state before another session's recent write.
    StoreStaleRead,
    /// A write that commits at once and whose answer arrives past a lease later.
    StoreAnswerAfterLease,
    /// Cosmos DB through the SDK: 429 without a retry-after, for a few requests.
    CosmosThrottled,
    /// Cosmos DB: 429/3200 with a retry-after.
    CosmosThrottledHint,
    /// Cosmos DB: 503 for a few requests.
    CosmosUnavailable,
    /// Cosmos DB: a request not sent, no answer.
    CosmosTimeout,
    /// Cosmos DB: a write served and its answer lost (the SDK re-sends it).
    CosmosTimeoutAfterService,
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
    /// Instances' clocks differ, each by up to 2 s (drawn when a process starts).
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
    // Clocks (each drawn when a process starts; NTP sets them right when faults stop).
    /// A process's clock steps forwards or backwards for a while: within the bound the
    /// design assumes, beyond the 120 s lease, or beyond the key window's 5-minute margin.
    ClockJump,
    /// A process's clock runs fast or slow for a while, up to minutes off.
    ClockDrift,
    // The operator's re-drive (`dead-letters resubmit`) against the broker.
    /// A copy's send is accepted and its answer lost (the tool says "unsure").
    RedriveSendUnsure,
    /// The dead letter's lock is lost between the accepted send and the delete.
    RedriveLockLost,
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
    pub const ALL: [Fault; 41] = [
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
        // Drawn after the kinds above, so that adding them changed no earlier draw.
        Fault::StoreWaits,
        Fault::StoreWriteTwice,
        Fault::StoreCommitsAfterFailure,
        Fault::StoreStaleRead,
        Fault::StoreAnswerAfterLease,
        Fault::CosmosThrottled,
        Fault::CosmosThrottledHint,
        Fault::CosmosUnavailable,
        Fault::CosmosTimeout,
        Fault::CosmosTimeoutAfterService,
        Fault::ClockJump,
        Fault::ClockDrift,
        Fault::RedriveSendUnsure,
        Fault::RedriveLockLost,
        Fault::ProcessPaused,
        Fault::ReconcileCrash,
    ];

    /// The range its rate is drawn from, per opportunity (a call, a delivery, a second
    /// of a process's life, ...).
    fn rate_range(self) -> (f64, f64) {
        match self {
            Fault::StoreOutage | Fault::StoreReadOnly => (0.002, 0.01),
            Fault::StoreSlowBeyondLease | Fault::StoreAnswerAfterLease => (0.001, 0.01),
            Fault::StoreWaits => (0.2, 0.9),
            Fault::StoreCommitsAfterFailure => (0.005, 0.05),
            Fault::StoreStaleRead => (0.05, 0.3),
            Fault::CosmosThrottled
            | Fault::CosmosThrottledHint
            | Fault::CosmosUnavailable
            | Fault::CosmosTimeout
            | Fault::CosmosTimeoutAfterService => (0.005, 0.05),
            Fault::HandlerCrash | Fault::InstanceLost => (0.002, 0.02),
            Fault::ProcessPaused => (0.002, 0.01),
            Fault::ReconcileCrash => (0.05, 0.3),
            Fault::ClockSkew | Fault::BankDarkPastKeyWindow => (1.0, 1.0),
            Fault::ClockJump | Fault::ClockDrift => (0.1, 0.5),
            Fault::RedriveSendUnsure | Fault::RedriveLockLost => (0.05, 0.3),
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

    /// `faults` at their highest rates, no other kind.
    pub fn only(faults: &[Fault]) -> Self {
        FaultPlan {
            rates: faults.iter().map(|f| (*f, f.rate_range().1)).collect(),
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
