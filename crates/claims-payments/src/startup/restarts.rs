//! What a start learns from the process that served on its port before it.
//!
//! The Functions host restarts a handler that exited on the same port, and holds every
//! invocation that arrives meanwhile until the new process answers `GET /`, without
//! counting a delivery (see `crates/claims-payments-dev/src/sim/driver.rs` for the
//! host's code). A process that dies instead costs each invocation in flight one
//! delivery. So each `serve` keeps a small state file per consumer and port (in the
//! temporary directory, `TMPDIR`): its boot, whether it stopped cleanly, and when
//! processes on this port crashed lately. The next start reads it, once it holds the
//! port (so the process in the file no longer serves):
//!
//! - **The previous process did not stop cleanly** (killed, crashed, restarted after a
//!   function timeout): its registration is ended at once
//!   ([`liveness`](crate::lease::liveness)), so every lease it held is taken over by
//!   the next attempt that meets it, on any instance, instead of being waited out.
//! - **Processes on this port crashed several times within [`CRASH_WINDOW`]** (a crash
//!   loop): the start holds back before it answers, [`HOLD_FIRST`] doubling up to
//!   [`HOLD_MAX`]. The held invocations cost no delivery, while each crash costs one of
//!   every invocation in flight; and what the crashes interrupted finishes meanwhile (a
//!   payout the bank still processes under its key answers 409 "in use" until it is done,
//!   so redeliveries that come back at once only meet it again). [`HOLD_MAX`] stays far
//!   below the host's 30 s initialization timeout.
//!
//! A missing, unreadable or foreign file is a first start: nothing is ended, nothing held.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::lease::liveness;
use crate::store::{Boot, Store};

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
    /// The previous process on this port, when it did not stop cleanly.
    pub(crate) crashed: Option<Boot>,
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

/// Pure: what a start at `now` makes of the state `found` (None: no usable file).
fn judge(found: Option<&State>, now: OffsetDateTime) -> (Start, Vec<i64>) {
    let now_ms = unix_ms(now);
    let window_ms = CRASH_WINDOW.as_millis() as i64;
    let mut crashes: Vec<i64> = found
        .map(|s| s.crashes_ms.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|&t| t <= now_ms && now_ms - t < window_ms)
        .collect();
    let crashed = found
        .filter(|s| !s.clean)
        .and_then(|s| Boot::parse(&s.boot));
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

/// This process's record of its start, to be marked clean when it stops.
pub(crate) struct Restarts {
    path: PathBuf,
    state: State,
}

/// Reads the previous process's state, ends its registration if it crashed (best
/// effort: otherwise it runs out), and records this process as running. Call it once
/// the port is held and before this process registers.
pub(crate) async fn begin(store: &dyn Store, path: PathBuf) -> (Start, Restarts) {
    let (start, crashes_ms) = judge(read(&path).as_ref(), OffsetDateTime::now_utc());
    if let Some(boot) = start.crashed {
        match liveness::end_registration_of(store, boot, OffsetDateTime::now_utc()).await {
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
    let state = State {
        boot: Boot::current().to_string(),
        clean: false,
        crashes_ms,
    };
    if let Err(e) = write(&path, &state) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the restart state file; the next start will not know how this one ended");
    }
    (start, Restarts { path, state })
}

impl Restarts {
    /// Records a clean stop: the next start ends nothing and counts no crash.
    pub(crate) fn stopped_cleanly(mut self) {
        self.state.clean = true;
        if let Err(e) = write(&self.path, &self.state) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record the clean stop");
        }
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
        let (start, crashes) = judge(None, now);
        assert_eq!(start.crashed, None);
        assert_eq!((start.recent_crashes, start.hold), (0, Duration::ZERO));
        assert!(crashes.is_empty());
        let (start, _) = judge(Some(&state(true, vec![])), now);
        assert_eq!((start.crashed, start.hold), (None, Duration::ZERO));
    }

    #[test]
    fn a_crash_ends_the_previous_registration_and_a_crash_loop_holds_back() {
        let now_ms = 1_800_000_000_000;
        let now = at(now_ms);
        let previous = state(false, vec![]);
        let (start, crashes) = judge(Some(&previous), now);
        assert_eq!(start.crashed, Boot::parse(&previous.boot));
        // One crash is not a loop: no hold.
        assert_eq!((start.recent_crashes, start.hold), (1, Duration::ZERO));
        assert_eq!(crashes, vec![now_ms]);
        // The second within the window holds the first step, then it doubles.
        let (start, _) = judge(Some(&state(false, vec![now_ms - 5_000])), now);
        assert_eq!((start.recent_crashes, start.hold), (2, HOLD_FIRST));
        let (start, _) = judge(Some(&state(false, vec![now_ms - 9, now_ms - 5])), now);
        assert_eq!(start.hold, HOLD_FIRST * 2);
        let many = (1..40).map(|i| now_ms - i).collect();
        let (start, crashes) = judge(Some(&state(false, many)), now);
        assert_eq!(start.hold, HOLD_MAX);
        assert_eq!(crashes.len(), CRASHES_KEPT);
        // Crashes older than the window (or from a clock that went back) do not count.
        let old = vec![now_ms - CRASH_WINDOW.as_millis() as i64, now_ms + 60_000];
        let (start, _) = judge(Some(&state(false, old)), now);
        assert_eq!(start.recent_crashes, 1);
        // A clean stop after crashes keeps their times; only a crash adds one.
        let (start, crashes) = judge(Some(&state(true, vec![now_ms - 9, now_ms - 5])), now);
        assert_eq!((start.crashed, start.recent_crashes), (None, 2));
        assert_eq!(start.hold, Duration::ZERO, "a clean stop ended the loop");
        assert_eq!(crashes, vec![now_ms - 9, now_ms - 5]);
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
        let (start, _) = judge(Some(&previous), at(1_800_000_000_000));
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
