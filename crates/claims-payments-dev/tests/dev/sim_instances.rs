//! `simulate --instances N`: several real `serve` processes side by side on one Cosmos
//! container (the `cosmos-emulator` dev binary over HTTP), the simulated host spreading
//! deliveries over them like competing consumers, with lock expiries that hand a
//! message to a second instance while the first still works, chaos kills, kills
//! mid-payout (of the process that sent the bank request) and restarts per instance.
//! The verdict must still be exactly once.
//!
//! Short timings and a small run: about 10 s in a debug build on two cores. The faults
//! are decided by the seed; the rates are high so that every kind happens.

use claims_payments_dev::sim::{self, SimStore, SimulateArgs};

/// The runs share two cores; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn args(instances: usize) -> SimulateArgs {
    SimulateArgs {
        messages: 150,
        instances,
        // maxConcurrentCalls per instance; low, so a message whose lock expired is
        // redelivered while the first instance still works on it.
        concurrency: 4,
        lock_expiry_rate: 0.15,
        kill_rate: 0.02,
        kill_mid_payout_rate: 0.05,
        crash_rate: 0.02,
        reconcile_every_secs: 2,
        short_timings: true,
        seed: Some(16),
        exe: Some(env!("CARGO_BIN_EXE_claims-payments-dev").into()),
        cosmos_emulator: Some(env!("CARGO_BIN_EXE_cosmos-emulator").into()),
        ..SimulateArgs::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_cosmos_compete_for_messages_and_pay_exactly_once() {
    let _serial = SERIAL.lock().await;
    let report = sim::run(args(3)).await.expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");

    assert_eq!(report.store, "cosmos", "{text}");
    assert_eq!(report.instances.len(), 3, "{text}");
    for i in &report.instances {
        assert!(
            i.deliveries > 0,
            "instance {} got nothing\n{text}",
            i.instance
        );
        assert!(
            i.completed > 0,
            "instance {} completed nothing\n{text}",
            i.instance
        );
        assert!(i.starts >= 1, "{text}");
    }
    let sum = |f: fn(&sim::report::InstanceSummary) -> u64| -> u64 {
        report.instances.iter().map(f).sum()
    };
    // The deliveries the host counted are the instances' deliveries.
    assert_eq!(sum(|i| i.deliveries), report.host.deliveries, "{text}");
    // Competing consumers on one message: a redelivery after a lock expiry reached
    // another instance while the first still worked, and leases changed hands.
    assert!(report.host.cross_instance_redeliveries > 0, "{text}");
    assert!(sum(|i| i.takeovers) > 0, "{text}");
    // Instances were killed (mid-payout: the one that sent the request) and restarted
    // while the others kept working.
    assert!(sum(|i| i.mid_payout_kills) > 0, "{text}");
    assert!(sum(|i| i.chaos_kills + i.crash_after_commit) > 0, "{text}");
    assert!(sum(|i| i.starts) > 3, "{text}");
    assert_eq!(sum(|i| i.unexpected_exits), 0, "{text}");
    assert_eq!(report.processes.starts, sum(|i| i.starts), "{text}");

    let v = &report.verification;
    assert_eq!(v.claims_paid_twice_at_bank, 0, "{text}");
    assert_eq!(v.claims_with_two_ledger_payments, 0, "{text}");
    assert_eq!(v.lost_claims, 0, "{text}");
    let reconcile = report.reconcile.as_ref().expect("a bank run reconciles");
    assert!(reconcile.settled(), "{text}");
    assert!(report.exactly_once, "{text}");
    assert!(text.contains("instances  3 serve processes"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_runs_on_cosmos_when_asked_and_sqlite_refuses_several() {
    let _serial = SERIAL.lock().await;
    let report = sim::run(SimulateArgs {
        messages: 60,
        store: Some(SimStore::Cosmos),
        ..args(1)
    })
    .await
    .expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");
    assert_eq!(report.store, "cosmos", "{text}");
    assert!(report.mode.starts_with("Cosmos DB ledger"), "{text}");
    assert_eq!(report.instances.len(), 1, "{text}");
    assert_eq!(report.instances[0].deliveries, report.host.deliveries);
    assert!(
        !text.contains("instances  "),
        "no table for one instance\n{text}"
    );
    assert!(report.exactly_once, "{text}");

    let refused = sim::run(SimulateArgs {
        store: Some(SimStore::Sqlite),
        ..args(2)
    })
    .await
    .map(|report| report.exactly_once)
    .expect_err("two instances on SQLite are refused");
    assert!(
        refused.to_string().contains("--store cosmos"),
        "{refused:#}"
    );
}
