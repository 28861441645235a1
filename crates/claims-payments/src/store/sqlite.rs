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

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Duration;

use async_trait::async_trait;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use super::{
    ClaimResult, InboxKey, InboxOutcome, InboxRecord, InboxStatus, InsertResult, PaymentRecord,
    PaymentStatus, Store, StoreError, StoreResult, Version, Versioned,
};
use crate::message::{
    ClaimId, IdempotencyKey, InvalidMessage, MessageId, Money, PayeeRef, PayloadHash, Purpose,
    TenantId,
};
use crate::telemetry;

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
    round_trips: AtomicU64,
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

/// Called on the syncer thread before every WAL sync; an error counts as a failed sync.
/// The extension point for tests: hold commits that are visible but not yet durable, or
/// make a sync fail. Production installs none.
pub trait SyncHook: Send + Sync {
    fn before_sync(&self) -> std::io::Result<()>;
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
            round_trips: AtomicU64::new(0),
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
            round_trips: AtomicU64::new(0),
            _checkpointer: None,
            _instance_lock: None,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Store calls made so far (reads and write jobs), for round-trip measurements.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    fn count_round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
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

fn reader_pool(
    path: &Path,
    flags: OpenFlags,
) -> anyhow::Result<r2d2::Pool<SqliteConnectionManager>> {
    let manager = SqliteConnectionManager::file(path)
        .with_flags(flags)
        .with_init(|c| c.busy_timeout(Duration::from_secs(5)));
    Ok(r2d2::Pool::builder()
        .max_size(READ_POOL_SIZE)
        .min_idle(Some(1))
        .build(manager)?)
}

/// Opens a connection; without `SQLITE_OPEN_CREATE` in `flags`, a missing file is an
/// error that says so instead of a new, empty database.
fn open_connection(path: &Path, flags: OpenFlags) -> anyhow::Result<Connection> {
    if !flags.contains(OpenFlags::SQLITE_OPEN_CREATE) && !path.exists() {
        anyhow::bail!(
            "no SQLite database at {} (only `serve` creates one; is the path right?)",
            path.display()
        );
    }
    Connection::open_with_flags(path, flags).map_err(|e| describe_open_error(path, e.into()))
}

/// Names the path and, for the failures an operator must fix by hand, what is wrong.
fn describe_open_error(path: &Path, e: anyhow::Error) -> anyhow::Error {
    use rusqlite::ErrorCode::*;
    let sqlite = e.downcast_ref::<rusqlite::Error>();
    let code = sqlite.and_then(rusqlite::Error::sqlite_error_code);
    // SQLite's own text once (its error's source repeats it with the code number).
    let cause = sqlite.map_or_else(|| format!("{e:#}"), ToString::to_string);
    let what = match code {
        Some(ReadOnly) => {
            "cannot be written by this process (read-only file, -wal or -shm file, directory \
             or file system; check the owner and permissions)"
        }
        Some(DatabaseCorrupt) => "is corrupt (restore it from a backup)",
        Some(NotADatabase) => "is not a SQLite database",
        Some(CannotOpen) => "cannot be opened (missing directory or no permission)",
        _ => "cannot be used",
    };
    anyhow::anyhow!("SQLite database {} {what}: {cause}", path.display())
}

/// Proves at start-up that this process can write the database: a write transaction with
/// a real write, rolled back. SQLite opens a file it may not write (or whose -wal or -shm
/// it may not write) read-only without a word; the first write then fails with
/// SQLITE_READONLY, whatever the cause.
fn check_writable(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let written = conn.execute_batch("CREATE TABLE claims_payments_write_probe (x)");
    let rolled_back = conn.execute_batch("ROLLBACK");
    written.and(rolled_back)
}

/// `PRAGMA quick_check`: every page and b-tree is well formed (O(database size); it skips
/// only the index-to-table cross-checks of `integrity_check`).
fn check_integrity(conn: &Connection) -> anyhow::Result<()> {
    let found = conn.prepare("PRAGMA quick_check(5)").and_then(|mut stmt| {
        stmt.query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    });
    let problems = match found {
        Ok(rows) if rows == ["ok"] => return Ok(()),
        Ok(rows) => rows.join("; ").replace('\n', "; "),
        // A page too damaged to walk stops the check itself.
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            e.to_string()
        }
        Err(e) => return Err(e.into()),
    };
    Err(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
        Some(format!("PRAGMA quick_check: {problems}")),
    )
    .into())
}

