//! The once-guard's records: an [`Effect`] (what a consumer does once per message, as a
//! record) and the store capability [`OnceStore`] that writes it in the same atomic step
//! as the message's inbox record: the transactional outbox. The consumer's side, the
//! guard, is the engine's `once` module, a layer above this port.
//!
//! An effect is unique twice over: under its message's inbox key (consumer, claim,
//! message), so a redelivery writes no second effect, and under its own key (kind,
//! claim, key), so another message about the same claim (a re-sent approval under a new
//! MessageId) writes none either. Both uniquenesses are the database's, in one step;
//! a refusal writes nothing. Effect records are never purged: once the inbox record's
//! retention is over, the effect is the guard left, as the payment is for payments.
//!
//! Every part is parsed on the way in and bounded, so an adapter stores it as it is, and
//! a refusal names the part and the rule broken, never the value.

use std::fmt;

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{CorruptRecord, InboxRecord, Listed, Store, StoreResult, Versioned};
use crate::domain::{json_error, ClaimId, MessageId};

/// Why a part of an [`Effect`] is refused: the part and the rule, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{part}: {problem}")]
pub struct InvalidEffect {
    pub part: &'static str,
    pub problem: String,
}

impl InvalidEffect {
    fn new(part: &'static str, problem: impl Into<String>) -> Self {
        InvalidEffect {
            part,
            problem: problem.into(),
        }
    }
}

/// Names shared by other records of the inbox (a process's registration, a reconcile
/// run's lease, an HTTP key record): an effect kind is the consumer of its inbox records,
/// so it must never be one of theirs.
pub const RESERVED_KINDS: [&str; 3] = ["process", "reconcile-run", "payments-api"];

/// Checks `s` against the characters an identifier here may hold (letters, digits and
/// `allowed`; no `/`, `\`, `?` or `#`, which a Cosmos DB id may not hold) and a length.
fn identifier(part: &'static str, s: &str, max: usize, allowed: &str) -> Result<(), InvalidEffect> {
    if s.is_empty() {
        return Err(InvalidEffect::new(part, "is empty"));
    }
    if s.len() > max {
        return Err(InvalidEffect::new(
            part,
            format!("has {} bytes; at most {max} are allowed", s.len()),
        ));
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || allowed.contains(c))
    {
        return Err(InvalidEffect::new(
            part,
            format!("may hold only ASCII letters, digits and {allowed:?}"),
        ));
    }
    Ok(())
}

/// What kind of effect, and the consumer whose inbox records guard it (`claim-letters`):
/// 1 to 64 ASCII letters, digits, `-` or `_`, and not a [reserved](RESERVED_KINDS) name.
/// It must also differ from the payment consumer's `CONSUMER_NAME`, which the engine
/// cannot see: both would share one message's inbox record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EffectKind(String);

impl EffectKind {
    pub const MAX_BYTES: usize = 64;

