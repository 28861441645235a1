//! The switch every fault site asks: whether a fault of a kind fires now. Faults fire
//! only while the run's chaos phase lasts; each firing is counted (the coverage of the
//! fault space across seeds) and written to the trace.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::faults::{Fault, FaultPlan};
use super::world::{Dice, Trace};

#[derive(Clone)]
pub struct Chaos(Arc<Inner>);

struct Inner {
    plan: FaultPlan,
    dice: Dice,
    trace: Trace,
    on: AtomicBool,
    fired: Mutex<BTreeMap<Fault, u64>>,
}

impl Chaos {
    pub fn new(plan: FaultPlan, dice: Dice, trace: Trace) -> Self {
        Chaos(Arc::new(Inner {
            plan,
            dice,
            trace,
            on: AtomicBool::new(true),
            fired: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Whether `fault` fires at this opportunity; `what` names the site in the trace.
    pub fn fires(&self, fault: Fault, what: &str) -> bool {
        let rate = self.0.plan.rate(fault);
        if rate == 0.0 || !self.0.on.load(Ordering::Relaxed) || !self.0.dice.hit(rate) {
            return false;
        }
        *self
            .0
            .fired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(fault)
            .or_default() += 1;
        crate::trace_event!(self.0.trace, "fault {fault} {what}");
        true
    }

    pub fn is_active(&self, fault: Fault) -> bool {
        self.0.on.load(Ordering::Relaxed) && self.0.plan.rate(fault) > 0.0
    }

    /// Ends the chaos phase: no fault fires any more.
    pub fn calm(&self) {
        self.0.on.store(false, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.0.on.load(Ordering::Relaxed)
    }

    pub fn dice(&self) -> &Dice {
        &self.0.dice
    }

    pub fn trace(&self) -> &Trace {
        &self.0.trace
    }

    pub fn plan(&self) -> &FaultPlan {
        &self.0.plan
    }

    pub fn fired(&self) -> BTreeMap<Fault, u64> {
        self.0
            .fired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
