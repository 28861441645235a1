//! What only the PostgreSQL store has: its round trips, its schema check, its login and
//! error answers, and a server restart in the middle of work. On a real server (see
//! `claims_payments_testkit::postgres`); skipped with a SKIP line where there is none.

use std::sync::Arc;

use claims_payments::message::{ClaimId, Purpose};
use claims_payments::store::postgres::{provision, Access, PostgresSettings, PostgresStore};
use claims_payments::store::{AttemptId, ClaimResult, InboxStatus, Store, StoreError};
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::postgres::{available, connect, PgServer, TestDatabase};
use claims_payments_testkit::records::records;

async fn provisioned() -> (TestDatabase, PostgresSettings, Arc<PostgresStore>) {
    let db = TestDatabase::create().await;
    let settings = PostgresSettings::from_url(&db.url).unwrap();
    provision(&settings).await.unwrap();
    let store = PostgresStore::connect(&settings, Access::Checked)
        .await
        .unwrap();
    (db, settings, Arc::new(store))
}

/// Top-level statements the server ran in this database whose text contains `needle`,
/// counted by pg_stat_statements (None where the module is not loaded).
async fn server_calls(url: &str, needle: &str) -> Option<i64> {
    let client = connect(url).await.ok()?;
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .ok()?;
    let row = client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND query LIKE '%' || $1 || '%'",
            &[&needle],
        )
        .await
        .ok()?;
    Some(row.get(0))
}

/// The claim is one statement: a fresh message, a redelivery (the claim returns the inbox
/// row) and a business duplicate (it returns the payment) each cost one round trip, once
/// the statement is prepared on the connection. Counted by the adapter and, where
/// pg_stat_statements is loaded, by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_claim_a_duplicate_and_a_business_duplicate_are_one_statement_each() {
    if !available() {
        return;
    }
    let (db, _, store) = provisioned().await;
    // Prepares the statement on the (one) pooled connection.
    let warm_up = common::new_claim();
    let (inbox, payment) = records(&warm_up, "m-warm", AttemptId::new());
    store.claim(&inbox, &payment).await.unwrap();

    let claim = common::new_claim();
    let server_before = server_calls(&db.url, "claims_payments_claim(").await;
    let mut costs = Vec::new();
    for (message, expect) in [("m-1", "claimed"), ("m-1", "inbox"), ("m-2", "payment")] {
        let (inbox, payment) = records(&claim, message, AttemptId::new());
        let before = store.round_trips();
        let result = store.claim(&inbox, &payment).await.unwrap();
        costs.push(store.round_trips() - before);
        let kind = match result {
            ClaimResult::Claimed { .. } => "claimed",
            ClaimResult::InboxExists(_) => "inbox",
            ClaimResult::PaymentExists(_) => "payment",
        };
        assert_eq!(kind, expect, "{message}");
    }
    assert_eq!(
        costs,
        [1, 1, 1],
        "round trips: fresh, duplicate, business duplicate"
    );
    if let (Some(before), Some(after)) = (
        server_before,
        server_calls(&db.url, "claims_payments_claim(").await,
    ) {
        assert_eq!(
            after - before,
            3,
            "statements the server ran for the three claims"
        );
        println!("server-side: 3 claims ran as {} statements", after - before);
    } else {
        println!("pg_stat_statements not loaded: server-side count not taken");
    }
}

/// `POST /api/payments` with a new Idempotency-Key (ledger-only) costs three round trips:
/// the key record, the claim, the stored answer. The consumer hands back the payment it
/// wrote, so the answer is built without reading it again (that read would be a fourth).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_idempotency_key_costs_three_round_trips() {
    if !available() {
        return;
    }
    let (_db, _, store) = provisioned().await;
    let api = claims_payments::payments_api::PaymentsApi::new(
        common::ledger_consumer(store.clone()),
        claims_payments::payments_api::CallerAuth::FunctionKey,
        std::time::Duration::from_secs(3600),
    );
    let post = |key: &'static str| {
        let api = api.clone();
        async move {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("idempotency-key", key.parse().unwrap());
            let body = format!(
                r#"{{"claimId":"{}","amount":"12.00","currency":"EUR"}}"#,
                common::new_claim()
            );
            api.post(&headers, body.as_bytes()).await
        }
    };
    // Prepares the statements on the pooled connection.
    assert_eq!(post("warm-up").await.status, 201);
    let before = store.round_trips();
    let answer = post("new-key").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(store.round_trips() - before, 3);
}

