//! The embedded store: SQLite, for local runs and single-instance deployments.
//!
//! The guard is the schema: the inbox's unique key (consumer, claim, message) and the
//! payment's unique key (claim, purpose). The claim step inserts both rows in one
//! transaction; a refused insert rolls the whole step back.
//!
//! Durability and throughput come from **pipelined group commit**. One writer thread owns
//! the only write connection. Writes from concurrent invocations queue on a channel; the
//! writer takes everything queued, runs each job in its own SAVEPOINT (so one job's
//! refusal never undoes another's), then commits once. The commit writes the group's WAL
//! frames without waiting for the disk; a second thread, the syncer, then `fdatasync`s the
//! WAL file and only then answers the group's jobs. While the syncer waits for the disk
//! the writer already runs the next group, and one sync covers every group committed
//! before it. No job is answered before its commit is on disk.
//!
//! Reads never queue behind writes: they use a pool of read-only connections, which WAL
//! lets run concurrently with the writer. A read may see a commit the syncer has not made
//! durable yet, so its answer also waits until everything committed before it returned
//! is on disk; otherwise a redelivery could be answered from a row a power cut would undo.
//!
//! Checkpoints (copying the WAL back into the database file) run on a third thread and
//! connection, so the writer never stalls on them; the writer checkpoints itself only if
//! the WAL outgrows a backstop.
//!
//! The store is single-instance: how a process may use the file is its [`Access`]. `serve`
//! holds an exclusive lock on `<db>.lock` for its whole life (a second process's reads
//! could otherwise answer from this one's commits before they are synced), and refuses at
//! start a file it cannot write or that fails `PRAGMA quick_check`. Operator listings open
//! the file read-only and never create it.
//!
//! A crate of its own, on the engine's store port and SQLite alone: Cargo keeps the product
//! out of it, editing the product never rebuilds it, and another consumer of the engine can
//! use the store without the product. [`SyncHook`] is its one seam for
//! development: tests hold commits that are visible but not yet durable, or fail a sync.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Duration;
pub use sync_hook::SyncHook;

use async_trait::async_trait;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use claims_payments_engine::domain::{
    ClaimId, IdempotencyKey, InvalidMessage, MessageId, Money, PayeeRef, PayloadHash, Purpose,
    TenantId,
};
use claims_payments_engine::store::once::{Effect, EffectKind, OnceResult, OnceStore};
use claims_payments_engine::store::{
    ClaimResult, CorruptRecord, Finalize, InboxKey, InboxOutcome, InboxRecord, InboxStatus,
    InsertResult, Listed, PaymentRecord, PaymentStatus, Store, StoreError, StoreResult, Version,
    Versioned,
};
use claims_payments_engine::telemetry;

mod engine;
#[cfg(test)]
mod engine_tests;
mod rows;
mod sync_hook;
#[cfg(test)]
mod tests;

use engine::*;
use rows::*;

/// Most jobs one commit may carry; bounds the latency a large group adds.
const MAX_GROUP: usize = 256;
const READ_POOL_SIZE: u32 = 8;
/// Every page a commit touches is written to the WAL and synced, and a claim touches a
/// few index pages at random: smaller pages make each durable commit fewer bytes (much
/// smaller ones cost more write calls and deeper trees; 2 KiB measured best here).
const PAGE_SIZE: u32 = 2048;
/// Page cache of the write connection. Deliberately small: a commit whose b-tree split
/// reordered pages (SQLite parks one under the lock page's number meanwhile) ends with a
/// walk over every cached page header, so a big cache costs each such commit one cache
/// miss per page (16 MiB: about 80 µs a commit, 1 in 5 of the writer's CPU). A miss on
/// a small cache is one `pread` from the OS page cache.
const WRITER_CACHE_KIB: i64 = 2 * 1024;
/// How often the checkpointer copies committed WAL frames into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);
/// WAL pages after which the writer checkpoints itself (the checkpointer fell behind).
const WAL_BACKSTOP_PAGES: u32 = 16_000;

