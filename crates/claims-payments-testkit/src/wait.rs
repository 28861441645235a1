//! Waiting for a condition instead of sleeping and hoping it happened.

use std::time::{Duration, Instant};

/// How often a condition is asked again.
const POLL: Duration = Duration::from_millis(5);

/// Waits until `condition` holds, asking every few milliseconds; panics with `what` if
/// it still does not hold after `timeout`. The timeout only bounds a broken test: a
/// passing one waits exactly as long as the condition takes.
pub async fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        tokio::time::sleep(POLL).await;
    }
}
