//! How PostgreSQL's errors become the store's answers: what is retried here, what is
//! waited for (a server that cannot be reached), what is `Transient` (redelivered) and what
//! is `Permanent` (an operator's). Descriptions name the server's reason, never a password.

use tokio_postgres::error::SqlState;

use super::pool;
use crate::store::StoreError;
use crate::telemetry;

/// Custom SQLSTATEs raised by `claims_payments_finalize`.
const PRECONDITION_FAILED: &str = "CP412";
const PAYMENT_MISSING: &str = "CP404";

/// What went wrong with one statement, before it is classified.
pub(super) enum Failure {
    Pool(deadpool::managed::PoolError<pool::ConnectError>),
    Postgres(tokio_postgres::Error),
    /// No answer within this budget.
    Timeout(std::time::Duration),
}

impl Failure {
    pub(super) fn into_store_error(self) -> StoreError {
        let error = match self {
            Failure::Pool(e) => pool_error(&e),
            Failure::Postgres(e) => map_postgres_error(&e),
            Failure::Timeout(budget) => {
                StoreError::Transient(format!("PostgreSQL did not answer within {budget:?}"))
            }
        };
        if matches!(error, StoreError::Transient(_)) {
            telemetry::counters().store_transient_errors.inc();
        }
        error
    }
}

/// Whether a pool error means that no connection to the server could be made at all:
/// what a failover or a restart looks like. A full pool (every connection busy) is load,
/// not an outage; a refused login or a missing database is permanent.
pub(super) fn unreachable(e: &deadpool::managed::PoolError<pool::ConnectError>) -> bool {
    use deadpool::managed::{PoolError, TimeoutType};
    match e {
        PoolError::Timeout(TimeoutType::Wait) => false,
        PoolError::Timeout(_) => true,
        other => matches!(pool_error(other), StoreError::Transient(_)),
    }
}

pub(super) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

pub(super) fn describe_pool_error(e: &deadpool::managed::PoolError<pool::ConnectError>) -> String {
    use deadpool::managed::PoolError;
    match e {
        PoolError::Timeout(kind) => format!("timed out ({kind:?})"),
        PoolError::Backend(e) => describe_connect_error(e),
        PoolError::Closed => "the pool is closed".into(),
        PoolError::NoRuntimeSpecified => "no runtime for the pool's timeouts".into(),
        PoolError::PostCreateHook(e) => e.to_string(),
    }
}

/// tokio-postgres's `Display` says only "db error" for a server's refusal: the server's
/// message says why (it never contains the password).
pub(super) fn describe_connect_error(e: &pool::ConnectError) -> String {
    match e {
        pool::ConnectError::Postgres(e) => describe_postgres_error(e),
        other => other.to_string(),
    }
}

pub(super) fn describe_postgres_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

pub(super) fn pool_error(e: &deadpool::managed::PoolError<pool::ConnectError>) -> StoreError {
    use deadpool::managed::PoolError;
    let text = format!("PostgreSQL: {}", describe_pool_error(e));
    match e {
        // Every connection busy, or a connection attempt that did not finish: heals.
        PoolError::Timeout(_) => StoreError::Transient(text),
        PoolError::Backend(pool::ConnectError::Postgres(e)) => match map_postgres_error(e) {
            StoreError::Permanent(_) => StoreError::Permanent(text),
            _ => StoreError::Transient(text),
        },
        PoolError::Backend(pool::ConnectError::Timeout(_)) => StoreError::Transient(text),
        // A setting to change (PAYMENTS_POSTGRES_POOLER or the port), not a passing state.
        PoolError::Backend(pool::ConnectError::Pooled { .. }) => StoreError::Permanent(text),
        // The identity endpoint may be briefly unavailable; a wrong identity is reported
        // at start-up, where the first connection is made.
        PoolError::Backend(pool::ConnectError::Token(_)) => StoreError::Transient(text),
        PoolError::Closed | PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
            StoreError::Permanent(text)
        }
    }
}

/// Transient: what heals while the message waits for its redelivery. Permanent: what only
/// an operator can fix (credentials, a missing schema, our own statements or data).
pub(super) fn map_postgres_error(e: &tokio_postgres::Error) -> StoreError {
    let text = format!("PostgreSQL: {}", describe_postgres_error(e));
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection broke (I/O error, closed, TLS) or a client-side
        // problem. A broken connection heals with a new one.
        return StoreError::Transient(text);
    };
    let class = &code.code()[..2];
    let transient = matches!(
        class,
        // connection exception, transaction rollback (serialization, deadlock),
        // insufficient resources (too many connections, disk full, out of memory),
        // operator intervention (shutdown, statement timeout, cannot connect now)
        "08" | "40" | "53" | "57"
    ) || *code == SqlState::READ_ONLY_SQL_TRANSACTION // 25006: a replica, or mid-failover
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || *code == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT;
    if transient {
        StoreError::Transient(text)
    } else {
        StoreError::Permanent(text)
    }
}

/// Maps a statement error from the finalize function: its own SQLSTATEs first.
pub(super) fn map_finalize_error(e: StoreError, raw: Option<&str>) -> StoreError {
    match raw {
        Some(PRECONDITION_FAILED) => StoreError::PreconditionFailed,
        Some(PAYMENT_MISSING) => e,
        _ => e,
    }
}
