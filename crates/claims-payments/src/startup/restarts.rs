//! What a start learns from the process that served on its port before it.
//!
//! The Functions host restarts a handler that exited on the same port, and holds every
//! invocation that arrives meanwhile until the new process answers `GET /`, without
//! counting a delivery (see `crates/claims-payments-dev/src/sim/driver.rs` for the
//! host's code). A process that dies instead costs each invocation in flight one
//! delivery. So each `serve` keeps a small state file per consumer and port (in the
//! temporary directory, `TMPDIR`): the boot of the latest process on the port, whether
//! it stopped cleanly, and when processes on this port crashed lately. The next start
//! reads it once it holds the port:
//!
//! - **The previous process did not stop cleanly and has exited** (killed, crashed,
//!   restarted after a function timeout): its registration is ended at once
//!   ([`liveness`](crate::lease::liveness)), so every lease it held is taken over by
//!   the next attempt that meets it, on any instance, instead of being waited out.
//! - **The previous process is still running**: a free port proves nothing, since a
//!   process that drains after SIGTERM has closed its listener but still finishes its
//!   invocations (and renews its registration) for up to `SHUTDOWN_DRAIN`; a paused one
//!   may run again. Each process holds an exclusive lock on a file of its own boot
//!   beside the state file for as long as it lives (the kernel drops it when the
//!   process ends, however it ends), so the start knows. Nothing is ended and no crash
//!   counted: the previous process ends its own registration when it stops. The start
//!   waits for that lock in the background, and if the process exits without having
//!   ended its registration (killed mid-drain), ends it then.
//! - **Processes on this port crashed several times within [`CRASH_WINDOW`]** (a crash
//!   loop): the start holds back before it answers, [`HOLD_FIRST`] doubling up to
//!   [`HOLD_MAX`]. The held invocations cost no delivery, while each crash costs one of
//!   every invocation in flight; and what the crashes interrupted finishes meanwhile (a
//!   payout the bank still processes under its key answers 409 "in use" until it is done,
//!   so redeliveries that come back at once only meet it again). [`HOLD_MAX`] stays far
//!   below the host's 30 s initialization timeout.
//!
//! A process records its clean stop only if the state file still names its boot: a
//! later process that started while it drained owns the file from then on, and must
//! still be found crashed if it is killed.
//!
//! A missing, unreadable or foreign file is a first start: nothing is ended, nothing held.
//! A predecessor whose lock cannot be told (no lock file: an older build) counts as
//! exited when its lock file is missing, and as running when the lock cannot be read.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::lease::liveness;
use crate::store::{Boot, DynStore};

/// Crashes this recent count towards a crash loop.
pub(crate) const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// The hold of the second crash within the window; it doubles with each further one.
pub(crate) const HOLD_FIRST: Duration = Duration::from_millis(250);
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(1);
/// Crash times kept in the file.
const CRASHES_KEPT: usize = 16;

/// The state file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    /// The boot of the process that wrote it (12 hex digits).
    boot: String,
    /// Whether it stopped cleanly (drained after SIGTERM).
    clean: bool,
    /// When processes on this port were found to have crashed, Unix milliseconds.
    crashes_ms: Vec<i64>,
}

/// What this start found and does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The previous process on this port, when it did not stop cleanly and has exited.
    pub(crate) crashed: Option<Boot>,
    /// The previous process on this port, when it has not stopped yet (it drains, or
    /// is paused): left alone.
    pub(crate) running: Option<Boot>,
    /// Crashes within [`CRASH_WINDOW`], this one included.
    pub(crate) recent_crashes: usize,
    /// How long to hold back before answering.
    pub(crate) hold: Duration,
}

/// The state file of `consumer` on `port` over the store `store` (a description that
/// tells stores apart: unrelated runs on one machine may use the same port).
pub(crate) fn state_file(consumer: &str, store: &str, port: u16) -> PathBuf {
    use sha2::{Digest, Sha256};
    let name: String = consumer
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let store = hex::encode(&Sha256::digest(store.as_bytes())[..4]);
    std::env::temp_dir().join(format!("claims-payments-{name}-{store}-{port}.json"))
}

/// The hold after `recent_crashes` crashes within the window.
pub(crate) fn hold_for(recent_crashes: usize) -> Duration {
    if recent_crashes < 2 {
        return Duration::ZERO;
    }
    let doublings = u32::try_from(recent_crashes - 2)
        .unwrap_or(u32::MAX)
        .min(16);
    HOLD_FIRST.saturating_mul(1 << doublings).min(HOLD_MAX)
}

