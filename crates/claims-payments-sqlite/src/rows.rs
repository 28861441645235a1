//! Records as SQLite rows: the columns, reading and writing them, and the errors that
//! map onto the store's.

use super::*;
use rusqlite::ToSql;

/// Transient: what can heal while the message waits for its redelivery: a busy or locked
/// database, memory, an I/O error, and a full disk (space can be freed; the write is not
/// lost, the message is answered non-2xx and comes back). Permanent: everything that only
/// an operator can fix, above all a read-only file (SQLITE_READONLY), a damaged one
/// (SQLITE_CORRUPT, SQLITE_NOTADB) or one that cannot be opened (SQLITE_CANTOPEN), and
/// errors in our own statements or data.
pub(super) fn map_sqlite_error(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::*;
    match e.sqlite_error_code() {
        Some(DatabaseBusy | DatabaseLocked | DiskFull | SystemIoFailure | OutOfMemory) => {
            telemetry::counters().store_transient_errors.inc();
            StoreError::Transient(e.to_string())
        }
        // ReadOnly, DatabaseCorrupt, NotADatabase, CannotOpen and the rest.
        _ => StoreError::Permanent(e.to_string()),
    }
}

pub(super) fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// A stored millisecond timestamp; `Err` is why it is not one.
pub(super) fn from_ms(ms: i64) -> Result<OffsetDateTime, String> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map_err(|e| format!("{ms} is not a timestamp: {e}"))
}

pub(super) const INBOX_COLUMNS: &str =
    "consumer, claim_id, message_id, payload_hash, status, outcome, owner, \
     lease_until_ms, first_delivery_count, last_delivery_count, created_at_ms, updated_at_ms, \
     expires_at_ms, version";

pub(super) const PAYMENT_COLUMNS: &str =
    "claim_id, purpose, tenant_id, amount, currency, payee, payload_hash, \
     message_id, idempotency_key, payout_request, status, bank_payment_id, status_reason, \
     created_at_ms, updated_at_ms, version";

/// Raw row values; converted to records outside rusqlite's error type.
pub(super) struct InboxRow {
    pub(super) consumer: String,
    pub(super) claim_id: String,
    pub(super) message_id: String,
    pub(super) payload_hash: String,
    pub(super) status: String,
    pub(super) outcome: Option<String>,
    pub(super) owner: String,
    pub(super) lease_until_ms: Option<i64>,
    pub(super) first_delivery_count: i64,
    pub(super) last_delivery_count: i64,
    pub(super) created_at_ms: i64,
    pub(super) updated_at_ms: i64,
    pub(super) expires_at_ms: i64,
    pub(super) version: i64,
}

impl InboxRow {
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(InboxRow {
            consumer: r.get(0)?,
            claim_id: r.get(1)?,
            message_id: r.get(2)?,
            payload_hash: r.get(3)?,
            status: r.get(4)?,
            outcome: r.get(5)?,
            owner: r.get(6)?,
            lease_until_ms: r.get(7)?,
            first_delivery_count: r.get(8)?,
            last_delivery_count: r.get(9)?,
            created_at_ms: r.get(10)?,
            updated_at_ms: r.get(11)?,
            expires_at_ms: r.get(12)?,
            version: r.get(13)?,
        })
    }

    pub(super) fn into_record(self) -> Result<Versioned<InboxRecord>, CorruptRecord> {
        let claim = self.claim_id.clone();
        let message = self.message_id.clone();
        let corrupt = |column: &'static str, reason: String| {
            CorruptRecord::inbox(&claim, &message, column, reason)
        };
        let time = |column: &'static str, ms: i64| from_ms(ms).map_err(|e| corrupt(column, e));
        let record = InboxRecord {
            claim_id: ClaimId::parse(&self.claim_id)
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            message_id: MessageId::parse(&self.message_id)
                .map_err(|e| corrupt("message_id", e.to_string()))?,
            consumer: self.consumer,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            status: InboxStatus::parse(&self.status)
                .ok_or_else(|| corrupt("status", format!("unknown status {:?}", self.status)))?,
            outcome: self
                .outcome
                .as_deref()
                .map(|o| InboxOutcome::parse(o).map_err(|e| corrupt("outcome", e)))
                .transpose()?,
            owner: serde_json::from_value(serde_json::Value::String(self.owner.clone()))
                .map_err(|_| corrupt("owner", format!("{:?} is not an attempt id", self.owner)))?,
            lease_until: self
                .lease_until_ms
                .map(|ms| time("lease_until_ms", ms))
                .transpose()?,
            first_delivery_count: u32::try_from(self.first_delivery_count).unwrap_or(u32::MAX),
            last_delivery_count: u32::try_from(self.last_delivery_count).unwrap_or(u32::MAX),
            created_at: time("created_at_ms", self.created_at_ms)?,
            updated_at: time("updated_at_ms", self.updated_at_ms)?,
            expires_at: time("expires_at_ms", self.expires_at_ms)?,
        };
        Ok(Versioned {
            record,
            version: Version(self.version.to_string()),
        })
    }
}

