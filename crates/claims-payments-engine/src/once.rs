//! The once-guard: a consumer whose work on a message is one record (a letter to send,
//! a notice to publish) has it written exactly once, however often the message comes.
//!
//! One delivery is one atomic store step ([`OnceStore::record_once`]): the message's
//! inbox record, completed at once, and the [`Effect`], or nothing. What carries the
//! effect out (a print run, a mailer) reads the effects ([`OnceStore::effects`]) and
//! goes by their key, as the bank goes by the payment's Idempotency-Key; that part is
//! not the guard's. The payment consumer ([`crate::consumer`]) needs more (a bank call
//! between its records, under a lease); this needs no lease, as nothing happens between
//! reading and writing.
//!
//! - a new message: both records are written, [`Outcome::Done`];
//! - the same message again (redelivered, or re-sent after the answer was lost):
//!   [`Outcome::Duplicate`], nothing written;
//! - another message whose effect is already recorded: [`Outcome::AlreadyRecorded`] if it
//!   is the same effect, [`Outcome::Conflict`] if not; nothing written;
//! - the same MessageId with another payload: [`Outcome::Conflict`];
//! - a store answer that may hide a commit (a timeout after it): the inbox record is read
//!   again, and our own write (our attempt's owner) is [`Outcome::Done`].

use std::sync::Arc;
use std::time::Duration;

use crate::ambient::Ambient;
use crate::consumer::Delivery;
use crate::domain::{ClaimApproved, MessageId, OutcomeKind};
use crate::lease::{new_record, Terms};
use crate::store::once::{Effect, EffectBody, EffectKey, EffectKind, OnceResult, OnceStore};
use crate::store::{InboxKey, InboxOutcome, InboxRecord, StoreError};

/// How a delivery ended under the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This attempt recorded the effect.
    Done,
    /// The message was handled before; nothing was done now.
    Duplicate,
    /// Another message recorded the same effect first; nothing was done now.
    AlreadyRecorded { by: MessageId },
    /// The same MessageId with another payload, or another effect under a key already
    /// taken. Never accepted: a person must look.
    Conflict { reason: String },
    /// The store may heal: the broker should deliver again later.
    RetryLater { reason: String },
    /// The store failed in a way retrying cannot heal.
    StoreFailure { reason: String },
}

impl Outcome {
    /// Whether the host should complete the message.
    pub fn completes_message(&self) -> bool {
        matches!(
            self,
            Outcome::Done | Outcome::Duplicate | Outcome::AlreadyRecorded { .. }
        )
    }

    /// Whether redelivery can never change the answer (the message belongs in the DLQ).
    pub fn is_permanent_failure(&self) -> bool {
        matches!(
            self,
            Outcome::Conflict { .. } | Outcome::StoreFailure { .. }
        )
    }

    /// The outcome in the vocabulary of logs and stored records.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Done => OutcomeKind::Recorded,
            Outcome::Duplicate => OutcomeKind::Duplicate,
            Outcome::AlreadyRecorded { .. } => OutcomeKind::BusinessDuplicate,
            Outcome::Conflict { .. } => OutcomeKind::Conflict,
            Outcome::RetryLater { .. } => OutcomeKind::RetryLater,
            Outcome::StoreFailure { .. } => OutcomeKind::StoreFailure,
        }
    }
}

/// The guard of one kind of effect, on a store that can record effects.
#[derive(Clone)]
pub struct OnceGuard {
    store: Arc<dyn OnceStore>,
    kind: EffectKind,
    /// How long a message's inbox record is kept: longer than the broker may redeliver.
    retention: Duration,
    ambient: Ambient,
}

impl OnceGuard {
    pub fn new(store: Arc<dyn OnceStore>, kind: EffectKind, retention: Duration) -> Self {
        Self::with_ambient(store, kind, retention, Ambient::system())
    }

    /// The guard on another clock and source of attempt ids (a simulator's).
    pub fn with_ambient(
        store: Arc<dyn OnceStore>,
        kind: EffectKind,
        retention: Duration,
        ambient: Ambient,
    ) -> Self {
        OnceGuard {
            store,
            kind,
            retention,
            ambient,
        }
    }

    pub fn kind(&self) -> &EffectKind {
        &self.kind
    }

