//! Rows and parameters: how the store's records become statement parameters and how a
//! result row becomes a record again, value by value, as the SQLite store's `rows.rs` does for
//! SQLite. A column of another type than the schema's fails the whole statement; a value
//! that does not parse is that row's [`CorruptRecord`].

use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use claims_payments_engine::domain::{
    ClaimId, IdempotencyKey, InvalidMessage, MessageId, Money, PayeeRef, PayloadHash, Purpose,
    TenantId,
};
use claims_payments_engine::store::once::{Effect, EffectBody, EffectKey, EffectKind};
use claims_payments_engine::store::{
    AttemptId, CorruptRecord, InboxOutcome, InboxRecord, InboxStatus, PaymentRecord, PaymentStatus,
    StoreError, StoreResult, Version, Versioned,
};

/// Millisecond precision, as every store keeps timestamps (and truncated the way SQLite's
/// millisecond integers are), so the same record reads back the same from each.
pub(super) fn ms(t: OffsetDateTime) -> OffsetDateTime {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.replace_nanosecond(t.nanosecond() / 1_000_000 * 1_000_000)
        .unwrap_or(t)
}

pub(super) fn count_param(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(super) fn attempt_uuid(owner: AttemptId) -> Uuid {
    // AttemptId displays as its UUID.
    Uuid::parse_str(&owner.to_string()).unwrap_or_default()
}

/// An inbox record as statement parameters, in the table's column order (version aside).
pub(super) struct InboxParams {
    consumer: String,
    claim_id: Uuid,
    message_id: Vec<u8>,
    payload_hash: String,
    status: &'static str,
    outcome: Option<String>,
    owner: Uuid,
    lease_until: Option<OffsetDateTime>,
    first_delivery_count: i32,
    last_delivery_count: i32,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
    expires_at: OffsetDateTime,
}

impl InboxParams {
    pub(super) fn new(r: &InboxRecord) -> Self {
        InboxParams {
            consumer: r.consumer.clone(),
            claim_id: r.claim_id.as_uuid(),
            message_id: r.message_id.as_str().as_bytes().to_vec(),
            payload_hash: r.payload_hash.as_str().to_owned(),
            status: r.status.as_str(),
            outcome: r.outcome.as_ref().map(|o| o.as_str().to_owned()),
            owner: attempt_uuid(r.owner),
            lease_until: r.lease_until.map(ms),
            first_delivery_count: count_param(r.first_delivery_count),
            last_delivery_count: count_param(r.last_delivery_count),
            created_at: ms(r.created_at),
            updated_at: ms(r.updated_at),
            expires_at: ms(r.expires_at),
        }
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.consumer,
            &self.claim_id,
            &self.message_id,
            &self.payload_hash,
            &self.status,
            &self.outcome,
            &self.owner,
            &self.lease_until,
            &self.first_delivery_count,
            &self.last_delivery_count,
            &self.created_at,
            &self.updated_at,
            &self.expires_at,
        ]
    }
}

/// A payment record as statement parameters, in the table's column order (version aside).
pub(super) struct PaymentParams {
    claim_id: Uuid,
    purpose: &'static str,
    tenant_id: Option<String>,
    amount: String,
    currency: String,
    payee: Option<String>,
    payload_hash: String,
    message_id: Vec<u8>,
    idempotency_key: String,
    payout_request: Option<String>,
    status: &'static str,
    bank_payment_id: Option<String>,
    status_reason: Option<String>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
}

impl PaymentParams {
    pub(super) fn new(p: &PaymentRecord) -> Self {
        PaymentParams {
            claim_id: p.claim_id.as_uuid(),
            purpose: p.purpose.as_str(),
            tenant_id: p.tenant_id.as_ref().map(|t| t.as_str().to_owned()),
            amount: p.money.amount_string(),
            currency: p.money.currency().code().to_owned(),
            payee: p.payee.as_ref().map(|p| p.as_str().to_owned()),
            payload_hash: p.payload_hash.as_str().to_owned(),
            message_id: p.message_id.as_str().as_bytes().to_vec(),
            idempotency_key: p.idempotency_key.as_str().to_owned(),
            payout_request: p.payout_request.clone(),
            status: p.status.as_str(),
            bank_payment_id: p.bank_payment_id.clone(),
            status_reason: p.status_reason.clone(),
            created_at: ms(p.created_at),
            updated_at: ms(p.updated_at),
        }
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.claim_id,
            &self.purpose,
            &self.tenant_id,
            &self.amount,
            &self.currency,
            &self.payee,
            &self.payload_hash,
            &self.message_id,
            &self.idempotency_key,
            &self.payout_request,
            &self.status,
            &self.bank_payment_id,
            &self.status_reason,
            &self.created_at,
            &self.updated_at,
        ]
    }
}

