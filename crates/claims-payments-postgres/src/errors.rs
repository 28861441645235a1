//! How PostgreSQL's errors become the store's answers: what is retried here, what is an
//! outage that is waited for (a server that cannot take writes now, [`Outage`]) and whether
//! its statement may be sent again, what is `Transient` (redelivered) and what is
//! `Permanent` (an operator's). Descriptions name the SQLSTATE, the server's message and
//! what to do, never a password.

use tokio_postgres::error::SqlState;

use super::describe::describe_postgres_error;

use super::pool;
use claims_payments_engine::store::StoreError;
use claims_payments_engine::telemetry;

/// The SQLSTATE `claims_payments_finalize` raises when a version does not match (its
/// other one, CP404 for a missing payment, is `Permanent` like every unknown code).
const PRECONDITION_FAILED: &str = "CP412";

/// What went wrong with one statement, before it is classified.
pub(super) enum Failure {
    Pool(deadpool::managed::PoolError<pool::ConnectError>),
    Postgres(tokio_postgres::Error),
    /// No answer within this budget.
    Timeout(std::time::Duration),
}

impl Failure {
    /// For logs: the cause, as an operator reads it.
    pub(super) fn describe(&self) -> String {
        match self {
            Failure::Pool(e) => describe_pool_error(e),
            Failure::Postgres(e) => describe_postgres_error(e),
            Failure::Timeout(budget) => format!("no answer within {budget:?}"),
        }
    }

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

/// What a failed statement says about the server, and about the statement itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outage {
    /// Not an outage: an answer about this statement (or load), classified as usual.
    No,
    /// The server cannot take the statement now, and it certainly did not commit: it was
    /// refused before it ran, or never sent. Sending it again is safe, a write too.
    NotRun,
    /// The connection broke, or the server shut down, while the statement ran: a write may
    /// have committed.
    Unknown,
}

/// Classifies a failed statement. `code`: the server's SQLSTATE, if it answered; `lost`:
/// without one, whether the connection is gone (closed, an I/O error, no answer within
/// the statement's budget) rather than a client-side error of ours; `sent`: whether the
/// statement's Execute was sent (a failure while preparing it means it never ran).
pub(super) fn outage(code: Option<&SqlState>, lost: bool, sent: bool) -> Outage {
    let Some(code) = code else {
        return match (lost, sent) {
            (false, _) => Outage::No,
            (true, false) => Outage::NotRun,
            (true, true) => Outage::Unknown,
        };
    };
    // 25006: a server that is read-only (a standby, a failover or promotion in progress,
    // storage-full protection) refuses the statement's first write, and the statement's
    // transaction rolls back. 57P03 and the connect-phase 08s: no session to run it in.
    if *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION
        || *code == SqlState::SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION
    {
        return Outage::NotRun;
    }
    // The backend was terminated, or the connection failed, at a moment we cannot know:
    // before the statement ran, or after its commit and before the answer.
    if *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || code.code().starts_with("08")
    {
        return if sent {
            Outage::Unknown
        } else {
            Outage::NotRun
        };
    }
    Outage::No
}

/// Whether a statement's error without a SQLSTATE means that its connection is gone.
pub(super) fn connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.code().is_some() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        source = cause.source();
    }
    e.is_closed()
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
    if e.code().map(SqlState::code) == Some(PRECONDITION_FAILED) {
        return StoreError::PreconditionFailed;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_cannot_take_writes_is_an_outage_and_only_a_refusal_is_resent() {
        use Outage::*;
        let read_only = SqlState::READ_ONLY_SQL_TRANSACTION;
        for sent in [false, true] {
            assert_eq!(outage(Some(&read_only), false, sent), NotRun);
            assert_eq!(
                outage(Some(&SqlState::CANNOT_CONNECT_NOW), false, sent),
                NotRun
            );
        }
        for code in [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
        ] {
            assert_eq!(outage(Some(&code), false, true), Unknown, "{code:?}");
            assert_eq!(outage(Some(&code), false, false), NotRun, "{code:?}");
        }
        assert_eq!(outage(None, true, true), Unknown, "lost mid-statement");
        assert_eq!(outage(None, true, false), NotRun, "lost while preparing");
        assert_eq!(outage(None, false, true), No, "a client-side error");
        for code in [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::QUERY_CANCELED,
            SqlState::UNIQUE_VIOLATION,
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::TOO_MANY_CONNECTIONS,
        ] {
            assert_eq!(outage(Some(&code), false, true), No, "{code:?}");
        }
    }
}
