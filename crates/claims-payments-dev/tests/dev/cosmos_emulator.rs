//! The `cosmos-emulator` dev binary as a separate process.

use std::time::Duration;

use claims_payments_cosmos::{CosmosSettings, CosmosStore};
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::process::CosmosEmulator;

/// The `cosmos-emulator` binary as a separate process: reads its settings from stdout,
/// connects a real `CosmosStore` over HTTP, claims, and stops it with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosmos_emulator_binary_serves_a_connected_store() {
    let emulator = CosmosEmulator::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_cosmos-emulator")),
        None,
    )
    .await
    .expect("cosmos-emulator prints its settings and ready");
    let settings = CosmosSettings::from_lookup(|name| emulator.setting(name).map(str::to_owned))
        .expect("printed settings are valid");
    assert!(
        settings.endpoint.as_str().starts_with("http://127.0.0.1:"),
        "{}",
        settings.endpoint
    );

    let store: claims_payments::seams::store::DynStore = std::sync::Arc::new(
        CosmosStore::connect(&settings, Duration::from_secs(30 * 86_400))
            .await
            .unwrap(),
    );
    let msg = common::message(&common::new_claim(), "12.50");
    // Two consumers, as two instances: the second meets the first one's stored claim.
    for expected in ["recorded", "duplicate"] {
        let consumer = common::ledger_consumer(store.clone());
        let outcome = consumer
            .handle(&msg, &common::delivery("m-process", 1))
            .await;
        assert_eq!(outcome.label(), expected);
    }

    let status = emulator.terminate().await.expect("exits after SIGTERM");
    assert!(
        status.success(),
        "cosmos-emulator exits cleanly on SIGTERM: {status}"
    );
}
