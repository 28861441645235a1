//! The domain: the `ClaimApproved` message contract and the types it is parsed into.
//!
//! Parse, don't validate: every type here can only hold a valid value, so the
//! consumer never re-checks a claim id, an amount or a key. Each violation names
//! the field it concerns, because the error ends up in an operator's log next to a
//! dead-lettered message. It names the field and what is wrong (the JSON type, the
//! rule broken), never the value: the error reaches log lines, exported telemetry and
//! the operator's dead-letter list, and a value may be an account number or a name.
//!
//! - [`claim_approved`]: the message contract (wire shape, payload hash, payout body);
//! - [`ids`]: the identities (claim, message, tenant, payee, the bank's key, the hash);
//! - [`money`]: amounts and currencies, under one strict decimal grammar;
//! - [`outcome`]: the stored names of how a delivery ended;
//! - [`redrive`]: a re-driven message's identity (the copy's MessageId, the original it names).

pub mod claim_approved;
pub mod ids;
pub mod money;
pub mod outcome;
pub mod redrive;

pub use claim_approved::ClaimApproved;
pub use ids::{ClaimId, IdempotencyKey, MessageId, PayeeRef, PayloadHash, Purpose, TenantId};
pub use money::parse_decimal_amount;
pub use money::{Currency, Money};
pub use outcome::OutcomeKind;

/// Why a message body is not a valid `ClaimApproved`. Permanent: redelivery cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidMessage {
    pub field: &'static str,
    pub problem: String,
}

impl InvalidMessage {
    pub fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }
}

/// A stored value must be exactly what writing its parsed form gives.
pub(super) fn canonical(
    field: &'static str,
    stored: &str,
    written: &str,
) -> Result<(), InvalidMessage> {
    if stored == written {
        Ok(())
    } else {
        Err(InvalidMessage::new(
            field,
            "is not in its canonical form (as this service writes it)",
        ))
    }
}

/// The JSON type of a value, for an error that must not repeat the value itself.
pub fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// What is wrong with JSON text, by category and position only: serde_json's own
/// messages quote the offending value ("invalid type: string \"...\""), and that value
/// may be a payee's account or a name.
pub fn json_error(error: &serde_json::Error) -> String {
    let what = match error.classify() {
        serde_json::error::Category::Io => "cannot be read",
        serde_json::error::Category::Syntax => "is not valid JSON",
        serde_json::error::Category::Data => "does not have the expected shape",
        serde_json::error::Category::Eof => "ends before the JSON is complete",
    };
    format!("{what} (line {}, column {})", error.line(), error.column())
}
