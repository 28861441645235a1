//! The SQLite store's own tests; the behaviour every store shares is the conformance
//! suite's.

use super::*;

fn database() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    drop(SqliteStore::open(&path).unwrap());
    (dir, path)
}

fn read_only(path: &Path) -> Connection {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn writable(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// Tests run as root, whom file permissions do not stop; a connection SQLite opened
/// read-only is what an unprivileged process gets on a read-only file, -wal, -shm or
/// directory (the end-to-end test covers the real case).
#[test]
fn the_start_up_probe_refuses_a_database_this_process_cannot_write() {
    let (_dir, path) = database();
    check_writable(&writable(&path)).expect("a writable database");

    let err = check_writable(&read_only(&path)).unwrap_err();
    assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::ReadOnly));
    let message = describe_open_error(&path, err.into()).to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("cannot be written"), "{message}");
    // The probe leaves nothing behind.
    let tables: i64 = read_only(&path)
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name LIKE '%probe%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0);
}

#[test]
fn sqlite_errors_that_retrying_cannot_heal_are_permanent() {
    let (_dir, path) = database();
    let readonly = read_only(&path)
        .execute("DELETE FROM inbox", [])
        .unwrap_err();
    assert!(
        matches!(map_sqlite_error(readonly), StoreError::Permanent(m) if m.contains("readonly")),
    );
    let failure = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
    for code in [
        rusqlite::ffi::SQLITE_CORRUPT,
        rusqlite::ffi::SQLITE_NOTADB,
        rusqlite::ffi::SQLITE_CANTOPEN,
    ] {
        assert!(
            matches!(map_sqlite_error(failure(code)), StoreError::Permanent(_)),
            "{code}"
        );
    }
    // A full disk heals when space is freed; a busy database when the other writer ends.
    for code in [rusqlite::ffi::SQLITE_FULL, rusqlite::ffi::SQLITE_BUSY] {
        assert!(
            matches!(map_sqlite_error(failure(code)), StoreError::Transient(_)),
            "{code}"
        );
    }
}

fn inbox_row(outcome: Option<&str>) -> InboxRow {
    InboxRow {
        consumer: "payments".into(),
        claim_id: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
        message_id: "evt-1".into(),
        payload_hash: "sha256:00".into(),
        status: "completed".into(),
        outcome: outcome.map(str::to_owned),
        owner: claims_payments_engine::store::AttemptId::new().to_string(),
        lease_until_ms: None,
        first_delivery_count: 1,
        last_delivery_count: 1,
        created_at_ms: 0,
        updated_at_ms: 0,
        expires_at_ms: 0,
        version: 1,
    }
}

#[test]
fn stored_outcomes_read_as_written_and_unknown_ones_are_a_store_error() {
    for stored in [
        "paid",
        "business-duplicate",
        "reconciled",
        r#"{"status":201}"#,
    ] {
        let record = inbox_row(Some(stored)).into_record().unwrap().record;
        assert_eq!(
            record.outcome.as_ref().map(InboxOutcome::as_str),
            Some(stored)
        );
    }
    assert_eq!(inbox_row(None).into_record().unwrap().record.outcome, None);
    let err = inbox_row(Some("lost")).into_record().unwrap_err();
    assert!(
        err.column == "outcome" && err.reason.contains("lost"),
        "{err}"
    );
}

fn payment_row(amount: &str, currency: &str, tenant: Option<&str>) -> PaymentRow {
    PaymentRow {
        claim_id: "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
        purpose: "payout".into(),
        tenant_id: tenant.map(str::to_owned),
        amount: amount.into(),
        currency: currency.into(),
        payee: Some("NL91ABNA0417164300".into()),
        payload_hash: "sha256:00".into(),
        message_id: "evt-1".into(),
        idempotency_key: "claim-payment-x".into(),
        payout_request: None,
        status: "recorded".into(),
        bank_payment_id: None,
        status_reason: None,
        created_at_ms: 0,
        updated_at_ms: 0,
        version: 1,
    }
}

#[test]
fn stored_payment_values_parse_strictly_and_a_bad_one_is_a_store_error() {
    let record = payment_row("1000", "JPY", Some("acme"))
        .into_record()
        .unwrap()
        .record;
    assert_eq!(record.money.amount_string(), "1000");
    assert_eq!(record.money.currency().code(), "JPY");
    assert_eq!(
        record.tenant_id.as_ref().map(TenantId::as_str),
        Some("acme")
    );
    for (amount, currency, tenant) in [
        ("12.5", "EUR", None),
        ("1e3", "EUR", None),
        ("12.50", "EURO", None),
        ("12.50", "EUR", Some("")),
    ] {
        let err = payment_row(amount, currency, tenant)
            .into_record()
            .unwrap_err();
        let column = match (amount, currency) {
            ("12.50", "EUR") => "tenant_id",
            ("12.50", _) => "currency",
            _ => "amount",
        };
        assert_eq!(err.column, column, "{amount} {currency} {tenant:?}: {err}");
        assert!(
            matches!(StoreError::from(err), StoreError::Permanent(m) if m.starts_with("corrupt payment in the database")),
            "{amount} {currency} {tenant:?}"
        );
    }
}