/// Rows are appended in arrival order (rowid tables), so a group's rows share a few pages;
/// the unique constraints are the guard, and their small index entries are the only
/// pages a claim touches at random. The payment's Idempotency-Key is derived from its
/// (claim, purpose) key, so it needs no index of its own.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    consumer             TEXT    NOT NULL,
    claim_id             TEXT    NOT NULL,
    message_id           TEXT    NOT NULL,
    payload_hash         TEXT    NOT NULL,
    status               TEXT    NOT NULL,
    outcome              TEXT,
    owner                TEXT    NOT NULL,
    lease_until_ms       INTEGER,
    first_delivery_count INTEGER NOT NULL,
    last_delivery_count  INTEGER NOT NULL,
    created_at_ms        INTEGER NOT NULL,
    updated_at_ms        INTEGER NOT NULL,
    expires_at_ms        INTEGER NOT NULL,
    version              INTEGER NOT NULL,
    UNIQUE (consumer, claim_id, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_expiry ON inbox (expires_at_ms);
CREATE TABLE IF NOT EXISTS payments (
    claim_id         TEXT    NOT NULL,
    purpose          TEXT    NOT NULL,
    tenant_id        TEXT,
    amount           TEXT    NOT NULL,
    currency         TEXT    NOT NULL,
    payee            TEXT,
    payload_hash     TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    payout_request   TEXT,
    status           TEXT    NOT NULL,
    bank_payment_id  TEXT,
    status_reason    TEXT,
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    version          INTEGER NOT NULL,
    UNIQUE (claim_id, purpose)
);
CREATE INDEX IF NOT EXISTS payments_created ON payments (created_at_ms);
-- What reconcile lists and counts: the few payments not settled yet, oldest first.
CREATE INDEX IF NOT EXISTS payments_open ON payments (status, created_at_ms, claim_id)
    WHERE status IN ('in_progress', 'needs_reconciliation', 'mismatched');
-- The once-guard's effects, written with their message's inbox row (`record_once`) and
-- never purged. Added after the tables above: a database made before it gets the table
-- at its next writable open, as every table here (`IF NOT EXISTS`).
CREATE TABLE IF NOT EXISTS effects (
    kind          TEXT    NOT NULL,
    claim_id      TEXT    NOT NULL,
    effect_key    TEXT    NOT NULL,
    message_id    TEXT    NOT NULL,
    body          TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (kind, claim_id, effect_key)
);
CREATE INDEX IF NOT EXISTS effects_by_kind ON effects (kind, created_at_ms);
";

/// What a write job asks the writer to do with its savepoint.
enum Tx<T> {
    Keep(T),
    Undo(T),
}

type Reply = Box<dyn FnOnce(Option<StoreError>) + Send>;
/// A job runs against the writer's connection, or is told why it could not run.
type WriteJob = Box<dyn FnOnce(Result<&mut Connection, StoreError>) -> Reply + Send>;

pub struct SqliteStore {
    path: PathBuf,
    /// None when the store was opened [`Access::ReadOnly`]: every write is refused.
    writer: Option<mpsc::UnboundedSender<WriteJob>>,
    readers: r2d2::Pool<SqliteConnectionManager>,
    durability: Arc<Durability>,
    /// Dropping the store stops the checkpointer.
    _checkpointer: Option<std_mpsc::Sender<()>>,
    /// Held for the store's life when opened [`Access::Serve`].
    _instance_lock: Option<InstanceLock>,
}

/// How a process uses the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `serve`: the only process that writes the file. Creates the database on first start,
    /// holds an exclusive lock on `<db>.lock` for the store's life (a second `serve` is
    /// refused), and refuses a file it cannot write or that fails `PRAGMA quick_check`:
    /// such a file fails every message, so the service must not report itself ready.
    Serve,
    /// An operator's write (`purge`), possibly next to a running `serve` (SQLite serializes
    /// the writers). The database must exist: it is never created.
    Existing,
    /// An operator's listing (`ledger`, `inbox`): read-only connections to an existing
    /// database, which is never created or written. Works while `serve` runs.
    ReadOnly,
}

