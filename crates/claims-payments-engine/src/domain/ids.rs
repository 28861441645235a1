//! The identities a payment is known by: the claim, the message, the tenant, the payee,
//! the bank's Idempotency-Key and the payload hash. Each is a newtype that holds only a
//! valid value, in the canonical form it is stored in.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{canonical, InvalidMessage};

/// The claim being paid. A UUID, kept in its canonical lowercase hyphenated form,
/// which is also the Cosmos partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimId(Uuid);

impl ClaimId {
    pub fn parse(s: &str) -> Result<Self, InvalidMessage> {
        let uuid = Uuid::try_parse(s.trim())
            .map_err(|_| InvalidMessage::new("claimId", "is not a UUID"))?;
        if uuid.is_nil() {
            return Err(InvalidMessage::new(
                "claimId",
                "is the nil UUID, which names no claim",
            ));
        }
        Ok(ClaimId(uuid))
    }

    pub fn random() -> Self {
        ClaimId(Uuid::new_v4())
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// The Service Bus MessageId: the producer's stable identity of one event.
/// Service Bus allows any characters, up to 128 of them; storage adapters encode it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    pub const MAX_CHARS: usize = 128;

    pub fn parse(s: &str) -> Result<Self, InvalidMessage> {
        let chars = s.chars().count();
        if chars == 0 {
            return Err(InvalidMessage::new("MessageId", "is empty"));
        }
        if chars > Self::MAX_CHARS {
            return Err(InvalidMessage::new(
                "MessageId",
                format!("has {chars} characters; Service Bus allows at most 128"),
            ));
        }
        Ok(MessageId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bounded_text(
    field: &'static str,
    value: &str,
    max_chars: usize,
    allowed: impl Fn(char) -> bool,
    describe_allowed: &str,
) -> Result<String, InvalidMessage> {
    let value = value.trim();
    if value.is_empty() {
        return Err(InvalidMessage::new(field, "is empty"));
    }
    if value.chars().count() > max_chars {
        return Err(InvalidMessage::new(
            field,
            format!("is longer than {max_chars} characters"),
        ));
    }
    if let Some(position) = value.chars().position(|c| !allowed(c)) {
        return Err(InvalidMessage::new(
            field,
            format!(
                "contains a character that is not allowed (character {}); allowed: {describe_allowed}",
                position + 1
            ),
        ));
    }
    Ok(value.to_owned())
}

/// A newtype of text with a bounded length and alphabet: `parse` reads it from a message,
/// `from_stored` back from the store (the same grammar, and no surrounding spaces).
macro_rules! bounded_text_type {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:literal, $allowed:expr, $alphabet:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, InvalidMessage> {
                bounded_text($field, s, $max, $allowed, $alphabet).map($name)
            }

            pub fn from_stored(s: &str) -> Result<Self, InvalidMessage> {
                let value = Self::parse(s)?;
                canonical($field, s, value.as_str())?;
                Ok(value)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

bounded_text_type!(
    /// The insurer's tenant, when claims come from several. It scopes the bank's
    /// Idempotency-Key so two tenants can never share one.
    TenantId,
    "tenantId",
    64,
    |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
    "letters, digits, '-', '_', '.'"
);

bounded_text_type!(
    /// The account the payout goes to, as the bank knows it (an IBAN or a payee id).
    PayeeRef,
    "payee",
    70,
    |c| c.is_ascii_graphic() || c == ' ',
    "printable ASCII"
);

/// What a payment is for. One payment document exists per (claim, purpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    Payout,
}

impl Purpose {
    pub fn as_str(&self) -> &'static str {
        match self {
            Purpose::Payout => "payout",
        }
    }
}

/// The bank's Idempotency-Key for one payout: derived from tenant, claim and purpose
/// only, so every retry, takeover and redelivery sends the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn for_payout(tenant: Option<&TenantId>, claim: ClaimId) -> Self {
        let key = format!("claim-payment-{claim}");
        IdempotencyKey(match tenant {
            Some(tenant) => format!("{}:{key}", tenant.as_str()),
            None => key,
        })
    }

    /// Restores a key read back from the store, where it was written by `for_payout`.
    pub fn from_stored(s: String) -> Self {
        IdempotencyKey(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// SHA-256 over the canonical business fields (not the envelope): two deliveries
/// with equal hashes ask for the same payment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PayloadHash(pub(super) String);

impl PayloadHash {
    pub fn from_stored(s: String) -> Self {
        PayloadHash(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}
