//! The key record of one (caller scope, Idempotency-Key): opened before the payment
//! ([`open`]: created, replayed, refused or taken over, as [`next_action`] decides from
//! the record found) and closed after it ([`close`]: the answer kept, or the key given
//! back). The lease itself is an [`lease::Lease`], taken with [`Lease::acquire`] under the
//! one takeover rule.

use time::OffsetDateTime;

use super::answer::{Answer, Problem};
use super::key::KeyIdentity;
use crate::ambient::Ambient;
use crate::domain::PayloadHash;
use crate::lease::liveness::Owners;
use crate::lease::{self, Acquired, Bid, Created, Lease, Seen, Terms};
use crate::store::{InboxKey, InboxOutcome, InboxRecord, InboxStatus, Store, StoreError};
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
    /// The key expired: a new key, written over the old record with a write conditional
    /// on the version read, whoever held it.
    Renew,
    /// The key's lease decides: take it over ([`Lease::acquire`]: nobody holds it after
    /// a crash or a 503 that gave it back, or its holder's process ended), or answer 409
    /// while another request holds it.
    TakeLease,
}

pub(super) fn next_action(
    record: &InboxRecord,
    fingerprint: &PayloadHash,
    now: OffsetDateTime,
) -> NextAction {
    if record.expires_at <= now {
        return NextAction::Renew;
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
    NextAction::TakeLease
}

/// The seconds a 409 asks the client to wait for a lease live `until`: 1 to 5.
fn retry_after(until: OffsetDateTime, now: OffsetDateTime) -> u64 {
    ((until - now).whole_seconds().max(1) as u64).min(5)
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
    let taken = match next_action(record, fingerprint, now) {
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
        NextAction::Renew => {
            let renewed = InboxRecord {
                last_delivery_count: record.last_delivery_count.saturating_add(1),
                ..fresh
            };
            Lease::take_over(store, &seen, renewed).await?
        }
        NextAction::TakeLease => {
            // A client's retry is not a broker delivery: only the lease decides (count
            // 0), or the end of the process of the request that holds it.
            let bid = Bid {
                me,
                delivery: 0,
                now,
            };
            let take = |record: &InboxRecord| {
                let attempt = record.last_delivery_count.saturating_add(1);
                lease::taken_over(record, me, attempt, terms, now)
            };
            match Lease::acquire(store, Seen::Record(&seen), bid, owners, take).await? {
                Acquired::Held { lease, .. } => Some(lease),
                Acquired::Live(until) => {
                    telemetry::counters().http_in_flight.inc();
                    let answer = in_flight(retry_after(until, now));
                    return Ok(Begin::Answer(answer, "in-flight"));
                }
                Acquired::Lost => None,
            }
        }
    };
    Ok(match taken {
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
    use crate::store::AttemptId;

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
        let held = key_record(&mine, now);
        assert_eq!(next_action(&held, &other, now), NextAction::Reused);
        // Held or not, the lease decides (a 409 while it is live: see `lease`).
        assert_eq!(next_action(&held, &mine, now), NextAction::TakeLease);
        let lapsed = InboxRecord {
            lease_until: Some(now - time::Duration::seconds(1)),
            ..held.clone()
        };
        assert_eq!(next_action(&lapsed, &mine, now), NextAction::TakeLease);
        let expired = InboxRecord {
            expires_at: now,
            ..held.clone()
        };
        // An expired key is a new key, whatever body it was used with.
        assert_eq!(next_action(&expired, &other, now), NextAction::Renew);
        let answer = Problem::ClaimAlreadyPaid.answer("x");
        let done = InboxRecord {
            status: InboxStatus::Completed,
            lease_until: None,
            outcome: Some(InboxOutcome::HttpAnswer(
                serde_json::to_string(&answer).unwrap(),
            )),
            ..held
        };
        assert_eq!(next_action(&done, &mine, now), NextAction::Replay(answer));
    }

    #[test]
    fn a_409_asks_for_one_to_five_seconds() {
        let now = OffsetDateTime::now_utc();
        let in_secs = |s| now + time::Duration::seconds(s);
        assert_eq!(retry_after(in_secs(60), now), 5);
        assert_eq!(retry_after(in_secs(3), now), 3);
        assert_eq!(retry_after(now, now), 1);
    }
}
