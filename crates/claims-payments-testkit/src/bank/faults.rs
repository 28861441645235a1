//! What goes wrong at the bank, and when, decided apart from the books and from HTTP
//! (this module uses no other module of the bank): the fault state the books keep (the
//! faults a test scripts, `POST /_control/fail-next` included, applied first; the
//! failing lookups; the attempt count per key) and the faults decided per (key, attempt)
//! from the seed of [`FakeBankSettings`], so that two runs with one seed fail alike.
//! `routes` turns each decision into an answer and `ledger` records it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use axum::http::StatusCode;

use super::{BankAnswer, FakeBankSettings};
use crate::chance;

/// What a test makes the bank do with the next payout request, before the seeded
/// faults and before the request is read.
#[derive(Debug, Clone, PartialEq)]
pub enum BankFault {
    /// 503 without paying.
    Unavailable,
    /// 503 with this Retry-After value, without paying.
    UnavailableFor(String),
    /// 429 with Retry-After: 0, without paying.
    Throttled,
    /// 429 with this Retry-After value, without paying.
    ThrottledFor(String),
    /// Handles the request, then answers after the client's timeout
    /// ([`FakeBankSettings::client_timeout_ms`]): a new key is paid and the client never
    /// learns it.
    LoseAnswer,
    /// 400: a definite rejection, without paying.
    Reject,
    /// Answers this status without paying (401, 404, 402, ...).
    Status(u16),
    /// Waits this long before handling the request normally (the bank has not seen
    /// the key yet while it waits).
    Slow(Duration),
}

/// An answer a fault gives instead of handling the request; nothing is paid.
pub(super) struct FaultAnswer {
    /// What the bank records it answered.
    pub(super) answer: BankAnswer,
    pub(super) status: StatusCode,
    /// The Retry-After header, if any (left out if it is not a valid header value).
    pub(super) retry_after: Option<String>,
}

/// What a scripted fault does to the payout request it takes.
pub(super) enum FaultEffect {
    /// The fault is the whole answer.
    Answer(FaultAnswer),
    /// Waits this long, then the request is handled normally.
    Wait(Duration),
    /// The request is handled, then answered after the client's timeout.
    LoseAnswer,
}

impl BankFault {
    /// What this fault does to the payout request it takes.
    pub(super) fn effect(&self) -> FaultEffect {
        let answer = |answer: BankAnswer, status: StatusCode, retry_after: Option<&str>| {
            FaultEffect::Answer(FaultAnswer {
                answer,
                status,
                retry_after: retry_after.map(str::to_owned),
            })
        };
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        let throttled = StatusCode::TOO_MANY_REQUESTS;
        match self {
            BankFault::Unavailable => answer(BankAnswer::Injected5xx, unavailable, None),
            BankFault::UnavailableFor(after) => {
                answer(BankAnswer::Injected5xx, unavailable, Some(after))
            }
            BankFault::Throttled => answer(BankAnswer::Injected429, throttled, Some("0")),
            BankFault::ThrottledFor(after) => {
                answer(BankAnswer::Injected429, throttled, Some(after))
            }
            BankFault::Reject => answer(BankAnswer::Scripted(400), StatusCode::BAD_REQUEST, None),
            BankFault::Status(status) => {
                let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::IM_A_TEAPOT);
                answer(BankAnswer::Scripted(*status), code, None)
            }
            BankFault::Slow(wait) => FaultEffect::Wait(*wait),
            BankFault::LoseAnswer => FaultEffect::LoseAnswer,
        }
    }
}

/// The fault state kept in the books.
#[derive(Debug, Default)]
pub(super) struct FaultState {
    /// Faults for the next payout requests, in order.
    pub(super) script: VecDeque<BankFault>,
    /// Applied to every payout request once the script is empty.
    pub(super) always: Option<BankFault>,
    /// Lookups still to answer 503, before the seeded lookup faults.
    pub(super) failing_lookups: u64,
    /// Requests per Idempotency-Key: the attempt number the seeded faults are drawn for.
    attempts: HashMap<String, u64>,
}