/// Commit sequence numbers: what the writer has committed and what is on disk.
struct Durability {
    committed: AtomicU64,
    durable: watch::Sender<u64>,
    /// Set once, with the reason, when a WAL sync fails; the store is unusable after it.
    failed: watch::Sender<Option<String>>,
    sync_hook: Option<Arc<dyn SyncHook>>,
}

impl Durability {
    fn new(sync_hook: Option<Arc<dyn SyncHook>>) -> Arc<Self> {
        Arc::new(Durability {
            committed: AtomicU64::new(0),
            durable: watch::Sender::new(0),
            failed: watch::Sender::new(None),
            sync_hook,
        })
    }
}

/// A committed group on its way to the syncer.
struct Committed {
    seq: u64,
    replies: Vec<Reply>,
    error: Option<StoreError>,
}

impl SqliteStore {
    /// Opens (and on first start creates) the database at `path`, without the instance
    /// lock or the start-up checks of [`Access::Serve`]: for tests and tools that own the file.
    pub fn open(path: impl AsRef<Path>) -> anyhow::Result<Arc<Self>> {
        Self::open_writer(path.as_ref(), OpenFlags::default(), None, false, None)
    }

    /// [`open`](Self::open) with `hook` called before every WAL sync (see [`SyncHook`]).
    pub fn open_with_sync_hook(
        path: impl AsRef<Path>,
        hook: Arc<dyn SyncHook>,
    ) -> anyhow::Result<Arc<Self>> {
        Self::open_writer(path.as_ref(), OpenFlags::default(), None, false, Some(hook))
    }

