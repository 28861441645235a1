//! The simulated world's ground rules: one seeded generator for every choice the
//! simulator makes, the true wall clock (the bank's and the broker's; each instance's own
//! is in [`super::clocks`]), and the trace of events whose hash proves that a seed replays
//! its run.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use claims_payments::seams::ambient::Entropy;
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::time::Instant;

/// When every simulated run starts, on the wall clock (2026-01-01T00:00:00Z).
pub const EPOCH_UNIX: i64 = 1_767_225_600;

/// The run's generator: every choice the simulator makes, in the order it makes them.
/// One thread runs the whole simulation, so that order is the seed's alone.
#[derive(Clone)]
pub struct Dice(Arc<Mutex<StdRng>>);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Dice(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))))
    }

    fn with<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut rng)
    }

    /// True with probability `p`.
    pub fn hit(&self, p: f64) -> bool {
        p > 0.0 && self.with(|r| r.random_bool(p.clamp(0.0, 1.0)))
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.with(|r| r.random_range(lo..=hi))
    }

    pub fn millis(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    pub fn unit(&self) -> f64 {
        self.with(|r| r.random::<f64>())
    }

    pub fn u64(&self) -> u64 {
        self.with(|r| r.next_u64())
    }

    /// A generator of its own, seeded from this one (an instance's entropy).
    pub fn fork(&self) -> Dice {
        Dice::new(self.u64())
    }
}

impl Entropy for Dice {
    fn fill(&self, bytes: &mut [u8]) {
        self.with(|r| r.fill_bytes(bytes))
    }
}

/// The true wall-clock time (the bank's and the broker's clock).
pub fn wall_at(start: Instant) -> OffsetDateTime {
    let elapsed = Instant::now().saturating_duration_since(start);
    OffsetDateTime::from_unix_timestamp(EPOCH_UNIX).unwrap_or(OffsetDateTime::UNIX_EPOCH) + elapsed
}

/// The events of one run, with their virtual times. Its hash is the run's fingerprint:
/// two runs of one seed on one build must give the same one.
#[derive(Clone)]
pub struct Trace {
    start: Instant,
    inner: Arc<Mutex<TraceInner>>,
}

struct TraceInner {
    lines: Vec<String>,
    hasher: Sha256,
    /// Keep every line (a failing seed's replay); otherwise only the hash.
    keep: bool,
}

impl Trace {
    pub fn new(start: Instant, keep: bool) -> Self {
        Trace {
            start,
            inner: Arc::new(Mutex::new(TraceInner {
                lines: Vec::new(),
                hasher: Sha256::new(),
                keep,
            })),
        }
    }

    /// Milliseconds of virtual time since the run started.
    pub fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.start)
            .as_millis() as u64
    }

    pub fn event(&self, what: std::fmt::Arguments<'_>) {
        let mut line = String::with_capacity(64);
        let _ = write!(line, "{:>12} ", self.now_ms());
        let _ = line.write_fmt(what);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.hasher.update(line.as_bytes());
        inner.hasher.update(b"\n");
        if inner.keep {
            inner.lines.push(line);
        }
    }

    pub fn hash(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        hex::encode(&inner.hasher.clone().finalize()[..16])
    }

    /// Whether the run keeps its event lines, not only their hash.
    pub fn keeps_lines(&self) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).keep
    }

    /// The kept lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .lines
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

/// `trace!(trace, "fmt", args)`: one event.
#[macro_export]
macro_rules! trace_event {
    ($trace:expr, $($arg:tt)*) => {
        $trace.event(format_args!($($arg)*))
    };
}