/// A MessageId may hold any character, NUL included, which PostgreSQL text refuses: the
/// store keeps it as bytes and gives it back unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_with_a_nul_character_round_trips() {
    if !available() {
        return;
    }
    let (_db, _, store) = provisioned().await;
    let claim = common::new_claim();
    let (inbox, payment) = records(&claim, "evt\0-1", AttemptId::new());
    assert!(matches!(
        store.claim(&inbox, &payment).await.unwrap(),
        ClaimResult::Claimed { .. }
    ));
    let read = store
        .inbox(&inbox.key())
        .await
        .unwrap()
        .expect("the inbox row");
    assert_eq!(read.record.message_id.as_str(), "evt\0-1");
    let paid = store
        .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
        .await
        .unwrap()
        .expect("the payment");
    assert_eq!(paid.record.message_id.as_str(), "evt\0-1");
}

/// `serve` (and every command) refuses a database whose schema is missing, older or newer
/// than this build's, and says what to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_older_or_newer_schema_is_refused_naming_provision() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let settings = PostgresSettings::from_url(&db.url).unwrap();
    let refusal = |e: anyhow::Error| format!("{e:#}");

    let missing = refusal(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("no schema"),
    );
    assert!(missing.contains("no claims-payments schema"), "{missing}");
    assert!(missing.contains("claims-payments provision"), "{missing}");

    let report = provision(&settings).await.unwrap();
    assert_eq!(report.applied, ["V1__initial"], "{report}");
    let again = provision(&settings).await.unwrap();
    assert!(again.applied.is_empty(), "{again}");
    PostgresStore::connect(&settings, Access::Checked)
        .await
        .expect("this build's schema");

    let admin = connect(&db.url).await.unwrap();
    admin
        .batch_execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
             VALUES (2, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
        )
        .await
        .unwrap();
    let newer = refusal(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("a newer schema"),
    );
    assert!(newer.contains("newer than this build's 1"), "{newer}");

    admin
        .batch_execute("DELETE FROM refinery_schema_history")
        .await
        .unwrap();
    let older = refusal(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("an older schema"),
    );
    assert!(older.contains("older than this build's 1"), "{older}");
    assert!(older.contains("claims-payments provision"), "{older}");
}

/// A refused login says why and names the setting, without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_names_the_setting_and_never_the_password() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_password(Some("wrong-SECRET-pw")).unwrap();
    let settings = PostgresSettings::from_url(url.as_str()).unwrap();
    let error = format!(
        "{:#}",
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("a wrong password is refused")
    );
    assert!(error.contains("PAYMENTS_POSTGRES_URL"), "{error}");
    assert!(error.contains("password authentication failed"), "{error}");
    assert!(!error.contains("SECRET"), "{error}");
    let provision_error = format!("{:#}", provision(&settings).await.unwrap_err());
    assert!(!provision_error.contains("SECRET"), "{provision_error}");
}

