//! The bank's HTTP side: the axum router, the payout and lookup handlers (also under
//! `/clients/{client}/`), the control routes (`POST /_control/fail-next` among them),
//! the validation of a payout request's body against the contract, and the answers:
//! the JSON ones, those of the faults `faults` decides (recorded in the books of
//! `ledger`) and the cut connection. The top of the bank: it uses `faults` and `ledger`,
//! and neither uses it.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use rust_decimal::Decimal;

use super::faults::{self, BankFault, FaultAnswer, FaultEffect, PayoutFaults};
use super::ledger::{Arrival, Bank, KeyState, Step, ValidRequest};
use super::BankAnswer;

/// The payout API, its lookup, the same under `/clients/{client}/`, and the control
/// routes.
pub(super) fn router(bank: Arc<Bank>) -> Router {
    Router::new()
        .route("/payments", post(payments).get(lookup))
        .route("/_control/fail-next", post(fail_next))
        .route("/_control/payouts", axum::routing::get(payouts_of_claim))
        .route(
            "/clients/{client}/payments",
            post(client_payments).get(client_lookup),
        )
        .with_state(bank)
}

fn validate(body: &[u8]) -> Result<(serde_json::Value, ValidRequest), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let field = |name: &str| -> Result<String, String> {
        match value.get(name) {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(serde_json::Value::String(_)) => Err(format!("{name} is empty")),
            Some(other) => Err(format!("{name} must be a string, got {other}")),
            None => Err(format!("{name} is missing")),
        }
    };
    let claim_id = field("claimId")?;
    uuid::Uuid::try_parse(&claim_id).map_err(|_| format!("claimId {claim_id:?} is not a UUID"))?;
    let amount_text = field("amount")?;
    let amount = Decimal::from_str(&amount_text)
        .map_err(|_| format!("amount {amount_text:?} is not a decimal string"))?;
    if amount <= Decimal::ZERO || amount.normalize().scale() > 2 {
        return Err(format!(
            "amount {amount_text} must be positive with at most 2 fraction digits"
        ));
    }
    let currency = field("currency")?;
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("currency {currency:?} is not an ISO 4217 code"));
    }
    let payee = match value.get("payee") {
        None | Some(serde_json::Value::Null) => None,
        Some(_) => Some(field("payee")?),
    };
    let reference = match value.get("reference") {
        None => None,
        Some(_) => Some(field("reference")?),
    };
    Ok((
        value,
        ValidRequest {
            claim_id,
            amount,
            currency,
            payee,
            reference,
        },
    ))
}

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (status, axum::Json(value)).into_response()
}

fn error(status: StatusCode, message: &str, code: &str) -> Response {
    json(status, serde_json::json!({"error": message, "code": code}))
}

async fn payments(State(bank): State<Arc<Bank>>, headers: HeaderMap, body: Bytes) -> Response {
    pay_request(bank, None, headers, body).await
}

async fn client_payments(
    State(bank): State<Arc<Bank>>,
    Path(client): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    pay_request(bank, Some(client), headers, body).await
}

async fn client_lookup(
    State(bank): State<Arc<Bank>>,
    Path(_client): Path<String>,
    query: Query<LookupQuery>,
) -> Response {
    lookup(State(bank), query).await
}

async fn pay_request(
    bank: Arc<Bank>,
    client: Option<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let fault = bank.books().arrive(Arrival {
        idempotency_key: header("idempotency-key"),
        body: body.to_vec(),
        authorization: header("authorization"),
        traceparent: header("traceparent"),
        at: time::OffsetDateTime::now_utc(),
    });
    let key = header("idempotency-key")
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty() && k.len() <= 255);
    let past_timeout = faults::past_timeout(&bank.settings);
    let lose_answer = match apply_scripted(&bank, key.as_deref(), &body, fault.as_ref()).await {
        Scripted::Answered(response) => return response,
        Scripted::Proceed { lose_answer } => lose_answer,
    };
    let Some(key) = key else {
        bank.record(None, &body, BankAnswer::InvalidRequest, None);
        return error(
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key header (1 to 255 characters) is required",
            "idempotency_key_missing",
        );
    };
    let attempt = bank.books().faults.next_attempt(&key);
    if let Some(fault) = faults::seeded(&bank.settings, &key, attempt) {
        return fault_answer(&bank, Some(&key), &body, fault);
    }

    let (value, request) = match validate(&body) {
        Ok(ok) => ok,
        Err(problem) => {
            bank.record(Some(&key), &body, BankAnswer::InvalidRequest, None);
            return error(StatusCode::BAD_REQUEST, &problem, "invalid_request");
        }
    };

    let (step, identical) = bank
        .books()
        .step(&key, value, &body, bank.settings.key_window_ms);
    if let Step::New = step {
        return process_new(bank, key, body, request, attempt, client, lose_answer).await;
    }
    let response = answer_known_key(&bank, &key, &body, step, identical);
    if lose_answer {
        tokio::time::sleep(past_timeout).await;
    }
    response
}