pub(super) struct PaymentRow {
    pub(super) claim_id: String,
    pub(super) purpose: String,
    pub(super) tenant_id: Option<String>,
    pub(super) amount: String,
    pub(super) currency: String,
    pub(super) payee: Option<String>,
    pub(super) payload_hash: String,
    pub(super) message_id: String,
    pub(super) idempotency_key: String,
    pub(super) payout_request: Option<String>,
    pub(super) status: String,
    pub(super) bank_payment_id: Option<String>,
    pub(super) status_reason: Option<String>,
    pub(super) created_at_ms: i64,
    pub(super) updated_at_ms: i64,
    pub(super) version: i64,
}

impl PaymentRow {
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(PaymentRow {
            claim_id: r.get(0)?,
            purpose: r.get(1)?,
            tenant_id: r.get(2)?,
            amount: r.get(3)?,
            currency: r.get(4)?,
            payee: r.get(5)?,
            payload_hash: r.get(6)?,
            message_id: r.get(7)?,
            idempotency_key: r.get(8)?,
            payout_request: r.get(9)?,
            status: r.get(10)?,
            bank_payment_id: r.get(11)?,
            status_reason: r.get(12)?,
            created_at_ms: r.get(13)?,
            updated_at_ms: r.get(14)?,
            version: r.get(15)?,
        })
    }

    pub(super) fn into_record(self) -> Result<Versioned<PaymentRecord>, CorruptRecord> {
        let claim = self.claim_id.clone();
        let corrupt =
            |column: &'static str, reason: String| CorruptRecord::payment(&claim, column, reason);
        // A domain type's refusal names its field, which is the column's name here.
        let refused = |e: InvalidMessage| corrupt(column_of(e.field), e.problem);
        let time = |column: &'static str, ms: i64| from_ms(ms).map_err(|e| corrupt(column, e));
        let purpose = match self.purpose.as_str() {
            "payout" => Purpose::Payout,
            other => return Err(corrupt("purpose", format!("unknown purpose {other:?}"))),
        };
        let record = PaymentRecord {
            claim_id: ClaimId::parse(&self.claim_id)
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            purpose,
            tenant_id: self
                .tenant_id
                .as_deref()
                .map(TenantId::from_stored)
                .transpose()
                .map_err(refused)?,
            money: Money::from_stored(&self.amount, &self.currency).map_err(refused)?,
            payee: self
                .payee
                .as_deref()
                .map(PayeeRef::from_stored)
                .transpose()
                .map_err(refused)?,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            message_id: MessageId::parse(&self.message_id)
                .map_err(|e| corrupt("message_id", e.to_string()))?,
            idempotency_key: IdempotencyKey::from_stored(self.idempotency_key),
            payout_request: self.payout_request,
            status: PaymentStatus::parse(&self.status)
                .ok_or_else(|| corrupt("status", format!("unknown status {:?}", self.status)))?,
            bank_payment_id: self.bank_payment_id,
            status_reason: self.status_reason,
            created_at: time("created_at_ms", self.created_at_ms)?,
            updated_at: time("updated_at_ms", self.updated_at_ms)?,
        };
        Ok(Versioned {
            record,
            version: Version(self.version.to_string()),
        })
    }
}

