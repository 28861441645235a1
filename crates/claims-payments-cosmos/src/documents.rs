//! The Cosmos DB document shapes of the store records, their deterministic ids, and the
//! conversions between them.
//!
//! Every document carries `docType` and `dedupKey`, the two paths of the container's
//! unique key: a missing path counts as null, and null is a value too, so a document
//! type without them would collide with its siblings in the same claim.
//!
//! Reading is strict: a document that does not parse into a valid record is reported as
//! a [`CorruptRecord`] naming its claim and the field, never a panic. It can only come from a
//! bug or a hand edit, and retrying will not repair it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use claims_payments_engine::domain::{
    ClaimId, IdempotencyKey, MessageId, Money, PayeeRef, PayloadHash, Purpose, TenantId,
};
use claims_payments_engine::store::once::{Effect, EffectBody, EffectKey, EffectKind};
use claims_payments_engine::store::{
    AttemptId, CorruptRecord, InboxKey, InboxOutcome, InboxRecord, InboxStatus, Listed,
    PaymentRecord, PaymentStatus,
};

pub const INBOX_DOC_TYPE: &str = "inbox";
pub const PAYMENT_DOC_TYPE: &str = "payment";

/// Cosmos DB refuses ids longer than this many characters.
pub const MAX_ID_CHARS: usize = 255;

const INBOX_ID_PREFIX: &str = "inbox:";
/// Differs from [`INBOX_ID_PREFIX`] in its sixth character, so a hashed id can never
/// equal an encoded one.
const INBOX_HASHED_ID_PREFIX: &str = "inboxh:";

/// The deterministic id of the inbox document of `(consumer, message)`, so a duplicate
/// check is a point read.
///
/// Cosmos ids may not contain `/ \ ? #` and are at most 255 characters; a MessageId may be
/// up to 128 arbitrary characters. Both parts are escaped byte-wise: ASCII letters,
/// digits, `-`, `.` and `_` stay, every other UTF-8 byte becomes `~XX` (upper-case hex).
/// `~` plays the role of `%` in percent-encoding because Cosmos gateways URL-decode `%`
/// sequences in the resource path, which would make two different ids address one
/// document. The escaping is injective and `:` (escaped inside the parts) separates them.
/// When the result is too long, the id is `inboxh:` followed by the SHA-256 (hex) of the
/// escaped form, which keeps it deterministic and collision-resistant. The guard does not
/// depend on this encoding: the unique key `(docType, dedupKey)` holds the raw values.
pub fn inbox_id(consumer: &str, message_id: &MessageId) -> String {
    let mut id = String::with_capacity(INBOX_ID_PREFIX.len() + consumer.len() + 1 + 128);
    id.push_str(INBOX_ID_PREFIX);
    escape_into(&mut id, consumer);
    id.push(':');
    escape_into(&mut id, message_id.as_str());
    if id.len() <= MAX_ID_CHARS {
        return id;
    }
    let digest = Sha256::digest(id.as_bytes());
    format!("{INBOX_HASHED_ID_PREFIX}{}", hex::encode(digest))
}

/// The raw unique-key value of an inbox document: consumer and MessageId as they are.
pub fn inbox_dedup_key(consumer: &str, message_id: &MessageId) -> String {
    format!("{consumer}/{}", message_id.as_str())
}

/// The deterministic id of the payment document of a claim (the claim is the partition).
pub fn payment_id(purpose: Purpose) -> String {
    format!("payment:{}", purpose.as_str())
}

pub fn payment_dedup_key(purpose: Purpose) -> String {
    purpose.as_str().to_owned()
}

fn escape_into(out: &mut String, raw: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_') {
            out.push(char::from(byte));
        } else {
            out.push('~');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}