fn configure_writer(conn: &Connection) -> anyhow::Result<()> {
    // Takes effect only when this creates the database (before WAL mode writes a header).
    conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE};"))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    anyhow::ensure!(
        mode.eq_ignore_ascii_case("wal"),
        "SQLite refused WAL mode (got {mode}); the database must be on a local file system"
    );
    // NORMAL: a commit writes its WAL frames without syncing; the syncer makes each group
    // durable before any of its jobs is answered (see the module docs).
    conn.execute_batch(&format!(
        "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; \
         PRAGMA cache_size=-{WRITER_CACHE_KIB}; PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES};"
    ))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // Room for every statement the writer repeats, so none is parsed twice.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Runs a statement the writer repeats on every job or group, parsed once per connection.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Runs a job inside its own savepoint so its refusal undoes only its own rows.
fn in_savepoint<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Connection) -> StoreResult<Tx<T>>,
) -> StoreResult<T> {
    run_cached(conn, "SAVEPOINT job").map_err(map_sqlite_error)?;
    let result = f(conn);
    let end = match &result {
        Ok(Tx::Keep(_)) => run_cached(conn, "RELEASE job"),
        Ok(Tx::Undo(_)) | Err(_) => {
            run_cached(conn, "ROLLBACK TO job").and_then(|()| run_cached(conn, "RELEASE job"))
        }
    };
    match (result, end) {
        (Ok(Tx::Keep(value) | Tx::Undo(value)), Ok(())) => Ok(value),
        // The job's own failure explains more than a savepoint SQLite already unwound.
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(map_sqlite_error(e)),
    }
}

/// Runs one group in one transaction. Its sequence number is taken before the commit, so
/// a reader that sees the commit also sees a number at least this high.
fn run_group(conn: &mut Connection, jobs: Vec<WriteJob>, committed: &AtomicU64) -> Committed {
    let seq = committed.fetch_add(1, Ordering::SeqCst) + 1;
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        let err = map_sqlite_error(e);
        tracing::error!(error = %err, "SQLite writer could not begin a transaction");
        let replies = jobs.into_iter().map(|job| job(Err(err.clone()))).collect();
        return Committed {
            seq,
            replies,
            error: None,
        };
    }
    let replies: Vec<Reply> = jobs.into_iter().map(|job| job(Ok(&mut *conn))).collect();
    let error = run_cached(conn, "COMMIT").err().map(|e| {
        let _ = run_cached(conn, "ROLLBACK");
        map_sqlite_error(e)
    });
    if error.is_none() {
        let counters = telemetry::counters();
        counters.sqlite_commits.inc();
        counters.sqlite_committed_jobs.add(replies.len() as u64);
    }
    Committed {
        seq,
        replies,
        error,
    }
}

/// The WAL file, opened a second time so the syncer can flush it while the writer runs.
/// The path is kept for error messages.
struct WalFile {
    path: PathBuf,
    file: File,
}

/// A file next to the database: `<db><suffix>`.
fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut path = db.as_os_str().to_owned();
    path.push(suffix);
    PathBuf::from(path)
}

impl WalFile {
    fn open(db: &Path) -> anyhow::Result<Self> {
        let path = sidecar(db, "-wal");
        let file = File::open(&path)
            .map_err(|e| anyhow::anyhow!("cannot open the SQLite WAL {}: {e}", path.display()))?;
        Ok(WalFile { path, file })
    }