    pub fn parse(s: &str) -> Result<Self, InvalidEffect> {
        identifier("effect kind", s, Self::MAX_BYTES, "-_")?;
        if RESERVED_KINDS.contains(&s) {
            return Err(InvalidEffect::new(
                "effect kind",
                format!(
                    "is reserved for the inbox's own records ({})",
                    RESERVED_KINDS.join(", ")
                ),
            ));
        }
        Ok(EffectKind(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EffectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which effect of its kind for one claim (`approved` for the approval letter): 1 to 128
/// ASCII letters, digits, `-`, `_`, `.` or `:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EffectKey(String);

impl EffectKey {
    pub const MAX_BYTES: usize = 128;

    pub fn parse(s: &str) -> Result<Self, InvalidEffect> {
        identifier("effect key", s, Self::MAX_BYTES, "-_.:")?;
        Ok(EffectKey(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the effect is (the letter's fields): a JSON object of at most
/// [`MAX_BYTES`](Self::MAX_BYTES), kept as the exact text given, so it is stored, read
/// back and compared byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectBody(String);

impl EffectBody {
    /// Bounded so one effect cannot outgrow a Cosmos DB document or a batch.
    pub const MAX_BYTES: usize = 16 * 1024;

    pub fn parse(text: &str) -> Result<Self, InvalidEffect> {
        if text.len() > Self::MAX_BYTES {
            return Err(InvalidEffect::new(
                "effect body",
                format!(
                    "has {} bytes; at most {} are allowed",
                    text.len(),
                    Self::MAX_BYTES
                ),
            ));
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(_)) => Ok(EffectBody(text.to_owned())),
            Ok(_) => Err(InvalidEffect::new("effect body", "is not a JSON object")),
            Err(e) => Err(InvalidEffect::new("effect body", json_error(&e))),
        }
    }

    /// The body of `value`'s JSON text (serde_json writes an object's keys sorted, so the
    /// same fields always give the same text).
    pub fn from_json(value: &serde_json::Value) -> Result<Self, InvalidEffect> {
        Self::parse(&value.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One effect, as recorded: what the outbox holds for whatever carries it out (a print
/// run, a mailer), which goes by `(kind, claim_id, key)` to do it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The consumer's name: its inbox records carry it as their `consumer`.
    pub kind: EffectKind,
    /// The claim: the partition, as for inbox records.
    pub claim_id: ClaimId,
    pub key: EffectKey,
    /// The message that recorded it.
    pub message_id: MessageId,
    pub body: EffectBody,
    pub created_at: OffsetDateTime,
}

impl Effect {
    /// Whether a stored effect is the same effect as this one: same identity and body
    /// (the message that recorded it may differ).
    pub fn same_as(&self, other: &Effect) -> bool {
        (&self.kind, self.claim_id, &self.key, &self.body)
            == (&other.kind, other.claim_id, &other.key, &other.body)
    }

    /// A stored effect that does not read back: which one, which column, and why.
    pub fn corrupt(
        claim_id: &str,
        column: &'static str,
        reason: impl fmt::Display,
    ) -> CorruptRecord {
        CorruptRecord {
            record: "effect",
            ..CorruptRecord::payment(claim_id, column, reason)
        }
    }
}

/// The answer to [`OnceStore::record_once`].
#[derive(Debug, Clone, PartialEq)]
pub enum OnceResult {
    /// Both records were written by this call.
    Recorded,
    /// The message was seen before: here is its inbox record. Nothing was written.
    InboxExists(Versioned<InboxRecord>),
    /// The message is new, but its effect was recorded by another message: here it is.
    /// Nothing was written.
    EffectExists(Effect),
}

/// A store that can write a message's effect with its inbox record in one atomic step.
/// A separate trait, so that stores and decorators which never record effects need not
/// implement it.
#[async_trait]
pub trait OnceStore: Store {
    /// Atomically create `inbox` and `effect` (same consumer as kind, same claim), or
    /// create nothing and report which record already exists: the inbox key's record
    /// first, then the effect key's. An adapter may spend one read on a refusal, to return
    /// the existing record.
    async fn record_once(&self, inbox: &InboxRecord, effect: &Effect) -> StoreResult<OnceResult>;

    /// The effects of `kind`, oldest first, at most `limit`: the outbox a carrier reads.
    /// A record that does not read is listed as its [`CorruptRecord`], in its place.
    async fn effects(&self, kind: &EffectKind, limit: usize) -> StoreResult<Vec<Listed<Effect>>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_bounded_and_refusals_never_repeat_the_value() {
        assert_eq!(
            EffectKind::parse("claim-letters").unwrap().as_str(),
            "claim-letters"
        );
        assert_eq!(
            EffectKey::parse("approved:v1").unwrap().as_str(),
            "approved:v1"
        );
        for (bad, why) in [
            ("", "is empty"),
            ("letters/2", "may hold only"),
            ("secret account 123", "may hold only"),
            ("process", "is reserved"),
        ] {
            let e = EffectKind::parse(bad).unwrap_err();
            assert!(e.problem.contains(why), "{bad:?}: {e}");
            if !bad.is_empty() && bad != "process" {
                assert!(!e.to_string().contains(bad), "{e}");
            }
        }
        assert!(EffectKind::parse(&"k".repeat(64)).is_ok());
        assert!(EffectKind::parse(&"k".repeat(65)).is_err());
        assert!(EffectKey::parse(&"k".repeat(128)).is_ok());
        assert!(EffectKey::parse(&"k".repeat(129)).is_err());
        assert!(EffectKey::parse("a#b").is_err());

        let text = r#"{"to":"Jane Doe","amount":"10.00"}"#;
        assert_eq!(EffectBody::parse(text).unwrap().as_str(), text);
        for bad in [r#"["Jane Doe"]"#, r#""Jane Doe""#, r#"{"to":"Jane Doe""#] {
            let e = EffectBody::parse(bad).unwrap_err();
            assert!(!e.to_string().contains("Jane"), "{e}");
        }
        let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(EffectBody::MAX_BYTES));
        assert!(EffectBody::parse(&big)
            .unwrap_err()
            .problem
            .contains("at most"));
    }
}