/// Timestamps are written in UTC with nine fraction digits, so that their string order
/// is their time order (`ORDER BY c.createdAt` compares strings). Still RFC 3339.
pub fn format_timestamp(t: OffsetDateTime) -> String {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z");
    // Formatting a UTC date in the range `time` can represent only fails for years
    // beyond 9999, which no claim timestamp reaches; fall back to plain RFC 3339.
    let utc = t.to_offset(UtcOffset::UTC);
    utc.format(&format)
        .or_else(|_| utc.format(&Rfc3339))
        .unwrap_or_else(|_| utc.unix_timestamp().to_string())
}

fn parse_timestamp(doc: &str, field: &'static str, value: &str) -> Result<OffsetDateTime, Bad> {
    OffsetDateTime::parse(value, &Rfc3339).map_err(|_| {
        corrupt(
            doc,
            field,
            format!("{value:?} is not an RFC 3339 timestamp"),
        )
    })
}

/// A field of a document that does not read: which, and why.
pub struct Bad {
    field: &'static str,
    problem: String,
}

fn corrupt(_doc: &str, field: &'static str, problem: impl std::fmt::Display) -> Bad {
    Bad {
        field,
        problem: problem.to_string(),
    }
}

/// One payment document of a listing: the record, or why it does not read.
pub fn listed_payment(value: serde_json::Value) -> Listed<PaymentRecord> {
    serde_json::from_value::<PaymentDoc>(value.clone())
        .map_err(|e| unreadable_doc(PAYMENT_DOC_TYPE, &value, &e))?
        .into_record(None)
}

/// One inbox document of a listing: the record, or why it does not read.
pub fn listed_inbox(value: serde_json::Value) -> Listed<InboxRecord> {
    serde_json::from_value::<InboxDoc>(value.clone())
        .map_err(|e| unreadable_doc(INBOX_DOC_TYPE, &value, &e))?
        .into_record(None)
}

/// A document that does not even have the shape of its type (a field missing or of
/// another JSON type): its corrupt record, named by the claim (and MessageId) it holds.
fn unreadable_doc(
    doc_type: &str,
    value: &serde_json::Value,
    e: &serde_json::Error,
) -> CorruptRecord {
    let text = |field: &str| value.get(field).and_then(|v| v.as_str()).unwrap_or("?");
    if doc_type == INBOX_DOC_TYPE {
        CorruptRecord::inbox(text("claimId"), text("messageId"), "document", e)
    } else {
        CorruptRecord::payment(text("claimId"), "document", e)
    }
}

fn parse_purpose(doc: &str, value: &str) -> Result<Purpose, Bad> {
    match value {
        "payout" => Ok(Purpose::Payout),
        other => Err(corrupt(
            doc,
            "purpose",
            format!("unknown purpose {other:?}"),
        )),
    }
}

/// The inbox document as stored. Unknown fields (the system properties `_rid`, `_etag`,
/// `_ts`, ...) are ignored on read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxDoc {
    pub id: String,
    pub claim_id: String,
    doc_type: String,
    dedup_key: String,
    consumer: String,
    message_id: String,
    payload_hash: String,
    status: String,
    outcome: Option<InboxOutcome>,
    owner: AttemptId,
    lease_until: Option<String>,
    first_delivery_count: u32,
    last_delivery_count: u32,
    created_at: String,
    updated_at: String,
    expires_at: String,
    /// Seconds after the last write at which Cosmos deletes the document.
    ttl: i32,
}

impl InboxDoc {
    pub fn from_record(record: &InboxRecord, ttl_seconds: i32) -> Self {
        InboxDoc {
            id: inbox_id(&record.consumer, &record.message_id),
            claim_id: record.claim_id.to_string(),
            doc_type: INBOX_DOC_TYPE.to_owned(),
            dedup_key: inbox_dedup_key(&record.consumer, &record.message_id),
            consumer: record.consumer.clone(),
            message_id: record.message_id.as_str().to_owned(),
            payload_hash: record.payload_hash.as_str().to_owned(),
            status: record.status.as_str().to_owned(),
            outcome: record.outcome.clone(),
            owner: record.owner,
            lease_until: record.lease_until.map(format_timestamp),
            first_delivery_count: record.first_delivery_count,
            last_delivery_count: record.last_delivery_count,
            created_at: format_timestamp(record.created_at),
            updated_at: format_timestamp(record.updated_at),
            expires_at: format_timestamp(record.expires_at),
            ttl: ttl_seconds,
        }
    }