/// The payment column a domain type's field is stored in.
fn column_of(field: &'static str) -> &'static str {
    match field {
        "tenantId" => "tenant_id",
        other => other,
    }
}

/// A row whose cells do not even have their column's type (a hand edit that stored a
/// text in a number column): its corrupt record, named by the claim id (and MessageId)
/// as stored and the column rusqlite names. `columns`: [`INBOX_COLUMNS`] or
/// [`PAYMENT_COLUMNS`], the order the row was selected in.
pub(super) fn unreadable_row(
    row: &Row<'_>,
    columns: &'static str,
    e: &rusqlite::Error,
) -> CorruptRecord {
    let text = |i: usize| match row.get_ref(i) {
        Ok(rusqlite::types::ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        _ => "?".into(),
    };
    let index = match e {
        rusqlite::Error::InvalidColumnType(i, ..)
        | rusqlite::Error::FromSqlConversionFailure(i, ..) => Some(*i),
        _ => None,
    };
    let column = index
        .and_then(|i| columns.split(',').nth(i))
        .map(str::trim)
        .unwrap_or("?");
    if columns == INBOX_COLUMNS {
        CorruptRecord::inbox(&text(1), &text(2), column, e)
    } else {
        CorruptRecord::payment(&text(0), column, e)
    }
}

pub(super) fn read_inbox(
    conn: &Connection,
    key: &InboxKey,
) -> StoreResult<Option<Versioned<InboxRecord>>> {
    read_one(
        conn,
        &format!(
            "SELECT {INBOX_COLUMNS} FROM inbox WHERE consumer = ?1 AND claim_id = ?2 AND message_id = ?3"
        ),
        params![key.consumer, key.claim_id.to_string(), key.message_id.as_str()],
        InboxRow::from_row,
        InboxRow::into_record,
    )
}

pub(super) fn read_payment(
    conn: &Connection,
    claim: ClaimId,
    purpose: Purpose,
) -> StoreResult<Option<Versioned<PaymentRecord>>> {
    read_one(
        conn,
        &format!("SELECT {PAYMENT_COLUMNS} FROM payments WHERE claim_id = ?1 AND purpose = ?2"),
        params![claim.to_string(), purpose.as_str()],
        PaymentRow::from_row,
        PaymentRow::into_record,
    )
}

/// The record of the one row `sql` selects, if any: read as raw values first, so a
/// value that does not convert is a corrupt record, not a SQLite error.
fn read_one<R, T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    from_row: fn(&Row<'_>) -> rusqlite::Result<R>,
    into_record: fn(R) -> Result<Versioned<T>, CorruptRecord>,
) -> StoreResult<Option<Versioned<T>>> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_row(params, from_row).optional())
        .map_err(map_sqlite_error)?
        .map(|row| into_record(row).map_err(StoreError::from))
        .transpose()
}

/// The inbox row's values in [`INBOX_COLUMNS`] order, as `?1` to `?13`: the two that
/// must be formatted are kept here, the rest borrowed from the record (this runs on the
/// writer thread, once per fresh message).
struct InboxValues<'r> {
    r: &'r InboxRecord,
    claim_id: String,
    message_id: &'r str,
    payload_hash: &'r str,
    status: &'static str,
    owner: String,
    outcome: Option<&'r str>,
    lease_until: Option<i64>,
    times: [i64; 3],
}

impl<'r> InboxValues<'r> {
    fn new(r: &'r InboxRecord) -> Self {
        InboxValues {
            r,
            claim_id: r.claim_id.to_string(),
            message_id: r.message_id.as_str(),
            payload_hash: r.payload_hash.as_str(),
            status: r.status.as_str(),
            owner: r.owner.to_string(),
            outcome: r.outcome.as_ref().map(InboxOutcome::as_str),
            lease_until: r.lease_until.map(to_ms),
            times: [
                to_ms(r.created_at),
                to_ms(r.updated_at),
                to_ms(r.expires_at),
            ],
        }
    }

    fn params(&self) -> [&dyn ToSql; 13] {
        [
            &self.r.consumer,
            &self.claim_id,
            &self.message_id,
            &self.payload_hash,
            &self.status,
            &self.outcome,
            &self.owner,
            &self.lease_until,
            &self.r.first_delivery_count,
            &self.r.last_delivery_count,
            &self.times[0],
            &self.times[1],
            &self.times[2],
        ]
    }
}