/// What a scripted fault leaves to the rest of the request.
enum Scripted {
    /// The fault is the whole answer; nothing paid.
    Answered(Response),
    /// Handle the request; with `lose_answer`, answer after the client's timeout.
    Proceed { lose_answer: bool },
}

/// Applies the payout request's scripted fault (a `Slow` one waits here). `key` is the
/// request's valid Idempotency-Key, if any.
async fn apply_scripted(
    bank: &Bank,
    key: Option<&str>,
    body: &[u8],
    fault: Option<&BankFault>,
) -> Scripted {
    match fault.map(BankFault::effect) {
        Some(FaultEffect::Answer(fault)) => {
            Scripted::Answered(fault_answer(bank, key, body, fault))
        }
        Some(FaultEffect::Wait(wait)) => {
            tokio::time::sleep(wait).await;
            Scripted::Proceed { lose_answer: false }
        }
        Some(FaultEffect::LoseAnswer) => Scripted::Proceed { lose_answer: true },
        None => Scripted::Proceed { lose_answer: false },
    }
}

/// Records a fault's answer under `key` and gives it.
fn fault_answer(bank: &Bank, key: Option<&str>, body: &[u8], fault: FaultAnswer) -> Response {
    bank.record(key, body, fault.answer, None);
    let (message, code) = match fault.status {
        StatusCode::SERVICE_UNAVAILABLE => ("payment engine unavailable", "unavailable"),
        StatusCode::TOO_MANY_REQUESTS => ("slow down", "rate_limited"),
        _ => ("scripted by the test", "scripted"),
    };
    let mut response = error(fault.status, message, code);
    let retry_after = fault.retry_after.as_deref();
    if let Some(after) = retry_after.and_then(|a| header::HeaderValue::from_str(a).ok()) {
        response.headers_mut().insert(header::RETRY_AFTER, after);
    }
    response
}

/// The answer to a valid request under a key the bank already holds.
fn answer_known_key(
    bank: &Bank,
    key: &str,
    body: &[u8],
    step: Step,
    identical: Option<bool>,
) -> Response {
    match step {
        Step::Reused => {
            bank.record(Some(key), body, BankAnswer::KeyReused, Some(false));
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this Idempotency-Key was used with a different request body",
                "idempotency_key_reused",
            )
        }
        Step::InProgress => {
            bank.record(Some(key), body, BankAnswer::KeyInProgress, identical);
            error(
                StatusCode::CONFLICT,
                "a request with this Idempotency-Key is still being processed",
                "idempotency_key_in_use",
            )
        }
        Step::Replay(payment_id) => {
            bank.record(Some(key), body, BankAnswer::Replayed, identical);
            let mut response = json(
                StatusCode::OK,
                serde_json::json!({"paymentId": payment_id, "status": "paid"}),
            );
            response.headers_mut().insert(
                "idempotent-replayed",
                header::HeaderValue::from_static("true"),
            );
            response
        }
        Step::RejectedReplay => {
            bank.record(Some(key), body, BankAnswer::RejectedReplay, identical);
            error(
                StatusCode::PAYMENT_REQUIRED,
                "payee account closed",
                "account_closed",
            )
        }
        Step::New => unreachable!("handled above"),
    }
}

#[derive(serde::Deserialize)]
struct FailNext {
    count: u64,
}