    /// Checks the document against the key it was read by, then converts it.
    pub fn into_record(self, expected: Option<&InboxKey>) -> Result<InboxRecord, CorruptRecord> {
        let (claim, message) = (self.claim_id.clone(), self.message_id.clone());
        self.read(expected)
            .map_err(|bad| CorruptRecord::inbox(&claim, &message, bad.field, bad.problem))
    }

    fn read(self, expected: Option<&InboxKey>) -> Result<InboxRecord, Bad> {
        const DOC: &str = "inbox";
        if self.doc_type != INBOX_DOC_TYPE {
            return Err(corrupt(DOC, "docType", format!("is {:?}", self.doc_type)));
        }
        let claim_id = ClaimId::parse(&self.claim_id).map_err(|e| corrupt(DOC, "claimId", e))?;
        let message_id =
            MessageId::parse(&self.message_id).map_err(|e| corrupt(DOC, "messageId", e))?;
        if let Some(key) = expected {
            if key.claim_id != claim_id
                || key.message_id != message_id
                || key.consumer != self.consumer
            {
                return Err(corrupt(
                    DOC,
                    "id",
                    format!("{} holds another message's record", self.id),
                ));
            }
        }
        let status = InboxStatus::parse(&self.status)
            .ok_or_else(|| corrupt(DOC, "status", format!("unknown status {:?}", self.status)))?;
        let lease_until = self
            .lease_until
            .as_deref()
            .map(|t| parse_timestamp(DOC, "leaseUntil", t))
            .transpose()?;
        Ok(InboxRecord {
            consumer: self.consumer,
            claim_id,
            message_id,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            status,
            outcome: self.outcome,
            owner: self.owner,
            lease_until,
            first_delivery_count: self.first_delivery_count,
            last_delivery_count: self.last_delivery_count,
            created_at: parse_timestamp(DOC, "createdAt", &self.created_at)?,
            updated_at: parse_timestamp(DOC, "updatedAt", &self.updated_at)?,
            expires_at: parse_timestamp(DOC, "expiresAt", &self.expires_at)?,
        })
    }
}

/// The payment document as stored. It has no `ttl` on purpose: with the container's
/// `defaultTtl = -1` a document without `ttl` never expires, and the payment is the
/// permanent guard behind the expiring inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentDoc {
    pub id: String,
    claim_id: String,
    doc_type: String,
    dedup_key: String,
    purpose: String,
    tenant_id: Option<String>,
    amount: String,
    currency: String,
    payee: Option<String>,
    payload_hash: String,
    message_id: String,
    idempotency_key: String,
    payout_request: Option<String>,
    status: String,
    bank_payment_id: Option<String>,
    status_reason: Option<String>,
    created_at: String,
    updated_at: String,
}

impl PaymentDoc {
    pub fn from_record(record: &PaymentRecord) -> Self {
        PaymentDoc {
            id: payment_id(record.purpose),
            claim_id: record.claim_id.to_string(),
            doc_type: PAYMENT_DOC_TYPE.to_owned(),
            dedup_key: payment_dedup_key(record.purpose),
            purpose: record.purpose.as_str().to_owned(),
            tenant_id: record.tenant_id.as_ref().map(|t| t.as_str().to_owned()),
            amount: record.money.amount_string(),
            currency: record.money.currency().code().to_owned(),
            payee: record.payee.as_ref().map(|p| p.as_str().to_owned()),
            payload_hash: record.payload_hash.as_str().to_owned(),
            message_id: record.message_id.as_str().to_owned(),
            idempotency_key: record.idempotency_key.as_str().to_owned(),
            payout_request: record.payout_request.clone(),
            status: record.status.as_str().to_owned(),
            bank_payment_id: record.bank_payment_id.clone(),
            status_reason: record.status_reason.clone(),
            created_at: format_timestamp(record.created_at),
            updated_at: format_timestamp(record.updated_at),
        }
    }

