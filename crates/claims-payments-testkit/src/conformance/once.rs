//! The once-guard's store capability ([`OnceStore`]): an effect and its message's inbox
//! record in one atomic step, unique under both keys, for every adapter that has it.
//!
//! A store's test file instantiates it with
//! `claims_payments_testkit::once_conformance!(make_store);` where
//! `async fn make_store() -> (DynOnceStore, Keep)` builds a fresh, empty store (and
//! `, if ready` as for [`store_conformance!`](crate::store_conformance)).

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::store::{AttemptId, InboxOutcome, InboxRecord, InboxStatus};
use claims_payments::{ClaimId, MessageId, OutcomeKind};
use claims_payments_engine::lease::{new_record, Terms};
use claims_payments_engine::once::{OnceGuard, Outcome};
use claims_payments_engine::store::once::{
    Effect, EffectBody, EffectKey, EffectKind, OnceResult, OnceStore,
};
use tokio::sync::Barrier;

use crate::fixtures::{delivery, message, new_claim};
use crate::records::now_ms;

/// A store with the once-guard's capability.
pub type DynOnceStore = Arc<dyn OnceStore>;

const RETENTION: Duration = Duration::from_secs(3600);

fn kind(name: &str) -> EffectKind {
    EffectKind::parse(name).unwrap()
}

fn claim() -> ClaimId {
    ClaimId::parse(&new_claim()).unwrap()
}

/// The completed inbox record a guarded delivery of `message_id` writes.
fn inbox(kind: &EffectKind, claim: ClaimId, message_id: &str, hash: &str) -> InboxRecord {
    let key = claims_payments::seams::store::InboxKey {
        consumer: kind.as_str().into(),
        claim_id: claim,
        message_id: MessageId::parse(message_id).unwrap(),
    };
    let terms = Terms {
        lease: Duration::ZERO,
        retention: RETENTION,
    };
    new_record(
        &key,
        &claims_payments::PayloadHash::from_stored(hash.into()),
        AttemptId::new(),
        1,
        terms,
        now_ms(),
        Some(InboxOutcome::Message(OutcomeKind::Recorded)),
    )
}

fn effect(kind: &EffectKind, claim: ClaimId, key: &str, message_id: &str, body: &str) -> Effect {
    Effect {
        kind: kind.clone(),
        claim_id: claim,
        key: EffectKey::parse(key).unwrap(),
        message_id: MessageId::parse(message_id).unwrap(),
        body: EffectBody::parse(body).unwrap(),
        created_at: now_ms(),
    }
}

async fn listed(store: &DynOnceStore, kind: &EffectKind) -> Vec<Effect> {
    store
        .effects(kind, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.expect("every effect reads"))
        .collect()
}

