//! The PostgreSQL store through a real PgBouncer pooling by transaction, as Azure Database
//! for PostgreSQL's built-in one does (port 6432, `pool_mode = transaction`), with fewer
//! server sessions per database ([`pgbouncer::SHARED_POOL_SIZE`]) than the store has
//! connections, so consecutive statements of one store connection run on different
//! server sessions: `PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction` pays each claim once
//! there (and passes the whole conformance suite), and without it such a pooler is refused
//! at start-up. Debian's PgBouncer (1.18) predates tracking of named prepared statements
//! (1.21, `max_prepared_statements`, 0 by default also on Azure), so a named statement of
//! the store would meet a session that does not have it.

use std::sync::Arc;

use claims_payments::seams::consumer::Outcome;
use claims_payments::seams::store::{DynStore, Store};
use claims_payments_postgres::{provision, Access, Pooler, PostgresSettings, PostgresStore};
use claims_payments_testkit::bank::FakeBank;
use claims_payments_testkit::conformance::Keep;
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::pgbouncer::{self, SHARED_POOL_SIZE};
use claims_payments_testkit::postgres::{connect, TestDatabase};

/// A provisioned database of its own (straight to PostgreSQL: `provision` needs a session of
/// its own), whose login role carries the limits a transaction pooler needs as the role's
/// defaults (`ALTER ROLE ... IN DATABASE`, so other tests' databases keep theirs).
async fn database(limits: bool) -> TestDatabase {
    let db = TestDatabase::create().await;
    provision(&PostgresSettings::from_url(&db.url).unwrap())
        .await
        .unwrap();
    if limits {
        let client = connect(&db.url).await.unwrap();
        client
            .batch_execute(&format!(
                "ALTER ROLE CURRENT_USER IN DATABASE {db} SET statement_timeout = '10s'; \
                 ALTER ROLE CURRENT_USER IN DATABASE {db} SET lock_timeout = '5s'; \
                 ALTER ROLE CURRENT_USER IN DATABASE {db} \
                 SET idle_in_transaction_session_timeout = '30s'",
                db = db.name
            ))
            .await
            .unwrap();
    }
    db
}

/// The settings of `db` through the shared PgBouncer.
fn through_pgbouncer(db: &TestDatabase) -> PostgresSettings {
    PostgresSettings::from_url(&pgbouncer::shared().url_for(&db.url)).unwrap()
}

async fn store_through_pgbouncer(db: &TestDatabase) -> Arc<PostgresStore> {
    let settings = through_pgbouncer(db).with_pooler(Pooler::PgBouncerTransaction);
    Arc::new(
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\nPgBouncer: {}", pgbouncer::shared().log())),
    )
}

async fn make_store() -> (DynStore, Keep) {
    let db = database(true).await;
    let store = store_through_pgbouncer(&db).await;
    (store, Box::new(db))
}

claims_payments_testkit::store_conformance!(make_store, if pgbouncer::available);

/// Server sessions open on `db` now (the test's own admin connection goes elsewhere).
async fn server_sessions(db: &TestDatabase) -> i64 {
    let admin = connect(&claims_payments_testkit::postgres::shared().url("postgres"))
        .await
        .unwrap();
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Claims, redeliveries, business duplicates, finalizes and reads of 24 claims at once,
/// through PgBouncer's 2 server sessions for the store's 16 connections: every claim is
/// paid once with one bank call, every other delivery is a duplicate (or waits for the
/// lease), and no statement fails. The same run with the store's named statements (before
/// `PAYMENTS_POSTGRES_POOLER`) answers `store-failure` (a prepared statement that does not
/// exist on the session the statement landed on).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_duplicates_finalizes_and_reads_through_pgbouncer_pay_once() {
    if !pgbouncer::available() {
        return;
    }
    let db = database(true).await;
    let store = store_through_pgbouncer(&db).await;
    let bank = FakeBank::start().await;
    let consumer = common::bank_consumer(store.clone(), &bank);
    let claims: Vec<String> = (0..24).map(|_| common::new_claim()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, claim) in claims.iter().enumerate() {
        let msg = common::message(claim, "25.00");
        for (message, count) in [("a", 1), ("a", 2), ("a", 3), ("b", 1)] {
            let (consumer, msg) = (consumer.clone(), msg.clone());
            let message_id = format!("evt-{n}-{message}");
            tasks.spawn(async move {
                let outcome = consumer
                    .handle(&msg, &common::delivery(&message_id, count))
                    .await;
                (message_id, outcome)
            });
        }
        let (store, claim_id) = (store.clone(), msg.claim_id);
        tasks.spawn(async move {
            let read = store
                .payment(claim_id, claims_payments::Purpose::Payout)
                .await;
            let listed = store.list_payments(100).await;
            let outcome = match (read, listed) {
                (Ok(_), Ok(_)) => Outcome::Recorded,
                (Err(e), _) | (_, Err(e)) => Outcome::StoreFailure {
                    reason: e.to_string(),
                },
            };
            ("read".to_owned(), outcome)
        });
    }
    let (mut paid, mut waited) = (0, Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (what, outcome) = done.unwrap();
        match outcome {
            Outcome::Paid { .. } => paid += 1,
            Outcome::Recorded | Outcome::Duplicate { .. } | Outcome::BusinessDuplicate { .. } => {}
            Outcome::RetryLater { .. } => waited.push(what),
            other => panic!(
                "{what}: {other:?}\nPgBouncer: {}",
                pgbouncer::shared().log()
            ),
        }
    }
    assert!(
        server_sessions(&db).await <= i64::from(SHARED_POOL_SIZE),
        "PgBouncer keeps at most {SHARED_POOL_SIZE} server sessions for the database"
    );
    // What waited for a lease comes back, as the broker would redeliver it.
    for (n, claim) in claims.iter().enumerate() {
        let msg = common::message(claim, "25.00");
        for message in ["a", "b"] {
            let outcome = common::deliver(&consumer, &msg, &format!("evt-{n}-{message}"), 9).await;
            assert!(
                matches!(outcome, "duplicate" | "business-duplicate" | "paid"),
                "evt-{n}-{message}: {outcome} (waited: {waited:?})"
            );
        }
    }
    let payments = store.list_payments(100).await.unwrap();
    assert_eq!(payments.len(), claims.len());
    assert!(
        payments.iter().all(|p| p
            .as_ref()
            .is_ok_and(|p| p.status == claims_payments::seams::store::PaymentStatus::Paid)),
        "{payments:?}"
    );
    assert_eq!(
        bank.effective_payouts(),
        claims.len(),
        "one payout per claim"
    );
    assert!(paid <= claims.len());
}

