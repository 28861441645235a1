//! The `cosmos-emulator` dev binary as a separate process.

use std::time::Duration;

use claims_payments::store::cosmos::{CosmosSettings, CosmosStore};
use claims_payments_testkit::fake_bank as common;

/// The `cosmos-emulator` binary as a separate process: reads its settings from stdout,
/// connects a real `CosmosStore` over HTTP, claims, and stops it with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosmos_emulator_binary_serves_a_connected_store() {
    use tokio::io::AsyncBufReadExt;

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cosmos-emulator"))
        .args(["--port", "0", "--provision"])
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start cosmos-emulator");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut settings = std::collections::HashMap::new();
    // A guard against hanging forever if the binary never gets ready, not a speed check.
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "ready" {
                return true;
            }
            if let Some((name, value)) = line.split_once('=') {
                settings.insert(name.to_owned(), value.to_owned());
            }
        }
        false
    })
    .await
    .expect("cosmos-emulator printed ready");
    assert!(ready, "cosmos-emulator exited before ready");
    let settings = CosmosSettings::from_lookup(|name| settings.get(name).cloned())
        .expect("printed settings are valid");
    assert!(
        settings.endpoint.as_str().starts_with("http://127.0.0.1:"),
        "{}",
        settings.endpoint
    );

    let store: claims_payments::store::DynStore = std::sync::Arc::new(
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

    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(
        status.success(),
        "cosmos-emulator exits cleanly on SIGTERM: {status}"
    );
}
