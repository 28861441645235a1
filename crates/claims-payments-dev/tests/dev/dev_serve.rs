//! The real `claims-payments-dev serve` process: the product's composition root with the
//! dev seams. A SIGKILL after the commit, before the answer, then the host's restart and
//! redelivery; and the message path on the Cosmos DB emulator over real HTTP (without
//! dev settings this serve is the product's).

use claims_payments::seams::configuration::Settings;
use claims_payments::seams::startup::open_store;
use claims_payments_dev::emulator::ServedEmulator;
use claims_payments_sqlite::Access;
use claims_payments_testkit::fixtures as common;
use claims_payments_testkit::service::{
    claim_body, deliver_one_message_five_times, host_envelope, invoke, outcome, Backend, Handler,
};

/// A Cosmos DB emulator account served over loopback HTTP by this test process.
fn cosmos() -> Backend {
    let emulator = ServedEmulator::start().expect("the Cosmos DB emulator starts");
    Backend::other(emulator.env(), Box::new(emulator))
}

const EXE: &str = env!("CARGO_BIN_EXE_claims-payments-dev");

/// The payments the product would list for `env`, read through the library.
async fn ledger_on(env: &[(&str, &str)]) -> usize {
    let settings = Settings::from_lookup(|name| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    let store = open_store(&settings, Access::ReadOnly).await.unwrap();
    store.list_payments(100).await.unwrap().len()
}

async fn sigkill_after_commit_then_restart_skips_the_duplicate(backend: Backend) {
    let client = reqwest::Client::new();
    let body = claim_body(&common::new_claim(), "77.70");

    let mut doomed_env = backend.env();
    doomed_env.push(("PAYMENTS_FAULT_CRASH_AFTER_COMMIT", "1"));
    let doomed = Handler::start_on(EXE, &doomed_env);
    let lost = invoke(&client, &doomed, &host_envelope(&body, "evt-crash", 1)).await;
    assert!(
        lost.is_err(),
        "the process must die before answering, got {lost:?}"
    );
    doomed.kill();

    // The host restarts the handler and Service Bus redelivers the abandoned message.
    let restarted = Handler::start_on(EXE, &backend.env());
    let (status, answer) = invoke(&client, &restarted, &host_envelope(&body, "evt-crash", 2))
        .await
        .unwrap();
    assert_eq!((status, outcome(&answer)), (200, "duplicate"), "{answer}");
    restarted.kill();
    assert_eq!(ledger_on(&backend.env()).await, 1);
}

#[tokio::test]
async fn sigkill_after_commit_then_restart_on_the_same_sqlite_file_skips_the_duplicate() {
    sigkill_after_commit_then_restart_skips_the_duplicate(Backend::sqlite()).await;
}

#[tokio::test]
async fn sigkill_after_commit_then_restart_on_cosmos_skips_the_duplicate() {
    sigkill_after_commit_then_restart_skips_the_duplicate(cosmos()).await;
}

#[tokio::test]
async fn five_deliveries_make_one_ledger_row_on_cosmos_over_http() {
    let backend = cosmos();
    deliver_one_message_five_times(EXE, &backend.env()).await;
    assert_eq!(ledger_on(&backend.env()).await, 1);
}

/// The baselines behind the same route and composition root: the do-nothing handler
/// answers without storing (and still serves the readiness probe and the counters the
/// benchmark reads), the naive one records.
#[tokio::test]
async fn the_baselines_answer_behind_the_products_routes() {
    let client = reqwest::Client::new();
    for (handler, expected) in [("noop", "noop"), ("naive", "recorded")] {
        let backend = Backend::sqlite();
        let mut env = backend.env();
        env.push(("PAYMENTS_DEV_HANDLER", handler));
        let serve = Handler::start_on(EXE, &env);
        let body = claim_body(&common::new_claim(), "10.00");
        let (status, answer) = invoke(&client, &serve, &host_envelope(&body, "m-1", 1))
            .await
            .unwrap();
        assert_eq!(
            (status, outcome(&answer)),
            (200, expected),
            "{handler}: {answer}"
        );
        let metrics = client.get(serve.url("/metrics")).send().await.unwrap();
        assert_eq!(metrics.status(), 200, "{handler}: GET /metrics");
    }
}