    /// Flushes every frame written so far. SQLite never replaces the WAL while the
    /// writer's connection is open; it unlinks the file only when its last connection
    /// closes, after checkpointing it into the database file, and a flush of the unlinked
    /// file then succeeds with nothing left to do.
    fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

/// One `serve` per database file: an exclusive advisory lock (`flock`) on `<db>.lock`,
/// held for the store's life and released by the kernel when the process ends, however it
/// ends. A lock file beside the database, not the database itself: SQLite's own POSIX
/// locks on the database file would be dropped by any `close` of another descriptor to it,
/// and the readers and checkpointer keep working as they are. The file keeps the holder's
/// pid for the refusal message; it may stay behind and is reused.
struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    fn acquire(db: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let path = sidecar(db, ".lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            // A lock file left by another user: reading is enough to lock it. If that fails
            // too, the first error says why (no directory, no permission, read-only).
            .or_else(|e| File::open(&path).map_err(|_| e))
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot open the lock file {} of SQLite database {}: {e}",
                    path.display(),
                    db.display()
                )
            })?;
        loop {
            // SAFETY: flock(2) on a descriptor owned by `file`; no memory is shared.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = match holder.trim().parse::<u32>() {
                        Ok(pid) => format!("pid {pid}, "),
                        Err(_) => String::new(),
                    };
                    anyhow::bail!(
                        "SQLite database {} is in use: another claims-payments serve holds it \
                         ({holder}lock file {}); the embedded store allows one serving process \
                         per database",
                        db.display(),
                        path.display()
                    );
                }
                _ => anyhow::bail!("cannot lock {}: {e}", path.display()),
            }
        }
        // Best effort: the pid only makes the refusal message more useful.
        let _ = file
            .set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(InstanceLock { _file: file })
    }
}

/// Makes committed groups durable, as many per `fdatasync` as have queued up, and only
/// then answers their jobs.
fn run_syncer(wal: WalFile, groups: std_mpsc::Receiver<Committed>, durability: &Durability) {
    while let Ok(first) = groups.recv() {
        let mut batch = vec![first];
        batch.extend(groups.try_iter());
        let synced = match &durability.sync_hook {
            Some(hook) => hook.before_sync().and_then(|()| wal.sync()),
            None => wal.sync(),
        };
        if let Err(e) = synced {
            // After a failed fsync the kernel may have dropped the dirty pages, so no
            // retry can prove them durable. Refuse this batch and every later write, and
            // tell the server, which stops and exits non-zero: the host restarts the
            // handler, SQLite recovers from what is on disk, the unanswered messages
            // come back.
            let reason = format!("the SQLite WAL sync failed: {e}");
            tracing::error!(error = %e, wal = %wal.path.display(), "SQLite WAL sync failed; the store stops");
            for group in batch {
                for reply in group.replies {
                    reply(Some(StoreError::Permanent(reason.clone())));
                }
            }
            durability.failed.send_replace(Some(reason));
            return;
        }
        telemetry::counters().sqlite_syncs.inc();
        let upto = batch.iter().map(|g| g.seq).max().unwrap_or(0);
        durability.durable.send_modify(|d| *d = (*d).max(upto));
        for group in batch {
            for reply in group.replies {
                reply(group.error.clone());
            }
        }
    }
}

/// Transient: what can heal while the message waits for its redelivery: a busy or locked
/// database, memory, an I/O error, and a full disk (space can be freed; the write is not
/// lost, the message is answered non-2xx and comes back). Permanent: everything that only
/// an operator can fix, above all a read-only file (SQLITE_READONLY), a damaged one
/// (SQLITE_CORRUPT, SQLITE_NOTADB) or one that cannot be opened (SQLITE_CANTOPEN), and
/// errors in our own statements or data.
fn map_sqlite_error(e: rusqlite::Error) -> StoreError {
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

fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn from_ms(ms: i64) -> StoreResult<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map_err(|e| StoreError::Permanent(format!("corrupt timestamp {ms}: {e}")))
}

/// A stored payment field that does not parse as the domain type it was written from.
fn corrupt_payment(e: InvalidMessage) -> StoreError {
    StoreError::Permanent(format!("corrupt payment in the database: {e}"))
}

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Permanent(format!("corrupt {what} in the database: {value:?}"))
}

const INBOX_COLUMNS: &str =
    "consumer, claim_id, message_id, payload_hash, status, outcome, owner, \
     lease_until_ms, first_delivery_count, last_delivery_count, created_at_ms, updated_at_ms, \
     expires_at_ms, version";

const PAYMENT_COLUMNS: &str =
    "claim_id, purpose, tenant_id, amount, currency, payee, payload_hash, \
     message_id, idempotency_key, payout_request, status, bank_payment_id, status_reason, \
     created_at_ms, updated_at_ms, version";

