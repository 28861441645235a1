//! The `ClaimApproved` message contract and the domain types it is parsed into.
//!
//! Parse, don't validate: every type here can only hold a valid value, so the
//! consumer never re-checks a claim id, an amount or a key. Each violation names
//! the field it concerns, because the error ends up in an operator's log next to a
//! dead-lettered message.
//!
//! Money is `rust_decimal::Decimal` end to end. A JSON number is taken from its raw
//! text (`serde_json::value::RawValue`), never through `f64`.

use std::fmt;
use std::str::FromStr;

use iso_currency::Currency as IsoCurrency;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use uuid::Uuid;

/// Why a message body is not a valid `ClaimApproved`. Permanent: redelivery cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidMessage {
    pub(crate) field: &'static str,
    pub(crate) problem: String,
}

impl InvalidMessage {
    pub(crate) fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }
}

/// The claim being paid. A UUID, kept in its canonical lowercase hyphenated form,
/// which is also the Cosmos partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimId(Uuid);

impl ClaimId {
    pub fn parse(s: &str) -> Result<Self, InvalidMessage> {
        let uuid = Uuid::try_parse(s.trim())
            .map_err(|_| InvalidMessage::new("claimId", format!("{s:?} is not a UUID")))?;
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

    pub(crate) fn as_uuid(&self) -> Uuid {
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

/// An ISO 4217 currency with a defined number of minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency(IsoCurrency);

impl Currency {
    pub(crate) fn parse(s: &str) -> Result<Self, InvalidMessage> {
        let currency = IsoCurrency::from_code(s).ok_or_else(|| {
            InvalidMessage::new(
                "currency",
                format!("{s:?} is not an ISO 4217 code (three capital letters, e.g. EUR)"),
            )
        })?;
        if currency.exponent().is_none() {
            return Err(InvalidMessage::new(
                "currency",
                format!("{s} has no minor unit (a fund or metal code), so it cannot be paid out"),
            ));
        }
        Ok(Currency(currency))
    }

    pub fn code(&self) -> &'static str {
        self.0.code()
    }

    /// Fraction digits the currency allows, capped at the contract's two.
    fn max_fraction_digits(&self) -> u32 {
        u32::from(self.0.exponent().unwrap_or(0)).min(Money::MAX_FRACTION_DIGITS)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A positive amount in a currency, with at most two fraction digits (fewer if the
/// currency has fewer minor units). Trailing zeros are not precision: `12.50` and
/// `12.5` are the same amount and hash the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Money {
    amount: Decimal,
    currency: Currency,
}

impl Money {
    pub(crate) const MAX_FRACTION_DIGITS: u32 = 2;
    /// One trillion minus a cent: larger is a producer bug, not a claim.
    pub(crate) const MAX_AMOUNT: Decimal = Decimal::from_parts(276_447_231, 23_283, 0, false, 2);

    pub(crate) fn new(amount: Decimal, currency: Currency) -> Result<Self, InvalidMessage> {
        let amount = amount.normalize();
        if amount <= Decimal::ZERO {
            return Err(InvalidMessage::new(
                "amount",
                format!("must be positive, got {amount}"),
            ));
        }
        if amount > Self::MAX_AMOUNT {
            return Err(InvalidMessage::new(
                "amount",
                format!("{amount} exceeds the maximum {}", Self::MAX_AMOUNT),
            ));
        }
        let allowed = currency.max_fraction_digits();
        if amount.scale() > allowed {
            return Err(InvalidMessage::new(
                "amount",
                format!(
                    "{amount} has {} fraction digits; {} allows at most {allowed}",
                    amount.scale(),
                    currency.code()
                ),
            ));
        }
        Ok(Money { amount, currency })
    }

    pub fn amount(&self) -> Decimal {
        self.amount
    }

    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// Reads an amount and a currency back from the store, where [`Money::amount_string`]
    /// and [`Currency::code`] wrote them: the message's strict grammar and limits, and
    /// the canonical form, so that writing the value again gives the same bytes.
    pub(crate) fn from_stored(amount: &str, currency: &str) -> Result<Self, InvalidMessage> {
        if !is_plain_decimal(amount) {
            return Err(InvalidMessage::new(
                "amount",
                format!("{amount:?} is not a plain decimal number"),
            ));
        }
        let value = Decimal::from_str_exact(amount)
            .map_err(|_| InvalidMessage::new("amount", format!("{amount:?} is out of range")))?;
        let money = Money::new(value, Currency::parse(currency)?)?;
        canonical("amount", amount, &money.amount_string())?;
        Ok(money)
    }

    /// The amount as the string every document and the bank body carry, with the
    /// currency's fraction digits (`12.50`, `1000` for JPY).
    pub fn amount_string(&self) -> String {
        let mut rounded = self.amount;
        rounded.rescale(self.currency.max_fraction_digits());
        rounded.to_string()
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount_string(), self.currency)
    }
}

/// Parses an amount from the raw JSON text: a string (`"12.50"`) or a number (`12.5`),
/// without ever going through `f64`. One strict grammar for both: an optional `-` (so
/// a negative amount is refused as such), digits, and optionally `.` and more digits.
/// No exponent, sign `+`, separators, spaces or a bare `.`: money from another system
/// that does not match is refused, never guessed at.
fn parse_amount(raw: &RawValue) -> Result<Decimal, InvalidMessage> {
    let text = raw.get().trim();
    let literal = if text.starts_with('"') {
        serde_json::from_str::<String>(text)
            .map_err(|e| InvalidMessage::new("amount", format!("is not a valid string: {e}")))?
    } else if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        text.to_owned()
    } else {
        return Err(InvalidMessage::new(
            "amount",
            format!("must be a decimal number or a string holding one, got {text}"),
        ));
    };
    if !is_plain_decimal(&literal) {
        return Err(InvalidMessage::new(
            "amount",
            format!(
                "{literal:?} is not a plain decimal number (digits, optionally '.' and digits)"
            ),
        ));
    }
    Decimal::from_str_exact(&literal)
        .map_err(|_| InvalidMessage::new("amount", format!("{literal:?} is out of range")))
}

/// An amount another party (the bank) wrote, under the same strict grammar as a
/// message's: `None` for anything else. Its scale is kept for display; decimals
/// compare by value, so `75.0` equals `75.00`.
pub(crate) fn parse_decimal_amount(text: &str) -> Option<Decimal> {
    if !is_plain_decimal(text) {
        return None;
    }
    Decimal::from_str_exact(text).ok()
}

/// `-?[0-9]+(\.[0-9]+)?`
fn is_plain_decimal(s: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    match unsigned.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(unsigned),
    }
}

/// A stored value must be exactly what writing its parsed form gives.
fn canonical(field: &'static str, stored: &str, written: &str) -> Result<(), InvalidMessage> {
    if stored == written {
        Ok(())
    } else {
        Err(InvalidMessage::new(
            field,
            format!("{stored:?} is not in its canonical form {written:?}"),
        ))
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
    if let Some(bad) = value.chars().find(|c| !allowed(*c)) {
        return Err(InvalidMessage::new(
            field,
            format!("contains {bad:?}; allowed: {describe_allowed}"),
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
            pub(crate) fn parse(s: &str) -> Result<Self, InvalidMessage> {
                bounded_text($field, s, $max, $allowed, $alphabet).map($name)
            }

            pub(crate) fn from_stored(s: &str) -> Result<Self, InvalidMessage> {
                let value = Self::parse(s)?;
                canonical($field, s, value.as_str())?;
                Ok(value)
            }

            pub(crate) fn as_str(&self) -> &str {
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
    pub(crate) fn as_str(&self) -> &'static str {
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
    pub(crate) fn for_payout(tenant: Option<&TenantId>, claim: ClaimId) -> Self {
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
pub struct PayloadHash(String);

impl PayloadHash {
    pub(crate) fn from_stored(s: String) -> Self {
        PayloadHash(s)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// The wire shape. Unknown fields are ignored so producers can add fields
/// without breaking this consumer; they do not count towards the payload hash.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireClaimApproved<'a> {
    #[serde(borrow)]
    claim_id: Option<&'a RawValue>,
    #[serde(borrow)]
    amount: Option<&'a RawValue>,
    currency: Option<serde_json::Value>,
    tenant_id: Option<serde_json::Value>,
    payee: Option<serde_json::Value>,
    approved_at: Option<serde_json::Value>,
}

/// A valid `ClaimApproved` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimApproved {
    pub claim_id: ClaimId,
    pub money: Money,
    pub tenant: Option<TenantId>,
    pub payee: Option<PayeeRef>,
    approved_at: Option<OffsetDateTime>,
}

fn optional_string(
    field: &'static str,
    value: Option<serde_json::Value>,
) -> Result<Option<String>, InvalidMessage> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(InvalidMessage::new(
            field,
            format!("must be a string, got {other}"),
        )),
    }
}

impl ClaimApproved {
    /// Parses the message body (UTF-8 JSON text).
    pub fn parse(body: &str) -> Result<Self, InvalidMessage> {
        // serde reads a struct from a JSON array too, field by field in order: a message
        // is an object with named fields, never a positional list.
        if !body.trim_start().starts_with('{') {
            return Err(InvalidMessage::new("body", "is not a JSON object"));
        }
        let wire: WireClaimApproved = serde_json::from_str(body)
            .map_err(|e| InvalidMessage::new("body", format!("is not a JSON object: {e}")))?;

        let claim_raw = wire
            .claim_id
            .ok_or_else(|| InvalidMessage::new("claimId", "is missing"))?;
        let claim_text: String = serde_json::from_str(claim_raw.get())
            .map_err(|_| InvalidMessage::new("claimId", "must be a string holding a UUID"))?;
        let claim_id = ClaimId::parse(&claim_text)?;

        let currency = optional_string("currency", wire.currency)?
            .ok_or_else(|| InvalidMessage::new("currency", "is missing"))?;
        let currency = Currency::parse(&currency)?;
        let amount = wire
            .amount
            .filter(|raw| raw.get() != "null")
            .ok_or_else(|| InvalidMessage::new("amount", "is missing"))?;
        let money = Money::new(parse_amount(amount)?, currency)?;

        let tenant = optional_string("tenantId", wire.tenant_id)?
            .map(|t| TenantId::parse(&t))
            .transpose()?;
        let payee = optional_string("payee", wire.payee)?
            .map(|p| PayeeRef::parse(&p))
            .transpose()?;
        let approved_at = optional_string("approvedAt", wire.approved_at)?
            .map(|t| {
                OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).map_err(
                    |_| {
                        InvalidMessage::new(
                            "approvedAt",
                            format!("{t:?} is not an RFC 3339 timestamp"),
                        )
                    },
                )
            })
            .transpose()?;

        Ok(ClaimApproved {
            claim_id,
            money,
            tenant,
            payee,
            approved_at,
        })
    }

    /// Hash of the fields that decide the payment: claim, amount, currency, tenant, payee.
    /// `approvedAt` is left out on purpose: a re-sent approval with a new timestamp is
    /// still the same payment.
    pub fn payload_hash(&self) -> PayloadHash {
        // serde_json's map is sorted by key, so this is canonical JSON.
        let canonical = serde_json::json!({
            "amount": self.money.amount_string(),
            "claimId": self.claim_id.to_string(),
            "currency": self.money.currency().code(),
            "payee": self.payee.as_ref().map(PayeeRef::as_str),
            "tenantId": self.tenant.as_ref().map(TenantId::as_str),
        });
        let digest = Sha256::digest(format!("claim-approved/v1\n{canonical}").as_bytes());
        PayloadHash(format!("sha256:{}", hex::encode(digest)))
    }

    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::for_payout(self.tenant.as_ref(), self.claim_id)
    }

    /// The exact bytes of the bank payout request, built once, stored with the payment
    /// and re-sent unchanged on every retry. It carries
    /// the Idempotency-Key as `reference`, so the bank can be asked what it holds under
    /// that reference even after it forgot the key (see `reconcile`).
    pub fn payout_request_body(&self) -> String {
        serde_json::json!({
            "claimId": self.claim_id.to_string(),
            "amount": self.money.amount_string(),
            "currency": self.money.currency().code(),
            "payee": self.payee.as_ref().map(PayeeRef::as_str),
            "reference": self.idempotency_key().as_str(),
        })
        .to_string()
    }
}

impl FromStr for ClaimApproved {
    type Err = InvalidMessage;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClaimApproved::parse(s)
    }
}

/// The name of how a delivery ended, without its details. These strings are stored in
/// inbox records and appear in logs and HTTP answers: never rename one, or data written
/// before would no longer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutcomeKind {
    Recorded,
    Paid,
    Duplicate,
    BusinessDuplicate,
    Rejected,
    NeedsReconciliation,
    Conflict,
    InvalidMessage,
    RetryLater,
    StoreFailure,
    /// Written by `dead-letters discard`, never by the consumer: a person dropped this
    /// message's dead letter, so a re-send of it completes as a duplicate, unpaid.
    Discarded,
}

impl OutcomeKind {
    pub(crate) const ALL: [OutcomeKind; 11] = [
        OutcomeKind::Recorded,
        OutcomeKind::Paid,
        OutcomeKind::Duplicate,
        OutcomeKind::BusinessDuplicate,
        OutcomeKind::Rejected,
        OutcomeKind::NeedsReconciliation,
        OutcomeKind::Conflict,
        OutcomeKind::InvalidMessage,
        OutcomeKind::RetryLater,
        OutcomeKind::StoreFailure,
        OutcomeKind::Discarded,
    ];

    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Recorded => "recorded",
            OutcomeKind::Paid => "paid",
            OutcomeKind::Duplicate => "duplicate",
            OutcomeKind::BusinessDuplicate => "business-duplicate",
            OutcomeKind::Rejected => "rejected",
            OutcomeKind::NeedsReconciliation => "needs-reconciliation",
            OutcomeKind::Conflict => "conflict",
            OutcomeKind::InvalidMessage => "invalid-message",
            OutcomeKind::RetryLater => "retry-later",
            OutcomeKind::StoreFailure => "store-failure",
            OutcomeKind::Discarded => "discarded",
        }
    }

