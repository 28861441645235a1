//! The deterministic simulator on every change: a fixed set of seeds (plus every seed
//! that once found a defect) must pass, with at least a tenth of their deliveries meeting
//! another attempt on their claim, and a seed must replay its run exactly.

use claims_payments_dev::dst::faults::Fault;
use claims_payments_dev::dst::{run_seed, RunOptions, StoreKind, CI_SEEDS, FOUND_SEEDS};

fn options() -> RunOptions {
    RunOptions {
        messages: 200,
        http_intents: 20,
        instances: 0,
        all_faults: false,
        keep_trace: true,
        product_logs: false,
        store: StoreKind::Model,
        only_faults: None,
    }
}

/// A small run on a production adapter (they cost more per delivery than the model).
fn on(store: StoreKind, messages: usize) -> RunOptions {
    RunOptions {
        messages,
        http_intents: 5,
        store,
        ..options()
    }
}

/// The production SQLite adapter under the simulator: its seeds pass, and replay (each
/// call runs to its end on the runtime's thread: see `dst::stores`).
#[test]
fn sqlite_seeds_pass_and_replay() {
    for seed in SQLITE_SEEDS {
        let result = run_seed(*seed, &on(StoreKind::Sqlite, 40));
        assert!(result.violations.is_empty(), "{}", result.failure_report());
        assert!(result.payouts > 0, "seed {seed} paid nothing");
        let again = run_seed(*seed, &on(StoreKind::Sqlite, 40));
        assert_eq!(
            result.trace_hash, again.trace_hash,
            "seed {seed} ran differently twice"
        );
    }
}

/// Seeds the SQLite adapter runs on every change.
const SQLITE_SEEDS: &[u64] = &[2, 7];

/// The production Cosmos DB adapter through the SDK over its in-memory emulator, with the
/// SDK's own transport faults armed: its seed passes.
#[test]
fn cosmos_seed_passes_through_the_sdk() {
    let options = RunOptions {
        only_faults: Some(vec![
            Fault::CosmosThrottled,
            Fault::CosmosThrottledHint,
            Fault::CosmosUnavailable,
            Fault::CosmosTimeout,
            Fault::CosmosTimeoutAfterService,
            Fault::StoreStaleRead,
            Fault::HandlerCrash,
        ]),
        ..on(StoreKind::Cosmos, 25)
    };
    let result = run_seed(3, &options);
    assert!(result.violations.is_empty(), "{}", result.failure_report());
    assert!(result.payouts > 0);
    let met = |path: &str| result.store_paths.get(path).copied().unwrap_or(0);
    for path in ["sdk-429", "sdk-503", "sdk-timeout-after-service"] {
        assert!(met(path) > 0, "{path} never met: {:?}", result.store_paths);
    }
}

/// Each of the store faults that change when or how often a write applies, or which
/// state a read sees, fires and the run still pays exactly once and checks out.
#[test]
fn every_new_store_fault_fires_and_is_survived() {
    let new = [
        Fault::StoreWaits,
        Fault::StoreWriteTwice,
        Fault::StoreCommitsAfterFailure,
        Fault::StoreStaleRead,
        Fault::StoreAnswerAfterLease,
        // The windows the adapters wait in.
        Fault::StoreOutage,
        Fault::StoreReadOnly,
    ];
    let options = RunOptions {
        only_faults: Some(new.to_vec()),
        ..options()
    };
    let mut fired = std::collections::BTreeMap::new();
    let mut paths = std::collections::BTreeMap::new();
    for seed in [1, 2] {
        let result = run_seed(seed, &options);
        assert!(result.violations.is_empty(), "{}", result.failure_report());
        for (fault, n) in result.fired {
            *fired.entry(fault).or_insert(0) += n;
        }
        for (path, n) in result.store_paths {
            *paths.entry(path).or_insert(0) += n;
        }
    }
    for fault in new {
        assert!(
            fired.get(&fault).copied().unwrap_or(0) > 0,
            "{fault} never fired"
        );
    }
    // A claim applied twice answers as the retry of a committed write: the consumer
    // recognises its own record.
    assert!(
        paths
            .get("claim found its own earlier write")
            .copied()
            .unwrap_or(0)
            > 0,
        "{paths:?}"
    );
}

#[test]
fn two_runs_of_one_seed_give_the_same_trace() {
    for seed in [3, 126, 1_000_003] {
        let (first, second) = (run_seed(seed, &options()), run_seed(seed, &options()));
        assert!(first.deliveries > 0, "seed {seed} delivered nothing");
        assert_eq!(
            first.trace_hash, second.trace_hash,
            "seed {seed} ran differently twice ({} and {} deliveries)",
            first.deliveries, second.deliveries
        );
        assert_eq!(first.events(), second.events());
    }
    // And the seed matters: another seed is another run.
    assert_ne!(
        run_seed(4, &options()).trace_hash,
        run_seed(5, &options()).trace_hash
    );
}

#[test]
fn the_fixed_seeds_and_every_seed_that_found_a_defect_pass() {
    let (mut deliveries, mut met, mut redriven) = (0, 0, 0);
    let mut failures = Vec::new();
    for seed in CI_SEEDS.chain(FOUND_SEEDS.iter().copied()) {
        let result = run_seed(seed, &options());
        deliveries += result.deliveries;
        met += result.deliveries_met;
        redriven += result.redriven;
        if !result.violations.is_empty() {
            failures.push(result.failure_report());
        }
    }
    println!(
        "dst: {} seeds, {deliveries} deliveries, {met} met another attempt on their claim",
        CI_SEEDS.count() + FOUND_SEEDS.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The operator's own tool re-drove dead letters, through the broker port.
    assert!(redriven > 0, "no dead letter was re-driven");
    // The hot claims make attempts meet: at least one delivery in ten.
    assert!(
        met * 10 >= deliveries,
        "only {met} of {deliveries} deliveries met another attempt on their claim"
    );
}

#[test]
fn every_fault_kind_at_its_highest_rate_still_pays_exactly_once() {
    let options = RunOptions {
        all_faults: true,
        ..options()
    };
    for seed in [1, 2] {
        let result = run_seed(seed, &options);
        assert!(result.violations.is_empty(), "{}", result.failure_report());
        assert!(result.payouts > 0);
    }
}