/// Inserts the inbox row unless its key exists; returns whether it was inserted.
pub(super) fn insert_inbox(conn: &Connection, r: &InboxRecord) -> StoreResult<bool> {
    conn.prepare_cached(&format!(
        "INSERT INTO inbox ({INBOX_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 1) \
         ON CONFLICT DO NOTHING"
    ))
    .and_then(|mut stmt| stmt.execute(InboxValues::new(r).params()))
    .map(|changed| changed == 1)
    .map_err(map_sqlite_error)
}

pub(super) fn insert_payment(conn: &Connection, p: &PaymentRecord) -> StoreResult<bool> {
    conn.prepare_cached(&format!(
        "INSERT INTO payments ({PAYMENT_COLUMNS}) VALUES \
         (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 1) ON CONFLICT DO NOTHING"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            p.claim_id.to_string(),
            p.purpose.as_str(),
            p.tenant_id.as_ref().map(TenantId::as_str),
            p.money.amount_string(),
            p.money.currency().code(),
            p.payee.as_ref().map(PayeeRef::as_str),
            p.payload_hash.as_str(),
            p.message_id.as_str(),
            p.idempotency_key.as_str(),
            p.payout_request,
            p.status.as_str(),
            p.bank_payment_id,
            p.status_reason,
            to_ms(p.created_at),
            to_ms(p.updated_at),
        ])
    })
    .map(|changed| changed == 1)
    .map_err(map_sqlite_error)
}

/// A SQLite row version, as [`Version`] carries it.
pub(super) fn parse_version(version: &Version) -> StoreResult<i64> {
    version
        .0
        .parse()
        .map_err(|_| StoreError::Permanent(format!("not a SQLite version: {:?}", version.0)))
}

/// Replaces the inbox row if its version is still `expected`; returns the new version.
/// The values are the insert's (`?11`, the creation time, is never changed) and `?14`.
pub(super) fn replace_inbox_row(
    conn: &Connection,
    r: &InboxRecord,
    expected: &Version,
) -> StoreResult<Option<i64>> {
    let expected = parse_version(expected)?;
    let values = InboxValues::new(r);
    let [p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13] = values.params();
    conn.prepare_cached(
        "UPDATE inbox SET payload_hash = ?4, status = ?5, outcome = ?6, owner = ?7, lease_until_ms = ?8, \
         first_delivery_count = ?9, last_delivery_count = ?10, updated_at_ms = ?12, expires_at_ms = ?13, \
         version = version + 1 \
         WHERE consumer = ?1 AND claim_id = ?2 AND message_id = ?3 AND version = ?14",
    )
    .and_then(|mut stmt| {
        stmt.execute([p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, &expected])
    })
    .map(|changed| (changed == 1).then_some(expected + 1))
    .map_err(map_sqlite_error)
}

pub(super) fn list<T>(
    conn: &Connection,
    sql: &str,
    limit: usize,
    map: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
) -> StoreResult<Vec<T>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare(sql).map_err(map_sqlite_error)?;
    let rows = stmt
        .query_map(params![limit], map)
        .map_err(map_sqlite_error)?
        .collect::<rusqlite::Result<Vec<T>>>()
        .map_err(map_sqlite_error)?;
    Ok(rows)
}

