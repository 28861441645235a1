//! A second consumer of `ClaimApproved`: the "claim approved" letter, written once per
//! claim however often the broker delivers the message. Sending two such letters is
//! real money and real regulatory risk; losing one is a complaint.
//!
//! The engine does the hard part. Each delivery is one call of
//! [`OnceGuard::handle`]: the letter is an effect record, written in the same atomic
//! step as the message's inbox record, or not at all. A redelivery finds the inbox
//! record and is a duplicate; the same approval re-sent under a new MessageId finds the
//! letter and writes none. The letters are an outbox: the print run reads them
//! ([`OnceStore::effects`]) and goes by their key, so it prints each once.
//!
//! ```text
//! cargo run -p claims-payments --example claim_letters -- [--deliveries N] [--db PATH] [--no-guard]
//! ```
//!
//! delivers one approval `N` times (5 by default) to a SQLite database (a fresh one, or
//! `PATH`: run it twice on the same file and every delivery is a duplicate), then prints
//! the outcomes and the letters. `--no-guard` writes each delivery's letter under a
//! made-up identity of its own, as code without a guard does when it inserts a letter per
//! delivery: nothing lets the store recognise a redelivery, and the letters multiply.
//!
//! Written only against the engine's public API (`claims_payments_engine`) and the SQLite
//! adapter (`claims_payments_sqlite`). It lives in the product's folder, not the engine's:
//! a program that uses an adapter stands above the engine, as every adapter does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use claims_payments_engine::ambient::AttemptId;
use claims_payments_engine::consumer::Delivery;
use claims_payments_engine::domain::{ClaimApproved, ClaimId, InvalidMessage, MessageId};
use claims_payments_engine::once::{OnceGuard, Outcome};
use claims_payments_engine::store::once::{Effect, EffectBody, EffectKey, EffectKind, OnceStore};
use claims_payments_sqlite::SqliteStore;

/// This consumer's name: its letters' kind, and the consumer of its inbox records.
const KIND: &str = "claim-letters";
/// Longer than the broker may redeliver a message (its TTL and redeliveries).
const INBOX_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The letter consumer.
pub struct Letters {
    guard: OnceGuard,
    store: Arc<dyn OnceStore>,
    guarded: bool,
}

impl Letters {
    /// `guarded: false` is `--no-guard`.
    pub fn new(store: Arc<dyn OnceStore>, guarded: bool) -> Self {
        let kind = EffectKind::parse(KIND).expect("a valid kind");
        Letters {
            guard: OnceGuard::new(store.clone(), kind, INBOX_RETENTION),
            store,
            guarded,
        }
    }

    /// One delivery of a message body, as the host hands it over: the outcome says
    /// whether to complete the message ([`Outcome::completes_message`]). A body that is
    /// not a valid `ClaimApproved` can never become one: dead-letter it.
    pub async fn on_message(
        &self,
        body: &str,
        delivery: &Delivery,
    ) -> Result<Outcome, InvalidMessage> {
        let msg = ClaimApproved::parse(body)?;
        let letter = letter(&msg);
        // One approval letter per claim: the key says which letter of the claim it is.
        let key = EffectKey::parse("approved").expect("a valid key");
        if self.guarded {
            return Ok(self.guard.handle(&msg, delivery, key, letter).await);
        }
        // Without the guard: a fresh identity for the message and the letter on every
        // delivery, so nothing ties this write to the ones before it.
        let fresh = AttemptId::new().to_string();
        let unguarded = Delivery {
            message_id: MessageId::parse(&fresh).expect("a valid MessageId"),
            ..delivery.clone()
        };
        let key = EffectKey::parse(&format!("approved-{fresh}")).expect("a valid key");
        Ok(self.guard.handle(&msg, &unguarded, key, letter).await)
    }

    /// The letters written for `claim`, as the print run would read them.
    pub async fn letters(&self, claim: ClaimId) -> Vec<Effect> {
        let all = self
            .store
            .effects(self.guard.kind(), 10_000)
            .await
            .expect("the letters can be read");
        all.into_iter()
            .filter_map(Result::ok)
            .filter(|letter| letter.claim_id == claim)
            .collect()
    }
}

/// The letter's fields, from the message alone: the same approval always gives the
/// same letter, byte for byte.
fn letter(msg: &ClaimApproved) -> EffectBody {
    EffectBody::from_json(&serde_json::json!({
        "template": "claim-approved/v1",
        "claimId": msg.claim_id.to_string(),
        "amount": msg.money.amount_string(),
        "currency": msg.money.currency().code(),
    }))
    .expect("a small JSON object")
}

/// The approval the example delivers: one claim, one MessageId.
const APPROVAL: &str =
    r#"{"claimId":"6f1c1a52-3c2e-4d4b-9a57-2b0f5c8e4d10","amount":"1250.00","currency":"EUR"}"#;
const MESSAGE_ID: &str = "approval-6f1c1a52";

