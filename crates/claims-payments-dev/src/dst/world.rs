//! The simulated world's ground rules: one seeded generator for every choice the
//! simulator makes, each instance's wall clock (virtual time plus a skew of up to 2 s,
//! and, while faults fire, jumps and drift of up to half an hour) and generator, and the trace of events whose hash proves that a seed replays its run.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use claims_payments::seams::ambient::{Ambient, Boot, Entropy, WallClock};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::chaos::Chaos;
use super::faults::Fault;
use super::timings::MAX_SKEW_MS;

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

/// An instance's wall clock: the run's virtual time, plus the instance's skew, plus its
/// clock faults while faults fire (when they stop, NTP has set every clock right).
pub struct SkewedClock {
    start: Instant,
    profile: ClockProfile,
    chaos: Chaos,
}

/// How one process's clock is off: a fixed skew and the faults it meets.
#[derive(Debug, Clone, Default)]
pub struct ClockProfile {
    pub skew_ms: i64,
    pub faults: Vec<ClockFault>,
}

/// One fault of a process's clock, in the run's virtual time.
#[derive(Debug, Clone, Copy)]
pub enum ClockFault {
    /// From `at` until `until` the clock reads `by_ms` off (a step, and a step back).
    Jump {
        at: Duration,
        until: Duration,
        by_ms: i64,
    },
    /// From `at` until `until` the clock gains `ppm` millionths of a second per second
    /// (loses, when negative).
    Drift {
        at: Duration,
        until: Duration,
        ppm: i64,
    },
}

impl ClockProfile {
    /// How far the clock is off at `t` of the run while faults fire.
    pub fn error_ms(&self, t: Duration, faults_on: bool) -> i64 {
        let mut error = self.skew_ms;
        if !faults_on {
            return error;
        }
        for fault in &self.faults {
            match *fault {
                ClockFault::Jump { at, until, by_ms } if at <= t && t < until => error += by_ms,
                ClockFault::Drift { at, until, ppm } if at <= t && t < until => {
                    error += (t - at).as_millis() as i64 * ppm / 1_000_000
                }
                _ => {}
            }
        }
        error
    }

    /// The clock of a process starting at `now` (of the run): its skew, jumps and drift,
    /// each kind drawn (and counted as fired) as the run's plan says.
    pub fn draw(chaos: &Chaos, dice: &Dice, now: Duration, process: u64) -> Self {
        let what = format!("clock of process {process}");
        let mut profile = ClockProfile::default();
        if chaos.fires(Fault::ClockSkew, &what) {
            profile.skew_ms = dice.range(0, 2 * MAX_SKEW_MS as u64) as i64 - MAX_SKEW_MS;
        }
        let sign = |dice: &Dice| if dice.hit(0.5) { 1 } else { -1 };
        // Mostly within the next two hours (the chaos phase), sometimes a day on (a bank
        // dark past its key window keeps the faults on that long).
        let when = |dice: &Dice| {
            let horizon = if dice.hit(0.7) { 2 * 3600 } else { 26 * 3600 };
            now + Duration::from_secs(dice.range(0, horizon))
        };
        if chaos.fires(Fault::ClockJump, &what) {
            for _ in 0..dice.range(1, 2) {
                let at = when(dice);
                let seconds = match dice.range(0, 2) {
                    // Within the bound the product assumes (25 s).
                    0 => dice.range(1, 20),
                    // Beyond the 120 s lease, within the key window's 5-minute margin.
                    1 => dice.range(121, 299),
                    // Beyond the margin.
                    _ => dice.range(301, 1_800),
                };
                profile.faults.push(ClockFault::Jump {
                    at,
                    until: at + Duration::from_secs(dice.range(10, 2 * 3600)),
                    by_ms: sign(dice) * seconds as i64 * 1_000,
                });
            }
        }
        if chaos.fires(Fault::ClockDrift, &what) {
            let at = when(dice);
            profile.faults.push(ClockFault::Drift {
                at,
                until: at + Duration::from_secs(dice.range(300, 3 * 3600)),
                ppm: sign(dice) * dice.range(100, 50_000) as i64,
            });
        }
        profile
    }

    /// For the trace: the skew, and each fault.
    pub fn describe(&self) -> String {
        let mut out = format!("skew {}", self.skew_ms);
        for fault in &self.faults {
            match fault {
                ClockFault::Jump { at, until, by_ms } => {
                    let _ = write!(
                        out,
                        " jump {by_ms} ms {}..{} s",
                        at.as_secs(),
                        until.as_secs()
                    );
                }
                ClockFault::Drift { at, until, ppm } => {
                    let _ = write!(
                        out,
                        " drift {ppm} ppm {}..{} s",
                        at.as_secs(),
                        until.as_secs()
                    );
                }
            }
        }
        out
    }
}

impl WallClock for SkewedClock {
    fn now(&self) -> OffsetDateTime {
        let t = Instant::now().saturating_duration_since(self.start);
        wall_at(self.start)
            + time::Duration::milliseconds(self.profile.error_ms(t, self.chaos.is_on()))
    }
}

/// The true wall-clock time (the bank's and the broker's clock).
pub fn wall_at(start: Instant) -> OffsetDateTime {
    let elapsed = Instant::now().saturating_duration_since(start);
    OffsetDateTime::from_unix_timestamp(EPOCH_UNIX).unwrap_or(OffsetDateTime::UNIX_EPOCH) + elapsed
}

/// The ambient of simulated process number `n` (its boot), on a clock `profile` off.
pub fn ambient(
    start: Instant,
    n: u64,
    profile: ClockProfile,
    chaos: &Chaos,
    dice: &Dice,
) -> Ambient {
    Ambient::new(
        Arc::new(SkewedClock {
            start,
            profile,
            chaos: chaos.clone(),
        }),
        Arc::new(dice.fork()),
        Boot::numbered(n + 1),
    )
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
