//! The key record of one (caller scope, Idempotency-Key): opened before the payment
//! ([`open`]: created, replayed, refused or taken over, as [`next_action`] decides from
//! the record found) and closed after it ([`close`]: the answer kept, or the key given
//! back). The lease itself is an [`lease::Lease`], under the one takeover rule.

use time::OffsetDateTime;

use super::answer::{Answer, Problem};
use super::key::KeyIdentity;
use crate::ambient::Ambient;
use crate::domain::PayloadHash;
use crate::lease::liveness::Owners;
use crate::lease::{self, Created, Holder, Lease, Terms};
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, Store, StoreError,
};
use crate::telemetry;

/// What [`open`] leads to.
pub(super) enum Begin {
    /// Answer at once, with the log label; nothing is paid.
    Answer(Answer, &'static str),
    /// This request holds the key: pay, then [`close`].
    Proceed(Lease),
}

/// What a request does with a key record that exists already. Pure: the record read,
/// the request's fingerprint, the clock.
#[derive(Debug, PartialEq)]
pub(super) enum NextAction {
    /// Another request body was sent under this key: 422.
    Reused,
    /// The answer the key already gave, byte for byte.
    Replay(Answer),
    /// Another request holds the key: 409, retry after this many seconds.
    InFlight(u64),
    /// Nobody holds it (a crash, a 503 that gave it back), or the key expired: take it
    /// over with a write conditional on the version read.
    TakeOver { expired: bool },
}

pub(super) fn next_action(
    record: &InboxRecord,
    fingerprint: &PayloadHash,
    me: AttemptId,
    owner_gone: bool,
    now: OffsetDateTime,
) -> NextAction {
    if record.expires_at <= now {
        return NextAction::TakeOver { expired: true };
    }
    if record.payload_hash != *fingerprint {
        return NextAction::Reused;
    }
    if record.status == InboxStatus::Completed {
        if let Some(InboxOutcome::HttpAnswer(json)) = &record.outcome {
            if let Ok(answer) = serde_json::from_str::<Answer>(json) {
                return NextAction::Replay(answer);
            }
        }
    }
    // A client's retry is not a broker delivery: only the lease decides (count 0).
    match lease::holder(record, me, 0, owner_gone, now) {
        Holder::Live(until) => {
            NextAction::InFlight(((until - now).whole_seconds().max(1) as u64).min(5))
        }
        _ => NextAction::TakeOver { expired: false },
    }
}

/// Step 1: the key record, created or taken over, or the answer it already gives.
pub(super) async fn open(
    store: &dyn Store,
    owners: &Owners,
    identity: &KeyIdentity,
    fingerprint: &PayloadHash,
    terms: Terms,
    ambient: &Ambient,
) -> Result<Begin, StoreError> {
    let now = ambient.now();
    let me = ambient.attempt_id();
    let fresh = lease::new_record(&identity.key, fingerprint, me, 1, terms, now, None);
    let seen = match Lease::create(store, fresh.clone()).await? {
        Created::Held(lease) => return Ok(Begin::Proceed(lease)),
        Created::Exists(seen) => seen,
    };
    let record = &seen.record;
    let mut action = next_action(record, fingerprint, me, false, now);
    if matches!(action, NextAction::InFlight(_)) && owners.check(record.owner).await {
        // The request that holds it ran in a process that has ended: nobody is working
        // on it, so this retry takes it over instead of waiting out the lease.
        action = next_action(record, fingerprint, me, true, now);
    }
    let taken = match action {
        NextAction::Reused => {
            telemetry::counters().http_key_mismatches.inc();
            let answer = Problem::KeyReused.answer(
                "this Idempotency-Key was used with a different request; use a new key for a new payment",
            );
            return Ok(Begin::Answer(answer, "key-reused"));
        }
        NextAction::Replay(mut answer) => {
            telemetry::counters().http_replays.inc();
            answer.replayed = true;
            return Ok(Begin::Answer(answer, "replayed"));
        }
        NextAction::InFlight(seconds) => {
            telemetry::counters().http_in_flight.inc();
            return Ok(Begin::Answer(in_flight(seconds), "in-flight"));
        }
        NextAction::TakeOver { expired: true } => InboxRecord {
            last_delivery_count: record.last_delivery_count.saturating_add(1),
            ..fresh
        },
        NextAction::TakeOver { expired: false } => {
            let attempt = record.last_delivery_count.saturating_add(1);
            lease::taken_over(record, me, attempt, terms, now)
        }
    };
    Ok(match Lease::take_over(store, &seen, taken).await? {
        Some(lease) => Begin::Proceed(lease),
        None => Begin::Answer(in_flight(1), "in-flight"),
    })
}

/// Step 3: keeps the answer under the key, or gives the key back when the answer is not
/// final (5xx: the retry resumes) or refuses the request itself (400: never stored).
pub(super) async fn close(
    store: &dyn Store,
    lease: Lease,
    answer: &Answer,
    key: &InboxKey,
    now: OffsetDateTime,
) {
    if answer.status == 503 || answer.status == 500 {
        lease.release(store, now).await;
        return;
    }
    if answer.status == 400 {
        // The draft: the client must correct the request, and the corrected one is then
        // processed. Marked expired, the key reads as never seen to [`open`]; nothing was
        // paid under it (the consumer refused the body before its claim step).
        let forgotten = InboxRecord {
            lease_until: None,
            expires_at: now,
            updated_at: now,
            ..lease.record.clone()
        };
        lease.give_back(store, forgotten).await;
        return;
    }
    let Ok(stored) = serde_json::to_string(answer) else {
        return;
    };
    if let Err(e) = lease
        .complete(store, InboxOutcome::HttpAnswer(stored), now)
        .await
    {
        // The answer is still right: a retry recomputes it from the records.
        tracing::warn!(error = %e, messageId = %key.message_id, "could not store the answer under its key");
    }
}

/// 409: another request with the key is being handled.
fn in_flight(retry_after: u64) -> Answer {
    Problem::RequestInFlight
        .answer("retry later with the same Idempotency-Key")
        .retry_after(retry_after)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{ClaimId, MessageId};

    const TERMS: Terms = Terms {
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
    };

    fn key_record(fingerprint: &PayloadHash, now: OffsetDateTime) -> InboxRecord {
        let key = InboxKey {
            consumer: "payments-api".into(),
            claim_id: ClaimId::random(),
            message_id: MessageId::parse("http-k").unwrap(),
        };
        lease::new_record(&key, fingerprint, AttemptId::new(), 1, TERMS, now, None)
    }

    fn hash(text: &str) -> PayloadHash {
        crate::domain::ClaimApproved::parse(&format!(
            r#"{{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"{text}","currency":"EUR"}}"#
        ))
        .unwrap()
        .payload_hash()
    }

    #[test]
    fn each_key_record_found_leads_to_one_action() {
        let now = OffsetDateTime::now_utc();
        let (mine, other) = (hash("1.00"), hash("2.00"));
        let me = AttemptId::new();
        let held = key_record(&mine, now);
        assert_eq!(
            next_action(&held, &other, me, false, now),
            NextAction::Reused
        );
        assert_eq!(
            next_action(&held, &mine, me, false, now),
            NextAction::InFlight(5)
        );
        // Held by a request of a process that has ended: taken over at once.
        assert_eq!(
            next_action(&held, &mine, me, true, now),
            NextAction::TakeOver { expired: false }
        );
        let lapsed = InboxRecord {
            lease_until: Some(now - time::Duration::seconds(1)),
            ..held.clone()
        };
        assert_eq!(
            next_action(&lapsed, &mine, me, false, now),
            NextAction::TakeOver { expired: false }
        );
        let expired = InboxRecord {
            expires_at: now,
            ..held.clone()
        };
        // An expired key is a new key, whatever body it was used with.
        assert_eq!(
            next_action(&expired, &other, me, false, now),
            NextAction::TakeOver { expired: true }
        );
        let answer = Problem::ClaimAlreadyPaid.answer("x");
        let done = InboxRecord {
            status: InboxStatus::Completed,
            lease_until: None,
            outcome: Some(InboxOutcome::HttpAnswer(
                serde_json::to_string(&answer).unwrap(),
            )),
            ..held
        };
        assert_eq!(
            next_action(&done, &mine, me, false, now),
            NextAction::Replay(answer)
        );
    }
}