/// Pure: what a start at `now` makes of the state `found` (None: no usable file), when
/// the process it names is still running (`previous_running`) or not.
fn judge(found: Option<&State>, previous_running: bool, now: OffsetDateTime) -> (Start, Vec<i64>) {
    let now_ms = unix_ms(now);
    let window_ms = CRASH_WINDOW.as_millis() as i64;
    let mut crashes: Vec<i64> = found
        .map(|s| s.crashes_ms.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|&t| t <= now_ms && now_ms - t < window_ms)
        .collect();
    let previous = found
        .filter(|s| !s.clean)
        .and_then(|s| Boot::parse(&s.boot));
    let (crashed, running) = if previous_running {
        (None, previous)
    } else {
        (previous, None)
    };
    if crashed.is_some() {
        crashes.push(now_ms);
    }
    let keep_from = crashes.len().saturating_sub(CRASHES_KEPT);
    let crashes = crashes.split_off(keep_from);
    // Only a start after a crash holds: a clean stop in between ended the loop.
    let hold = if crashed.is_some() {
        hold_for(crashes.len())
    } else {
        Duration::ZERO
    };
    let start = Start {
        crashed,
        running,
        recent_crashes: crashes.len(),
        hold,
    };
    (start, crashes)
}

fn unix_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn read(path: &Path) -> Option<State> {
    let text = std::fs::read(path).ok()?;
    // A few hundred bytes; anything larger is not ours.
    if text.len() > 4096 {
        return None;
    }
    serde_json::from_slice(&text).ok()
}

/// Writes `state` whole: to a new sibling file first, then renamed over, so a crash
/// mid-write leaves the old file or the new one, never half of one. The sibling is created
/// exclusively under a name of this boot's, so a file or link planted in a shared
/// temporary directory is never written through.
fn write(path: &Path, state: &State) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("{}.tmp", Boot::random()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    let written = file
        .write_all(&serde_json::to_vec(state).unwrap_or_default())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The lock file the process `boot` holds while it lives, beside the state file.
fn lock_file(state: &Path, boot: Boot) -> PathBuf {
    state.with_extension(format!("{boot}.lock"))
}

/// Takes the exclusive flock(2) on `file`, waiting for it or not (`WouldBlock` then).
/// The kernel releases it when the last descriptor of the file closes: at the latest
/// when the process ends, however it ends.
fn flock(file: &File, wait: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let operation = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns and keeps open during the call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Creates and locks this process's lock file. Created exclusively (never through a
/// planted file or link), and held until the process ends.
fn hold_lock(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    flock(&file, false)?;
    Ok(file)
}

/// Whether the process whose lock file is `path` still runs.
#[derive(Debug)]
enum Previous {
    /// Exited (its lock was free, and is removed), or it never held one.
    Exited,
    /// Still running: its lock is held; the file, to wait for it.
    Running(File),
    /// The lock cannot be read: counted as running, and not waited for.
    Unknown,
}

fn probe(path: &Path) -> Previous {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Previous::Exited,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot tell whether the previous process on this port still runs; its registration is left to run out");
            return Previous::Unknown;
        }
    };
    match flock(&file, false) {
        Ok(()) => {
            let _ = std::fs::remove_file(path);
            Previous::Exited
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Previous::Running(file),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot tell whether the previous process on this port still runs; its registration is left to run out");
            Previous::Unknown
        }
    }
}

/// Runs `f` holding the lock that orders writers of the state file `path`, so a clean
/// stop's read and write are not split by a start's write (best effort: without the
/// lock file, `f` runs unlocked).
fn exclusively<T>(path: &Path, f: impl FnOnce() -> T) -> T {
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path.with_extension("lock"))
        .ok()
        .filter(|file| flock(file, true).is_ok());
    let out = f();
    drop(lock);
    out
}

/// Waits (on a thread of its own: the lock is a blocking call) until the process
/// `previous`, which holds `lock`, exits; then ends its registration if it left it live
/// (it was killed while it drained). A clean stop ends its own first, and nothing is
/// done.
fn watch(store: DynStore, previous: Boot, lock: File, path: PathBuf) {
    let (exited, on_exit) = tokio::sync::oneshot::channel();
    let waiter = std::thread::Builder::new()
        .name("previous-process".into())
        .spawn(move || {
            let _ = exited.send(flock(&lock, true).map(|()| lock));
        });
    if let Err(e) = waiter {
        tracing::warn!(error = %e, "cannot wait for the previous process on this port; if it is killed, its registration runs out");
        return;
    }
    tokio::spawn(async move {
        let Ok(Ok(_lock)) = on_exit.await else {
            return;
        };
        let _ = std::fs::remove_file(&path);
        match liveness::end_registration_of(store.as_ref(), previous, OffsetDateTime::now_utc())
            .await
        {
            Ok(true) => tracing::warn!(
                previousBoot = %previous,
                "the previous process on this port exited without a clean stop while this one ran; its leases are taken over at once"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                previousBoot = %previous,
                error = %e,
                "cannot end the registration of the previous process; its leases run out instead"
            ),
        }
    });
}