pub(super) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    idx: usize,
) -> StoreResult<T> {
    row.try_get(idx).map_err(|e| {
        StoreError::Permanent(format!(
            "unexpected PostgreSQL column {idx}: {e} (is the schema this build's?)"
        ))
    })
}

/// A stored MessageId (bytea: a MessageId may hold NUL); `Err` is why it is not one.
pub(super) fn message_id(bytes: Vec<u8>) -> Result<MessageId, String> {
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("{:?} is not UTF-8", String::from_utf8_lossy(e.as_bytes())))?;
    MessageId::parse(&text).map_err(|e| e.to_string())
}

/// Reads a row in two steps: a column of another type than the schema's is an error
/// of the whole statement (`Err`: the schema is not this build's), a value that does
/// not parse is this row's ([`CorruptRecord`], the inner result), so a listing can go on.
pub(super) type RowRead<T> = StoreResult<Result<T, CorruptRecord>>;

/// The inbox record in `row` starting at column `at` (INBOX_COLUMNS' order).
pub(super) fn inbox_from_row(row: &Row, at: usize) -> RowRead<Versioned<InboxRecord>> {
    let claim: Uuid = get(row, at + 1)?;
    let message: Vec<u8> = get(row, at + 2)?;
    let status: String = get(row, at + 4)?;
    let outcome: Option<String> = get(row, at + 5)?;
    let owner: Uuid = get(row, at + 6)?;
    let first: i32 = get(row, at + 8)?;
    let last: i32 = get(row, at + 9)?;
    let version = version_at(row, at + 13)?;
    let (consumer, payload_hash, lease_until, created_at, updated_at, expires_at) = (
        get(row, at)?,
        get(row, at + 3)?,
        get(row, at + 7)?,
        get(row, at + 10)?,
        get(row, at + 11)?,
        get(row, at + 12)?,
    );
    let shown = String::from_utf8_lossy(&message).into_owned();
    let corrupt = |column: &'static str, reason: String| {
        CorruptRecord::inbox(&claim.to_string(), &shown, column, reason)
    };
    let read = || -> Result<InboxRecord, CorruptRecord> {
        Ok(InboxRecord {
            consumer,
            claim_id: ClaimId::parse(&claim.to_string())
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            message_id: message_id(message.clone()).map_err(|e| corrupt("message_id", e))?,
            payload_hash: PayloadHash::from_stored(payload_hash),
            status: InboxStatus::parse(&status)
                .ok_or_else(|| corrupt("status", format!("unknown status {status:?}")))?,
            outcome: outcome
                .as_deref()
                .map(|o| InboxOutcome::parse(o).map_err(|e| corrupt("outcome", e)))
                .transpose()?,
            owner: serde_json::from_value::<AttemptId>(serde_json::Value::String(
                owner.to_string(),
            ))
            .map_err(|_| corrupt("owner", format!("{owner} is not an attempt id")))?,
            lease_until,
            first_delivery_count: u32::try_from(first).unwrap_or(0),
            last_delivery_count: u32::try_from(last).unwrap_or(0),
            created_at,
            updated_at,
            expires_at,
        })
    };
    Ok(read().map(|record| Versioned { record, version }))
}