pub async fn record_once_writes_the_inbox_record_and_the_effect_together(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let claim = claim();
    let inbox = inbox(&letters, claim, "m-1", "h1");
    let letter = effect(&letters, claim, "approved", "m-1", r#"{"to":"J. Doe"}"#);
    assert_eq!(
        store.record_once(&inbox, &letter).await.unwrap(),
        OnceResult::Recorded
    );
    let stored = store
        .inbox(&inbox.key())
        .await
        .unwrap()
        .expect("inbox record");
    assert_eq!(stored.record, inbox);
    assert_eq!(stored.record.status, InboxStatus::Completed);
    assert_eq!(listed(&store, &letters).await, [letter]);
}

/// The inbox key's uniqueness: a redelivery (here with another effect key, so only the
/// inbox record can refuse it) writes no second effect.
pub async fn a_redelivered_message_records_no_second_effect(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let claim = claim();
    let first = inbox(&letters, claim, "m-1", "h1");
    let letter = effect(&letters, claim, "approved", "m-1", "{}");
    store.record_once(&first, &letter).await.unwrap();
    let again = inbox(&letters, claim, "m-1", "h1");
    let other = effect(&letters, claim, "approved-again", "m-1", "{}");
    match store.record_once(&again, &other).await.unwrap() {
        OnceResult::InboxExists(seen) => assert_eq!(seen.record.owner, first.owner),
        refused => panic!("expected InboxExists, got {refused:?}"),
    }
    assert_eq!(listed(&store, &letters).await, [letter]);
}

/// The effect key's uniqueness, and atomicity: another message's step is refused as a
/// whole, so it leaves no inbox record either.
pub async fn an_effect_recorded_by_another_message_refuses_the_whole_step(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let claim = claim();
    let letter = effect(&letters, claim, "approved", "m-1", r#"{"n":1}"#);
    store
        .record_once(&inbox(&letters, claim, "m-1", "h1"), &letter)
        .await
        .unwrap();
    let other = inbox(&letters, claim, "m-2", "h1");
    let again = effect(&letters, claim, "approved", "m-2", r#"{"n":2}"#);
    assert_eq!(
        store.record_once(&other, &again).await.unwrap(),
        OnceResult::EffectExists(letter.clone())
    );
    assert_eq!(store.inbox(&other.key()).await.unwrap(), None);
    assert_eq!(listed(&store, &letters).await, [letter]);
}

/// Concurrent deliveries of one message, each with an effect key of its own: only the
/// inbox record can keep all but one out.
pub async fn concurrent_record_once_of_one_message_exactly_one_wins(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let claim = claim();
    let tasks = 12;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (store, barrier, letters) = (store.clone(), barrier.clone(), letters.clone());
        handles.push(tokio::spawn(async move {
            let inbox = inbox(&letters, claim, "m-1", "h1");
            let letter = effect(&letters, claim, &format!("k-{i}"), "m-1", "{}");
            barrier.wait().await;
            store.record_once(&inbox, &letter).await.unwrap()
        }));
    }
    let mut recorded = 0;
    for h in handles {
        match h.await.unwrap() {
            OnceResult::Recorded => recorded += 1,
            OnceResult::InboxExists(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(recorded, 1);
    assert_eq!(listed(&store, &letters).await.len(), 1);
}

/// Concurrent messages recording one effect: one wins, and the others leave nothing.
pub async fn concurrent_record_once_of_one_effect_exactly_one_wins(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let claim = claim();
    let tasks = 12;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (store, barrier, letters) = (store.clone(), barrier.clone(), letters.clone());
        handles.push(tokio::spawn(async move {
            let message = format!("m-{i}");
            let inbox = inbox(&letters, claim, &message, "h1");
            let letter = effect(&letters, claim, "approved", &message, "{}");
            barrier.wait().await;
            (
                inbox.key(),
                store.record_once(&inbox, &letter).await.unwrap(),
            )
        }));
    }
    let mut recorded = 0;
    for h in handles {
        let (key, result) = h.await.unwrap();
        match result {
            OnceResult::Recorded => recorded += 1,
            OnceResult::EffectExists(_) => assert_eq!(store.inbox(&key).await.unwrap(), None),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(recorded, 1);
    assert_eq!(listed(&store, &letters).await.len(), 1);
}

pub async fn effects_are_listed_by_kind_oldest_first_and_bounded(store: DynOnceStore) {
    let (letters, notices) = (kind("claim-letters"), kind("claim-notices"));
    let mut written = Vec::new();
    for (i, kind) in [&letters, &notices, &letters].into_iter().enumerate() {
        let claim = claim();
        let message = format!("m-{i}");
        let mut e = effect(
            kind,
            claim,
            "approved",
            &message,
            &format!(r#"{{"i":{i}}}"#),
        );
        e.created_at = now_ms() + time::Duration::seconds(i as i64);
        store
            .record_once(&inbox(kind, claim, &message, "h"), &e)
            .await
            .unwrap();
        written.push(e);
    }
    assert_eq!(
        listed(&store, &letters).await,
        [written[0].clone(), written[2].clone()]
    );
    assert_eq!(listed(&store, &notices).await, [written[1].clone()]);
    let first = store.effects(&letters, 1).await.unwrap();
    assert_eq!(first, [Ok(written[0].clone())]);
}

/// The guard on the store: five deliveries, a re-sent approval under a new MessageId,
/// and the same MessageId with another payload; one effect.
pub async fn the_once_guard_records_one_effect_whatever_the_deliveries(store: DynOnceStore) {
    let letters = kind("claim-letters");
    let guard = OnceGuard::new(store.clone(), letters.clone(), RETENTION);
    let claim = new_claim();
    let msg = message(&claim, "120.50");
    let key = || EffectKey::parse("approved").unwrap();
    let body = || EffectBody::parse(r#"{"amount":"120.50"}"#).unwrap();
    let mut outcomes = Vec::new();
    for count in 1..=5 {
        outcomes.push(
            guard
                .handle(&msg, &delivery("m-1", count), key(), body())
                .await,
        );
    }
    assert_eq!(outcomes[0], Outcome::Done);
    assert!(
        outcomes[1..].iter().all(|o| *o == Outcome::Duplicate),
        "{outcomes:?}"
    );
    let by = MessageId::parse("m-1").unwrap();
    assert_eq!(
        guard.handle(&msg, &delivery("m-2", 1), key(), body()).await,
        Outcome::AlreadyRecorded { by }
    );
    let other = EffectBody::parse(r#"{"amount":"99.00"}"#).unwrap();
    let changed = guard.handle(&msg, &delivery("m-3", 1), key(), other).await;
    assert!(matches!(changed, Outcome::Conflict { .. }), "{changed:?}");
    let other_payload = message(&claim, "99.00");
    let reused = guard
        .handle(&other_payload, &delivery("m-1", 6), key(), body())
        .await;
    assert!(matches!(reused, Outcome::Conflict { .. }), "{reused:?}");
    assert!(!reused.completes_message());
    assert_eq!(listed(&store, &letters).await.len(), 1);
}

/// One `#[tokio::test]` per scenario of the once-guard's suite, in the calling test
/// crate, each on a fresh store from `$make`.
#[macro_export]
macro_rules! once_conformance {
    ($make:path) => {
        $crate::once_conformance!($make, if (|| true));
    };
    ($make:path, if $ready:expr) => {
        $crate::store_conformance!(@tests $make, $ready;
            record_once_writes_the_inbox_record_and_the_effect_together,
            a_redelivered_message_records_no_second_effect,
            an_effect_recorded_by_another_message_refuses_the_whole_step,
            concurrent_record_once_of_one_message_exactly_one_wins,
            concurrent_record_once_of_one_effect_exactly_one_wins,
            effects_are_listed_by_kind_oldest_first_and_bounded,
            the_once_guard_records_one_effect_whatever_the_deliveries,
        );
    };
}