/// A server that is gone answers Transient (the message is redelivered later), never
/// Permanent, once the call's outage wait (the default, 20 s) has run out; a restart
/// (`pg_ctl restart -m immediate`: every connection cut as in a crash) heals without
/// restarting the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_server_is_transient_and_its_restart_heals() {
    if !available() || !claims_payments_testkit::postgres::can_start_servers() {
        return;
    }
    let server = PgServer::start().unwrap();
    let settings = PostgresSettings::from_url(&server.url("postgres")).unwrap();
    provision(&settings).await.unwrap();
    let store = PostgresStore::connect(&settings, Access::Checked)
        .await
        .unwrap();
    let (inbox, payment) = records(&common::new_claim(), "m-before", AttemptId::new());
    store.claim(&inbox, &payment).await.unwrap();

    server.restart_immediate().unwrap();
    // The pooled connection died with the server: the first call may still meet it.
    let (inbox, payment) = records(&common::new_claim(), "m-after", AttemptId::new());
    match store.claim(&inbox, &payment).await {
        Ok(ClaimResult::Claimed { .. }) => {}
        Err(StoreError::Transient(_)) => {
            // Redelivered: the next call gets a new connection.
            assert!(matches!(
                store.claim(&inbox, &payment).await.unwrap(),
                ClaimResult::Claimed { .. } | ClaimResult::InboxExists(_)
            ));
        }
        other => panic!("expected the claim or Transient, got {other:?}"),
    }
    let stored = store.inbox(&inbox.key()).await.unwrap().expect("claimed");
    assert_eq!(stored.record.status, InboxStatus::InProgress);

    drop(server);
    let (inbox, payment) = records(&common::new_claim(), "m-gone", AttemptId::new());
    let gone = store.claim(&inbox, &payment).await;
    assert!(matches!(gone, Err(StoreError::Transient(_))), "{gone:?}");
}

/// The server crashes (`pg_ctl restart -m immediate`) while messages are being paid:
/// every message is redelivered until it ends, as Service Bus would, and each claim is
/// still paid exactly once at the bank, every payment ends `paid`, and no inbox record is
/// left in progress. No delivery is answered `store-failure`: a crash is transient.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_crash_mid_run_pays_each_claim_exactly_once_and_leaves_nothing_stuck() {
    use claims_payments::store::PaymentStatus;
    use claims_payments_testkit::bank::{FakeBank, FakeBankSettings};

    if !available() || !claims_payments_testkit::postgres::can_start_servers() {
        return;
    }
    const MESSAGES: usize = 24;
    /// A bound for a broken test; a message normally ends within a few deliveries.
    const MAX_DELIVERIES: u32 = 60;

    let server = PgServer::start().unwrap();
    let settings = PostgresSettings::from_url(&server.url("postgres")).unwrap();
    provision(&settings).await.unwrap();
    let store: claims_payments::store::DynStore = Arc::new(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .unwrap(),
    );
    // Payouts take a while, so the crash finds some of them at the bank.
    let bank = FakeBank::start_with(FakeBankSettings {
        latency_min_ms: 20,
        latency_max_ms: 100,
        ..FakeBankSettings::default()
    })
    .await
    .unwrap();
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        common::policy(),
        std::time::Duration::from_millis(500),
    );

    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..MESSAGES {
        let (consumer, done) = (consumer.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            // Staggered, so the crash meets messages at every step.
            tokio::time::sleep(std::time::Duration::from_millis(15 * n as u64)).await;
            let claim = common::new_claim();
            let msg = common::message(&claim, "42.00");
            let mut outcomes = Vec::new();
            for count in 1..=MAX_DELIVERIES {
                let outcome = common::deliver(&consumer, &msg, &format!("m-{n}"), count).await;
                outcomes.push(outcome);
                match outcome {
                    "paid" | "duplicate" => break,
                    "retry-later" => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                    other => panic!("message {n}: unexpected {other} after {outcomes:?}"),
                }
            }
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (claim, outcomes)
        }));
    }
    // The crash comes while messages are in flight: after the first ones ended, before all.
    claims_payments_testkit::wait::wait_until(
        std::time::Duration::from_secs(60),
        "the first messages are paid",
        || done.load(std::sync::atomic::Ordering::SeqCst) >= 3,
    )
    .await;
    let ended_before_crash = done.load(std::sync::atomic::Ordering::SeqCst);
    let server = tokio::task::spawn_blocking(move || {
        server.restart_immediate().unwrap();
        server
    })
    .await
    .unwrap();

    let mut retried = 0;
    for task in tasks {
        let (claim, outcomes) = task.await.unwrap();
        assert!(
            matches!(outcomes.last(), Some(&"paid" | &"duplicate")),
            "{claim}: never ended: {outcomes:?}"
        );
        retried += usize::from(outcomes.len() > 1);
        let payment = store
            .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
            .await
            .unwrap()
            .expect("the payment");
        assert_eq!(payment.record.status, PaymentStatus::Paid, "{claim}");
    }
    assert_eq!(bank.effective_payouts(), MESSAGES, "one payout per claim");
    let stuck: Vec<_> = store
        .list_inbox(1000)
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .filter(|r| r.status == InboxStatus::InProgress)
        .collect();
    assert!(stuck.is_empty(), "left in progress: {stuck:?}");
    println!(
        "{MESSAGES} messages, {ended_before_crash} ended before the crash, \
         {retried} needed a redelivery"
    );
    drop(server);
}

