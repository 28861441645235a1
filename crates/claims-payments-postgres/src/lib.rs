//! The PostgreSQL store: several instances on one database, the guard kept by the server.
//!
//! The same records, fields, states and answers as the SQLite store (`claims-payments-sqlite`);
//! the schema is in `migrations/` (applied by `claims-payments provision`, checked by `serve`).
//!
//! **The guard.** The inbox's primary key (consumer, claim, message) and the payment's
//! (claim, purpose). The claim is one statement, a call of `claims_payments_claim` (see
//! `migrations/V1__initial.sql`): it inserts both rows in the statement's transaction, or
//! neither, and on a refusal returns the row that refused it. A unique violation never
//! surfaces as an error: `ON CONFLICT DO NOTHING` turns it into the duplicate (`inbox`) or
//! business-duplicate (`payment`) answer. The once-guard's `record_once` is the same shape
//! with an effect row in the place of the payment (`claims_payments_record_once`, in
//! `migrations/V2__effects.sql`).
//!
//! **Round trips** (each statement is prepared once per pooled connection, then one
//! Bind/Execute exchange): a fresh message's claim 1; a duplicate at the store 1 (the claim
//! returns the existing inbox row); a business duplicate 1 (the claim returns the payment)
//! plus the consumer's `record_handled`; finalize 1 (`claims_payments_finalize`, which
//! raises, and so rolls everything back, when a version does not match); `replace_inbox`
//! 1; reads 1. Through a transaction-pooling PgBouncer (`PAYMENTS_POSTGRES_POOLER`,
//! `pool.rs`) the same counts, each statement one unnamed Parse/Bind/Execute exchange, after
//! a describe of 3 round trips per statement and process instead of a prepare per
//! connection.
//!
//! **Errors.** Serialization failures and deadlocks (40001, 40P01) roll the statement back
//! and are retried here. A statement timeout, too many connections and an exhausted pool
//! are `Transient` at once, so the message is abandoned and redelivered. Authentication,
//! a missing schema and our own statements' errors are `Permanent` (`errors.rs`). Every
//! error names the server's SQLSTATE, message and what to do, never a password or token.
//!
//! **Outages.** A server that cannot take writes now is waited for, within
//! `PAYMENTS_POSTGRES_OUTAGE_WAIT_MS` from the call's start (pauses from 250 ms doubling
//! to 4 s, each counted in `store.outage_waits` and logged): one that cannot be reached or
//! refuses new connections (57P03 while starting, the 08 class, a connect timeout), one
//! that is read-only (25006: a standby, a failover or promotion in progress, storage-full
//! protection), one shutting down (57P01, 57P02), and a connection lost mid-statement. A
//! failover then costs a message a few deliveries rather than all of them in a burst. The
//! connection that met it is dropped, never given back to the pool, and the next one is a
//! new login to whatever the host name resolves to now (nothing keeps an address); a new
//! connection must find the server writable (`target_session_attrs=read-write`), so none
//! to a standby is pooled.
//!
//! What is sent again depends on whether the statement can have committed. Each statement
//! is its own transaction. A 25006 rolls it back; 57P03 and the connect-phase 08 errors
//! mean there was no session to run it; a connection lost while the statement was being
//! prepared means it was never sent: such a statement, a write too, is sent again on the
//! new connection. A connection lost, a 57P01/57P02 or an 08 error after the statement
//! was sent (or no answer within its budget) leaves the commit unknown: a read is sent
//! again, but a write is not, since the claim or finalize could then meet its own first
//! write as another attempt's. For such a write the store waits, within the same
//! deadline, until a new connection can be made, then answers `Transient`: the
//! redelivery reads the stored state (the claim recognises its own attempt, the finalize
//! its versions) from a server that is back, instead of spending itself on one that is
//! still down. After its first try, every try of a call ends at the deadline, so a call
//! takes at most the longer of its first try and the outage wait (the start-up check
//! that the lease outlasts the wait plus the bank's budget stays true).
//!
//! A crate of its own, on the engine's store port, the settings vocabulary and the driver
//! alone: Cargo keeps the product out of it, and editing the product never rebuilds it.