struct Args {
    deliveries: u32,
    db: Option<PathBuf>,
    guarded: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        deliveries: 5,
        db: None,
        guarded: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--no-guard" => parsed.guarded = false,
            "--deliveries" => {
                parsed.deliveries = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or("--deliveries needs a number from 1 to 1000")?;
            }
            "--db" => parsed.db = Some(args.next().ok_or("--db needs a path")?.into()),
            _ => {
                return Err(
                    "unknown argument; use [--deliveries N] [--db PATH] [--no-guard]".into(),
                )
            }
        }
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claim_letters: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let args = args()?;
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let path = args.db.unwrap_or_else(|| dir.path().join("letters.db"));
    let store = SqliteStore::open(&path).map_err(|e| format!("{e:#}"))?;
    let letters = Letters::new(store, args.guarded);

    for count in 1..=args.deliveries {
        let delivery = Delivery {
            message_id: MessageId::parse(MESSAGE_ID).expect("a valid MessageId"),
            delivery_count: count,
        };
        let outcome = letters
            .on_message(APPROVAL, &delivery)
            .await
            .map_err(|e| format!("the approval is not valid: {e}"))?;
        println!(
            "delivery {count}: {} (complete the message: {})",
            outcome.kind(),
            outcome.completes_message()
        );
    }
    let claim = ClaimApproved::parse(APPROVAL)
        .map_err(|e| e.to_string())?
        .claim_id;
    let written = letters.letters(claim).await;
    println!("{} letter(s) for claim {claim}:", written.len());
    for letter in written {
        println!("  {} {}", letter.key, letter.body.as_str());
    }
    Ok(())
}

/// The seed's hands-on exercise, run by `cargo test`.
#[cfg(test)]
mod tests {
    use claims_payments_engine::store::once::OnceResult;
    use claims_payments_engine::store::Listed;
    use claims_payments_engine::store::{
        InboxRecord, Store, StoreCall, StoreDecorator, StoreError, StoreResult,
    };

    use super::*;

    fn store() -> (Arc<SqliteStore>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (
            SqliteStore::open(dir.path().join("letters.db")).unwrap(),
            dir,
        )
    }

    fn delivery(count: u32) -> Delivery {
        Delivery {
            message_id: MessageId::parse(MESSAGE_ID).unwrap(),
            delivery_count: count,
        }
    }

    fn claim() -> ClaimId {
        ClaimApproved::parse(APPROVAL).unwrap().claim_id
    }

    /// Delivers the approval `times` times; the outcomes.
    async fn deliver(letters: &Letters, times: u32) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        for count in 1..=times {
            outcomes.push(
                letters
                    .on_message(APPROVAL, &delivery(count))
                    .await
                    .unwrap(),
            );
        }
        outcomes
    }

    #[tokio::test]
    async fn the_same_message_five_times_gives_one_letter() {
        let (store, _dir) = store();
        let letters = Letters::new(store, true);
        let outcomes = deliver(&letters, 5).await;
        assert_eq!(outcomes[0], Outcome::Done);
        assert!(
            outcomes[1..].iter().all(|o| *o == Outcome::Duplicate),
            "{outcomes:?}"
        );
        assert!(outcomes.iter().all(Outcome::completes_message));
        assert_eq!(letters.letters(claim()).await.len(), 1);
    }

    /// The SQLite store, whose `record_once` commits and then loses its answer: the
    /// connection dropped after the commit, before the reply.
    struct AnswerLostAfterCommit(Arc<SqliteStore>);

    impl StoreDecorator for AnswerLostAfterCommit {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        fn around<T: Send + 'static>(
            &self,
            _call: StoreCall<'_>,
            work: impl std::future::Future<Output = StoreResult<T>> + Send,
        ) -> impl std::future::Future<Output = StoreResult<T>> + Send {
            work
        }
    }

    #[async_trait::async_trait]
    impl OnceStore for AnswerLostAfterCommit {
        async fn record_once(
            &self,
            inbox: &InboxRecord,
            effect: &Effect,
        ) -> StoreResult<OnceResult> {
            self.0.record_once(inbox, effect).await?;
            Err(StoreError::Transient("connection reset".into()))
        }

        async fn effects(
            &self,
            kind: &EffectKind,
            limit: usize,
        ) -> StoreResult<Vec<Listed<Effect>>> {
            self.0.effects(kind, limit).await
        }
    }

    /// A failure after the record is written, before the delivery completes: the
    /// attempt whose answer was lost recognises its own write, and after a process that
    /// died before answering the host, the redelivery is a duplicate and completes.
    #[tokio::test]
    async fn a_failure_after_the_commit_is_a_duplicate_on_redelivery_and_completes() {
        let (store, dir) = store();
        let lossy = Letters::new(Arc::new(AnswerLostAfterCommit(store.clone())), true);
        let answered = lossy.on_message(APPROVAL, &delivery(1)).await.unwrap();
        assert_eq!(answered, Outcome::Done, "its own committed write");

        // The process dies after the commit, before the host hears an answer: a new
        // process on the same file gets the redelivery.
        drop((lossy, store));
        let reopened = SqliteStore::open(dir.path().join("letters.db")).unwrap();
        let letters = Letters::new(reopened, true);
        let redelivered = letters.on_message(APPROVAL, &delivery(2)).await.unwrap();
        assert_eq!(redelivered, Outcome::Duplicate);
        assert!(redelivered.completes_message());
        assert_eq!(letters.letters(claim()).await.len(), 1);
    }

    /// The guard removed (`--no-guard`): the same deliveries duplicate the letter,
    /// which is what the tests above would see without it.
    #[tokio::test]
    async fn without_the_guard_letters_are_duplicated() {
        let (store, _dir) = store();
        let letters = Letters::new(store, false);
        let outcomes = deliver(&letters, 5).await;
        assert_eq!(outcomes, vec![Outcome::Done; 5]);
        assert_eq!(letters.letters(claim()).await.len(), 5);
    }

    #[tokio::test]
    async fn a_body_that_is_not_an_approval_is_refused_without_repeating_it() {
        let (store, _dir) = store();
        let letters = Letters::new(store, true);
        let refused = letters
            .on_message(
                r#"{"claimId":"Jane Doe","amount":"10.00","currency":"EUR"}"#,
                &delivery(1),
            )
            .await
            .unwrap_err();
        assert_eq!(refused.field, "claimId");
        assert!(!refused.to_string().contains("Jane"), "{refused}");
    }
}
