//! Whether this process's wall clock may be trusted with the bank's key window.
//!
//! The key window is judged on instance clocks twice: the instance that first asks for a
//! payout stamps `created_at`, and every later sender compares its own clock with
//! `created_at + window - margin`. A clock off by more than the margin (5 minutes) makes a
//! request leave after the bank forgot the key: the bank then pays a second time. The
//! design assumes every instance's clock within [`MAX_CLOCK_ERROR`] of the bank's, so the
//! margin covers the stamping clock's error, the sending clock's, a request's timeout and
//! the `Date` header's whole seconds.
//!
//! The bank's own clock is the reference: every answer it sends carries `Date` (RFC 9110
//! §6.6.1). Each answer the client receives is a reading: this clock minus the bank's.
//! Between readings the wall clock is followed against the monotonic clock, so a jump or
//! a drift after the last reading moves the estimate with it. When there is no reading yet
//! (a new process) or the estimate is beyond the bound on a reading older than
//! [`REREAD_AFTER`], one lookup under the payout's own key reads the bank's clock again:
//! a harmless request, and the only one this check ever adds. A bank whose answers carry
//! no `Date` cannot be checked: the check is then off, and said so once in the log.

use std::sync::Mutex;
use std::time::Duration;

use http::header::{HeaderMap, DATE};
use time::OffsetDateTime;
use tokio::time::Instant;

/// How far an instance's wall clock may be from the bank's. The key window's margin (5
/// minutes) covers twice this (the clock that stamped `created_at` and the one that sends),
/// a request's timeout and `Date`'s rounding; a lease (120 s) covers the retry budget
/// (60 s), a request's timeout and twice this.
pub const MAX_CLOCK_ERROR: Duration = Duration::from_secs(25);

/// A reading older than this is taken again before a clock found beyond the bound is
/// refused: the clock may have been set right since (a paused VM catching up).
pub const REREAD_AFTER: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Reading {
    /// This clock when the answer arrived.
    wall: OffsetDateTime,
    /// The monotonic clock then.
    mono: Instant,
    /// This clock minus the bank's `Date`.
    error: time::Duration,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Reading>,
    /// An answer arrived without a usable `Date`, and none with one yet: no reading.
    dateless: bool,
    /// The unchecked clock was said in the log.
    said_unchecked: bool,
}

/// The readings of one process (shared by the clones of its bank client).
#[derive(Debug, Default)]
pub struct ClockCheck(Mutex<State>);

/// What the last reading says of this clock now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimate {
    /// No reading yet: the bank must be asked.
    Unread,
    /// The bank's answers carry no `Date`: nothing can be checked.
    Unchecked,
    /// This clock minus the bank's, now; `fresh`: the reading is recent.
    Off { error: time::Duration, fresh: bool },
}

impl ClockCheck {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes an answer's `Date` against this clock's `now` (when the answer arrived).
    pub fn note(&self, headers: &HeaderMap, now: OffsetDateTime) {
        self.note_at(headers, now, Instant::now())
    }

    fn note_at(&self, headers: &HeaderMap, now: OffsetDateTime, mono: Instant) {
        let date = headers
            .get(DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .map(OffsetDateTime::from);
        let mut state = self.state();
        match date {
            Some(bank) => {
                state.last = Some(Reading {
                    wall: now,
                    mono,
                    error: now - bank,
                });
                state.dateless = false;
            }
            None if state.last.is_none() => state.dateless = true,
            None => {}
        }
    }

    /// True the first time only: the log says once that the clock is unchecked.
    pub fn first_unchecked(&self) -> bool {
        !std::mem::replace(&mut self.state().said_unchecked, true)
    }

    /// This clock's error now, from the last reading and how far the wall clock moved
    /// since, against the monotonic clock.
    pub fn estimate(&self, now: OffsetDateTime) -> Estimate {
        self.estimate_at(now, Instant::now())
    }

    fn estimate_at(&self, now: OffsetDateTime, mono: Instant) -> Estimate {
        let state = self.state();
        let Some(r) = state.last else {
            return if state.dateless {
                Estimate::Unchecked
            } else {
                Estimate::Unread
            };
        };
        let elapsed = mono.saturating_duration_since(r.mono);
        let moved =
            (now - r.wall) - time::Duration::try_from(elapsed).unwrap_or(time::Duration::MAX);
        Estimate::Off {
            error: r.error + moved,
            fresh: elapsed < REREAD_AFTER,
        }
    }
}

/// Whether `error` is beyond the bound.
pub fn beyond(error: time::Duration) -> bool {
    error.unsigned_abs() > MAX_CLOCK_ERROR
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

    fn dated(at: OffsetDateTime) -> HeaderMap {
        let text = httpdate::fmt_http_date(at.into());
        HeaderMap::from_iter([(DATE, HeaderValue::from_str(&text).unwrap())])
    }

    fn at(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_767_225_600 + secs).unwrap()
    }