mod describe;
mod errors;
pub mod pool;
mod rows;
mod schema;
pub mod settings;

use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use errors::{
    connection_lost, describe_pool_error, is_retryable, outage, unreachable, Failure, Outage,
};
use rows::{
    effect_from_row, get, inbox_from_row, limit_param, ms, one, parse_version, payment_from_row,
    version_at, EffectParams, InboxParams, PaymentParams,
};
pub use schema::check_schema;
pub use schema::provision;
pub use settings::{Pooler, PostgresSettings};

use claims_payments_engine::domain::{ClaimId, Purpose};
use claims_payments_engine::store::once::{self, EffectKind, OnceResult, OnceStore};
use claims_payments_engine::store::{
    ClaimResult, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, RoundTrips, Store, StoreError, StoreResult, Version, Versioned,
};
use claims_payments_engine::telemetry;

/// How long an invocation waits for a pooled connection before the store answers
/// `Transient` (the pool is exhausted: every connection is busy).
const POOL_WAIT: Duration = Duration::from_secs(5);
/// Every statement's answer must arrive within this (the server's own statement_timeout
/// is 10 s; this also covers a server that vanished without closing the connection).
const STATEMENT_BUDGET: Duration = Duration::from_secs(15);
/// Tries of a statement the server rolled back as a serialization failure or deadlock.
const SERIALIZATION_TRIES: u32 = 3;

/// How a process uses the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `serve` and the operator commands: the schema must be exactly this build's.
    Checked,
    /// Tests that provisioned the database themselves.
    Unchecked,
}

/// What a statement does, which decides whether it may be sent again on a new
/// connection when its commit is unknown (the connection was lost or the server shut
/// down after it was sent): a read may; a write is not, and the redelivery finds out
/// from the stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Reads,
    Writes,
}

pub struct PostgresStore {
    pool: pool::Pool,
    round_trips: RoundTrips,
    target: String,
    outage_wait: Duration,
}

/// The first pause between tries while the server cannot take the call's statement; it
/// doubles up to [`OUTAGE_MAX_PAUSE`].
const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(250);
const OUTAGE_MAX_PAUSE: Duration = Duration::from_secs(4);

