//! Where a test may make the consumer die between its steps. Reached from outside only
//! through the `seams` module; production installs no hook.

use std::sync::Arc;

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