/// The payment record in `row` starting at column `at` (PAYMENT_COLUMNS' order).
pub(super) fn payment_from_row(row: &Row, at: usize) -> RowRead<Versioned<PaymentRecord>> {
    let claim: Uuid = get(row, at)?;
    let purpose: String = get(row, at + 1)?;
    let tenant: Option<String> = get(row, at + 2)?;
    let amount: String = get(row, at + 3)?;
    let currency: String = get(row, at + 4)?;
    let payee: Option<String> = get(row, at + 5)?;
    let message: Vec<u8> = get(row, at + 7)?;
    let status: String = get(row, at + 10)?;
    let version = version_at(row, at + 15)?;
    let (payload_hash, idempotency_key, payout_request, bank_payment_id, status_reason) = (
        get(row, at + 6)?,
        get(row, at + 8)?,
        get(row, at + 9)?,
        get(row, at + 11)?,
        get(row, at + 12)?,
    );
    let (created_at, updated_at) = (get(row, at + 13)?, get(row, at + 14)?);
    let corrupt = |column: &'static str, reason: String| {
        CorruptRecord::payment(&claim.to_string(), column, reason)
    };
    // A domain type's refusal names its field, which is the column's name here.
    let refused = |e: InvalidMessage| {
        let column = if e.field == "tenantId" {
            "tenant_id"
        } else {
            e.field
        };
        corrupt(column, e.problem)
    };
    let read = || -> Result<PaymentRecord, CorruptRecord> {
        let purpose = match purpose.as_str() {
            "payout" => Purpose::Payout,
            other => return Err(corrupt("purpose", format!("unknown purpose {other:?}"))),
        };
        Ok(PaymentRecord {
            claim_id: ClaimId::parse(&claim.to_string())
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            purpose,
            tenant_id: tenant
                .as_deref()
                .map(TenantId::from_stored)
                .transpose()
                .map_err(refused)?,
            money: Money::from_stored(&amount, &currency).map_err(refused)?,
            payee: payee
                .as_deref()
                .map(PayeeRef::from_stored)
                .transpose()
                .map_err(refused)?,
            payload_hash: PayloadHash::from_stored(payload_hash),
            message_id: message_id(message.clone()).map_err(|e| corrupt("message_id", e))?,
            idempotency_key: IdempotencyKey::from_stored(idempotency_key),
            payout_request,
            status: PaymentStatus::parse(&status)
                .ok_or_else(|| corrupt("status", format!("unknown status {status:?}")))?,
            bank_payment_id,
            status_reason,
            created_at,
            updated_at,
        })
    };
    Ok(read().map(|record| Versioned { record, version }))
}

/// The row version in column `idx` (a `bigint` the statements bump on every write).
pub(super) fn version_at(row: &Row, idx: usize) -> StoreResult<Version> {
    let version: i64 = get(row, idx)?;
    Ok(Version(version.to_string()))
}

/// A PostgreSQL row version, as [`Version`] carries it.
pub(super) fn parse_version(version: &Version) -> StoreResult<i64> {
    version
        .0
        .parse()
        .map_err(|_| StoreError::Permanent(format!("not a PostgreSQL version: {:?}", version.0)))
}

/// A row read for one record: its corrupt value is the call's `Permanent` error.
pub(super) fn one<T>(read: RowRead<T>) -> StoreResult<T> {
    read?.map_err(StoreError::from)
}

/// An effect as statement parameters, in the `effects` table's column order.
pub(super) struct EffectParams {
    kind: String,
    claim_id: Uuid,
    key: String,
    message_id: Vec<u8>,
    body: String,
    created_at: OffsetDateTime,
}

impl EffectParams {
    pub(super) fn new(e: &Effect) -> Self {
        EffectParams {
            kind: e.kind.as_str().to_owned(),
            claim_id: e.claim_id.as_uuid(),
            key: e.key.as_str().to_owned(),
            message_id: e.message_id.as_str().as_bytes().to_vec(),
            body: e.body.as_str().to_owned(),
            created_at: ms(e.created_at),
        }
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.kind,
            &self.claim_id,
            &self.key,
            &self.message_id,
            &self.body,
            &self.created_at,
        ]
    }
}

/// The effect in `row` starting at column `at` (the `effects` table's column order).
pub(super) fn effect_from_row(row: &Row, at: usize) -> RowRead<Effect> {
    let kind: String = get(row, at)?;
    let claim: Uuid = get(row, at + 1)?;
    let key: String = get(row, at + 2)?;
    let message: Vec<u8> = get(row, at + 3)?;
    let body: String = get(row, at + 4)?;
    let created_at: OffsetDateTime = get(row, at + 5)?;
    let corrupt =
        |column: &'static str, reason: String| Effect::corrupt(&claim.to_string(), column, reason);
    let read = || -> Result<Effect, CorruptRecord> {
        Ok(Effect {
            kind: EffectKind::parse(&kind).map_err(|e| corrupt("kind", e.problem))?,
            claim_id: ClaimId::parse(&claim.to_string())
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            key: EffectKey::parse(&key).map_err(|e| corrupt("effect_key", e.problem))?,
            message_id: message_id(message.clone()).map_err(|e| corrupt("message_id", e))?,
            body: EffectBody::parse(&body).map_err(|e| corrupt("body", e.problem))?,
            created_at,
        })
    };
    Ok(read())
}
