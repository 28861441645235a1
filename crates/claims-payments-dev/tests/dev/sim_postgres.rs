//! `simulate --store postgres --instances 4`: four real `serve` processes on one real
//! PostgreSQL server (a throwaway one the simulator starts), with the usual faults (kills,
//! lock expiries that hand a message to another instance, kills mid-payout) and a crash
//! of the server itself mid-run (`pg_ctl restart -m immediate`, as a Flexible Server
//! failover). Every claim must still be paid exactly once, with nothing left in progress.
//!
//! Skipped with a loud line without PostgreSQL's binaries, unless `CI` is set: then it
//! fails, as the testkit's PostgreSQL tests do.

use claims_payments_dev::sim::{self, SimStore, SimulateArgs};

fn can_start_a_server() -> bool {
    let present = std::path::Path::new(claims_payments_testkit::postgres::PG_BIN)
        .join("pg_ctl")
        .is_file();
    if !present && std::env::var_os("CI").is_some() {
        panic!(
            "no PostgreSQL binaries in {}; CI must run the PostgreSQL simulation",
            claims_payments_testkit::postgres::PG_BIN
        );
    }
    present || claims_payments_testkit::postgres::can_start_servers()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_on_postgres_survive_a_server_restart_and_pay_exactly_once() {
    if !can_start_a_server() {
        return;
    }
    let report = sim::run(SimulateArgs {
        messages: 150,
        instances: 4,
        store: Some(SimStore::Postgres),
        postgres_url: None,
        restart_store_at: vec![0.4],
        concurrency: 4,
        lock_expiry_rate: 0.15,
        kill_rate: 0.02,
        kill_mid_payout_rate: 0.05,
        crash_rate: 0.02,
        reconcile_every_secs: 2,
        short_timings: true,
        seed: Some(23),
        exe: Some(env!("CARGO_BIN_EXE_claims-payments-dev").into()),
        ..SimulateArgs::default()
    })
    .await
    .expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");

    assert_eq!(report.store, "postgres", "{text}");
    assert!(report.mode.starts_with("PostgreSQL ledger"), "{text}");
    assert_eq!(report.instances.len(), 4, "{text}");
    assert_eq!(
        report.store_restarts.len(),
        1,
        "the server restarted once\n{text}"
    );
    assert!(text.contains("PostgreSQL restarted"), "{text}");
    for i in &report.instances {
        assert!(
            i.completed > 0,
            "instance {} completed nothing\n{text}",
            i.instance
        );
    }
    assert_eq!(report.processes.unexpected_exits, 0, "{text}");
    assert!(report.host.cross_instance_redeliveries > 0, "{text}");

    let v = &report.verification;
    assert_eq!(v.claims_paid_twice_at_bank, 0, "{text}");
    assert_eq!(v.claims_with_two_ledger_payments, 0, "{text}");
    assert_eq!(v.lost_claims, 0, "{text}");
    // Nothing stuck: no payment left in progress or unknown.
    assert!(!v.ledger_by_status.contains_key("in_progress"), "{text}");
    assert!(
        !v.ledger_by_status.contains_key("needs_reconciliation"),
        "{text}"
    );
    let reconcile = report.reconcile.as_ref().expect("a bank run reconciles");
    assert!(reconcile.settled(), "{text}");
    assert!(report.exactly_once, "{text}");
}