    #[test]
    fn a_jump_after_the_reading_moves_the_estimate() {
        let check = ClockCheck::default();
        let t0 = Instant::now();
        assert_eq!(check.estimate_at(at(0), t0), Estimate::Unread);
        check.note_at(&dated(at(0)), at(3), t0);
        let Estimate::Off { error, fresh } = check.estimate_at(at(3), t0) else {
            panic!("a reading")
        };
        assert_eq!((error.whole_seconds(), fresh), (3, true));
        assert!(!beyond(error));
        // Twenty seconds later on the monotonic clock, the wall clock says ten minutes.
        let later = t0 + Duration::from_secs(20);
        let Estimate::Off { error, fresh } = check.estimate_at(at(603), later) else {
            panic!("a reading")
        };
        assert_eq!((error.whole_seconds(), fresh), (583, false));
        assert!(beyond(error));
    }

    #[test]
    fn a_hostile_date_is_a_reading_beyond_the_bound_or_none_never_a_panic() {
        let t0 = Instant::now();
        // The protocol's extremes: the epoch and the last second of year 9999.
        for (date, years) in [
            ("Thu, 01 Jan 1970 00:00:00 GMT", 56),
            ("Fri, 31 Dec 9999 23:59:59 GMT", -7979),
        ] {
            let check = ClockCheck::default();
            let headers = HeaderMap::from_iter([(DATE, HeaderValue::from_static(date))]);
            check.note_at(&headers, at(0), t0);
            // Long after, on a clock that jumped a century: still an estimate, far off.
            let later = t0 + Duration::from_secs(3600);
            for now in [at(3600), at(3600 + 100 * 365 * 86_400)] {
                let Estimate::Off { error, .. } = check.estimate_at(now, later) else {
                    panic!("{date}: a reading")
                };
                assert!(beyond(error), "{date}: {error}");
            }
            let Estimate::Off { error, .. } = check.estimate_at(at(0), t0) else {
                panic!("{date}: a reading")
            };
            // This clock minus the bank's, in 365-day years.
            assert_eq!(error.whole_days() / 365, years, "{date}");
        }
        // Texts that are not an HTTP date are no reading, and do not replace one.
        let check = ClockCheck::default();
        for text in [
            "",
            "yesterday",
            "Fri, 31 Dec 10000 23:59:59 GMT",
            "Mon, 32 Jan 2026 00:00:00 GMT",
        ] {
            let headers = HeaderMap::from_iter([(DATE, HeaderValue::from_str(text).unwrap())]);
            check.note_at(&headers, at(0), t0);
        }
        assert_eq!(check.estimate_at(at(0), t0), Estimate::Unchecked);
        check.note_at(&dated(at(0)), at(2), t0);
        check.note_at(
            &HeaderMap::from_iter([(DATE, HeaderValue::from_static("yesterday"))]),
            at(2),
            t0,
        );
        assert!(matches!(
            check.estimate_at(at(2), t0),
            Estimate::Off { error, .. } if error.whole_seconds() == 2
        ));
    }

    #[test]
    fn answers_without_a_date_leave_the_clock_unchecked_until_one_has_it() {
        let check = ClockCheck::default();
        check.note(&HeaderMap::new(), at(0));
        assert_eq!(check.estimate(at(0)), Estimate::Unchecked);
        check.note(&dated(at(0)), at(-400));
        assert!(matches!(check.estimate(at(-400)), Estimate::Off { error, .. } if beyond(error)));
        // A later answer without Date keeps the reading.
        check.note(&HeaderMap::new(), at(0));
        assert!(matches!(check.estimate(at(-400)), Estimate::Off { .. }));
    }
}