impl PostgresStore {
    /// Connects (one connection first, so a wrong URI, password or TLS setting fails at
    /// start with its cause) and, for [`Access::Checked`], refuses a database whose schema is
    /// missing, older or newer than this build's.
    pub async fn connect(settings: &PostgresSettings, access: Access) -> anyhow::Result<Self> {
        let pool = pool::build(settings, POOL_WAIT)?;
        let target = settings.describe_target();
        let mut conn = pool.get().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {target} (PAYMENTS_POSTGRES_URL, {}): {}",
                settings.auth.describe(),
                describe_pool_error(&e)
            )
        })?;
        if settings.pooler == Pooler::PgBouncerTransaction {
            pool::check_role_limits(&conn.client)
                .await
                .map_err(|e| anyhow::anyhow!("PostgreSQL at {target}: {e:#}"))?;
            if pool::own_session(&conn.client).await == Some(true) {
                // Harmless (nothing the store does needs a pooler), but not what was meant.
                tracing::warn!(
                    target = %target,
                    "PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction, but PostgreSQL itself \
                     answers (no pooler in between); unset it to use prepared statements"
                );
            }
        }
        if access == Access::Checked {
            check_schema(&mut conn.client)
                .await
                .map_err(|e| anyhow::anyhow!("PostgreSQL at {target}: {e:#}"))?;
        }
        drop(conn);
        tracing::info!(
            target = %target,
            tls = settings.uses_tls(),
            auth = %settings.auth.describe(),
            pooler = settings.pooler.as_str(),
            "connected to PostgreSQL"
        );
        Ok(PostgresStore {
            pool,
            round_trips: RoundTrips::default(),
            target,
            outage_wait: settings.outage_wait,
        })
    }

    /// Statements sent so far (prepares included), for round-trip measurements.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.so_far()
    }

    /// hosts, port and database, for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Runs `sql` with `params` and returns its rows (see [`call`](Self::call)).
    async fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        effect: Effect,
    ) -> StoreResult<Vec<Row>> {
        match self.call(sql, params, effect, Wants::Rows).await? {
            Output::Rows(rows) => Ok(rows),
            Output::Count(_) => Ok(Vec::new()),
        }
    }

    /// Runs a write without rows and returns how many rows it changed.
    async fn execute(&self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> StoreResult<u64> {
        match self.call(sql, params, Effect::Writes, Wants::Count).await? {
            Output::Count(n) => Ok(n),
            Output::Rows(rows) => Ok(rows.len() as u64),
        }
    }

    /// Runs `sql` on a pooled connection. Retries a serialization failure or deadlock
    /// (the server rolled the statement back), and rides out a server that cannot take
    /// the statement now, until the outage wait has passed since the call began: see the
    /// module's docs for what is sent again and what is not.
    async fn call(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        effect: Effect,
        wants: Wants,
    ) -> StoreResult<Output> {
        let mut window = Window::new(self.outage_wait);
        let mut rolled_back = 0;
        loop {
            let mut conn = self
                .connection(&mut window)
                .await
                .map_err(Failure::into_store_error)?;
            let (failure, outage) = match self.send(&mut conn, sql, params, wants, &window).await {
                Ok(output) => return Ok(output),
                Err(failed) => failed,
            };
            let resend = match outage {
                Outage::No => {
                    if let Failure::Postgres(e) = &failure {
                        if is_retryable(e) && rolled_back + 1 < SERIALIZATION_TRIES {
                            rolled_back += 1;
                            tracing::debug!(error = %e, "PostgreSQL rolled a statement back; retrying");
                            tokio::time::sleep(Duration::from_millis(5 * u64::from(rolled_back)))
                                .await;
                            continue;
                        }
                    }
                    return Err(failure.into_store_error());
                }
                Outage::NotRun => true,
                Outage::Unknown => effect == Effect::Reads,
            };
            // This connection is to a server that cannot take writes, is broken, or may
            // still answer (no answer within the budget): it is not given back to the
            // pool. The next one is a new login, to whatever the host name resolves to now.
            let _ = deadpool::managed::Object::take(conn);
            if !resend {
                return Err(self.after_unknown_write(failure, &mut window).await);
            }
            window
                .pause(
                    &self.target,
                    failure,
                    "PostgreSQL cannot take the statement now; trying again",
                )
                .await
                .map_err(Failure::into_store_error)?;
        }
    }

    /// A write whose commit is unknown is not sent again: what a lost answer left behind
    /// is decided in one place, the consumer's redelivery, which reads the stored state
    /// and recognises its own attempt's writes. The store waits, within the call's window,
    /// until a new connection can be made, and answers `Transient`, so the redelivery
    /// meets a server that is back rather than spending itself on one still down.
    async fn after_unknown_write(&self, failure: Failure, window: &mut Window) -> StoreError {
        let back = self.connection(window).await.is_ok();
        let error = failure.into_store_error();
        match error {
            StoreError::Transient(text) => StoreError::Transient(format!(
                "{text}; the write may have committed, so it is not sent again (the \
                 redelivery reads the stored state){}",
                if back {
                    "; the server takes connections again"
                } else {
                    "; the server could still not be reached"
                }
            )),
            other => other,
        }
    }

    /// A pooled connection. While no new connection can be made (the server is down,
    /// failing over or refusing), it tries again with the call's growing pauses until the
    /// outage wait has passed since the call began, so a call takes at most the longer of
    /// its first try and the outage wait; every other pool error (all connections busy, a
    /// refused login) is answered at once.
    async fn connection(
        &self,
        window: &mut Window,
    ) -> Result<deadpool::managed::Object<pool::Manager>, Failure> {
        let mut attempt = window.bounded(self.pool.get()).await;
        loop {
            let e = match attempt {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(e)) => e,
                Err(last) => return Err(last),
            };
            if !unreachable(&e) {
                return Err(Failure::Pool(e));
            }
            window
                .pause(
                    &self.target,
                    Failure::Pool(e),
                    "PostgreSQL cannot be reached; trying again",
                )
                .await?;
            attempt = window.bounded(self.pool.get()).await;
        }
    }

    /// One try of `sql` on `conn`: the failure, and what it says about the server and the
    /// statement. After the call's first try, a try ends at the call's deadline.
    async fn send(
        &self,
        conn: &mut deadpool::managed::Object<pool::Manager>,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        wants: Wants,
        window: &Window,
    ) -> Result<Output, (Failure, Outage)> {
        let started = tokio::time::Instant::now();
        let end = window.end_of_try(started + STATEMENT_BUDGET);
        let mut sent = false;
        let run = async {
            for _ in 0..conn.setup_round_trips(sql) {
                self.round_trips.count();
            }
            let prepared = conn.prepare(sql, params).await?;
            sent = true;
            self.round_trips.count();
            match wants {
                Wants::Rows => conn.query(&prepared).await.map(Output::Rows),
                Wants::Count => conn.execute(&prepared).await.map(Output::Count),
            }
        };
        let result = tokio::time::timeout_at(end, run).await;
        match result {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => {
                let lost = connection_lost(&e) || (e.code().is_none() && conn.client.is_closed());
                let outage = outage(e.code(), lost, sent);
                Err((Failure::Postgres(e), outage))
            }
            // No answer within the budget: a server that vanished without closing the
            // connection, or a proxy that holds it.
            Err(_) => Err((Failure::Timeout(end - started), outage(None, true, sent))),
        }
    }
}

