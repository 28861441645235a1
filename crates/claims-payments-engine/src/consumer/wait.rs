//! The one bounded wait of the consumer: for a live attempt of the same message, or for
//! another message's payout of the same claim, re-reading with a growing pause until
//! `policy.inflight_wait` has passed. Then the delivery answers retry-later, and the
//! broker's next delivery looks again.

use std::time::Duration;

use tokio::time::Instant;

use crate::telemetry;

/// How often a waiting delivery re-reads a record another attempt holds.
const POLL_FIRST: Duration = Duration::from_millis(20);
const POLL_MAX: Duration = Duration::from_millis(500);

/// A wait with a deadline fixed when it starts.
#[derive(Debug)]
pub(super) struct BoundedWait {
    until: Instant,
    poll: Duration,
    /// Counted as a lease wait on its first pause (waits for our own message only).
    count_lease_wait: bool,
}

impl BoundedWait {
    /// A wait for a live attempt of this very message (counted in `lease_waits`).
    pub fn for_attempt(limit: Duration) -> Self {
        Self::new(limit, true)
    }

    /// A wait for another message's payout of the same claim.
    pub fn for_payout(limit: Duration) -> Self {
        Self::new(limit, false)
    }

    fn new(limit: Duration, count_lease_wait: bool) -> Self {
        BoundedWait {
            until: Instant::now() + limit,
            poll: POLL_FIRST,
            count_lease_wait,
        }
    }

    /// Sleeps until the next re-read, never past the deadline. `false`, at once, when
    /// the deadline has passed: stop waiting.
    pub async fn pause(&mut self) -> bool {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if std::mem::take(&mut self.count_lease_wait) {
            telemetry::counters().lease_waits.inc();
        }
        tokio::time::sleep(self.poll.min(left)).await;
        self.poll = (self.poll * 2).min(POLL_MAX);
        true
    }
}