/// Test control: the next `count` payout requests answer 503 and pay nothing (what was
/// scripted before is replaced). The 503 says how long the outage lasts (Retry-After): a
/// client honours it, so each request of the service meets exactly one of the failures.
async fn fail_next(State(bank): State<Arc<Bank>>, axum::Json(f): axum::Json<FailNext>) -> Response {
    let retry_after_secs = bank.settings.retry_after_secs;
    bank.books().faults.fail_next(f.count, retry_after_secs);
    json(StatusCode::OK, serde_json::json!({"failNext": f.count}))
}

#[derive(serde::Deserialize)]
struct ClaimQuery {
    #[serde(rename = "claimId")]
    claim_id: String,
}

/// Test control: how many payouts the bank made for a claim.
async fn payouts_of_claim(State(bank): State<Arc<Bank>>, Query(q): Query<ClaimQuery>) -> Response {
    let count = bank
        .books()
        .payouts
        .iter()
        .filter(|p| p.claim_id == q.claim_id)
        .count();
    json(StatusCode::OK, serde_json::json!({"count": count}))
}

#[derive(serde::Deserialize)]
struct LookupQuery {
    reference: Option<String>,
}

/// `GET /payments?reference=`: every payment the bank holds under that reference,
/// paid or refused, whether or not it still remembers the Idempotency-Key.
async fn lookup(State(bank): State<Arc<Bank>>, Query(q): Query<LookupQuery>) -> Response {
    let Some(reference) = q.reference.filter(|r| !r.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the reference query parameter is required",
            "invalid_request",
        );
    };
    // A test's failing lookups first, then the seed; the lookup is counted either way.
    let (n, failing) = bank.books().count_lookup();
    if failing || faults::seeded_lookup_failure(&bank.settings, &reference, n) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "lookup unavailable",
            "unavailable",
        );
    }
    let held = bank.books().held_under(&reference);
    json(StatusCode::OK, serde_json::Value::Array(held))
}

/// Processes a first request for a key. The work runs in its own task so it always
/// finishes (and the key never stays "processing") even if the client hangs up.
async fn process_new(
    bank: Arc<Bank>,
    key: String,
    body: Bytes,
    request: ValidRequest,
    attempt: u64,
    client: Option<String>,
    lose_answer: bool,
) -> Response {
    let PayoutFaults {
        latency,
        lost,
        lost_mode,
        kill_mid_payout,
        past_timeout,
    } = PayoutFaults::draw(&bank.settings, &key, attempt, lose_answer);
    let mid_payout = kill_mid_payout.then(|| bank.mid_payout_hook()).flatten();

    let work = tokio::spawn(async move {
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if request
            .payee
            .as_deref()
            .is_some_and(|p| p.starts_with("CLOSED"))
        {
            if let Some(entry) = bank.books().keys.get_mut(&key) {
                entry.state = KeyState::Rejected;
            }
            bank.record(Some(&key), &body, BankAnswer::Rejected, None);
            return error(
                StatusCode::PAYMENT_REQUIRED,
                "payee account closed",
                "account_closed",
            );
        }
        if lost && lost_mode == 0 {
            // Still "processing" when the client gives up; its retries meet 409.
            tokio::time::sleep(past_timeout).await;
            let id = bank.pay(&key, &request);
            bank.record(Some(&key), &body, BankAnswer::LostWhileProcessing, None);
            return paid(&id);
        }
        let id = bank.pay(&key, &request);
        if let Some(kill) = mid_payout {
            // The money moved; the handler that asked dies before it hears so.
            bank.record(Some(&key), &body, BankAnswer::LostAfterPay, None);
            kill(&key, client.as_deref());
            tokio::time::sleep(past_timeout).await;
            return paid(&id);
        }
        if lose_answer || (lost && lost_mode == 1) {
            bank.record(Some(&key), &body, BankAnswer::LostAfterPay, None);
            tokio::time::sleep(past_timeout).await;
            return paid(&id);
        }
        if lost {
            bank.record(Some(&key), &body, BankAnswer::CutAfterPay, None);
            return cut_answer();
        }
        bank.record(Some(&key), &body, BankAnswer::Paid, None);
        paid(&id)
    });
    work.await
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn paid(payment_id: &str) -> Response {
    json(
        StatusCode::CREATED,
        serde_json::json!({"paymentId": payment_id, "status": "paid"}),
    )
}

/// A 201 whose connection is cut in the middle of the body.
fn cut_answer() -> Response {
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