/// What a statement hands back: its rows, or how many rows it changed.
enum Output {
    Rows(Vec<Row>),
    Count(u64),
}

#[derive(Debug, Clone, Copy)]
enum Wants {
    Rows,
    Count,
}

/// One store call's time: it may wait for the server until `deadline`, the outage wait
/// after its start, with pauses that grow from [`OUTAGE_FIRST_PAUSE`] to
/// [`OUTAGE_MAX_PAUSE`] across all its tries (connecting or sending).
struct Window {
    started: tokio::time::Instant,
    deadline: tokio::time::Instant,
    pause: Duration,
    /// Whether the call has paused: every try after a pause ends at the deadline.
    paused: bool,
    /// The failure that made the last pause, answered if the next try runs out of time.
    last: Option<Failure>,
}

impl Window {
    fn new(outage_wait: Duration) -> Self {
        let started = tokio::time::Instant::now();
        Window {
            started,
            deadline: started + outage_wait,
            pause: OUTAGE_FIRST_PAUSE,
            paused: false,
            last: None,
        }
    }

    /// Pauses before the next try, counted and logged, if the pause ends before the
    /// deadline; else hands `failure` back: the call answers it now.
    async fn pause(
        &mut self,
        target: &str,
        failure: Failure,
        message: &'static str,
    ) -> Result<(), Failure> {
        if tokio::time::Instant::now() + self.pause >= self.deadline {
            return Err(failure);
        }
        telemetry::counters().store_outage_waits.inc();
        tracing::warn!(
            database = %target,
            error = %failure.describe(),
            waitedMs = self.started.elapsed().as_millis() as u64,
            "{message}"
        );
        self.last = Some(failure);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(OUTAGE_MAX_PAUSE);
        self.paused = true;
        Ok(())
    }

    /// When a try that would otherwise end at `end` must end.
    fn end_of_try(&self, end: tokio::time::Instant) -> tokio::time::Instant {
        if self.paused {
            end.min(self.deadline)
        } else {
            end
        }
    }

    /// `attempt`, ended at the deadline once the call has paused: a server (or a proxy in
    /// front of it) that takes connections and never answers must not stretch the wait by a
    /// whole connection timeout per try. `Err` is the failure that made the last pause.
    async fn bounded<T>(
        &mut self,
        attempt: impl std::future::Future<Output = T>,
    ) -> Result<T, Failure> {
        if !self.paused {
            return Ok(attempt.await);
        }
        let started = self.started;
        tokio::time::timeout_at(self.deadline, attempt)
            .await
            .map_err(|_| {
                self.last
                    .take()
                    .unwrap_or_else(|| Failure::Timeout(started.elapsed()))
            })
    }
}