/// Through PgBouncer the store costs what it costs straight to PostgreSQL: a fresh claim,
/// a duplicate and a business duplicate one round trip each, once the statement's types are
/// known (3 round trips, once per process, instead of a prepare per connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_claim_and_its_duplicates_are_one_round_trip_each() {
    use claims_payments::seams::store::{AttemptId, ClaimResult};
    use claims_payments_testkit::records::records;

    if !pgbouncer::available() {
        return;
    }
    let db = database(true).await;
    let store = store_through_pgbouncer(&db).await;
    let (inbox, payment) = records(&common::new_claim(), "m-warm", AttemptId::new());
    let before = store.round_trips();
    store.claim(&inbox, &payment).await.unwrap();
    assert_eq!(
        store.round_trips() - before,
        4,
        "describe (3) and the claim"
    );
    let claim = common::new_claim();
    let mut costs = Vec::new();
    for message in ["m-1", "m-1", "m-2"] {
        let (inbox, payment) = records(&claim, message, AttemptId::new());
        let before = store.round_trips();
        let result = store.claim(&inbox, &payment).await.unwrap();
        costs.push(store.round_trips() - before);
        assert!(
            !matches!(result, ClaimResult::Claimed { .. }) || message == "m-1",
            "{result:?}"
        );
    }
    assert_eq!(costs, [1, 1, 1], "fresh, duplicate, business duplicate");
}

/// Without `PAYMENTS_POSTGRES_POOLER` a PgBouncer is refused at start-up, by `serve`'s
/// store and by `provision`, with what to set instead and no password; `provision` is also
/// refused with the setting (migrations need PostgreSQL itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgbouncer_without_the_pooler_setting_is_refused_at_start_saying_what_to_set() {
    if !pgbouncer::available() {
        return;
    }
    let db = database(true).await;
    let settings = through_pgbouncer(&db);
    let password = reqwest::Url::parse(&db.url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let refused = PostgresStore::connect(&settings, Access::Checked)
        .await
        .err()
        .expect("a pooler is refused without the setting");
    let refused = format!("{refused:#}");
    assert!(
        refused.contains("PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction"),
        "{refused}"
    );
    assert!(refused.contains("connection pooler"), "{refused}");
    assert!(
        !refused.contains(&password),
        "the password leaked: {refused}"
    );
    println!("refused: {refused}");

    let refused = format!("{:#}", provision(&settings).await.unwrap_err());
    assert!(
        refused.contains("PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction"),
        "{refused}"
    );
    let refused = format!(
        "{:#}",
        provision(&settings.with_pooler(Pooler::PgBouncerTransaction))
            .await
            .unwrap_err()
    );
    assert!(
        refused.contains("provision needs PostgreSQL itself"),
        "{refused}"
    );

    // Straight to PostgreSQL, the same check lets the connection through.
    let direct = PostgresSettings::from_url(&db.url).unwrap();
    PostgresStore::connect(&direct, Access::Checked)
        .await
        .unwrap();
}

/// Through a transaction pooler the service sets nothing on a session, so a role without
/// the limits as its defaults is refused at start-up, with the statements that give them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_role_without_the_limits_is_refused_naming_alter_role() {
    if !pgbouncer::available() {
        return;
    }
    let db = database(false).await;
    let settings = through_pgbouncer(&db).with_pooler(Pooler::PgBouncerTransaction);
    let refused = format!(
        "{:#}",
        PostgresStore::connect(&settings, Access::Checked)
            .await
            .err()
            .expect("a role without limits is refused")
    );
    for needle in [
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "ALTER ROLE",
    ] {
        assert!(refused.contains(needle), "{needle}: {refused}");
    }
    println!("refused: {refused}");
}
