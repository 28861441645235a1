//! What only the PostgreSQL store has: its round trips, its schema check, its login and
//! error answers, and a server restart in the middle of work. On a real server (see
//! `claims_payments_testkit::postgres`); skipped with a SKIP line where there is none.

use std::sync::Arc;

use claims_payments::seams::store::{
    AttemptId, ClaimResult, InboxStatus, PaymentStatus, Store, StoreError,
};
use claims_payments::{ClaimId, Purpose};
use claims_payments_postgres::{provision, Access, PostgresSettings, PostgresStore};
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
    let services = common::ledger_services(store.clone());
    let api = claims_payments::seams::payments_api::PaymentsApi::new(
        services.consumer(),
        &services,
        claims_payments::seams::payments_api::CallerAuth::FunctionKey,
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
    assert_eq!(report.applied, ["V1__initial", "V2__effects"], "{report}");
    let again = provision(&settings).await.unwrap();
    assert!(again.applied.is_empty(), "{again}");
    PostgresStore::connect(&settings, Access::Checked)
        .await
        .expect("this build's schema");

    let admin = connect(&db.url).await.unwrap();
    admin
        .batch_execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
             VALUES (3, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
        )
        .await
        .unwrap();
    let newer = refusal(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("a newer schema"),
    );
    assert!(newer.contains("newer than this build's 2"), "{newer}");

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
    assert!(older.contains("older than this build's 2"), "{older}");
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
    let store: claims_payments::seams::store::DynStore = Arc::new(
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
    use claims_payments::seams::store::InboxRecord;

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
    use claims_payments_postgres::pool;

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

/// Makes the whole server read-only (`default_transaction_read_only`, what a standby
/// mid-promotion, a failover in progress or storage-full protection looks like to a
/// client), or writable again, as its superuser. Returns once a new session sees it: the
/// postmaster has then re-read its configuration and signalled every backend, so the
/// sessions already open (pooled ones included) apply it from their next statement on.
async fn set_read_only(admin_url: &str, on: bool) {
    let want = if on { "on" } else { "off" };
    let admin = connect(admin_url).await.unwrap();
    // Two statements: ALTER SYSTEM refuses to run in a transaction block.
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {want}"
        ))
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // A bound for a broken test, not a speed check.
    for _ in 0..600 {
        if let Ok(client) = connect(admin_url).await {
            if let Ok(row) = client.query_one("SHOW transaction_read_only", &[]).await {
                if row.get::<_, String>(0) == want {
                    return;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no new session saw default_transaction_read_only = {want}");
}

/// A store whose server may wait for the primary for up to `wait` per call.
async fn store_waiting(url: &str, wait_ms: u64) -> Arc<PostgresStore> {
    let settings = PostgresSettings::from_lookup(|name| match name {
        "PAYMENTS_POSTGRES_URL" => Some(url.to_owned()),
        "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS" => Some(wait_ms.to_string()),
        _ => None,
    })
    .unwrap();
    provision(&settings).await.unwrap();
    Arc::new(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .unwrap(),
    )
}

/// A lease that outlasts the store's outage wait and the bank's budget, as the start-up
/// check demands of a deployment.
fn policy_for_outages() -> claims_payments::seams::consumer::Policy {
    claims_payments::seams::consumer::Policy {
        lease: std::time::Duration::from_secs(120),
        ..common::policy()
    }
}

/// A server that turns read-only for a few seconds while messages are claimed (a failover
/// or promotion as the client sees it: 25006 on the pooled connection, and new connections
/// to a server that takes no writes) is waited out like an unreachable one: each message
/// delivered in the window completes on its first delivery, with one bank call, instead of
/// spending its deliveries on `retry-later`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_window_during_claims_is_waited_out_on_the_first_delivery() {
    use claims_payments_testkit::bank::FakeBank;

    if !available() || !claims_payments_testkit::postgres::can_start_servers() {
        return;
    }
    const MESSAGES: usize = 4;
    let server = PgServer::start().unwrap();
    let admin_url = server.url("postgres");
    // The longest outage wait: the window must end well inside it on a loaded machine.
    let store = store_waiting(&admin_url, 60_000).await;
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        policy_for_outages(),
        std::time::Duration::from_millis(500),
    );
    // A message before the window leaves a connection in the pool, which the window then
    // meets as a session that turned read-only.
    let warm = common::message(&common::new_claim(), "10.00");
    assert_eq!(common::deliver(&consumer, &warm, "m-warm", 1).await, "paid");
    let session_before = connect(&admin_url).await.unwrap();

    set_read_only(&admin_url, true).await;
    // What the server does with a session opened before the reload: it is read-only too.
    let row = session_before
        .query_one("SHOW transaction_read_only", &[])
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, String>(0),
        "on",
        "an existing session after the reload"
    );

    let window_opened = std::time::Instant::now();
    let mut deliveries = Vec::new();
    for n in 0..MESSAGES {
        let consumer = consumer.clone();
        deliveries.push(tokio::spawn(async move {
            let claim = common::new_claim();
            let msg = common::message(&claim, "42.00");
            let outcome = common::deliver(&consumer, &msg, &format!("m-{n}"), 1).await;
            (claim, outcome)
        }));
    }
    // The window lasts a few seconds; nothing can be written meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let paid: i64 = session_before
        .query_one("SELECT count(*) FROM payments", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        paid, 1,
        "only the warm-up message is stored while the server is read-only"
    );
    let answered: Vec<usize> = (0..MESSAGES)
        .filter(|n| deliveries[*n].is_finished())
        .collect();
    assert!(
        answered.is_empty(),
        "deliveries answered while the server was read-only: {answered:?}"
    );
    set_read_only(&admin_url, false).await;
    let window = window_opened.elapsed();

    for delivery in deliveries {
        let (claim, outcome) = delivery.await.unwrap();
        assert_eq!(outcome, "paid", "{claim}: the first delivery completes");
        let payment = store
            .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
            .await
            .unwrap()
            .expect("the payment");
        assert_eq!(payment.record.status, PaymentStatus::Paid, "{claim}");
    }
    println!(
        "{MESSAGES} deliveries during a {window:?} read-only window all paid {:?} after it \
         opened",
        window_opened.elapsed()
    );
    assert_eq!(
        bank.effective_payouts(),
        MESSAGES + 1,
        "one payout per claim"
    );
    assert_eq!(
        bank.requests().len(),
        MESSAGES + 1,
        "one bank call per claim"
    );
    drop(server);
}

/// Forwards every call to the PostgreSQL store, and turns the server read-only for a few
/// seconds just before the first finalize: the bank has paid, and the write that records
/// it meets a server that cannot take it.
struct ReadOnlyAtFinalize {
    inner: Arc<PostgresStore>,
    admin_url: String,
    window: std::time::Duration,
    started: std::sync::atomic::AtomicBool,
    /// Set once the window has ended (the server writable again).
    ended: Arc<std::sync::atomic::AtomicBool>,
    /// Whether the first finalize returned only after the window ended.
    finalize_outlasted_the_window: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Store for ReadOnlyAtFinalize {
    async fn claim(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
        payment: &claims_payments::seams::store::PaymentRecord,
    ) -> claims_payments::seams::store::StoreResult<ClaimResult> {
        self.inner.claim(inbox, payment).await
    }
    async fn inbox(
        &self,
        key: &claims_payments::seams::store::InboxKey,
    ) -> claims_payments::seams::store::StoreResult<
        Option<
            claims_payments::seams::store::Versioned<claims_payments::seams::store::InboxRecord>,
        >,
    > {
        self.inner.inbox(key).await
    }
    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> claims_payments::seams::store::StoreResult<
        Option<
            claims_payments::seams::store::Versioned<claims_payments::seams::store::PaymentRecord>,
        >,
    > {
        self.inner.payment(claim, purpose).await
    }
    async fn record_handled(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
    ) -> claims_payments::seams::store::StoreResult<claims_payments::seams::store::InsertResult>
    {
        self.inner.record_handled(inbox).await
    }
    async fn replace_inbox(
        &self,
        inbox: &claims_payments::seams::store::InboxRecord,
        expected: &claims_payments::seams::store::Version,
    ) -> claims_payments::seams::store::StoreResult<claims_payments::seams::store::Version> {
        self.inner.replace_inbox(inbox, expected).await
    }
    async fn finalize(
        &self,
        write: claims_payments::seams::store::Finalize<'_>,
    ) -> claims_payments::seams::store::StoreResult<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let first = !self.started.swap(true, SeqCst);
        if first {
            set_read_only(&self.admin_url, true).await;
            let (url, window, ended) = (self.admin_url.clone(), self.window, self.ended.clone());
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                set_read_only(&url, false).await;
                ended.store(true, SeqCst);
            });
        }
        let result = self.inner.finalize(write).await;
        if first {
            self.finalize_outlasted_the_window
                .store(self.ended.load(SeqCst), SeqCst);
        }
        result
    }
    async fn list_payments(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Listed<claims_payments::seams::store::PaymentRecord>>,
    > {
        self.inner.list_payments(limit).await
    }
    async fn unsettled_payments(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Versioned<claims_payments::seams::store::PaymentRecord>>,
    > {
        self.inner.unsettled_payments(limit).await
    }
    async fn count_payments(
        &self,
        status: PaymentStatus,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<usize> {
        self.inner.count_payments(status, limit).await
    }
    async fn list_inbox(
        &self,
        limit: usize,
    ) -> claims_payments::seams::store::StoreResult<
        Vec<claims_payments::seams::store::Listed<claims_payments::seams::store::InboxRecord>>,
    > {
        self.inner.list_inbox(limit).await
    }
    async fn purge_expired(
        &self,
        now: time::OffsetDateTime,
        batch: usize,
    ) -> claims_payments::seams::store::StoreResult<u64> {
        self.inner.purge_expired(now, batch).await
    }
}

/// The server turns read-only for a few seconds after the bank paid, as the finalize is
/// sent: the finalize waits for the server to take writes again and records the payout,
/// so the message completes on its first delivery with exactly one bank call (a
/// `retry-later` here would make every redelivery call the bank again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_window_during_a_finalize_after_the_bank_paid_completes_with_one_bank_call() {
    use claims_payments_testkit::bank::FakeBank;
    use std::sync::atomic::Ordering::SeqCst;

    if !available() || !claims_payments_testkit::postgres::can_start_servers() {
        return;
    }
    let server = PgServer::start().unwrap();
    let admin_url = server.url("postgres");
    let inner = store_waiting(&admin_url, 60_000).await;
    let store = Arc::new(ReadOnlyAtFinalize {
        inner: inner.clone(),
        admin_url: admin_url.clone(),
        window: std::time::Duration::from_secs(3),
        started: Default::default(),
        ended: Default::default(),
        finalize_outlasted_the_window: Default::default(),
    });
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer_with(
        store.clone(),
        &bank,
        policy_for_outages(),
        std::time::Duration::from_millis(500),
    );
    let claim = common::new_claim();
    let msg = common::message(&claim, "42.00");
    let outcome = common::deliver(&consumer, &msg, "m-finalize", 1).await;
    assert!(
        store.started.load(SeqCst),
        "the window was opened at the finalize"
    );
    assert_eq!(outcome, "paid", "the first delivery completes");
    assert!(
        store.finalize_outlasted_the_window.load(SeqCst),
        "the finalize was answered while the server was read-only"
    );
    let payment = inner
        .payment(ClaimId::parse(&claim).unwrap(), Purpose::Payout)
        .await
        .unwrap()
        .expect("the payment");
    assert_eq!(payment.record.status, PaymentStatus::Paid);
    assert_eq!(bank.requests().len(), 1, "one bank call");
    assert_eq!(bank.effective_payouts(), 1);
    drop(server);
}

/// A statement whose backend is terminated while it runs (57P01 admin_shutdown, as a
/// failover or a restart cuts sessions): a read is sent again on a new connection and
/// answers; a write is not sent again (its commit is unknown), the call answers
/// `Transient` once the server takes connections, and the redelivery decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminated_statement_is_read_again_but_a_write_is_not_sent_again() {
    if !available() {
        return;
    }
    let (db, _, store) = provisioned().await;
    let (inbox, payment) = records(&common::new_claim(), "m-cut", AttemptId::new());
    for write in [false, true] {
        // Both statements prepared on the pooled connection first, so the cut comes while
        // the statement itself runs (a cut while preparing it is sent again, a write too).
        let (warm_inbox, warm_payment) = records(&common::new_claim(), "m-warm", AttemptId::new());
        store.claim(&warm_inbox, &warm_payment).await.unwrap();
        store.inbox(&warm_inbox.key()).await.unwrap();
        let admin = connect(&db.url).await.unwrap();
        // ACCESS EXCLUSIVE: the store's read and its claim both wait behind it.
        admin
            .batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        let call = {
            let (store, inbox, payment) = (store.clone(), inbox.clone(), payment.clone());
            tokio::spawn(async move {
                if write {
                    store.claim(&inbox, &payment).await.map(|_| "claimed")
                } else {
                    store.inbox(&inbox.key()).await.map(|_| "read")
                }
            })
        };
        let watcher = connect(&db.url).await.unwrap();
        let mut waiting = None;
        for _ in 0..600 {
            let rows = watcher
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'claims-payments' \
                     AND wait_event_type = 'Lock' AND datname = current_database()",
                    &[],
                )
                .await
                .unwrap();
            if let Some(row) = rows.first() {
                waiting = Some(row.get::<_, i32>(0));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let pid = waiting.expect("the store's statement waits on the lock");
        watcher
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        admin.batch_execute("ROLLBACK").await.unwrap();
        let answer = call.await.unwrap();
        if write {
            assert!(
                matches!(&answer, Err(StoreError::Transient(text)) if text.contains("not sent again")),
                "{answer:?}"
            );
            assert!(
                store.inbox(&inbox.key()).await.unwrap().is_none(),
                "the claim was cut before it committed, and not sent again"
            );
        } else {
            assert_eq!(answer.unwrap(), "read", "the read is sent again");
        }
    }
}

/// Six `provision` runs at once on a fresh database (several pipelines, or a pipeline and
/// a person): all succeed, one applies the migrations, the others wait for it and find the
/// schema up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_provisions_of_a_fresh_database_all_succeed_and_one_migrates() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let settings = PostgresSettings::from_url(&db.url).unwrap();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            let settings = settings.clone();
            tokio::spawn(async move { provision(&settings).await })
        })
        .collect();
    let mut applied = Vec::new();
    for run in runs {
        let report = run
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("a concurrent provision failed: {e:#}"));
        applied.push(report.applied.clone());
        if report.applied.is_empty() {
            assert!(report.to_string().contains("is up to date"), "{report}");
        }
    }
    applied.sort();
    assert_eq!(
        applied,
        [
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec!["V1__initial".to_owned(), "V2__effects".to_owned()]
        ],
        "exactly one run applied the migrations"
    );
    PostgresStore::connect(&settings, Access::Checked)
        .await
        .expect("this build's schema");
}