/// The claim: one statement. Parameters $1..$13 are the inbox row, $14..$28 the payment
/// row; both are created at version 1. Columns: kind, then the inbox row (1..=14), then the
/// payment row (15..=30), all NULL except the record the kind names.
const CLAIM: &str = "SELECT c.kind, (c.inbox_row).*, (c.payment_row).* FROM claims_payments_claim(\
     ROW($1::text, $2::uuid, $3::bytea, $4::text, $5::text, $6::text, $7::uuid, $8::timestamptz, \
         $9::int4, $10::int4, $11::timestamptz, $12::timestamptz, $13::timestamptz, 1::int8)::inbox, \
     ROW($14::uuid, $15::text, $16::text, $17::text, $18::text, $19::text, $20::text, $21::bytea, \
         $22::text, $23::text, $24::text, $25::text, $26::text, $27::timestamptz, $28::timestamptz, \
         1::int8)::payments) c";

/// The finalize: one statement. $1..$13 the inbox row, $14 its expected version, $15..$29
/// the payment row, $30 the payment's expected version (NULL: any).
const FINALIZE: &str = "SELECT claims_payments_finalize(\
     ROW($1::text, $2::uuid, $3::bytea, $4::text, $5::text, $6::text, $7::uuid, $8::timestamptz, \
         $9::int4, $10::int4, $11::timestamptz, $12::timestamptz, $13::timestamptz, 0::int8)::inbox, \
     $14::int8, \
     ROW($15::uuid, $16::text, $17::text, $18::text, $19::text, $20::text, $21::text, $22::bytea, \
         $23::text, $24::text, $25::text, $26::text, $27::text, $28::timestamptz, $29::timestamptz, \
         0::int8)::payments, \
     $30::int8)";

const INSERT_INBOX: &str =
    "INSERT INTO inbox (consumer, claim_id, message_id, payload_hash, status, \
     outcome, owner, lease_until, first_delivery_count, last_delivery_count, created_at, \
     updated_at, expires_at, version) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 1) \
     ON CONFLICT DO NOTHING RETURNING version";

const REPLACE_INBOX: &str = "UPDATE inbox SET payload_hash = $4, status = $5, outcome = $6, \
     owner = $7, lease_until = $8, first_delivery_count = $9, last_delivery_count = $10, \
     updated_at = $11, expires_at = $12, version = version + 1 \
     WHERE consumer = $1 AND claim_id = $2 AND message_id = $3 AND version = $13 \
     RETURNING version";

const READ_INBOX: &str =
    "SELECT consumer, claim_id, message_id, payload_hash, status, outcome, owner, \
     lease_until, first_delivery_count, last_delivery_count, created_at, updated_at, \
     expires_at, version FROM inbox WHERE consumer = $1 AND claim_id = $2 AND message_id = $3";

const READ_PAYMENT: &str =
    "SELECT claim_id, purpose, tenant_id, amount, currency, payee, payload_hash, \
     message_id, idempotency_key, payout_request, status, bank_payment_id, status_reason, \
     created_at, updated_at, version FROM payments WHERE claim_id = $1 AND purpose = $2";

const LIST_PAYMENTS: &str =
    "SELECT claim_id, purpose, tenant_id, amount, currency, payee, payload_hash, \
     message_id, idempotency_key, payout_request, status, bank_payment_id, status_reason, \
     created_at, updated_at, version FROM payments ORDER BY created_at, claim_id LIMIT $1";

const UNSETTLED_PAYMENTS: &str = "SELECT claim_id, purpose, tenant_id, amount, currency, payee, \
     payload_hash, message_id, idempotency_key, payout_request, status, bank_payment_id, \
     status_reason, created_at, updated_at, version FROM payments \
     WHERE status IN ('in_progress', 'needs_reconciliation') \
     ORDER BY created_at, claim_id LIMIT $1";

const COUNT_PAYMENTS: &str =
    "SELECT count(*) FROM (SELECT 1 FROM payments WHERE status = $1 LIMIT $2) AS s";

const LIST_INBOX: &str =
    "SELECT consumer, claim_id, message_id, payload_hash, status, outcome, owner, \
     lease_until, first_delivery_count, last_delivery_count, created_at, updated_at, \
     expires_at, version FROM inbox ORDER BY created_at, message_id LIMIT $1";

