//! Which `in_progress` payments a run takes up: those whose message was abandoned
//! mid-payout long enough ago that no request of the dead attempt can still reach the
//! bank.

use std::time::Duration;

use time::OffsetDateTime;

use crate::store::{InboxRecord, InboxStatus, PaymentRecord, Versioned};

/// Why an `in_progress` payment is not orphaned yet (`None`: it is). Orphaned: its
/// message's lease ran out longer ago than `min_age` (or its inbox record is gone and
/// the payment was last touched that long ago; or the lease's process has ended,
/// `owner_gone`, and the record was last written that long ago). An age past the
/// calendar's end is simply never reached.
pub(super) fn not_orphaned(
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