/// Raw row values; converted to records outside rusqlite's error type.
struct InboxRow {
    consumer: String,
    claim_id: String,
    message_id: String,
    payload_hash: String,
    status: String,
    outcome: Option<String>,
    owner: String,
    lease_until_ms: Option<i64>,
    first_delivery_count: i64,
    last_delivery_count: i64,
    created_at_ms: i64,
    updated_at_ms: i64,
    expires_at_ms: i64,
    version: i64,
}

impl InboxRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
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

    fn into_record(self) -> StoreResult<Versioned<InboxRecord>> {
        let record = InboxRecord {
            claim_id: ClaimId::parse(&self.claim_id)
                .map_err(|_| corrupt("claim id", &self.claim_id))?,
            message_id: MessageId::parse(&self.message_id)
                .map_err(|_| corrupt("message id", &self.message_id))?,
            consumer: self.consumer,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            status: InboxStatus::parse(&self.status)
                .ok_or_else(|| corrupt("inbox status", &self.status))?,
            outcome: self
                .outcome
                .as_deref()
                .map(|o| InboxOutcome::parse(o).map_err(|_| corrupt("inbox outcome", o)))
                .transpose()?,
            owner: serde_json::from_value(serde_json::Value::String(self.owner.clone()))
                .map_err(|_| corrupt("owner", &self.owner))?,
            lease_until: self.lease_until_ms.map(from_ms).transpose()?,
            first_delivery_count: u32::try_from(self.first_delivery_count).unwrap_or(u32::MAX),
            last_delivery_count: u32::try_from(self.last_delivery_count).unwrap_or(u32::MAX),
            created_at: from_ms(self.created_at_ms)?,
            updated_at: from_ms(self.updated_at_ms)?,
            expires_at: from_ms(self.expires_at_ms)?,
        };
        Ok(Versioned {
            record,
            version: Version(self.version.to_string()),
        })
    }
}

struct PaymentRow {
    claim_id: String,
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
    created_at_ms: i64,
    updated_at_ms: i64,
    version: i64,
}

impl PaymentRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
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

    fn into_record(self) -> StoreResult<Versioned<PaymentRecord>> {
        let purpose = match self.purpose.as_str() {
            "payout" => Purpose::Payout,
            other => return Err(corrupt("purpose", other)),
        };
        let record = PaymentRecord {
            claim_id: ClaimId::parse(&self.claim_id)
                .map_err(|_| corrupt("claim id", &self.claim_id))?,
            purpose,
            tenant_id: self
                .tenant_id
                .as_deref()
                .map(TenantId::from_stored)
                .transpose()
                .map_err(corrupt_payment)?,
            money: Money::from_stored(&self.amount, &self.currency).map_err(corrupt_payment)?,
            payee: self
                .payee
                .as_deref()
                .map(PayeeRef::from_stored)
                .transpose()
                .map_err(corrupt_payment)?,
            payload_hash: PayloadHash::from_stored(self.payload_hash),
            message_id: MessageId::parse(&self.message_id)
                .map_err(|_| corrupt("message id", &self.message_id))?,
            idempotency_key: IdempotencyKey::from_stored(self.idempotency_key),
            payout_request: self.payout_request,
            status: PaymentStatus::parse(&self.status)
                .ok_or_else(|| corrupt("payment status", &self.status))?,
            bank_payment_id: self.bank_payment_id,
            status_reason: self.status_reason,
            created_at: from_ms(self.created_at_ms)?,
            updated_at: from_ms(self.updated_at_ms)?,
        };
        Ok(Versioned {
            record,
            version: Version(self.version.to_string()),
        })
    }
}

fn read_inbox(conn: &Connection, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
    conn.prepare_cached(&format!(
        "SELECT {INBOX_COLUMNS} FROM inbox WHERE consumer = ?1 AND claim_id = ?2 AND message_id = ?3"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(
            params![key.consumer, key.claim_id.to_string(), key.message_id.as_str()],
            InboxRow::from_row,
        )
        .optional()
    })
    .map_err(map_sqlite_error)?
    .map(InboxRow::into_record)
    .transpose()
}

fn read_payment(
    conn: &Connection,
    claim: ClaimId,
    purpose: Purpose,
) -> StoreResult<Option<Versioned<PaymentRecord>>> {
    conn.prepare_cached(&format!(
        "SELECT {PAYMENT_COLUMNS} FROM payments WHERE claim_id = ?1 AND purpose = ?2"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(
            params![claim.to_string(), purpose.as_str()],
            PaymentRow::from_row,
        )
        .optional()
    })
    .map_err(map_sqlite_error)?
    .map(PaymentRow::into_record)
    .transpose()
}