/// record_once: one statement. $1..$13 the inbox row (created at version 1), $14..$19 the
/// effect row. Columns: the answer, then the inbox row (1..=14), then the effect row
/// (15..=20), all NULL except the record the answer names.
const RECORD_ONCE: &str = "SELECT r.answer, (r.inbox_row).*, (r.effect_row).* \
     FROM claims_payments_record_once(\
     ROW($1::text, $2::uuid, $3::bytea, $4::text, $5::text, $6::text, $7::uuid, $8::timestamptz, \
         $9::int4, $10::int4, $11::timestamptz, $12::timestamptz, $13::timestamptz, 1::int8)::inbox, \
     ROW($14::text, $15::uuid, $16::text, $17::bytea, $18::text, $19::timestamptz)::effects) r";

const LIST_EFFECTS: &str =
    "SELECT kind, claim_id, effect_key, message_id, body, created_at FROM effects \
     WHERE kind = $1 ORDER BY created_at, claim_id, effect_key LIMIT $2";

/// One batch of the retention purge. By ctid: the inner query finds at most $2 expired
/// rows through the expiry index; a row renewed meanwhile (a new version, a new ctid, a
/// later expiry) is not deleted, and the outer condition checks the expiry again.
const PURGE_BATCH: &str = "DELETE FROM inbox WHERE ctid IN \
     (SELECT ctid FROM inbox WHERE expires_at <= $1 LIMIT $2) AND expires_at <= $1";

impl PostgresStore {
    async fn list_payment_rows(
        &self,
        sql: &'static str,
        limit: usize,
    ) -> StoreResult<Vec<Listed<Versioned<PaymentRecord>>>> {
        let rows = self
            .query(sql, &[&limit_param(limit)], Effect::Reads)
            .await?;
        rows.iter().map(|r| payment_from_row(r, 0)).collect()
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        let (i, p) = (InboxParams::new(inbox), PaymentParams::new(payment));
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(28);
        params.extend(i.params());
        params.extend(p.params());
        let rows = self.query(CLAIM, &params, Effect::Writes).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Permanent("claims_payments_claim returned no row".into()))?;
        let kind: String = get(row, 0)?;
        match kind.as_str() {
            "claimed" => Ok(ClaimResult::Claimed {
                inbox_version: Version("1".into()),
            }),
            "inbox" => Ok(ClaimResult::InboxExists(one(inbox_from_row(row, 1))?)),
            "payment" => Ok(ClaimResult::PaymentExists(one(payment_from_row(row, 15))?)),
            // A purge or a concurrent refusal removed the row between the conflict and
            // the read; the redelivery sees a settled state.
            "vanished" => Err(StoreError::Transient(
                "the record that refused the claim vanished before it could be read".into(),
            )),
            other => Err(StoreError::Permanent(format!(
                "claims_payments_claim answered {other:?}"
            ))),
        }
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        let claim = key.claim_id.as_uuid();
        let message = key.message_id.as_str().as_bytes();
        let rows = self
            .query(
                READ_INBOX,
                &[&key.consumer, &claim, &message],
                Effect::Reads,
            )
            .await?;
        rows.first().map(|r| one(inbox_from_row(r, 0))).transpose()
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        let rows = self
            .query(
                READ_PAYMENT,
                &[&claim.as_uuid(), &purpose.as_str()],
                Effect::Reads,
            )
            .await?;
        rows.first()
            .map(|r| one(payment_from_row(r, 0)))
            .transpose()
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        let i = InboxParams::new(inbox);
        let rows = self
            .query(INSERT_INBOX, &i.params(), Effect::Writes)
            .await?;
        if let Some(row) = rows.first() {
            return Ok(InsertResult::Inserted(version_at(row, 0)?));
        }
        // The key exists (committed: ON CONFLICT waited for its inserter). A second
        // statement has a new snapshot, which shows it.
        let existing = self.inbox(&inbox.key()).await?.ok_or_else(|| {
            StoreError::Transient("inbox row vanished after a key conflict".into())
        })?;
        Ok(InsertResult::AlreadyExists(Box::new(existing)))
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        let expected = parse_version(expected)?;
        let i = InboxParams::new(inbox);
        // Every column but the key's and created_at, which a replace never changes.
        let all = i.params();
        let mut params: Vec<&(dyn ToSql + Sync)> = all[..10].to_vec();
        params.extend([all[11], all[12], &expected]);
        let rows = self.query(REPLACE_INBOX, &params, Effect::Writes).await?;
        match rows.first() {
            Some(row) => version_at(row, 0),
            None => Err(StoreError::PreconditionFailed),
        }
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        let expected = parse_version(write.inbox_version)?;
        let payment_expected = write.payment_version.map(parse_version).transpose()?;
        let (i, p) = (
            InboxParams::new(write.inbox),
            PaymentParams::new(write.payment),
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(30);
        params.extend(i.params());
        params.push(&expected);
        params.extend(p.params());
        params.push(&payment_expected);
        self.query(FINALIZE, &params, Effect::Writes).await?;
        Ok(())
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        Ok(self
            .list_payment_rows(LIST_PAYMENTS, limit)
            .await?
            .into_iter()
            .map(|row| row.map(|v| v.record))
            .collect())
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        self.list_payment_rows(UNSETTLED_PAYMENTS, limit)
            .await?
            .into_iter()
            .map(|row| row.map_err(StoreError::from))
            .collect()
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        let rows = self
            .query(
                COUNT_PAYMENTS,
                &[&status.as_str(), &limit_param(limit)],
                Effect::Reads,
            )
            .await?;
        let n: i64 = match rows.first() {
            Some(row) => get(row, 0)?,
            None => 0,
        };
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        let rows = self
            .query(LIST_INBOX, &[&limit_param(limit)], Effect::Reads)
            .await?;
        rows.iter()
            .map(|r| Ok(inbox_from_row(r, 0)?.map(|v| v.record)))
            .collect()
    }

    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        // Bounded batches, each its own statement and transaction: a large purge never
        // holds locks on many rows at once, and invocations interleave with it.
        let batch = limit_param(batch.max(1));
        let cutoff = ms(now);
        let mut total = 0u64;
        loop {
            let removed = self.execute(PURGE_BATCH, &[&cutoff, &batch]).await?;
            total += removed;
            if removed < batch as u64 {
                return Ok(total);
            }
        }
    }
}