    /// Handles one delivery of `msg`: records the effect `key` with `body`, once.
    /// Never panics on data; every path ends in an outcome.
    pub async fn handle(
        &self,
        msg: &ClaimApproved,
        delivery: &Delivery,
        key: EffectKey,
        body: EffectBody,
    ) -> Outcome {
        let now = self.ambient.now();
        let inbox_key = InboxKey {
            consumer: self.kind.as_str().to_owned(),
            claim_id: msg.claim_id,
            message_id: delivery.message_id.clone(),
        };
        let terms = Terms {
            // Completed at once: the record holds no lease.
            lease: Duration::ZERO,
            retention: self.retention,
        };
        let inbox = new_record(
            &inbox_key,
            &msg.payload_hash(),
            self.ambient.attempt_id(),
            delivery.delivery_count,
            terms,
            now,
            Some(InboxOutcome::Message(OutcomeKind::Recorded)),
        );
        let effect = Effect {
            kind: self.kind.clone(),
            claim_id: msg.claim_id,
            key,
            message_id: delivery.message_id.clone(),
            body,
            created_at: now,
        };
        match self.store.record_once(&inbox, &effect).await {
            Ok(result) => judge(&inbox, &effect, result),
            Err(StoreError::Transient(reason)) => self.after_lost_answer(&inbox, reason).await,
            Err(e) => Outcome::StoreFailure {
                reason: e.to_string(),
            },
        }
    }

    /// The write's answer was lost: it may have committed. Our attempt's owner on the
    /// inbox record (a fresh id per attempt, which nobody else writes) says it did.
    async fn after_lost_answer(&self, written: &InboxRecord, reason: String) -> Outcome {
        match self.store.inbox(&written.key()).await {
            Ok(Some(found)) if found.record.owner == written.owner => {
                crate::lease::own_write_recognised(written, "record-once");
                Outcome::Done
            }
            // Another attempt's record: judged as a refusal would have been.
            Ok(Some(found)) => duplicate_or_conflict(written, &found.record),
            // Nothing was written, or it cannot be read now: the first answer stands.
            Ok(None) | Err(_) => Outcome::RetryLater {
                reason: format!("store temporarily unavailable: {reason}"),
            },
        }
    }
}

fn judge(inbox: &InboxRecord, effect: &Effect, result: OnceResult) -> Outcome {
    match result {
        OnceResult::Recorded => Outcome::Done,
        OnceResult::InboxExists(seen) => duplicate_or_conflict(inbox, &seen.record),
        OnceResult::EffectExists(stored) if stored.same_as(effect) => Outcome::AlreadyRecorded {
            by: stored.message_id,
        },
        OnceResult::EffectExists(stored) => Outcome::Conflict {
            reason: format!(
                "effect {} of this claim was recorded by message {} with another body",
                stored.key, stored.message_id
            ),
        },
    }
}

fn duplicate_or_conflict(written: &InboxRecord, found: &InboxRecord) -> Outcome {
    if found.payload_hash == written.payload_hash {
        Outcome::Duplicate
    } else {
        Outcome::Conflict {
            reason: "this MessageId was handled before with another payload".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome;
    use crate::domain::MessageId;
    use crate::store::once::RESERVED_KINDS;

    /// Every outcome either completes the message, is retried, or is dead-lettered: one
    /// of the three, never two.
    #[test]
    fn each_outcome_completes_retries_or_dead_letters() {
        let reason = || "r".to_owned();
        let by = MessageId::parse("m-1").unwrap();
        for (outcome, completes, permanent) in [
            (Outcome::Done, true, false),
            (Outcome::Duplicate, true, false),
            (Outcome::AlreadyRecorded { by }, true, false),
            (Outcome::Conflict { reason: reason() }, false, true),
            (Outcome::RetryLater { reason: reason() }, false, false),
            (Outcome::StoreFailure { reason: reason() }, false, true),
        ] {
            assert_eq!(outcome.completes_message(), completes, "{outcome:?}");
            assert_eq!(outcome.is_permanent_failure(), permanent, "{outcome:?}");
        }
    }

    /// The inbox's own consumers, as the engine names them, are refused as kinds.
    #[test]
    fn the_reserved_kinds_are_the_inbox_records_own_consumers() {
        assert!(RESERVED_KINDS.contains(&crate::lease::liveness::CONSUMER));
        assert!(RESERVED_KINDS.contains(&crate::reconcile::RUN_LEASE_CONSUMER));
    }
}