/// This process's record of its start, to be marked clean when it stops.
pub(crate) struct Restarts {
    path: PathBuf,
    me: Boot,
    state: State,
    /// This process's lock, held until it stops (none if it could not be taken).
    lock: Option<File>,
}

/// Reads the previous process's state, ends its registration if it crashed (best
/// effort: otherwise it runs out), and records this process as running. Call it once
/// the port is held and before this process registers.
pub(crate) async fn begin(store: &DynStore, path: PathBuf) -> (Start, Restarts) {
    let me = Boot::current();
    let own = lock_file(&path, me);
    let lock = match hold_lock(&own) {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!(path = %own.display(), error = %e, "cannot hold this process's lock file; a start while this one drains will take it for crashed");
            None
        }
    };
    let found = read(&path);
    let previous = found
        .as_ref()
        .filter(|s| !s.clean)
        .and_then(|s| Boot::parse(&s.boot))
        .map(|boot| (boot, probe(&lock_file(&path, boot))));
    let previous_running = matches!(
        previous,
        Some((_, Previous::Running(_) | Previous::Unknown))
    );
    let (start, crashes_ms) = judge(found.as_ref(), previous_running, OffsetDateTime::now_utc());
    if let Some(boot) = start.crashed {
        match liveness::end_registration_of(store.as_ref(), boot, OffsetDateTime::now_utc()).await {
            Ok(true) => tracing::info!(
                previousBoot = %boot,
                recentCrashes = start.recent_crashes,
                "the previous process on this port did not stop cleanly; its leases are taken over at once"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                previousBoot = %boot,
                error = %e,
                "cannot end the registration of the previous process; its leases run out instead"
            ),
        }
    }
    if let Some((boot, previous)) = previous.filter(|_| start.running.is_some()) {
        tracing::info!(
            previousBoot = %boot,
            "the previous process on this port is still running (it drains, or is paused); its registration and leases stay its own"
        );
        if let Previous::Running(file) = previous {
            watch(store.clone(), boot, file, lock_file(&path, boot));
        }
    }
    let state = State {
        boot: me.to_string(),
        clean: false,
        crashes_ms,
    };
    if let Err(e) = exclusively(&path, || write(&path, &state)) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the restart state file; the next start will not know how this one ended");
    }
    (
        start,
        Restarts {
            path,
            me,
            state,
            lock,
        },
    )
}