/// Inserts the inbox row unless its key exists; returns whether it was inserted.
fn insert_inbox(conn: &Connection, r: &InboxRecord) -> StoreResult<bool> {
    conn.prepare_cached(&format!(
        "INSERT INTO inbox ({INBOX_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 1) \
         ON CONFLICT DO NOTHING"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            r.consumer,
            r.claim_id.to_string(),
            r.message_id.as_str(),
            r.payload_hash.as_str(),
            r.status.as_str(),
            r.outcome.as_ref().map(InboxOutcome::as_str),
            r.owner.to_string(),
            r.lease_until.map(to_ms),
            r.first_delivery_count,
            r.last_delivery_count,
            to_ms(r.created_at),
            to_ms(r.updated_at),
            to_ms(r.expires_at),
        ])
    })
    .map(|changed| changed == 1)
    .map_err(map_sqlite_error)
}

fn insert_payment(conn: &Connection, p: &PaymentRecord) -> StoreResult<bool> {
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
fn parse_version(version: &Version) -> StoreResult<i64> {
    version
        .0
        .parse()
        .map_err(|_| StoreError::Permanent(format!("not a SQLite version: {:?}", version.0)))
}

/// Replaces the inbox row if its version is still `expected`; returns the new version.
fn replace_inbox_row(
    conn: &Connection,
    r: &InboxRecord,
    expected: &Version,
) -> StoreResult<Option<i64>> {
    let expected = parse_version(expected)?;
    conn.prepare_cached(
        "UPDATE inbox SET payload_hash = ?4, status = ?5, outcome = ?6, owner = ?7, lease_until_ms = ?8, \
         first_delivery_count = ?9, last_delivery_count = ?10, updated_at_ms = ?11, expires_at_ms = ?12, \
         version = version + 1 \
         WHERE consumer = ?1 AND claim_id = ?2 AND message_id = ?3 AND version = ?13",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            r.consumer,
            r.claim_id.to_string(),
            r.message_id.as_str(),
            r.payload_hash.as_str(),
            r.status.as_str(),
            r.outcome.as_ref().map(InboxOutcome::as_str),
            r.owner.to_string(),
            r.lease_until.map(to_ms),
            r.first_delivery_count,
            r.last_delivery_count,
            to_ms(r.updated_at),
            to_ms(r.expires_at),
            expected,
        ])
    })
    .map(|changed| (changed == 1).then_some(expected + 1))
    .map_err(map_sqlite_error)
}