#[async_trait]
impl OnceStore for PostgresStore {
    async fn record_once(
        &self,
        inbox: &InboxRecord,
        effect: &once::Effect,
    ) -> StoreResult<OnceResult> {
        let (i, e) = (InboxParams::new(inbox), EffectParams::new(effect));
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(19);
        params.extend(i.params());
        params.extend(e.params());
        let rows = self.query(RECORD_ONCE, &params, Effect::Writes).await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::Permanent("claims_payments_record_once returned no row".into())
        })?;
        let answer: String = get(row, 0)?;
        match answer.as_str() {
            "recorded" => Ok(OnceResult::Recorded),
            "inbox" => Ok(OnceResult::InboxExists(one(inbox_from_row(row, 1))?)),
            "effect" => Ok(OnceResult::EffectExists(one(effect_from_row(row, 15))?)),
            // As for the claim: the refusing row was removed before it could be read.
            "vanished" => Err(StoreError::Transient(
                "the record that refused the effect vanished before it could be read".into(),
            )),
            other => Err(StoreError::Permanent(format!(
                "claims_payments_record_once answered {other:?}"
            ))),
        }
    }

    async fn effects(
        &self,
        kind: &EffectKind,
        limit: usize,
    ) -> StoreResult<Vec<Listed<once::Effect>>> {
        let kind = kind.as_str();
        let rows = self
            .query(LIST_EFFECTS, &[&kind, &limit_param(limit)], Effect::Reads)
            .await?;
        rows.iter().map(|r| effect_from_row(r, 0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_kept_to_the_millisecond_like_every_store() {
        let t = time::macros::datetime!(2026-12-03 10:15:30.123_456_789 UTC);
        assert_eq!(ms(t), time::macros::datetime!(2026-12-03 10:15:30.123 UTC));
        let offset = time::macros::datetime!(2026-12-03 11:15:30.5 +01:00);
        assert_eq!(ms(offset), offset);
    }
}