/// The retention purge deletes expired inbox records in batches of the given size (one
/// statement each), keeps live ones and never touches payments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_deletes_expired_records_in_bounded_batches() {
    use claims_payments::store::InboxRecord;

    if !available() {
        return;
    }
    let (_db, _, store) = provisioned().await;
    let now = time::OffsetDateTime::now_utc();
    let claim = common::new_claim();
    let (paid_inbox, payment) = records(&claim, "m-paid", AttemptId::new());
    store.claim(&paid_inbox, &payment).await.unwrap();
    for n in 0..5 {
        let (inbox, _) = records(&claim, &format!("m-old-{n}"), AttemptId::new());
        let expired = InboxRecord {
            expires_at: now - time::Duration::hours(1),
            ..inbox
        };
        store.record_handled(&expired).await.unwrap();
    }
    // Warm up the statement, so the count below is the batches alone.
    assert_eq!(
        store
            .purge_expired(now - time::Duration::days(1), 2)
            .await
            .unwrap(),
        0
    );
    let before = store.round_trips();
    assert_eq!(store.purge_expired(now, 2).await.unwrap(), 5);
    assert_eq!(
        store.round_trips() - before,
        3,
        "batches of 2, 2 and 1 (the short one ends the purge)"
    );
    let left: Vec<String> = store
        .list_inbox(100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().message_id.to_string())
        .collect();
    assert_eq!(
        left,
        [paid_inbox.message_id.to_string()],
        "the live record stays"
    );
    assert!(store
        .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
        .await
        .unwrap()
        .is_some());
}

/// An Entra credential that hands out the test server's password as its token, with a
/// chosen lifetime, and counts how often it was asked.
#[derive(Debug)]
struct CountingCredential {
    token: String,
    lifetime: time::Duration,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for CountingCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        assert_eq!(
            scopes,
            ["https://ossrdbms-aad.database.windows.net/.default"]
        );
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(azure_core::credentials::AccessToken::new(
            azure_core::credentials::Secret::new(self.token.clone()),
            time::OffsetDateTime::now_utc() + self.lifetime,
        ))
    }
}

/// With Entra login the token is the password of each new connection, and a connection
/// is not reused once its token is within five minutes of expiring: the next caller gets
/// a new connection with a new token, so no connection outlives its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entra_tokens_log_in_each_new_connection_which_retires_before_its_token_expires() {
    use claims_payments::store::postgres::pool;

    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    let password = url.password().unwrap().to_owned();
    url.set_password(None).unwrap();
    let settings = PostgresSettings::from_url(url.as_str()).unwrap();

    for (lifetime, expected_logins) in [
        // 60 minutes left: the connection is reused.
        (time::Duration::minutes(60), 1),
        // Inside the 5-minute margin: retired at once, the second caller logs in anew.
        (time::Duration::minutes(4), 2),
    ] {
        let credential = Arc::new(CountingCredential {
            token: password.clone(),
            lifetime,
            calls: Default::default(),
        });
        let manager = pool::Manager::with_credential(&settings, credential.clone()).unwrap();
        let pool = pool::build_with(manager, 1, std::time::Duration::from_secs(10)).unwrap();
        for _ in 0..2 {
            let conn = pool.get().await.expect("the token logs in as the password");
            let one: i32 = conn.client.query_one("SELECT 1", &[]).await.unwrap().get(0);
            assert_eq!(one, 1);
        }
        assert_eq!(
            credential.calls.load(std::sync::atomic::Ordering::SeqCst),
            expected_logins,
            "token lifetime {lifetime}"
        );
    }
}