fn list<T>(
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

    async fn finalize(
        &self,
        inbox: &InboxRecord,
        inbox_version: &Version,
        payment: &PaymentRecord,
        payment_version: Option<&Version>,
    ) -> StoreResult<()> {
        let (inbox, expected, payment) = (inbox.clone(), inbox_version.clone(), payment.clone());
        let payment_version = match payment_version {
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

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<PaymentRecord>> {
        self.read(move |c| {
            list(
                c,
                &format!("SELECT {PAYMENT_COLUMNS} FROM payments ORDER BY created_at_ms, claim_id LIMIT ?1"),
                limit,
                PaymentRow::from_row,
            )?
            .into_iter()
            .map(|row| row.into_record().map(|v| v.record))
            .collect()
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
            .map(PaymentRow::into_record)
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

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<InboxRecord>> {
        self.read(move |c| {
            list(
                c,
                &format!(
                    "SELECT {INBOX_COLUMNS} FROM inbox ORDER BY created_at_ms, message_id LIMIT ?1"
                ),
                limit,
                InboxRow::from_row,
            )?
            .into_iter()
            .map(|row| row.into_record().map(|v| v.record))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn database() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payments.db");
        drop(SqliteStore::open(&path).unwrap());
        (dir, path)
    }

    fn read_only(path: &Path) -> Connection {
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
    }

    fn writable(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    /// Tests run as root, whom file permissions do not stop; a connection SQLite opened
    /// read-only is what an unprivileged process gets on a read-only file, -wal, -shm or
    /// directory (the end-to-end test covers the real case).
    #[test]
    fn the_start_up_probe_refuses_a_database_this_process_cannot_write() {
        let (_dir, path) = database();
        check_writable(&writable(&path)).expect("a writable database");

        let err = check_writable(&read_only(&path)).unwrap_err();
        assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::ReadOnly));
        let message = describe_open_error(&path, err.into()).to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("cannot be written"), "{message}");
        // The probe leaves nothing behind.
        let tables: i64 = read_only(&path)
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name LIKE '%probe%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 0);
    }

    #[test]
    fn sqlite_errors_that_retrying_cannot_heal_are_permanent() {
        let (_dir, path) = database();
        let readonly = read_only(&path)
            .execute("DELETE FROM inbox", [])
            .unwrap_err();
        assert!(
            matches!(map_sqlite_error(readonly), StoreError::Permanent(m) if m.contains("readonly")),
        );
        let failure = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for code in [
            rusqlite::ffi::SQLITE_CORRUPT,
            rusqlite::ffi::SQLITE_NOTADB,
            rusqlite::ffi::SQLITE_CANTOPEN,
        ] {
            assert!(
                matches!(map_sqlite_error(failure(code)), StoreError::Permanent(_)),
                "{code}"
            );
        }
        // A full disk heals when space is freed; a busy database when the other writer ends.
        for code in [rusqlite::ffi::SQLITE_FULL, rusqlite::ffi::SQLITE_BUSY] {
            assert!(
                matches!(map_sqlite_error(failure(code)), StoreError::Transient(_)),
                "{code}"
            );
        }
    }

    fn inbox_row(outcome: Option<&str>) -> InboxRow {
        InboxRow {
            consumer: "payments".into(),
            claim_id: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
            message_id: "evt-1".into(),
            payload_hash: "sha256:00".into(),
            status: "completed".into(),
            outcome: outcome.map(str::to_owned),
            owner: crate::store::AttemptId::new().to_string(),
            lease_until_ms: None,
            first_delivery_count: 1,
            last_delivery_count: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            expires_at_ms: 0,
            version: 1,
        }
    }

    #[test]
    fn stored_outcomes_read_as_written_and_unknown_ones_are_a_store_error() {
        for stored in [
            "paid",
            "business-duplicate",
            "reconciled",
            r#"{"status":201}"#,
        ] {
            let record = inbox_row(Some(stored)).into_record().unwrap().record;
            assert_eq!(
                record.outcome.as_ref().map(InboxOutcome::as_str),
                Some(stored)
            );
        }
        assert_eq!(inbox_row(None).into_record().unwrap().record.outcome, None);
        let err = inbox_row(Some("lost")).into_record().unwrap_err();
        assert!(
            matches!(&err, StoreError::Permanent(m) if m.contains("inbox outcome") && m.contains("lost")),
            "{err}"
        );
    }

    fn payment_row(amount: &str, currency: &str, tenant: Option<&str>) -> PaymentRow {
        PaymentRow {
            claim_id: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
            purpose: "payout".into(),
            tenant_id: tenant.map(str::to_owned),
            amount: amount.into(),
            currency: currency.into(),
            payee: Some("NL91ABNA0417164300".into()),
            payload_hash: "sha256:00".into(),
            message_id: "evt-1".into(),
            idempotency_key: "claim-payment-x".into(),
            payout_request: None,
            status: "recorded".into(),
            bank_payment_id: None,
            status_reason: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 1,
        }
    }

    #[test]
    fn stored_payment_values_parse_strictly_and_a_bad_one_is_a_store_error() {
        let record = payment_row("1000", "JPY", Some("acme"))
            .into_record()
            .unwrap()
            .record;
        assert_eq!(record.money.amount_string(), "1000");
        assert_eq!(record.money.currency().code(), "JPY");
        assert_eq!(
            record.tenant_id.as_ref().map(TenantId::as_str),
            Some("acme")
        );
        for (amount, currency, tenant) in [
            ("12.5", "EUR", None),
            ("1e3", "EUR", None),
            ("12.50", "EURO", None),
            ("12.50", "EUR", Some("")),
        ] {
            let err = payment_row(amount, currency, tenant)
                .into_record()
                .unwrap_err();
            assert!(
                matches!(&err, StoreError::Permanent(m) if m.starts_with("corrupt payment in the database")),
                "{amount} {currency} {tenant:?}: {err}"
            );
        }
    }
}