/// Lists records with `sql` (`?1` is the limit): each row read with `from_row` and made
/// a record with `into_record`; a row that does not read is listed as its
/// [`CorruptRecord`] (`columns` names what it holds), and the rest are still read.
pub(super) fn list_records<R, T>(
    conn: &Connection,
    sql: &str,
    limit: usize,
    columns: &'static str,
    from_row: fn(&Row<'_>) -> rusqlite::Result<R>,
    into_record: fn(R) -> Result<Versioned<T>, CorruptRecord>,
) -> StoreResult<Vec<Listed<T>>> {
    let rows = list(conn, sql, limit, |r| {
        Ok(from_row(r).map_err(|e| unreadable_row(r, columns, &e)))
    })?;
    Ok(rows
        .into_iter()
        .map(|row| row.and_then(|row| into_record(row).map(|v| v.record)))
        .collect())
}

pub(super) const EFFECT_COLUMNS: &str =
    "kind, claim_id, effect_key, message_id, body, created_at_ms";

/// An effect row's raw values; converted to the record outside rusqlite's error type.
pub(super) struct EffectRow {
    kind: String,
    claim_id: String,
    key: String,
    message_id: String,
    body: String,
    created_at_ms: i64,
}

impl EffectRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(EffectRow {
            kind: r.get(0)?,
            claim_id: r.get(1)?,
            key: r.get(2)?,
            message_id: r.get(3)?,
            body: r.get(4)?,
            created_at_ms: r.get(5)?,
        })
    }

    fn into_record(self) -> Result<Effect, CorruptRecord> {
        use claims_payments_engine::store::once::{EffectBody, EffectKey};
        let claim = self.claim_id.clone();
        let corrupt =
            |column: &'static str, reason: String| Effect::corrupt(&claim, column, reason);
        Ok(Effect {
            kind: EffectKind::parse(&self.kind).map_err(|e| corrupt("kind", e.problem))?,
            claim_id: ClaimId::parse(&self.claim_id)
                .map_err(|e| corrupt("claim_id", e.to_string()))?,
            key: EffectKey::parse(&self.key).map_err(|e| corrupt("effect_key", e.problem))?,
            message_id: MessageId::parse(&self.message_id)
                .map_err(|e| corrupt("message_id", e.to_string()))?,
            body: EffectBody::parse(&self.body).map_err(|e| corrupt("body", e.problem))?,
            created_at: from_ms(self.created_at_ms).map_err(|e| corrupt("created_at_ms", e))?,
        })
    }
}

/// Inserts the effect row unless its key exists; returns whether it was inserted.
pub(super) fn insert_effect(conn: &Connection, e: &Effect) -> StoreResult<bool> {
    conn.prepare_cached(&format!(
        "INSERT INTO effects ({EFFECT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT DO NOTHING"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            e.kind.as_str(),
            e.claim_id.to_string(),
            e.key.as_str(),
            e.message_id.as_str(),
            e.body.as_str(),
            to_ms(e.created_at),
        ])
    })
    .map(|changed| changed == 1)
    .map_err(map_sqlite_error)
}

/// The stored effect under `e`'s key (kind, claim, key), if any.
pub(super) fn read_effect(conn: &Connection, e: &Effect) -> StoreResult<Option<Effect>> {
    conn.prepare_cached(&format!(
        "SELECT {EFFECT_COLUMNS} FROM effects WHERE kind = ?1 AND claim_id = ?2 AND effect_key = ?3"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(
            params![e.kind.as_str(), e.claim_id.to_string(), e.key.as_str()],
            EffectRow::from_row,
        )
        .optional()
    })
    .map_err(map_sqlite_error)?
    .map(|row| row.into_record().map_err(StoreError::from))
    .transpose()
}

/// The effects of `kind`, oldest first. A database only ever opened read-only since the
/// table was added has none, and no table to list.
pub(super) fn list_effects(
    conn: &Connection,
    kind: &str,
    limit: usize,
) -> StoreResult<Vec<Listed<Effect>>> {
    let exists: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'effects'",
            [],
            |r| r.get(0),
        )
        .map_err(map_sqlite_error)?;
    if exists == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {EFFECT_COLUMNS} FROM effects WHERE kind = ?1 \
             ORDER BY created_at_ms, claim_id, effect_key LIMIT ?2"
        ))
        .map_err(map_sqlite_error)?;
    let rows = stmt
        .query_map(params![kind, limit], |r| {
            // A cell without its column's type (a hand edit): named as for the others.
            Ok(EffectRow::from_row(r).map_err(|e| {
                let claim = match r.get_ref(1) {
                    Ok(rusqlite::types::ValueRef::Text(t)) => {
                        String::from_utf8_lossy(t).into_owned()
                    }
                    _ => "?".into(),
                };
                let column = match e {
                    rusqlite::Error::InvalidColumnType(i, ..)
                    | rusqlite::Error::FromSqlConversionFailure(i, ..) => {
                        EFFECT_COLUMNS.split(',').nth(i).map(str::trim)
                    }
                    _ => None,
                };
                Effect::corrupt(&claim, column.unwrap_or("?"), e)
            }))
        })
        .map_err(map_sqlite_error)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(map_sqlite_error)?;
    Ok(rows
        .into_iter()
        .map(|row| row.and_then(EffectRow::into_record))
        .collect())
}