    /// Opens the database at `path` for `access`. Every error names the path and the cause.
    pub fn open_as(path: impl AsRef<Path>, access: Access) -> anyhow::Result<Arc<Self>> {
        let path = path.as_ref();
        match access {
            Access::Serve => {
                let lock = InstanceLock::acquire(path)?;
                Self::open_writer(path, OpenFlags::default(), Some(lock), true, None)
            }
            Access::Existing => {
                let flags = OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE);
                Self::open_writer(path, flags, None, false, None)
            }
            Access::ReadOnly => Self::open_read_only(path),
        }
    }

    fn open_writer(
        path: &Path,
        flags: OpenFlags,
        instance_lock: Option<InstanceLock>,
        check: bool,
        sync_hook: Option<Arc<dyn SyncHook>>,
    ) -> anyhow::Result<Arc<Self>> {
        let path = path.to_path_buf();
        let mut conn = open_connection(&path, flags)?;
        configure_writer(&conn).map_err(|e| describe_open_error(&path, e))?;
        if check {
            // Before the schema goes in: a damaged file gets no new tables.
            check_integrity(&conn).map_err(|e| describe_open_error(&path, e))?;
            check_writable(&conn).map_err(|e| describe_open_error(&path, e.into()))?;
        }
        conn.execute_batch(SCHEMA)
            .map_err(|e| describe_open_error(&path, e.into()))?;
        let wal = WalFile::open(&path)?;

        let readers = reader_pool(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;

        let durability = Durability::new(sync_hook);
        let (to_syncer, synced) = std_mpsc::channel::<Committed>();
        let syncer_durability = durability.clone();
        std::thread::Builder::new()
            .name("sqlite-syncer".into())
            .spawn(move || run_syncer(wal, synced, &syncer_durability))?;

        let (tx, mut rx) = mpsc::unbounded_channel::<WriteJob>();
        let writer_durability = durability.clone();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut jobs = vec![first];
                    while jobs.len() < MAX_GROUP {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    let committed = run_group(&mut conn, jobs, &writer_durability.committed);
                    if to_syncer.send(committed).is_err() {
                        break;
                    }
                }
            })?;

        let checkpointer = Connection::open_with_flags(&path, flags)?;
        checkpointer.busy_timeout(Duration::from_secs(5))?;
        let (stop_checkpointer, stopped) = std_mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("sqlite-checkpointer".into())
            .spawn(move || {
                while let Err(std_mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_EVERY)
                {
                    // PASSIVE never blocks the writer or readers; it copies what it can.
                    if let Err(e) = checkpointer.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::warn!(error = %e, "SQLite checkpoint failed; the writer's backstop will checkpoint");
                    }
                }
            })?;

        Ok(Arc::new(SqliteStore {
            path,
            writer: Some(tx),
            readers,
            durability,
            _checkpointer: Some(stop_checkpointer),
            _instance_lock: instance_lock,
        }))
    }

    /// Readers only: no writer, syncer or checkpointer, and nothing is created.
    fn open_read_only(path: &Path) -> anyhow::Result<Arc<Self>> {
        let path = path.to_path_buf();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // One connection first, so a missing or foreign file fails at once with its cause
        // (the pool would keep retrying until its timeout).
        let first = open_connection(&path, flags)?;
        first
            .query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
            .map_err(|e| describe_open_error(&path, e.into()))?;
        drop(first);
        let readers = reader_pool(&path, flags)?;
        Ok(Arc::new(SqliteStore {
            path,
            writer: None,
            readers,
            durability: Durability::new(None),
            _checkpointer: None,
            _instance_lock: None,
        }))
    }

    fn count_round_trip(&self) {
        telemetry::counters().store_round_trips.inc();
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        self.count_round_trip();
        let pool = self.readers.clone();
        let result = tokio::task::spawn_blocking(move || {
            let conn = pool
                .get()
                .map_err(|e| StoreError::Transient(format!("no SQLite reader available: {e}")))?;
            f(&conn)
        })
        .await
        .map_err(|e| StoreError::Permanent(format!("SQLite reader task failed: {e}")))?;
        // The writer numbers a group before committing it, so this bounds every commit
        // the read could have seen.
        let seen = self.durability.committed.load(Ordering::SeqCst);
        self.wait_durable(seen).await?;
        result
    }

    async fn wait_durable(&self, seq: u64) -> StoreResult<()> {
        let mut durable = self.durability.durable.subscribe();
        durable
            .wait_for(|&d| d >= seq)
            .await
            .map(drop)
            .map_err(|_| StoreError::Permanent("the SQLite syncer has stopped".into()))
    }

    /// Ends the live leases of the in-progress records of `consumers` (the message
    /// consumer, the HTTP API's key records), so the next delivery or retry of each
    /// takes it over at once. `serve` calls this at start, before it listens
    /// (so before the Functions host, which waits for `GET /` to answer, sends any work):
    /// it holds the file's instance lock, so every such lease was taken by a `serve`
    /// that is gone, typically the process the host is replacing. Without this, a
    /// delivery that meets a dead attempt's lease waits `INFLIGHT_WAIT_MS` and answers
    /// retry-later, one delivery at a time, until the lease runs out; and every further
    /// restart cuts such a wait short, costing a delivery without the time it was
    /// budgeted for, which can dead-letter the message. A lease an operator's
    /// `reconcile` holds meanwhile may be ended too: taking over from a live attempt is
    /// safe (same bank Idempotency-Key, version-conditional finalize). The version is
    /// left as it is, so such a holder's own conditional writes still succeed.
    pub async fn end_leases_of_earlier_processes(
        &self,
        consumers: &[&str],
        now: OffsetDateTime,
    ) -> StoreResult<u64> {
        let consumers: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        let now = to_ms(now);
        self.write(move |conn| {
            let mut ended = 0;
            for consumer in &consumers {
                ended += conn
                    .execute(
                        "UPDATE inbox SET lease_until_ms = ?2 \
                         WHERE consumer = ?1 AND status = 'in_progress' AND lease_until_ms > ?2",
                        params![consumer, now],
                    )
                    .map_err(map_sqlite_error)? as u64;
            }
            Ok(Tx::Keep(ended))
        })
        .await
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> StoreResult<Tx<T>> + Send + 'static,
    ) -> StoreResult<T> {
        self.count_round_trip();
        let (tx, rx) = oneshot::channel::<StoreResult<T>>();
        let job: WriteJob = Box::new(move |conn: Result<&mut Connection, StoreError>| {
            let result = conn.and_then(|conn| in_savepoint(conn, f));
            Box::new(move |commit_error: Option<StoreError>| {
                let _ = tx.send(match commit_error {
                    Some(e) => Err(e),
                    None => result,
                });
            })
        });
        let writer = self.writer.as_ref().ok_or_else(|| {
            StoreError::Permanent(format!(
                "{} was opened read-only; this command cannot write",
                self.path.display()
            ))
        })?;
        writer
            .send(job)
            .map_err(|_| StoreError::Permanent("the SQLite writer has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Permanent("the SQLite writer dropped a job".into()))?
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn failed(&self) -> String {
        let mut failed = self.durability.failed.subscribe();
        let reason = match failed.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The sender lives as long as the store, which outlives this borrow.
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        // Write first: a fresh message costs one write job and no read. A refused insert
        // reads the existing row inside the same job (the consumer keeps messages it saw
        // completed in memory, so most redeliveries never get here).
        let (inbox, payment) = (inbox.clone(), payment.clone());
        self.write(move |conn| {
            if !insert_inbox(conn, &inbox)? {
                let existing = read_inbox(conn, &inbox.key())?.ok_or_else(|| {
                    StoreError::Transient("inbox row vanished after a key conflict".into())
                })?;
                return Ok(Tx::Undo(ClaimResult::InboxExists(existing)));
            }
            if !insert_payment(conn, &payment)? {
                let existing =
                    read_payment(conn, payment.claim_id, payment.purpose)?.ok_or_else(|| {
                        StoreError::Transient("payment row vanished after a key conflict".into())
                    })?;
                return Ok(Tx::Undo(ClaimResult::PaymentExists(existing)));
            }
            Ok(Tx::Keep(ClaimResult::Claimed {
                inbox_version: Version("1".into()),
            }))
        })
        .await
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        let key = key.clone();
        self.read(move |c| read_inbox(c, &key)).await
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        self.read(move |c| read_payment(c, claim, purpose)).await
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        let inbox = inbox.clone();
        self.write(move |conn| {
            if insert_inbox(conn, &inbox)? {
                return Ok(Tx::Keep(InsertResult::Inserted(Version("1".into()))));
            }
            let existing = read_inbox(conn, &inbox.key())?.ok_or_else(|| {
                StoreError::Transient("inbox row vanished after a key conflict".into())
            })?;
            Ok(Tx::Undo(InsertResult::AlreadyExists(Box::new(existing))))
        })
        .await
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        let (inbox, expected) = (inbox.clone(), expected.clone());
        self.write(
            move |conn| match replace_inbox_row(conn, &inbox, &expected)? {
                Some(version) => Ok(Tx::Keep(Version(version.to_string()))),
                None => Err(StoreError::PreconditionFailed),
            },
        )
        .await
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        let (inbox, expected) = (write.inbox.clone(), write.inbox_version.clone());
        let payment = write.payment.clone();
        let payment_version = match write.payment_version {
            Some(v) => Some(parse_version(v)?),
            None => None,
        };
        self.write(move |conn| {
            if replace_inbox_row(conn, &inbox, &expected)?.is_none() {
                return Err(StoreError::PreconditionFailed);
            }
            // An error below rolls the inbox write back with the savepoint.
            let changed = conn
                .prepare_cached(
                    "UPDATE payments SET status = ?3, bank_payment_id = ?4, status_reason = ?5, \
                     updated_at_ms = ?6, version = version + 1 \
                     WHERE claim_id = ?1 AND purpose = ?2 AND (?7 IS NULL OR version = ?7)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        payment.claim_id.to_string(),
                        payment.purpose.as_str(),
                        payment.status.as_str(),
                        payment.bank_payment_id,
                        payment.status_reason,
                        to_ms(payment.updated_at),
                        payment_version,
                    ])
                })
                .map_err(map_sqlite_error)?;
            match (changed, payment_version) {
                (1, _) => Ok(Tx::Keep(())),
                (_, Some(_)) => Err(StoreError::PreconditionFailed),
                (_, None) => Err(StoreError::Permanent(format!(
                    "payment for claim {} is missing at finalize",
                    payment.claim_id
                ))),
            }
        })
        .await
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        self.read(move |c| {
            list_records(
                c,
                &format!("SELECT {PAYMENT_COLUMNS} FROM payments ORDER BY created_at_ms, claim_id LIMIT ?1"),
                limit,
                PAYMENT_COLUMNS,
                PaymentRow::from_row,
                PaymentRow::into_record,
            )
        })
        .await
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        self.read(move |c| {
            list(
                c,
                &format!(
                    "SELECT {PAYMENT_COLUMNS} FROM payments \
                     WHERE status IN ('in_progress', 'needs_reconciliation') \
                     ORDER BY created_at_ms, claim_id LIMIT ?1"
                ),
                limit,
                PaymentRow::from_row,
            )?
            .into_iter()
            .map(|row| row.into_record().map_err(StoreError::from))
            .collect()
        })
        .await
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        self.read(move |c| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            c.query_row(
                "SELECT COUNT(*) FROM (SELECT 1 FROM payments WHERE status = ?1 LIMIT ?2)",
                params![status.as_str(), limit],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .map_err(map_sqlite_error)
        })
        .await
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        self.read(move |c| {
            list_records(
                c,
                &format!(
                    "SELECT {INBOX_COLUMNS} FROM inbox ORDER BY created_at_ms, message_id LIMIT ?1"
                ),
                limit,
                INBOX_COLUMNS,
                InboxRow::from_row,
                InboxRow::into_record,
            )
        })
        .await
    }

    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        // Small batches, each its own commit: a large purge never holds the write lock
        // long enough to stall invocations.
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let cutoff = to_ms(now);
        let mut total = 0u64;
        loop {
            let removed = self
                .write(move |conn| {
                    conn.execute(
                        "DELETE FROM inbox WHERE (consumer, claim_id, message_id) IN \
                         (SELECT consumer, claim_id, message_id FROM inbox \
                          WHERE expires_at_ms <= ?1 LIMIT ?2)",
                        params![cutoff, batch],
                    )
                    .map(|n| Tx::Keep(n as u64))
                    .map_err(map_sqlite_error)
                })
                .await?;
            total += removed;
            if removed < batch as u64 {
                return Ok(total);
            }
        }
    }
}