impl FaultState {
    /// The fault for the payout request that just arrived: the script's next one, else
    /// the standing one.
    pub(super) fn next_payout_fault(&mut self) -> Option<BankFault> {
        self.script.pop_front().or_else(|| self.always.clone())
    }

    /// Counts a request under `key` and returns its attempt number (1 for the first).
    pub(super) fn next_attempt(&mut self, key: &str) -> u64 {
        let n = self.attempts.entry(key.to_owned()).or_insert(0);
        *n += 1;
        *n
    }

    /// `POST /_control/fail-next`: the next `count` payout requests answer 503 with
    /// Retry-After `retry_after_secs` and pay nothing; what was scripted before is
    /// replaced.
    pub(super) fn fail_next(&mut self, count: u64, retry_after_secs: u64) {
        let after = BankFault::UnavailableFor(retry_after_secs.to_string());
        self.script = std::iter::repeat_n(after, count as usize).collect();
    }

    /// Whether a lookup takes one of the failing lookups a test asked for (and uses it).
    pub(super) fn take_failing_lookup(&mut self) -> bool {
        let failing = self.failing_lookups > 0;
        self.failing_lookups = self.failing_lookups.saturating_sub(1);
        failing
    }
}

/// A lost answer arrives this long after the request, i.e. after the client gave up.
pub(super) fn past_timeout(settings: &FakeBankSettings) -> Duration {
    Duration::from_millis(settings.client_timeout_ms + 200)
}

/// The seeded 503 or 429 for this attempt under `key`, if the seed draws one.
pub(super) fn seeded(settings: &FakeBankSettings, key: &str, attempt: u64) -> Option<FaultAnswer> {
    let s = settings;
    let k = key.as_bytes();
    if chance::hit(s.error_5xx_rate, s.seed, "bank-5xx", k, attempt) {
        return Some(FaultAnswer {
            answer: BankAnswer::Injected5xx,
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: None,
        });
    }
    if chance::hit(s.rate_429, s.seed, "bank-429", k, attempt) {
        return Some(FaultAnswer {
            answer: BankAnswer::Injected429,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(s.retry_after_secs.to_string()),
        });
    }
    None
}

/// The seeded faults of a new payout, drawn before its work starts.
pub(super) struct PayoutFaults {
    /// Processing time in milliseconds.
    pub(super) latency: u64,
    /// The answer is lost, as `lost_mode` says: 0 stays "processing" past the client's
    /// timeout, 1 answers after it, 2 cuts the connection mid-body.
    pub(super) lost: bool,
    pub(super) lost_mode: u64,
    /// Whether this payout kills its caller once paid (if a hook is set, see
    /// `FakeBank::on_mid_payout`).
    pub(super) kill_mid_payout: bool,
    pub(super) past_timeout: Duration,
}

impl PayoutFaults {
    /// `lose_answer`: a scripted [`BankFault::LoseAnswer`], which replaces the seeded
    /// lost answer.
    pub(super) fn draw(
        settings: &FakeBankSettings,
        key: &str,
        attempt: u64,
        lose_answer: bool,
    ) -> Self {
        let s = settings;
        let k = key.as_bytes();
        let spread = s.latency_max_ms.saturating_sub(s.latency_min_ms);
        let latency = s.latency_min_ms + chance::upto(spread, s.seed, "bank-latency", k, attempt);
        let lost = !lose_answer && chance::hit(s.lost_answer_rate, s.seed, "bank-lost", k, attempt);
        let lost_mode = chance::upto(2, s.seed, "bank-lost-mode", k, attempt);
        let past_timeout = past_timeout(s);
        let kill_mid_payout = chance::hit(
            s.kill_mid_payout_rate,
            s.seed,
            "bank-kill-mid-payout",
            k,
            attempt,
        );
        PayoutFaults {
            latency,
            lost,
            lost_mode,
            kill_mid_payout,
            past_timeout,
        }
    }
}

/// Whether the seed makes the `n`th lookup (counted from 1), under `reference`,
/// answer 503.
pub(super) fn seeded_lookup_failure(settings: &FakeBankSettings, reference: &str, n: u64) -> bool {
    chance::hit(
        settings.lookup_5xx_rate,
        settings.seed,
        "bank-lookup-5xx",
        reference.as_bytes(),
        n,
    )
}
