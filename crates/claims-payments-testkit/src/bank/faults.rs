//! What goes wrong at the bank, and when: the faults a test scripts (and
//! `POST /_control/fail-next`), applied first, then those decided per (key, attempt)
//! from the seed of [`FakeBankSettings`], so that two runs with one seed fail alike.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::ledger::Bank;
use super::routes::{error, json};
use super::{BankAnswer, FakeBankSettings, MidPayoutHook};
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
}

/// A lost answer arrives this long after the request, i.e. after the client gave up.
pub(super) fn past_timeout(settings: &FakeBankSettings) -> Duration {
    Duration::from_millis(settings.client_timeout_ms + 200)
}

/// What a scripted fault leaves to the rest of the request.
pub(super) enum Scripted {
    /// The fault is the whole answer; nothing paid.
    Answered(Response),
    /// Handle the request; with `lose_answer`, answer after the client's timeout.
    Proceed { lose_answer: bool },
}

/// Applies the payout request's scripted fault (a `Slow` one waits here). `key` is the
/// request's valid Idempotency-Key, if any.
pub(super) async fn apply_scripted(
    bank: &Bank,
    key: Option<&str>,
    body: &[u8],
    fault: Option<&BankFault>,
) -> Scripted {
    let scripted = |answer: BankAnswer, status: StatusCode, retry_after: Option<&str>| {
        bank.record(key, body, answer, None);
        let (message, code) = match status {
            StatusCode::SERVICE_UNAVAILABLE => ("payment engine unavailable", "unavailable"),
            StatusCode::TOO_MANY_REQUESTS => ("slow down", "rate_limited"),
            _ => ("scripted by the test", "scripted"),
        };
        let mut response = error(status, message, code);
        if let Some(after) = retry_after.and_then(|a| header::HeaderValue::from_str(a).ok()) {
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        Scripted::Answered(response)
    };
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let throttled = StatusCode::TOO_MANY_REQUESTS;
    match fault {
        Some(BankFault::Unavailable) => scripted(BankAnswer::Injected5xx, unavailable, None),
        Some(BankFault::UnavailableFor(after)) => {
            scripted(BankAnswer::Injected5xx, unavailable, Some(after))
        }
        Some(BankFault::Throttled) => scripted(BankAnswer::Injected429, throttled, Some("0")),
        Some(BankFault::ThrottledFor(after)) => {
            scripted(BankAnswer::Injected429, throttled, Some(after))
        }
        Some(BankFault::Reject) => {
            scripted(BankAnswer::Scripted(400), StatusCode::BAD_REQUEST, None)
        }
        Some(BankFault::Status(status)) => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::IM_A_TEAPOT);
            scripted(BankAnswer::Scripted(*status), code, None)
        }
        Some(BankFault::Slow(wait)) => {
            tokio::time::sleep(*wait).await;
            Scripted::Proceed { lose_answer: false }
        }
        Some(BankFault::LoseAnswer) => Scripted::Proceed { lose_answer: true },
        None => Scripted::Proceed { lose_answer: false },
    }
}

/// The seeded 503 or 429 for this attempt under `key`, recorded, if the seed draws one.
pub(super) fn seeded(bank: &Bank, key: &str, body: &[u8], attempt: u64) -> Option<Response> {
    let s = &bank.settings;
    let k = key.as_bytes();
    if chance::hit(s.error_5xx_rate, s.seed, "bank-5xx", k, attempt) {
        bank.record(Some(key), body, BankAnswer::Injected5xx, None);
        return Some(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "payment engine unavailable",
            "unavailable",
        ));
    }
    if chance::hit(s.rate_429, s.seed, "bank-429", k, attempt) {
        bank.record(Some(key), body, BankAnswer::Injected429, None);
        let mut response = error(StatusCode::TOO_MANY_REQUESTS, "slow down", "rate_limited");
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(s.retry_after_secs),
        );
        return Some(response);
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
    /// Set when this payout kills its caller once paid.
    pub(super) mid_payout: Option<MidPayoutHook>,
    pub(super) past_timeout: Duration,
}

impl PayoutFaults {
    /// `lose_answer`: a scripted [`BankFault::LoseAnswer`], which replaces the seeded
    /// lost answer.
    pub(super) fn draw(bank: &Bank, key: &str, attempt: u64, lose_answer: bool) -> Self {
        let s = &bank.settings;
        let k = key.as_bytes();
        let spread = s.latency_max_ms.saturating_sub(s.latency_min_ms);
        let latency = s.latency_min_ms + chance::upto(spread, s.seed, "bank-latency", k, attempt);
        let lost = !lose_answer && chance::hit(s.lost_answer_rate, s.seed, "bank-lost", k, attempt);
        let lost_mode = chance::upto(2, s.seed, "bank-lost-mode", k, attempt);
        let past_timeout = past_timeout(s);
        let mid_payout = chance::hit(
            s.kill_mid_payout_rate,
            s.seed,
            "bank-kill-mid-payout",
            k,
            attempt,
        )
        .then(|| bank.mid_payout.lock().ok().and_then(|h| h.clone()))
        .flatten();
        PayoutFaults {
            latency,
            lost,
            lost_mode,
            mid_payout,
            past_timeout,
        }
    }
}

/// A 201 whose connection is cut in the middle of the body.
pub(super) fn cut_answer() -> Response {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"{\"paymentId\":\"pay-")),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "sandbox bank cut the connection",
        )),
    ];
    Response::builder()
        .status(StatusCode::CREATED)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Whether this lookup answers 503: a test's failing lookups first, then the seed.
/// Counts the lookup either way.
pub(super) fn lookup_fails(bank: &Bank, reference: &str) -> bool {
    let s = &bank.settings;
    let (n, failing) = {
        let mut books = bank.books();
        books.lookups += 1;
        let failing = books.faults.failing_lookups > 0;
        books.faults.failing_lookups = books.faults.failing_lookups.saturating_sub(1);
        (books.lookups, failing)
    };
    failing
        || chance::hit(
            s.lookup_5xx_rate,
            s.seed,
            "bank-lookup-5xx",
            reference.as_bytes(),
            n,
        )
}

#[derive(serde::Deserialize)]
pub(super) struct FailNext {
    count: u64,
}

/// Test control: the next `count` payout requests answer 503 and pay nothing (what was
/// scripted before is replaced). The 503 says how long the outage lasts (Retry-After): a
/// client honours it, so each request of the service meets exactly one of the failures.
pub(super) async fn fail_next(
    State(bank): State<Arc<Bank>>,
    axum::Json(f): axum::Json<FailNext>,
) -> Response {
    let after = BankFault::UnavailableFor(bank.settings.retry_after_secs.to_string());
    bank.books().faults.script = std::iter::repeat_n(after, f.count as usize).collect();
    json(StatusCode::OK, serde_json::json!({"failNext": f.count}))
}
