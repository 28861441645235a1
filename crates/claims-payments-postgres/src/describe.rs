//! What an operator reads about a PostgreSQL error: the server's message, its SQLSTATE and
//! condition name, its detail and hint, and what to do; never a password (the server never
//! repeats it, and the URI is never part of the text). The bottom of the store's folder:
//! the pool, the schema check and the error classification all describe errors this way.

use tokio_postgres::error::{DbError, SqlState};

/// What an operator reads about a PostgreSQL error: for a server's answer its message, its
/// SQLSTATE, its detail and hint when it has them, and what to do; for a client-side one
/// (a broken connection, TLS) the chain of causes. tokio-postgres's own `Display` says only
/// "db error". Neither carries the password: the server never repeats it, and the URI is
/// never part of the text.
pub(super) fn describe_postgres_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => describe_db_error(db),
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

fn describe_db_error(db: &DbError) -> String {
    let code = db.code();
    let mut text = format!("{} (SQLSTATE {}", db.message(), code.code());
    if let Some(name) = condition_name(code) {
        text.push(' ');
        text.push_str(name);
    }
    text.push(')');
    if let Some(detail) = db.detail() {
        text.push_str("; detail: ");
        text.push_str(detail);
    }
    if let Some(hint) = db.hint() {
        text.push_str("; hint: ");
        text.push_str(hint);
    }
    if let Some(advice) = advice(code, db.message()) {
        text.push_str(". ");
        text.push_str(advice);
    }
    text
}

/// A refinery error: its step and, where the database refused it, the server's answer
/// (refinery wraps the tokio-postgres error, whose `Display` is only "db error").
pub(super) fn describe_refinery_error(e: &refinery::Error) -> String {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(pg) = cause.downcast_ref::<tokio_postgres::Error>() {
            return match e.kind() {
                refinery::error::Kind::Connection(step, _) => {
                    format!("{step}: {}", describe_postgres_error(pg))
                }
                _ => describe_postgres_error(pg),
            };
        }
        source = cause.source();
    }
    e.to_string()
}

/// The names of the conditions an operator meets (PostgreSQL's Appendix A), for the message.
fn condition_name(code: &SqlState) -> Option<&'static str> {
    let known = [
        (SqlState::INSUFFICIENT_PRIVILEGE, "insufficient_privilege"),
        (SqlState::INVALID_PASSWORD, "invalid_password"),
        (
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            "invalid_authorization_specification",
        ),
        (SqlState::UNDEFINED_DATABASE, "invalid_catalog_name"),
        (SqlState::UNDEFINED_TABLE, "undefined_table"),
        (SqlState::UNDEFINED_FUNCTION, "undefined_function"),
        (SqlState::UNDEFINED_COLUMN, "undefined_column"),
        (SqlState::INVALID_SCHEMA_NAME, "invalid_schema_name"),
        (
            SqlState::READ_ONLY_SQL_TRANSACTION,
            "read_only_sql_transaction",
        ),
        (SqlState::ADMIN_SHUTDOWN, "admin_shutdown"),
        (SqlState::CRASH_SHUTDOWN, "crash_shutdown"),
        (SqlState::CANNOT_CONNECT_NOW, "cannot_connect_now"),
        (SqlState::TOO_MANY_CONNECTIONS, "too_many_connections"),
        (SqlState::QUERY_CANCELED, "query_canceled"),
        (SqlState::LOCK_NOT_AVAILABLE, "lock_not_available"),
        (SqlState::DISK_FULL, "disk_full"),
        (SqlState::UNIQUE_VIOLATION, "unique_violation"),
    ];
    known
        .iter()
        .find(|(state, _)| state == code)
        .map(|(_, name)| *name)
}

/// What to do about an error that only an operator can fix, or that tells them to wait.
fn advice(code: &SqlState, message: &str) -> Option<&'static str> {
    Some(match code {
        c if *c == SqlState::INSUFFICIENT_PRIVILEGE
            && message.contains("refinery_schema_history") =>
        {
            "The role in PAYMENTS_POSTGRES_URL may not read the schema history: \
             GRANT SELECT ON refinery_schema_history to it, as docs/deploy.md (4.6, the app's \
             database role, step 3) shows"
        }
        c if *c == SqlState::INSUFFICIENT_PRIVILEGE => {
            "The role in PAYMENTS_POSTGRES_URL lacks a privilege: give it the grants \
             docs/deploy.md lists (4.6, the app's database role, steps 2 and 3: CONNECT, USAGE \
             on schema public, SELECT, INSERT, UPDATE, DELETE on the tables, SELECT on \
             refinery_schema_history); `claims-payments provision` needs a role that may create \
             in schema public (the database's owner)"
        }
        c if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            "The login was refused: check the user and password in PAYMENTS_POSTGRES_URL (with \
             PAYMENTS_POSTGRES_AUTH=entra: that the user is the identity's role name and the \
             role exists), and that the server's pg_hba rules admit this client"
        }
        c if *c == SqlState::UNDEFINED_DATABASE => {
            "The database in PAYMENTS_POSTGRES_URL does not exist: create it (docs/deploy.md, \
             4.6) or correct the name"
        }
        c if *c == SqlState::UNDEFINED_TABLE
            || *c == SqlState::UNDEFINED_FUNCTION
            || *c == SqlState::UNDEFINED_COLUMN
            || *c == SqlState::INVALID_SCHEMA_NAME =>
        {
            "The claims-payments schema is missing or not this build's: run \
             `claims-payments provision` of this release with the same settings"
        }
        c if *c == SqlState::READ_ONLY_SQL_TRANSACTION => {
            "The server takes no writes now (a standby, a failover in progress, or storage-full \
             protection): wait for it to become the primary again, or point \
             PAYMENTS_POSTGRES_URL at the primary"
        }
        c if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            "The server is shutting down, restarting or failing over: try again when it is back"
        }
        c if *c == SqlState::TOO_MANY_CONNECTIONS => {
            "The server has no connection slot left: raise its max_connections or run fewer \
             instances (each keeps up to 16 connections)"
        }
        _ => return None,
    })
}