/// A login role on the shared server (roles are server-wide), with the app's rights in
/// `db` as docs/deploy.md (4.6, "The app's database role") sets them up: step 2 before
/// `provision` (run by the administrator, here the superuser that owns the tables), step 3
/// after it when `provisioned`. Returns the role's URL for `db`.
async fn app_role(db: &TestDatabase, provisioned: bool) -> String {
    let role = format!("app_{}", uuid::Uuid::new_v4().simple());
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let admin = connect(&db.url).await.unwrap();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{password}'; \
             GRANT CONNECT ON DATABASE {db} TO {role}; \
             GRANT USAGE ON SCHEMA public TO {role}; \
             ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public \
               GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}; \
             ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public \
               GRANT EXECUTE ON FUNCTIONS TO {role};",
            db = db.name
        ))
        .await
        .unwrap();
    if provisioned {
        provision(&PostgresSettings::from_url(&db.url).unwrap())
            .await
            .unwrap();
        admin
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; \
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}; \
                 REVOKE INSERT, UPDATE, DELETE ON refinery_schema_history FROM {role};"
            ))
            .await
            .unwrap();
    }
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(&role).unwrap();
    url.set_password(Some(&password)).unwrap();
    url.to_string()
}

/// With the documented grants the app's role serves (the schema check reads the history,
/// a claim writes). Without the `SELECT` on `refinery_schema_history`, start-up is refused
/// with the server's SQLSTATE and message and the grant that is missing, not "db error",
/// and without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_grant_on_the_schema_history_names_42501_and_the_grant() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let app_url = app_role(&db, true).await;
    let settings = PostgresSettings::from_url(&app_url).unwrap();
    let store = PostgresStore::connect(&settings, Access::Checked)
        .await
        .expect("the documented grants let the app's role serve");
    let (inbox, payment) = records(&common::new_claim(), "m-granted", AttemptId::new());
    assert!(matches!(
        store.claim(&inbox, &payment).await.unwrap(),
        ClaimResult::Claimed { .. }
    ));
    drop(store);

    let role = reqwest::Url::parse(&app_url).unwrap().username().to_owned();
    connect(&db.url)
        .await
        .unwrap()
        .batch_execute(&format!(
            "REVOKE SELECT ON refinery_schema_history FROM {role}"
        ))
        .await
        .unwrap();
    let error = format!(
        "{:#}",
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("the schema check cannot read the history")
    );
    for needle in [
        "SQLSTATE 42501",
        "permission denied for table refinery_schema_history",
        "GRANT SELECT ON refinery_schema_history",
        "docs/deploy.md",
    ] {
        assert!(error.contains(needle), "{needle:?} missing from: {error}");
    }
    println!("{error}");
    let password = reqwest::Url::parse(&app_url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    assert!(!error.contains(&password), "{error}");
}

/// `provision` run with the app's role (which may not create tables) on a fresh database:
/// refinery's error says which step failed and the server's cause, with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_without_create_rights_names_the_servers_refusal() {
    if !available() {
        return;
    }
    let db = TestDatabase::create().await;
    let app_url = app_role(&db, false).await;
    let error = format!(
        "{:#}",
        provision(&PostgresSettings::from_url(&app_url).unwrap())
            .await
            .unwrap_err()
    );
    for needle in [
        "error asserting migrations table",
        "permission denied for schema public",
        "SQLSTATE 42501",
        "may create in schema public",
    ] {
        assert!(error.contains(needle), "{needle:?} missing from: {error}");
    }
    assert!(!error.contains("db error"), "{error}");
    println!("{error}");
}
