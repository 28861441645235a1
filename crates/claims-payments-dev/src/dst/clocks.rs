//! Each simulated process's wall clock: the run's virtual time, a fixed skew within the
//! bound the design assumes, and the clock faults the run injects (jumps and drift, some
//! beyond the lease and the key window's margin). Above [`super::world`] (the true clock)
//! and the fault plan ([`super::chaos`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::ambient::{Ambient, Boot, WallClock};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::chaos::Chaos;
use super::faults::Fault;
use super::timings::MAX_SKEW_MS;
use super::world::{wall_at, Dice};

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