#[async_trait]
impl OnceStore for SqliteStore {
    async fn record_once(&self, inbox: &InboxRecord, effect: &Effect) -> StoreResult<OnceResult> {
        // As `claim`: one write job, both inserts in its savepoint; a refusal reads the
        // row that refused it and undoes the job.
        let (inbox, effect) = (inbox.clone(), effect.clone());
        self.write(move |conn| {
            if !insert_inbox(conn, &inbox)? {
                let existing = read_inbox(conn, &inbox.key())?.ok_or_else(|| {
                    StoreError::Transient("inbox row vanished after a key conflict".into())
                })?;
                return Ok(Tx::Undo(OnceResult::InboxExists(existing)));
            }
            if !insert_effect(conn, &effect)? {
                let existing = read_effect(conn, &effect)?.ok_or_else(|| {
                    StoreError::Transient("effect row vanished after a key conflict".into())
                })?;
                return Ok(Tx::Undo(OnceResult::EffectExists(existing)));
            }
            Ok(Tx::Keep(OnceResult::Recorded))
        })
        .await
    }

    async fn effects(&self, kind: &EffectKind, limit: usize) -> StoreResult<Vec<Listed<Effect>>> {
        let kind = kind.as_str().to_owned();
        self.read(move |c| list_effects(c, &kind, limit)).await
    }
}
