//! The client's `Idempotency-Key` and the records derived from it.

use sha2::{Digest, Sha256};

use crate::domain::{ClaimId, MessageId};
use crate::store::InboxKey;

use super::caller::Scope;
use super::KEY_CONSUMER;

/// A client's `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): an
/// Item Structured Field whose value is a String (`"..."`), 1 to 255 characters.
///
/// Most clients send the key unquoted (Stripe's examples do), so a bare key is
/// accepted too, but only when it cannot be anything else: RFC 9110 `tchar`s only.
/// That excludes `,` and spaces (what a proxy makes of two header lines, `a, b`), `;`
/// (Structured Field parameters, `abc;x=1`), `:` (a byte sequence, `:YWJj:`) and `"`,
/// so every header value that a Structured Field parser would read as something other
/// than a plain string is refused instead of being taken literally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientKey(String);

/// The longest key; Stripe's limit, and what the browser client checks.
const MAX_KEY_CHARS: usize = 255;

/// Why an `Idempotency-Key` header value is refused: the detail of a 400
/// `idempotency-key-invalid`. It names what is wrong, never the value sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InvalidKey {
    #[error("Idempotency-Key must be printable ASCII")]
    NotVisibleAscii,
    #[error("send exactly one Idempotency-Key header")]
    SentTwice,
    #[error("Idempotency-Key is not a valid Structured Field string: {0}")]
    NotStructuredField(sfv::Error),
    #[error("Idempotency-Key must be a plain string, without parameters")]
    HasParameters,
    #[error("Idempotency-Key must be a string")]
    NotAString,
    #[error(
        "Idempotency-Key is neither a Structured Field string (\"...\") nor a bare token: {} is not allowed unquoted",
        describe(*.0)
    )]
    NotAToken(char),
    #[error("Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters, got {0}")]
    Length(usize),
}

