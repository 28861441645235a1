//! How Cosmos DB failures map onto [`StoreError`], and how each request is accounted
//! (request units, round trips, transient errors).
//!
//! Transient means "the broker should redeliver later": the SDK has already spent its own
//! bounded retries (honouring the server's retry-after) by the time an error gets here.

use azure_data_cosmos::CosmosError;

use claims_payments_engine::store::StoreError;
use claims_payments_engine::telemetry;

/// Status codes worth a later retry: timeouts (408, and the SDK's synthetic 408/20008),
/// partition moves (410), throttling (429), RetryWith (449), and server-side or transport
/// unavailability (500, 502, 503 including the SDK's synthetic transport 503s, 504).
/// 500 is included because the outcome of the message is decided by the state in the
/// store on redelivery, while a permanent answer would park a payment for a blip.
pub fn is_transient_code(code: u16) -> bool {
    matches!(code, 408 | 410 | 429 | 449 | 500 | 502 | 503 | 504)
}

/// Maps an SDK error of operation `op` to the store's error vocabulary.
pub fn classify(op: &'static str, error: &CosmosError) -> StoreError {
    let status = error.status();
    let code = u16::from(status.status_code());
    if code == 412 {
        return StoreError::PreconditionFailed;
    }
    let detail = describe(op, error);
    let transient = is_transient_code(code)
        // The account is failing over its write region; the SDK re-routes on retry.
        || status.is_write_forbidden()
        // A replica has not caught up with our session yet.
        || status.is_read_session_not_available();
    if transient {
        StoreError::Transient(detail)
    } else {
        StoreError::Permanent(detail)
    }
}

/// One line naming the operation, the status and sub-status, the server's retry-after
/// when there was one, and the first line of the SDK's message (never a credential: the
/// SDK does not put keys or tokens in error messages).
pub fn describe(op: &str, error: &CosmosError) -> String {
    let status = error.status();
    let code = u16::from(status.status_code());
    let mut text = format!("cosmos {op} failed with {code}");
    if let Some(sub) = status.sub_status() {
        text.push_str(&format!("/{}", sub.value()));
    }
    if let Some(name) = status.name() {
        text.push_str(&format!(" ({name})"));
    }
    if let Some(ms) = error.response().and_then(|r| r.headers().retry_after_ms) {
        text.push_str(&format!(", server asked to retry after {ms} ms"));
    }
    let message = error.to_string();
    let first_line = message.lines().next().unwrap_or_default();
    let mut first_line: String = first_line.chars().take(300).collect();
    if !first_line.is_empty() {
        first_line.insert_str(0, ": ");
        text.push_str(&first_line);
    }
    text
}

/// The request charge of a failed operation, retries included when diagnostics are present.
pub fn error_charge(error: &CosmosError) -> f64 {
    error
        .diagnostics()
        .map(|d| d.total_request_charge().value())
        .filter(|ru| *ru > 0.0)
        .or_else(|| {
            error
                .response()
                .and_then(|r| r.headers().request_charge)
                .map(|c| c.value())
        })
        .unwrap_or(0.0)
}

/// Records the charge of one operation in the process counters and the debug log.
pub fn record_charge(op: &'static str, request_units: f64, status: u16) {
    telemetry::counters()
        .cosmos_request_units
        .add(request_units);
    tracing::debug!(
        operation = op,
        requestUnits = request_units,
        status,
        "cosmos request"
    );
}

/// Counts a transient error in the process counters; returns the error unchanged.
pub fn note(error: StoreError) -> StoreError {
    if matches!(error, StoreError::Transient(_)) {
        telemetry::counters().store_transient_errors.inc();
    }
    error
}