    pub fn into_record(
        self,
        expected_claim: Option<ClaimId>,
    ) -> Result<PaymentRecord, CorruptRecord> {
        let claim = self.claim_id.clone();
        self.read(expected_claim)
            .map_err(|bad| CorruptRecord::payment(&claim, bad.field, bad.problem))
    }

    fn read(self, expected_claim: Option<ClaimId>) -> Result<PaymentRecord, Bad> {
        const DOC: &str = "payment";
        if self.doc_type != PAYMENT_DOC_TYPE {
            return Err(corrupt(DOC, "docType", format!("is {:?}", self.doc_type)));
        }
        let claim_id = ClaimId::parse(&self.claim_id).map_err(|e| corrupt(DOC, "claimId", e))?;
        if expected_claim.is_some_and(|expected| expected != claim_id) {
            return Err(corrupt(
                DOC,
                "claimId",
                "differs from the partition it was read from",
            ));
        }
        let status = PaymentStatus::parse(&self.status)
            .ok_or_else(|| corrupt(DOC, "status", format!("unknown status {:?}", self.status)))?;
        Ok(PaymentRecord {
            claim_id,
            purpose: parse_purpose(DOC, &self.purpose)?,
            tenant_id: self
                .tenant_id
                .as_deref()
                .map(TenantId::from_stored)
                .transpose()
                .map_err(|e| corrupt(DOC, "tenantId", e))?,
            money: Money::from_stored(&self.amount, &self.currency)
                .map_err(|e| corrupt(DOC, e.field, e))?,
            payee: self
                .payee
                .as_deref()
                .map(PayeeRef::from_stored)
                .transpose()
                .map_err(|e| corrupt(DOC, "payee", e))?,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            message_id: MessageId::parse(&self.message_id)
                .map_err(|e| corrupt(DOC, "messageId", e))?,
            idempotency_key: IdempotencyKey::from_stored(self.idempotency_key),
            payout_request: self.payout_request,
            status,
            bank_payment_id: self.bank_payment_id,
            status_reason: self.status_reason,
            created_at: parse_timestamp(DOC, "createdAt", &self.created_at)?,
            updated_at: parse_timestamp(DOC, "updatedAt", &self.updated_at)?,
        })
    }
}

/// The `docType` of the effects of `kind`: one document type per kind, so a kind's
/// effects are listed by the indexed `docType` alone, and the unique key `(docType,
/// dedupKey)` with the effect key as `dedupKey` holds one effect per (kind, claim, key).
pub fn effect_doc_type(kind: &EffectKind) -> String {
    format!("effect:{kind}")
}

/// The deterministic id of an effect document in its claim's partition. Kinds and keys
/// hold only characters a Cosmos id may hold, and a kind holds no `:`, so the id is
/// unique to (kind, key); at most 7 + 64 + 1 + 128 characters.
pub fn effect_id(kind: &EffectKind, key: &EffectKey) -> String {
    format!("effect:{kind}:{key}")
}

/// The once-guard's effect document. No `ttl`, as the payment: it never expires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectDoc {
    pub id: String,
    pub claim_id: String,
    doc_type: String,
    dedup_key: String,
    kind: String,
    effect_key: String,
    message_id: String,
    body: String,
    created_at: String,
}

impl EffectDoc {
    pub fn from_record(effect: &Effect) -> Self {
        EffectDoc {
            id: effect_id(&effect.kind, &effect.key),
            claim_id: effect.claim_id.to_string(),
            doc_type: effect_doc_type(&effect.kind),
            dedup_key: effect.key.as_str().to_owned(),
            kind: effect.kind.as_str().to_owned(),
            effect_key: effect.key.as_str().to_owned(),
            message_id: effect.message_id.as_str().to_owned(),
            body: effect.body.as_str().to_owned(),
            created_at: format_timestamp(effect.created_at),
        }
    }