impl ClientKey {
    pub(crate) fn parse(raw: &str) -> Result<Self, InvalidKey> {
        // Structured Fields discard leading and trailing spaces only (RFC 9651 4.2).
        let raw = raw.trim_matches(' ');
        let text = if raw.starts_with('"') {
            let item = sfv::Parser::new(raw)
                .parse::<sfv::Item>()
                .map_err(InvalidKey::NotStructuredField)?;
            if !item.params.is_empty() {
                return Err(InvalidKey::HasParameters);
            }
            item.bare_item
                .as_string()
                .map(|s| s.as_str().to_owned())
                .ok_or(InvalidKey::NotAString)?
        } else {
            if let Some(bad) = raw.chars().find(|c| !is_tchar(*c)) {
                return Err(InvalidKey::NotAToken(bad));
            }
            raw.to_owned()
        };
        if text.is_empty() || text.len() > MAX_KEY_CHARS {
            return Err(InvalidKey::Length(text.len()));
        }
        // An sf-string holds printable ASCII only; the parser already enforces it,
        // this keeps the rule in one visible place.
        if !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(InvalidKey::NotVisibleAscii);
        }
        Ok(ClientKey(text))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// RFC 9110 5.6.2 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// Names a refused character without echoing anything else of the header.
fn describe(c: char) -> String {
    match c {
        ',' => "',' (two Idempotency-Key headers merged into one?)".into(),
        ' ' => "a space".into(),
        c if c.is_ascii_graphic() => format!("{c:?}"),
        c => format!("U+{:04X}", c as u32),
    }
}

/// The key record's identity, derived from scope and key.
pub(crate) struct KeyIdentity {
    pub(crate) key: InboxKey,
}

impl KeyIdentity {
    /// The key record lives under a claim id and a MessageId derived from a hash of
    /// (scope, key). The MessageId is also the one the consumer records on the
    /// payment, `http-<scope tag>-<key hash>`: the payment itself then says which
    /// caller created it ([`created_by`]), without a field of its own in the store.
    pub(crate) fn new(scope: &Scope, client_key: &ClientKey) -> Self {
        let digest = Sha256::digest(format!("{}\n{}", scope.as_str(), client_key.as_str()));
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        // A UUID whose version says "custom" (8): its own partition on Cosmos.
        let uuid = uuid::Builder::from_custom_bytes(id).into_uuid();
        let claim_id = ClaimId::parse(&uuid.to_string()).expect("a hash is never the nil UUID");
        let message_id = MessageId::parse(&format!(
            "{}{}",
            message_prefix(scope),
            hex::encode(&digest[..16])
        ))
        .expect("a 62-character id is a valid MessageId");
        KeyIdentity {
            key: InboxKey {
                consumer: KEY_CONSUMER.into(),
                claim_id,
                message_id,
            },
        }
    }
}

/// `http-<scope tag>-`: how every MessageId of a scope's HTTP payments begins. The tag
/// is 96 bits of SHA-256 of the scope: a caller cannot choose its scope (the platform
/// names it), so it cannot aim at another's tag.
fn message_prefix(scope: &Scope) -> String {
    let tag = Sha256::digest(format!("scope\n{}", scope.as_str()));
    format!("http-{}-", hex::encode(&tag[..12]))
}

/// Whether a payment's MessageId says `scope` created it over HTTP. A payment created by
/// a Service Bus message, or by an HTTP caller before the tag existed, belongs to no
/// HTTP caller.
pub(crate) fn created_by(message_id: &MessageId, scope: &Scope) -> bool {
    message_id.as_str().starts_with(&message_prefix(scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sf_strings_or_bare_tokens_of_printable_ascii() {
        assert_eq!(ClientKey::parse("abc-123").unwrap().as_str(), "abc-123");
        assert_eq!(
            ClientKey::parse("5f0c7d1e-2b7a-4c1f-9f3e-8a1b2c3d4e5f")
                .unwrap()
                .as_str(),
            "5f0c7d1e-2b7a-4c1f-9f3e-8a1b2c3d4e5f"
        );
        assert_eq!(
            ClientKey::parse("\"8e03978e-40d5\"").unwrap().as_str(),
            "8e03978e-40d5"
        );
        assert_eq!(ClientKey::parse(r#""a\"b""#).unwrap().as_str(), "a\"b");
        // An sf-string may hold what a bare token may not.
        assert_eq!(ClientKey::parse(r#""a, b""#).unwrap().as_str(), "a, b");
        for bad in [
            "",
            "\"\"",
            "\"unterminated",
            "\"a\";p=1",
            "é",
            &"x".repeat(256),
        ] {
            assert!(ClientKey::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ClientKey::parse(&"x".repeat(255)).is_ok());
    }

    /// Values that are not a plain key once read as a Structured Field are refused, not
    /// taken literally: a proxy may merge headers, and two keys merged into one would
    /// otherwise name a third payment.
    #[test]
    fn merged_headers_parameters_and_byte_sequences_are_refused() {
        for bad in [
            "a, b",
            "a,b",
            "\"a\", \"b\"",
            "abc;x=1",
            ":YWJj:",
            "a b",
            "(a)",
            "a/b",
            "a=b",
        ] {
            ClientKey::parse(bad).expect_err(bad);
        }
        assert!(matches!(
            ClientKey::parse("a,b"),
            Err(InvalidKey::NotAToken(','))
        ));
        assert!(ClientKey::parse("a,b")
            .unwrap_err()
            .to_string()
            .contains("merged"));
    }

    #[test]
    fn scopes_and_keys_make_distinct_records() {
        let k = ClientKey::parse("same").unwrap();
        let a = KeyIdentity::new(&Scope::new("tenant:a"), &k);
        let b = KeyIdentity::new(&Scope::new("tenant:b"), &k);
        assert_ne!(a.key, b.key);
        let again = KeyIdentity::new(&Scope::new("tenant:a"), &k);
        assert_eq!(a.key, again.key);
        assert!(a.key.message_id.as_str().len() <= MessageId::MAX_CHARS);
    }

    #[test]
    fn a_payment_message_id_names_its_creator() {
        let k = ClientKey::parse("k").unwrap();
        let alice = Scope::new("aad:t:alice");
        let bob = Scope::new("aad:t:bob");
        let id = KeyIdentity::new(&alice, &k).key.message_id;
        assert!(created_by(&id, &alice));
        assert!(!created_by(&id, &bob));
        assert!(!created_by(
            &MessageId::parse("claim-approved-1").unwrap(),
            &alice
        ));
    }
}
