//! The SQLite engine room: opening and checking the file, the writer's group commit in
//! savepoints, the WAL syncer, and the instance lock.

use super::*;

pub(super) fn reader_pool(
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
pub(super) fn open_connection(path: &Path, flags: OpenFlags) -> anyhow::Result<Connection> {
    if !flags.contains(OpenFlags::SQLITE_OPEN_CREATE) && !path.exists() {
        anyhow::bail!(
            "no SQLite database at {} (only `serve` creates one; is the path right?)",
            path.display()
        );
    }
    Connection::open_with_flags(path, flags).map_err(|e| describe_open_error(path, e.into()))
}

/// Names the path and, for the failures an operator must fix by hand, what is wrong.
pub(super) fn describe_open_error(path: &Path, e: anyhow::Error) -> anyhow::Error {
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
pub(super) fn check_writable(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let written = conn.execute_batch("CREATE TABLE claims_payments_write_probe (x)");
    let rolled_back = conn.execute_batch("ROLLBACK");
    written.and(rolled_back)
}

/// `PRAGMA quick_check`: every page and b-tree is well formed (O(database size); it skips
/// only the index-to-table cross-checks of `integrity_check`).
pub(super) fn check_integrity(conn: &Connection) -> anyhow::Result<()> {
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

pub(super) fn configure_writer(conn: &Connection) -> anyhow::Result<()> {
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
pub(super) fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Runs a job inside its own savepoint so its refusal undoes only its own rows.
pub(super) fn in_savepoint<T>(
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
pub(super) fn run_group(
    conn: &mut Connection,
    jobs: Vec<WriteJob>,
    committed: &AtomicU64,
) -> Committed {
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
pub(super) struct WalFile {
    pub(super) path: PathBuf,
    pub(super) file: File,
}

/// A file next to the database: `<db><suffix>`.
pub(super) fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut path = db.as_os_str().to_owned();
    path.push(suffix);
    PathBuf::from(path)
}

impl WalFile {
    pub(super) fn open(db: &Path) -> anyhow::Result<Self> {
        let path = sidecar(db, "-wal");
        let file = File::open(&path)
            .map_err(|e| anyhow::anyhow!("cannot open the SQLite WAL {}: {e}", path.display()))?;
        Ok(WalFile { path, file })
    }

    /// Flushes every frame written so far. SQLite never replaces the WAL while the
    /// writer's connection is open; it unlinks the file only when its last connection
    /// closes, after checkpointing it into the database file, and a flush of the unlinked
    /// file then succeeds with nothing left to do.
    pub(super) fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

/// One `serve` per database file: an exclusive advisory lock (`flock`) on `<db>.lock`,
/// held for the store's life and released by the kernel when the process ends, however it
/// ends. A lock file beside the database, not the database itself: SQLite's own POSIX
/// locks on the database file would be dropped by any `close` of another descriptor to it,
/// and the readers and checkpointer keep working as they are. The file keeps the holder's
/// pid for the refusal message; it may stay behind and is reused.
pub(super) struct InstanceLock {
    pub(super) _file: File,
}

impl InstanceLock {
    pub(super) fn acquire(db: &Path) -> anyhow::Result<Self> {
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
pub(super) fn run_syncer(
    wal: WalFile,
    groups: std_mpsc::Receiver<Committed>,
    durability: &Durability,
) {
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