    pub fn into_record(self) -> Result<Effect, CorruptRecord> {
        let claim = self.claim_id.clone();
        self.read()
            .map_err(|bad| Effect::corrupt(&claim, bad.field, bad.problem))
    }

    fn read(self) -> Result<Effect, Bad> {
        const DOC: &str = "effect";
        let kind = EffectKind::parse(&self.kind).map_err(|e| corrupt(DOC, "kind", e.problem))?;
        let key =
            EffectKey::parse(&self.effect_key).map_err(|e| corrupt(DOC, "effectKey", e.problem))?;
        if self.doc_type != effect_doc_type(&kind) || self.dedup_key != key.as_str() {
            return Err(corrupt(DOC, "docType", "does not match the kind and key"));
        }
        Ok(Effect {
            kind,
            claim_id: ClaimId::parse(&self.claim_id).map_err(|e| corrupt(DOC, "claimId", e))?,
            key,
            message_id: MessageId::parse(&self.message_id)
                .map_err(|e| corrupt(DOC, "messageId", e))?,
            body: EffectBody::parse(&self.body).map_err(|e| corrupt(DOC, "body", e.problem))?,
            created_at: parse_timestamp(DOC, "createdAt", &self.created_at)?,
        })
    }
}

/// One effect document of a listing: the record, or why it does not read.
pub fn listed_effect(value: serde_json::Value) -> Listed<Effect> {
    serde_json::from_value::<EffectDoc>(value.clone())
        .map_err(|e| {
            let claim = value.get("claimId").and_then(|v| v.as_str()).unwrap_or("?");
            Effect::corrupt(claim, "document", e)
        })?
        .into_record()
}

#[cfg(test)]
mod tests {
    use super::*;
    use claims_payments_engine::store::StoreError;

    /// Reads a document body as the adapter's typed reads do.
    fn decode<T: serde::de::DeserializeOwned>(kind: &str, body: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(body)
            .map_err(|e| StoreError::Permanent(format!("corrupt {kind} document: {e}")))
    }

    fn msg(s: &str) -> MessageId {
        MessageId::parse(s).unwrap()
    }

    fn assert_legal(id: &str) {
        assert!(id.chars().count() <= MAX_ID_CHARS, "{id} too long");
        assert!(
            !id.contains(['/', '\\', '?', '#', '%']),
            "{id} has a reserved character"
        );
    }

    #[test]
    fn plain_ids_stay_readable() {
        assert_eq!(
            inbox_id("payments", &msg("m-1.a_b")),
            "inbox:payments:m-1.a_b"
        );
    }

    #[test]
    fn reserved_characters_are_escaped_injectively() {
        let weird = inbox_id("payments", &msg("a/b?c#d\\e"));
        assert_eq!(weird, "inbox:payments:a~2Fb~3Fc~23d~5Ce");
        assert_legal(&weird);
        // The separator and the escape character themselves are escaped, so distinct
        // (consumer, message) pairs never share an id.
        assert_ne!(inbox_id("a:b", &msg("c")), inbox_id("a", &msg("b:c")));
        assert_ne!(inbox_id("c", &msg("~2F")), inbox_id("c", &msg("/")));
        assert_legal(&inbox_id("c", &msg("100% ~ sure")));
    }

    #[test]
    fn long_ids_fall_back_to_a_hash() {
        let emoji: String = "🦀".repeat(MessageId::MAX_CHARS);
        let id = inbox_id("payments", &msg(&emoji));
        assert!(id.starts_with(INBOX_HASHED_ID_PREFIX));
        assert_eq!(id.len(), INBOX_HASHED_ID_PREFIX.len() + 64);
        assert_legal(&id);
        assert_eq!(id, inbox_id("payments", &msg(&emoji)));
        let other: String = "🦀".repeat(MessageId::MAX_CHARS - 1) + "🐙";
        assert_ne!(id, inbox_id("payments", &msg(&other)));
        // A 128-character ASCII id still fits in the readable form.
        let ascii = inbox_id("payments", &msg(&"x".repeat(128)));
        assert!(ascii.starts_with(INBOX_ID_PREFIX));
    }