    /// The kind a stored or logged string names; `None` for any other string.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIM: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn parse(body: serde_json::Value) -> Result<ClaimApproved, InvalidMessage> {
        ClaimApproved::parse(&body.to_string())
    }

    #[test]
    fn accepts_amount_as_string_or_number_without_float_rounding() {
        let a = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":"1250.10","currency":"EUR"}}"#
        ))
        .unwrap();
        let b = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":1250.1,"currency":"EUR"}}"#
        ))
        .unwrap();
        assert_eq!(a.money.amount_string(), "1250.10");
        assert_eq!(a.payload_hash(), b.payload_hash());
        // 0.1 + 0.2 style values survive exactly: f64 would print 9007199254740993 as ...992.
        let big = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":900719925474.99,"currency":"EUR"}}"#
        ))
        .unwrap();
        assert_eq!(big.money.amount_string(), "900719925474.99");
    }

    #[test]
    fn a_positional_array_is_not_a_message() {
        // The fields in WireClaimApproved's order: serde would read this as a message.
        let array = format!(r#"["{CLAIM}", "10.00", "EUR", null, "NL91ABNA0417164300", null]"#);
        let err = ClaimApproved::parse(&array).unwrap_err();
        assert_eq!(err.to_string(), "body: is not a JSON object");
        assert!(ClaimApproved::parse(&format!(
            "  \n{{\"claimId\":\"{CLAIM}\",\"amount\":\"1\",\"currency\":\"EUR\"}}"
        ))
        .is_ok());
    }

    #[test]
    fn each_violation_names_its_field() {
        let cases = [
            (
                serde_json::json!({"amount": "1", "currency": "EUR"}),
                "claimId",
            ),
            (
                serde_json::json!({"claimId": "nope", "amount": "1", "currency": "EUR"}),
                "claimId",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "0", "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "-5", "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1.001", "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1.5", "currency": "JPY"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "abc", "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": true, "currency": "EUR"}),
                "amount",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1"}),
                "currency",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "eur"}),
                "currency",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "XAU"}),
                "currency",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "EUR", "tenantId": "a b"}),
                "tenantId",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "EUR", "payee": ""}),
                "payee",
            ),
            (
                serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "EUR", "approvedAt": "yesterday"}),
                "approvedAt",
            ),
            (serde_json::json!([1, 2]), "body"),
            (
                serde_json::json!({"claimId": "00000000-0000-0000-0000-000000000000", "amount": "1", "currency": "EUR"}),
                "claimId",
            ),
        ];
        for (body, field) in cases {
            let err = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.field, field, "{body}: {err}");
        }
    }

    #[test]
    fn amounts_follow_one_strict_grammar() {
        let amount = |raw: &str| {
            ClaimApproved::parse(&format!(
                r#"{{"claimId":"{CLAIM}","amount":{raw},"currency":"EUR"}}"#
            ))
            .map(|m| m.money.amount_string())
        };
        for ok in [
            r#""5""#,
            r#""5.5""#,
            r#""0.01""#,
            "5",
            "5.25",
            r#""007.50""#,
        ] {
            assert!(amount(ok).is_ok(), "{ok}: {:?}", amount(ok));
        }
        for bad in [
            r#""1_000""#,
            r#""+5""#,
            r#"".5""#,
            r#""5.""#,
            r#""1e2""#,
            r#"" 5""#,
            r#""5 ""#,
            r#""1,000.00""#,
            r#""0x10""#,
            r#""5..1""#,
            r#""-""#,
            r#""""#,
            "1e2",
            "1.5E1",
            "-0.5",
        ] {
            let err = amount(bad).expect_err(bad);
            assert_eq!(err.field, "amount", "{bad}: {err}");
        }
    }

    #[test]
    fn hash_ignores_envelope_noise_but_not_business_fields() {
        let base = serde_json::json!({"claimId": CLAIM, "amount": "10.00", "currency": "EUR", "payee": "NL91ABNA0417164300"});
        let h = parse(base.clone()).unwrap().payload_hash();
        let mut with_extra = base.clone();
        with_extra["approvedAt"] = "2026-01-01T00:00:00Z".into();
        with_extra["note"] = "ignored".into();
        assert_eq!(parse(with_extra).unwrap().payload_hash(), h);
        let mut other_amount = base.clone();
        other_amount["amount"] = "10.01".into();
        assert_ne!(parse(other_amount).unwrap().payload_hash(), h);
        let mut other_payee = base;
        other_payee["payee"] = "DE89370400440532013000".into();
        assert_ne!(parse(other_payee).unwrap().payload_hash(), h);
    }

    #[test]
    fn idempotency_key_is_deterministic_and_tenant_scoped() {
        let claim = ClaimId::parse(CLAIM).unwrap();
        assert_eq!(
            IdempotencyKey::for_payout(None, claim).as_str(),
            format!("claim-payment-{CLAIM}")
        );
        let tenant = TenantId::parse("acme").unwrap();
        assert_eq!(
            IdempotencyKey::for_payout(Some(&tenant), claim).as_str(),
            format!("acme:claim-payment-{CLAIM}")
        );
    }

    #[test]
    fn stored_values_read_back_only_in_the_form_they_were_written() {
        let eur = Currency::parse("EUR").unwrap();
        let money = Money::from_stored("12.50", "EUR").unwrap();
        assert_eq!(money, Money::new(Decimal::new(125, 1), eur).unwrap());
        assert_eq!(money.amount_string(), "12.50");
        assert_eq!(
            Money::from_stored("1000", "JPY").unwrap().amount_string(),
            "1000"
        );
        for (amount, currency, field) in [
            ("12.5", "EUR", "amount"),
            ("012.50", "EUR", "amount"),
            ("1e2", "EUR", "amount"),
            ("-1.00", "EUR", "amount"),
            ("0.00", "EUR", "amount"),
            ("12.50", "eur", "currency"),
            ("12.50", "", "currency"),
            ("", "EUR", "amount"),
        ] {
            let err = Money::from_stored(amount, currency).expect_err(amount);
            assert_eq!(err.field, field, "{amount} {currency}: {err}");
        }
        assert_eq!(TenantId::from_stored("acme").unwrap().as_str(), "acme");
        assert_eq!(
            TenantId::from_stored(" acme").unwrap_err().field,
            "tenantId"
        );
        assert_eq!(TenantId::from_stored("a b").unwrap_err().field, "tenantId");
        let iban = "NL91ABNA0417164300";
        assert_eq!(PayeeRef::from_stored(iban).unwrap().as_str(), iban);
        assert_eq!(PayeeRef::from_stored("x ").unwrap_err().field, "payee");
        assert_eq!(PayeeRef::from_stored("").unwrap_err().field, "payee");
    }

    #[test]
    fn message_id_bounds() {
        assert!(MessageId::parse("").is_err());
        assert!(MessageId::parse(&"x".repeat(128)).is_ok());
        assert!(MessageId::parse(&"x".repeat(129)).is_err());
        assert!(MessageId::parse("a/b?c#d\\e").is_ok());
    }
}
