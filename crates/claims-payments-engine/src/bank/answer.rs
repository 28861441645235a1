//! Reading the bank's answers: bounded, classified as the contract defines them, and
//! nothing of the bank's text kept beyond its tokens.

use super::*;

/// Reads one answer of the bank. Pure, and total: no status, header or body can make
/// it panic (a property test feeds it arbitrary ones).
pub(super) fn read_answer(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    secret: Option<&str>,
) -> Answer {
    let after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, now));
    classify(status, body, after, secret)
}

/// A token the contract lets us keep (`paymentId`, an error `code`): visible ASCII,
/// bounded, and never carrying the credential back.
pub(super) fn token<'a>(text: &'a str, secret: Option<&str>) -> Option<&'a str> {
    let ok = !text.is_empty()
        && text.len() <= MAX_TOKEN_CHARS
        && text.bytes().all(|b| b.is_ascii_graphic())
        && secret.is_none_or(|s| s.is_empty() || !text.contains(s));
    ok.then_some(text)
}

/// The bank's error `code` (`{"code": "..."}`), when the body has a usable one.
pub(super) fn error_code(body: &[u8], secret: Option<&str>) -> Option<String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        code: String,
    }
    let parsed: ErrorBody = serde_json::from_slice(body).ok()?;
    token(&parsed.code, secret).map(str::to_owned)
}

/// Where a JSON body stopped making sense, without quoting it.
pub(super) fn json_position(e: &serde_json::Error) -> String {
    format!("line {} column {}", e.line(), e.column())
}

/// Reads a lookup answer. Only a 200 whose body is a JSON array of entries the contract
/// allows, each under our reference, is an answer. The bank may normalise the
/// reference's letter case, so it is compared case-insensitively (our keys are ASCII).
/// An entry without a reference, or under another one (a bank that ignores the filter),
/// makes the whole answer unusable: trusting it could mark the claim paid with another
/// claim's payment, dropping it could read "nothing held" and pay again.
pub(super) fn read_lookup(
    status: StatusCode,
    body: &[u8],
    reference: &IdempotencyKey,
    secret: Option<&str>,
) -> Lookup {
    let unknown = |reason: String| Lookup::Unknown { reason };
    if status != StatusCode::OK {
        return unknown(match error_code(body, secret) {
            Some(code) => format!("lookup answered {status} (code {code})"),
            None => format!("lookup answered {status}"),
        });
    }
    let entries: Vec<LookupEntry> = match serde_json::from_slice(body) {
        Ok(entries) => entries,
        Err(e) => {
            return unknown(format!(
                "lookup answer is not a list of payments as the contract defines them (at {})",
                json_position(&e)
            ))
        }
    };
    let mut held = Vec::with_capacity(entries.len());
    for (n, entry) in entries.into_iter().enumerate() {
        let n = n + 1;
        match entry.reference.as_deref() {
            None => return unknown(format!("lookup entry {n} has no reference")),
            Some(r) if !r.eq_ignore_ascii_case(reference.as_str()) => {
                return unknown(format!(
                    "lookup entry {n} is under another reference: the bank ignored the filter"
                ))
            }
            Some(_) => {}
        }
        let Some(payment_id) = token(&entry.payment_id, secret) else {
            return unknown(format!("lookup entry {n} has an unusable paymentId"));
        };
        let Some(amount) = crate::domain::parse_decimal_amount(&entry.amount) else {
            return unknown(format!(
                "lookup entry {n} has an amount that is not a decimal"
            ));
        };
        let currency = entry.currency.as_str();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return unknown(format!(
                "lookup entry {n} has a currency that is not a code"
            ));
        }
        held.push(BankPayment {
            payment_id: payment_id.to_owned(),
            status: BankStatus::from_word(&entry.status),
            amount,
            currency: currency.to_owned(),
        });
    }
    Lookup::Holds(held)
}

/// The longest Retry-After honoured; anything longer is beyond every retry budget
/// (`RETRY_BUDGET_MS` is at most 10 minutes) and ends the attempt as given up.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` as delay-seconds or an HTTP date, capped at [`MAX_RETRY_AFTER`].
pub(super) fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The bank contract's answers (docs/reference.md §7), in one place. Of the body, only the
/// `paymentId` of a success and the `code` of an error are read.
pub(super) fn classify(
    status: StatusCode,
    body: &[u8],
    after: Option<Duration>,
    secret: Option<&str>,
) -> Answer {
    let described = || match error_code(body, secret) {
        Some(code) => format!("bank answered {status} (code {code})"),
        None => format!("bank answered {status}"),
    };
    if status.is_success() {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct PaidBody {
            payment_id: String,
        }
        let id = serde_json::from_slice::<PaidBody>(body).ok();
        return match id.as_ref().and_then(|b| token(&b.payment_id, secret)) {
            Some(payment_id) => Answer::Done(PayoutOutcome::Paid {
                payment_id: payment_id.to_owned(),
            }),
            // The bank may have paid; a replay of the key returns the id, so ask again.
            None => Answer::Retry {
                error: format!("bank answered {status} without a usable paymentId"),
                after: None,
            },
        };
    }
    match status.as_u16() {
        // The payment itself is refused: invalid instruction, funds, limits, closed account.
        400 | 402 => Answer::Done(PayoutOutcome::Rejected {
            status: status.as_u16(),
            reason: described(),
        }),
        // Same key still in progress, timeouts, throttling, the bank's own failures.
        408 | 409 | 429 | 500..=599 => Answer::Retry {
            error: described(),
            after,
        },
        422 => Answer::Done(PayoutOutcome::KeyMismatch {
            reason: format!("{} (same Idempotency-Key, different body)", described()),
        }),
        // 401, 403, 404, 405, 407, 413, 415, any other 4xx, and redirects (3xx): the
        // request was wrong, not the payment.
        _ => Answer::Done(PayoutOutcome::ServiceFault {
            status: status.as_u16(),
            reason: described(),
        }),
    }
}