    #[test]
    fn timestamps_sort_as_strings_and_round_trip() {
        let whole = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let later = whole + time::Duration::milliseconds(500);
        let (a, b) = (format_timestamp(whole), format_timestamp(later));
        assert!(a < b, "{a} should sort before {b}");
        assert_eq!(a, "2027-01-15T08:00:00.000000000Z");
        let offset = later.to_offset(UtcOffset::from_hms(2, 0, 0).unwrap());
        assert_eq!(format_timestamp(offset), b);
        assert_eq!(parse_timestamp("t", "t", &b).ok(), Some(later));
    }

    /// A payment document every field of which is valid, with the optional ones set.
    fn valid_payment_doc() -> PaymentDoc {
        PaymentDoc {
            id: "payment:payout".into(),
            claim_id: ClaimId::random().to_string(),
            doc_type: PAYMENT_DOC_TYPE.into(),
            dedup_key: "payout".into(),
            purpose: "payout".into(),
            tenant_id: Some("acme".into()),
            amount: "1250.10".into(),
            currency: "EUR".into(),
            payee: Some("NL91ABNA0417164300".into()),
            payload_hash: "h".into(),
            message_id: "m".into(),
            idempotency_key: "k".into(),
            payout_request: None,
            status: "recorded".into(),
            bank_payment_id: None,
            status_reason: None,
            created_at: "2026-01-01T00:00:00.000000000Z".into(),
            updated_at: "2026-01-01T00:00:00.000000000Z".into(),
        }
    }

    #[test]
    fn corrupt_documents_name_the_field() {
        let doc = PaymentDoc {
            claim_id: "not-a-uuid".into(),
            ..valid_payment_doc()
        };
        let err = doc.clone().into_record(None).unwrap_err();
        assert_eq!(
            (err.column, err.claim_id.as_str()),
            ("claimId", "not-a-uuid")
        );
        let mut bad_status = doc;
        bad_status.claim_id = ClaimId::random().to_string();
        bad_status.status = "lost".into();
        let err = bad_status.into_record(None).unwrap_err();
        assert_eq!(err.column, "status", "{err}");
        let err = decode::<PaymentDoc>("payment", b"{\"id\": 3}").unwrap_err();
        assert!(matches!(err, StoreError::Permanent(_)));
    }

    #[test]
    fn inbox_outcomes_keep_their_stored_strings_and_unknown_ones_are_refused() {
        let doc = |outcome: serde_json::Value| {
            serde_json::json!({
                "id": "inbox:payments:evt-1", "claimId": ClaimId::random().to_string(),
                "docType": "inbox", "dedupKey": "payments/evt-1", "consumer": "payments",
                "messageId": "evt-1", "payloadHash": "h", "status": "completed",
                "outcome": outcome, "owner": AttemptId::new(), "leaseUntil": null,
                "firstDeliveryCount": 1, "lastDeliveryCount": 1,
                "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
                "expiresAt": "2026-01-02T00:00:00Z", "ttl": 86400
            })
            .to_string()
        };
        for stored in [
            "recorded",
            "needs-reconciliation",
            "reconciled",
            r#"{"status":201}"#,
        ] {
            let read: InboxDoc = decode("inbox", doc(stored.into()).as_bytes()).unwrap();
            let record = read.clone().into_record(None).unwrap();
            assert_eq!(
                record.outcome.as_ref().map(InboxOutcome::as_str),
                Some(stored)
            );
            // Written back as the same string.
            let written = serde_json::to_value(InboxDoc::from_record(&record, 86400)).unwrap();
            assert_eq!(written["outcome"], stored);
        }
        let read: InboxDoc = decode("inbox", doc(serde_json::Value::Null).as_bytes()).unwrap();
        assert_eq!(read.outcome, None);
        let err = decode::<InboxDoc>("inbox", doc("lost".into()).as_bytes()).unwrap_err();
        assert!(
            matches!(&err, StoreError::Permanent(m) if m.contains("unknown outcome")),
            "{err}"
        );
    }