impl Restarts {
    /// Records a clean stop, if the state file still names this process: the next
    /// start then ends nothing and counts no crash. A process that started on this port
    /// while this one drained owns the file, and is left to be found as it ends.
    pub(crate) fn stopped_cleanly(mut self) {
        self.state.clean = true;
        let written = exclusively(&self.path, || match read(&self.path) {
            Some(found) if found.boot == self.state.boot => {
                write(&self.path, &self.state).map(|()| true)
            }
            _ => Ok(false),
        });
        match written {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                path = %self.path.display(),
                "a later process on this port started while this one drained; the restart state file is left to it"
            ),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot record the clean stop")
            }
        }
        // Removed before it is unlocked (when the file closes), so no start finds it free.
        let lock = self.lock.take();
        if lock.is_some() {
            let _ = std::fs::remove_file(lock_file(&self.path, self.me));
        }
        drop(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap()
    }

    fn state(clean: bool, crashes_ms: Vec<i64>) -> State {
        State {
            boot: Boot::random().to_string(),
            clean,
            crashes_ms,
        }
    }

    #[test]
    fn a_first_start_or_one_after_a_clean_stop_ends_nothing_and_holds_nothing() {
        let now = at(1_800_000_000_000);
        let (start, crashes) = judge(None, false, now);
        assert_eq!(start.crashed, None);
        assert_eq!((start.recent_crashes, start.hold), (0, Duration::ZERO));
        assert!(crashes.is_empty());
        let (start, _) = judge(Some(&state(true, vec![])), false, now);
        assert_eq!((start.crashed, start.hold), (None, Duration::ZERO));
    }

    #[test]
    fn a_crash_ends_the_previous_registration_and_a_crash_loop_holds_back() {
        let now_ms = 1_800_000_000_000;
        let now = at(now_ms);
        let previous = state(false, vec![]);
        let (start, crashes) = judge(Some(&previous), false, now);
        assert_eq!(start.crashed, Boot::parse(&previous.boot));
        // One crash is not a loop: no hold.
        assert_eq!((start.recent_crashes, start.hold), (1, Duration::ZERO));
        assert_eq!(crashes, vec![now_ms]);
        // The second within the window holds the first step, then it doubles.
        let (start, _) = judge(Some(&state(false, vec![now_ms - 5_000])), false, now);
        assert_eq!((start.recent_crashes, start.hold), (2, HOLD_FIRST));
        let (start, _) = judge(
            Some(&state(false, vec![now_ms - 9, now_ms - 5])),
            false,
            now,
        );
        assert_eq!(start.hold, HOLD_FIRST * 2);
        let many = (1..40).map(|i| now_ms - i).collect();
        let (start, crashes) = judge(Some(&state(false, many)), false, now);
        assert_eq!(start.hold, HOLD_MAX);
        assert_eq!(crashes.len(), CRASHES_KEPT);
        // Crashes older than the window (or from a clock that went back) do not count.
        let old = vec![now_ms - CRASH_WINDOW.as_millis() as i64, now_ms + 60_000];
        let (start, _) = judge(Some(&state(false, old)), false, now);
        assert_eq!(start.recent_crashes, 1);
        // A clean stop after crashes keeps their times; only a crash adds one.
        let (start, crashes) = judge(Some(&state(true, vec![now_ms - 9, now_ms - 5])), false, now);
        assert_eq!((start.crashed, start.recent_crashes), (None, 2));
        assert_eq!(start.hold, Duration::ZERO, "a clean stop ended the loop");
        assert_eq!(crashes, vec![now_ms - 9, now_ms - 5]);
    }

    #[test]
    fn a_previous_process_that_still_runs_is_neither_ended_nor_counted() {
        let now_ms = 1_800_000_000_000;
        let previous = state(false, vec![now_ms - 5_000]);
        let (start, crashes) = judge(Some(&previous), true, at(now_ms));
        assert_eq!(start.crashed, None, "a draining process is not a crash");
        assert_eq!(start.running, Boot::parse(&previous.boot));
        assert_eq!((start.recent_crashes, start.hold), (1, Duration::ZERO));
        assert_eq!(crashes, vec![now_ms - 5_000]);
        // Exited without a clean stop: the crash it always was.
        let (start, _) = judge(Some(&previous), false, at(now_ms));
        assert_eq!(
            (start.crashed, start.running),
            (Boot::parse(&previous.boot), None)
        );
    }

    #[test]
    fn a_lock_file_tells_whether_its_process_still_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_file(&dir.path().join("state.json"), Boot::random());
        // No lock file (an older build, or one that stopped cleanly): exited.
        assert!(matches!(probe(&path), Previous::Exited));
        let held = hold_lock(&path).unwrap();
        assert!(matches!(probe(&path), Previous::Running(_)));
        assert!(hold_lock(&path).is_err(), "a boot holds one lock");
        // Its process ended (the kernel drops the lock): exited, and the file removed.
        drop(held);
        assert!(matches!(probe(&path), Previous::Exited));
        assert!(!path.exists());
    }

    #[test]
    fn a_clean_stop_is_recorded_only_while_the_file_names_this_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let me = Boot::random();
        let restarts = |crashes_ms| Restarts {
            path: path.clone(),
            me,
            state: State {
                boot: me.to_string(),
                clean: false,
                crashes_ms,
            },
            lock: hold_lock(&lock_file(&path, me)).ok(),
        };
        // A later start wrote its own state while this process drained: left as it is.
        let later = state(false, vec![7]);
        write(&path, &later).unwrap();
        restarts(vec![]).stopped_cleanly();
        assert_eq!(read(&path), Some(later));
        assert!(
            !lock_file(&path, me).exists(),
            "the lock file goes at a stop"
        );
        // Still this process's: marked clean.
        let mine = restarts(vec![3]);
        write(&path, &mine.state).unwrap();
        mine.stopped_cleanly();
        let found = read(&path).unwrap();
        assert_eq!((found.boot, found.clean), (me.to_string(), true));
    }

    #[test]
    fn an_unreadable_or_foreign_file_is_a_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        for junk in [&b"not json"[..], b"{\"boot\":1}", &[b' '; 5000][..]] {
            std::fs::write(&path, junk).unwrap();
            assert_eq!(read(&path), None);
        }
        let mut previous = state(false, vec![]);
        previous.boot = "not a boot".into();
        let (start, _) = judge(Some(&previous), false, at(1_800_000_000_000));
        assert_eq!(start.crashed, None);
        write(&path, &previous).unwrap();
        assert_eq!(read(&path), Some(previous));
    }

    #[test]
    fn a_link_planted_at_the_state_file_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let path = dir.path().join("state.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let state = state(false, vec![1]);
        write(&path, &state).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(read(&path), Some(state));
    }

    #[test]
    fn the_file_is_named_by_consumer_and_port_with_safe_characters() {
        let path = state_file("Claims Handler/..", "sqlite:/data/payments.db", 7071);
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with("claims-payments-Claims_Handler___-"),
            "{name}"
        );
        assert!(name.ends_with("-7071.json"), "{name}");
        assert_ne!(
            path,
            state_file("Claims Handler/..", "sqlite:/other.db", 7071)
        );
    }
}