    /// On Cosmos DB, a listed document that does not read (edited by hand) is named by
    /// its claim and field, in its place, and does not stop the listing.
    #[test]
    fn a_listed_document_that_does_not_read_names_its_claim_and_field() {
        let good = valid_payment_doc();
        let mut edited = serde_json::to_value(valid_payment_doc()).unwrap();
        edited["amount"] = "80.5".into();
        let mut shapeless = serde_json::to_value(valid_payment_doc()).unwrap();
        shapeless.as_object_mut().unwrap().remove("currency");
        let listed: Vec<_> = [
            serde_json::to_value(&good).unwrap(),
            edited.clone(),
            shapeless.clone(),
        ]
        .into_iter()
        .map(listed_payment)
        .collect();
        assert_eq!(
            listed[0].as_ref().unwrap().claim_id.to_string(),
            good.claim_id
        );
        let corrupt = listed[1].as_ref().unwrap_err();
        assert_eq!(
            (corrupt.record, corrupt.claim_id.as_str(), corrupt.column),
            ("payment", edited["claimId"].as_str().unwrap(), "amount")
        );
        assert!(corrupt.reason.contains("canonical form"), "{corrupt}");
        let corrupt = listed[2].as_ref().unwrap_err();
        assert_eq!(
            (corrupt.claim_id.as_str(), corrupt.column),
            (shapeless["claimId"].as_str().unwrap(), "document")
        );
        assert!(corrupt.reason.contains("currency"), "{corrupt}");

        let record = InboxRecord {
            consumer: "payments".into(),
            claim_id: ClaimId::random(),
            message_id: MessageId::parse("evt-1").unwrap(),
            payload_hash: PayloadHash::from_stored("h".into()),
            status: InboxStatus::Completed,
            outcome: Some(InboxOutcome::RunReleased),
            owner: AttemptId::new(),
            lease_until: None,
            first_delivery_count: 1,
            last_delivery_count: 1,
            created_at: OffsetDateTime::UNIX_EPOCH,
            updated_at: OffsetDateTime::UNIX_EPOCH,
            expires_at: OffsetDateTime::UNIX_EPOCH,
        };
        let mut inbox = serde_json::to_value(InboxDoc::from_record(&record, 60)).unwrap();
        assert!(listed_inbox(inbox.clone()).is_ok());
        inbox["outcome"] = "lost".into();
        let corrupt = listed_inbox(inbox).unwrap_err();
        assert_eq!(
            (
                corrupt.record,
                corrupt.claim_id,
                corrupt.message_id.as_deref(),
                corrupt.column
            ),
            (
                "inbox",
                record.claim_id.to_string(),
                Some("evt-1"),
                "document"
            )
        );
    }

    #[test]
    fn payment_fields_read_as_domain_types_and_write_back_the_same_strings() {
        let doc = valid_payment_doc();
        let record = doc.clone().into_record(None).unwrap();
        assert_eq!(record.money.amount_string(), "1250.10");
        assert_eq!(
            record.tenant_id.as_ref().map(TenantId::as_str),
            Some("acme")
        );
        assert_eq!(PaymentDoc::from_record(&record), doc);

        let bad = |edit: fn(&mut PaymentDoc), field: &str| {
            let mut d = doc.clone();
            edit(&mut d);
            let claim = d.claim_id.clone();
            let err = d.into_record(None).unwrap_err();
            assert_eq!(
                (err.column, err.claim_id.as_str()),
                (field, claim.as_str()),
                "{err}"
            );
        };
        bad(|d| d.amount = "1250.1".into(), "amount");
        bad(|d| d.amount = "12,50".into(), "amount");
        bad(|d| d.amount = "-5.00".into(), "amount");
        bad(|d| d.currency = "XXX".into(), "currency");
        bad(|d| d.tenant_id = Some("a b".into()), "tenantId");
        bad(|d| d.payee = Some(String::new()), "payee");
    }
}
