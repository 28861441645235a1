//! Tests of the Cosmos DB store adapter.
//!
//! The scenarios in `mod scenarios` run twice: against the SDK's in-process emulator (each
//! test with its own emulator and a few documents), and against a real Cosmos DB account
//! when `COSMOS_TEST_ENDPOINT` and `COSMOS_TEST_KEY` are set (each test in its own,
//! uniquely named container, deleted afterwards; database `COSMOS_TEST_DATABASE`, default
//! `claims-payments-test`). Without those variables the real-account variants print
//! `skipped: COSMOS_TEST_ENDPOINT not set`.
//!
//! The rest covers what only makes sense locally: the container definition against
//! `infra/cosmos-container.json`, provisioning and `CosmosStore::connect` over HTTP. The
//! `cosmos-emulator` binary is tested in claims-payments-dev.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use azure_core::http::{Request, StatusCode, Url};
use azure_data_cosmos::fault_injection::{
    CustomResponseBuilder, FaultInjectionConditionBuilder, FaultInjectionErrorType,
    FaultInjectionResultBuilder, FaultInjectionRule, FaultInjectionRuleBuilder, FaultOperationType,
};
use azure_data_cosmos::models::{ContainerProperties, TimeToLive};
use azure_data_cosmos::{ContainerClient, CosmosClient};
use claims_payments::seams::store::{
    AttemptId, ClaimResult, Finalize, InboxRecord, InsertResult, PaymentRecord, PaymentStatus,
    Store, StoreError,
};
use claims_payments::seams::telemetry::counters;
use claims_payments::{ClaimApproved, ClaimId, MessageId, Purpose};
use claims_payments_cosmos::container::indexing_policy_difference;
use claims_payments_cosmos::documents::{inbox_id, payment_id, InboxDoc, PaymentDoc};
use claims_payments_cosmos::{
    container_definition, container_definition_json, provision_with_client, CosmosSettings,
    CosmosStore,
};
use claims_payments_dev::emulator::{serve, InProcessEmulator, RequestObserver, EMULATOR_KEY};
use claims_payments_testkit::records::{claimed_version, completed, paid, records_for};
use futures::FutureExt;
use time::OffsetDateTime;

const CONSUMER: &str = "ClaimApprovedHandler";
const DATABASE: &str = "payments";
const CONTAINER: &str = "payments";
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

// ---------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------

/// Counts data-plane requests (`/docs`) as they reach the emulator, SDK retries included.
#[derive(Debug, Default)]
struct WireCounter(AtomicU64);

impl RequestObserver for WireCounter {
    fn on_request(&self, request: &Request) {
        if request.url().path().contains("/docs") {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

enum Backend {
    Emulator(InProcessEmulator),
    Real(CosmosSettings),
}

/// One provisioned container, and the means to reach it with or without faults.
struct Env {
    backend: Backend,
    database: String,
    container: String,
    /// A client without fault rules, for raw reads and writes around the store.
    raw: ContainerClient,
    raw_client: CosmosClient,
    wire: Option<Arc<WireCounter>>,
}

impl Env {
    async fn emulator() -> Env {
        let wire = Arc::new(WireCounter::default());
        let url = Url::parse("https://eastus.emulator.local/").unwrap();
        let emulator = InProcessEmulator::observed(url, wire.clone()).unwrap();
        emulator.provision(DATABASE, CONTAINER).await.unwrap();
        let raw_client = emulator.client(Vec::new()).await.unwrap();
        let raw = raw_client
            .database_client(DATABASE)
            .container_client(CONTAINER, None)
            .await
            .unwrap();
        Env {
            backend: Backend::Emulator(emulator),
            database: DATABASE.to_owned(),
            container: CONTAINER.to_owned(),
            raw,
            raw_client,
            wire: Some(wire),
        }
    }

    /// A fresh container in the real account named by `COSMOS_TEST_*`, if configured.
    async fn real() -> Option<Env> {
        let settings = real_settings()?;
        let container = format!("test-{}", uuid::Uuid::new_v4().simple());
        let raw_client = settings
            .build_client()
            .await
            .expect("connect to COSMOS_TEST_ENDPOINT");
        provision_with_client(&raw_client, &settings.database, &container)
            .await
            .expect("provision a test container");
        let raw = raw_client
            .database_client(settings.database.as_str())
            .container_client(container.as_str(), None)
            .await
            .unwrap();
        Some(Env {
            database: settings.database.clone(),
            backend: Backend::Real(settings),
            container,
            raw,
            raw_client,
            wire: None,
        })
    }

    async fn client(&self, rules: Vec<Arc<FaultInjectionRule>>) -> CosmosClient {
        match &self.backend {
            Backend::Emulator(emulator) => emulator.client(rules).await.unwrap(),
            Backend::Real(settings) => settings
                .build_client_configured(|builder| {
                    Ok(if rules.is_empty() {
                        builder
                    } else {
                        builder.with_fault_injection_rules(rules)?
                    })
                })
                .await
                .unwrap(),
        }
    }

    async fn store_with(&self, rules: Vec<Arc<FaultInjectionRule>>) -> Arc<CosmosStore> {
        let client = self.client(rules).await;
        let container = client
            .database_client(self.database.as_str())
            .container_client(self.container.as_str(), None)
            .await
            .unwrap();
        Arc::new(CosmosStore::from_container(container, RETENTION).unwrap())
    }

    async fn store(&self) -> Arc<CosmosStore> {
        self.store_with(Vec::new()).await
    }

    fn wire_requests(&self) -> Option<u64> {
        self.wire.as_ref().map(|w| w.0.load(Ordering::Relaxed))
    }

    async fn raw_json(&self, claim: ClaimId, id: &str) -> Option<serde_json::Value> {
        match self.raw.read_item(claim.to_string(), id, None).await {
            Ok(response) => Some(response.into_model().unwrap()),
            Err(e) if e.status().is_not_found() => None,
            Err(e) => panic!("raw read of {id} failed: {e}"),
        }
    }

    async fn finish(self) {
        if let Backend::Real(_) = self.backend {
            let deleted = self
                .raw_client
                .database_client(self.database.as_str())
                .container_client(self.container.as_str(), None)
                .await
                .unwrap()
                .delete(None)
                .await;
            if let Err(e) = deleted {
                eprintln!("could not delete test container {}: {e}", self.container);
            }
        }
    }
}

fn real_settings() -> Option<CosmosSettings> {
    let (Ok(endpoint), Ok(key)) = (
        std::env::var("COSMOS_TEST_ENDPOINT"),
        std::env::var("COSMOS_TEST_KEY"),
    ) else {
        println!("skipped: COSMOS_TEST_ENDPOINT not set (set it and COSMOS_TEST_KEY to run against a real account)");
        return None;
    };
    let database =
        std::env::var("COSMOS_TEST_DATABASE").unwrap_or_else(|_| "claims-payments-test".to_owned());
    let settings = CosmosSettings::from_lookup(|name| match name {
        "COSMOS_ENDPOINT" => Some(endpoint.clone()),
        "COSMOS_KEY" => Some(key.clone()),
        "COSMOS_DATABASE" => Some(database.clone()),
        _ => None,
    })
    .expect("COSMOS_TEST_ENDPOINT / COSMOS_TEST_KEY / COSMOS_TEST_DATABASE are valid settings");
    Some(settings)
}

async fn run_on(
    env: Env,
    scenario: impl FnOnce(Arc<Env>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
) {
    let env = Arc::new(env);
    let outcome = AssertUnwindSafe(scenario(env.clone())).catch_unwind().await;
    match Arc::try_unwrap(env) {
        Ok(env) => env.finish().await,
        Err(_) => eprintln!("test environment still shared; container not deleted"),
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Generates, for each scenario, one test on the in-process emulator and one on the real
/// account (skipped with a printed line when none is configured).
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod emulator {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let env = crate::cosmos_store::Env::emulator().await;
                    crate::cosmos_store::run_on(env, |env| Box::pin(crate::cosmos_store::scenarios::$scenario(env))).await;
                }
            )*
        }
        mod real_cosmos {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let Some(env) = crate::cosmos_store::Env::real().await else { return };
                    crate::cosmos_store::run_on(env, |env| Box::pin(crate::cosmos_store::scenarios::$scenario(env))).await;
                }
            )*
        }
    };
}

on_both_backends!(
    fresh_claim_is_one_request_and_round_trips,
    duplicate_claim_costs_at_most_two_requests,
    business_duplicate_reports_the_payment,
    batch_whose_second_op_conflicts_leaves_nothing,
    unique_key_refuses_a_second_payment_under_another_id,
    concurrent_claims_of_one_message_claim_once,
    takeover_race_has_one_winner,
    own_write_resent_after_ambiguous_timeout_is_recognisable,
    finalize_resent_after_ambiguous_timeout_reports_precondition_failed,
    documents_carry_ttl_only_on_inbox,
    injected_faults_become_transient_at_each_step,
    faults_that_clear_are_retried_by_the_sdk,
    a_conflicting_document_not_readable_yet_is_transient,
    unusual_message_ids_round_trip,
    record_handled_and_replace_inbox,
    lists_are_oldest_first_and_bounded,
);

// ---------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn message(id: &str) -> MessageId {
    MessageId::parse(id).unwrap()
}

/// The message every record here is built from: a tenant, a payee, 1250.10 EUR.
fn claim_message(claim: ClaimId) -> ClaimApproved {
    ClaimApproved::parse(&format!(
        r#"{{"claimId":"{claim}","amount":"1250.10","currency":"EUR","tenantId":"acme","payee":"NL91ABNA0417164300"}}"#
    ))
    .unwrap()
}

fn inbox_record(claim: ClaimId, message_id: &str, owner: AttemptId) -> InboxRecord {
    records_for(&claim_message(claim), message_id, owner, now()).0
}

fn payment_record(claim: ClaimId, message_id: &str) -> PaymentRecord {
    records_for(&claim_message(claim), message_id, AttemptId::new(), now()).1
}

fn rule(
    id: &str,
    operation: FaultOperationType,
    error: FaultInjectionErrorType,
    hit_limit: Option<u32>,
) -> Arc<FaultInjectionRule> {
    let result = FaultInjectionResultBuilder::new()
        .with_error(error)
        .with_probability(1.0)
        .build();
    let condition = FaultInjectionConditionBuilder::new()
        .with_operation_type(operation)
        .build();
    let mut builder = FaultInjectionRuleBuilder::new(id, result).with_condition(condition);
    if let Some(limit) = hit_limit {
        builder = builder.with_hit_limit(limit);
    }
    Arc::new(builder.build())
}

// ---------------------------------------------------------------------------------------
// Scenarios (both backends)
// ---------------------------------------------------------------------------------------

mod scenarios {
    use super::*;

    /// A fresh claim is exactly one request; both records read back equal; finalize uses
    /// the version the claim returned.
    pub async fn fresh_claim_is_one_request_and_round_trips(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-fresh", AttemptId::new());
        let payment = payment_record(claim, "m-fresh");

        let (requests, wire) = (store.request_count(), env.wire_requests());
        let charged = counters().cosmos_request_units.get();
        let version = claimed_version(store.claim(&inbox, &payment).await.unwrap());
        assert_eq!(
            store.request_count() - requests,
            1,
            "a fresh claim is one request"
        );
        // Process-wide and shared with concurrent tests, so only its growth is certain.
        assert!(
            counters().cosmos_request_units.get() > charged,
            "the claim's RU charge is recorded"
        );
        if let (Some(before), Some(after)) = (wire, env.wire_requests()) {
            assert_eq!(
                after - before,
                1,
                "a fresh claim is one request on the wire"
            );
        }

        let read = store
            .inbox(&inbox.key())
            .await
            .unwrap()
            .expect("inbox record");
        assert_eq!(read.record, inbox);
        assert_eq!(
            read.version, version,
            "the claim returns the inbox document's ETag"
        );
        let read = store
            .payment(claim, Purpose::Payout)
            .await
            .unwrap()
            .expect("payment record");
        assert_eq!(read.record, payment);

        let (final_inbox, final_payment) = (completed(&inbox), paid(&payment));
        store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &version,
                payment: &final_payment,
                payment_version: None,
            })
            .await
            .unwrap();
        assert_eq!(
            store.inbox(&inbox.key()).await.unwrap().unwrap().record,
            final_inbox
        );
        assert_eq!(
            store
                .payment(claim, Purpose::Payout)
                .await
                .unwrap()
                .unwrap()
                .record,
            final_payment
        );

        // The claim's version is spent: the same finalize again is refused.
        let again = store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &version,
                payment: &final_payment,
                payment_version: None,
            })
            .await;
        assert!(
            matches!(again, Err(StoreError::PreconditionFailed)),
            "{again:?}"
        );
    }

    /// A redelivery is the refused batch plus one point read, and writes nothing.
    pub async fn duplicate_claim_costs_at_most_two_requests(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let first = inbox_record(claim, "m-dup", AttemptId::new());
        let payment = payment_record(claim, "m-dup");
        let version = claimed_version(store.claim(&first, &payment).await.unwrap());

        let redelivery = InboxRecord {
            owner: AttemptId::new(),
            last_delivery_count: 2,
            ..first.clone()
        };
        let (requests, wire) = (store.request_count(), env.wire_requests());
        match store.claim(&redelivery, &payment).await.unwrap() {
            ClaimResult::InboxExists(existing) => {
                assert_eq!(
                    existing.record, first,
                    "the stored record, not the redelivery's"
                );
                assert_eq!(existing.version, version, "nothing was written");
            }
            other => panic!("expected InboxExists, got {other:?}"),
        }
        assert_eq!(
            store.request_count() - requests,
            2,
            "a duplicate is batch + read"
        );
        if let (Some(before), Some(after)) = (wire, env.wire_requests()) {
            assert_eq!(after - before, 2, "a duplicate is two requests on the wire");
        }
    }

    /// A second message for the same claim meets the payment, and leaves no inbox behind.
    pub async fn business_duplicate_reports_the_payment(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let payment = payment_record(claim, "m-first");
        claimed_version(
            store
                .claim(&inbox_record(claim, "m-first", AttemptId::new()), &payment)
                .await
                .unwrap(),
        );

        let second = inbox_record(claim, "m-second", AttemptId::new());
        match store
            .claim(&second, &payment_record(claim, "m-second"))
            .await
            .unwrap()
        {
            ClaimResult::PaymentExists(existing) => {
                assert_eq!(existing.record, payment);
                assert_eq!(existing.record.message_id, message("m-first"));
            }
            other => panic!("expected PaymentExists, got {other:?}"),
        }
        assert_eq!(store.inbox(&second.key()).await.unwrap(), None);

        // The consumer then records the second message as handled.
        let handled = completed(&second);
        assert!(matches!(
            store.record_handled(&handled).await.unwrap(),
            InsertResult::Inserted(_)
        ));
        match store.record_handled(&handled).await.unwrap() {
            InsertResult::AlreadyExists(existing) => assert_eq!(existing.record, handled),
            other => panic!("expected AlreadyExists, got {other:?}"),
        }
    }

    /// The payment already exists (written directly): the batch is refused as a whole and
    /// its first operation, the inbox create, is not persisted.
    pub async fn batch_whose_second_op_conflicts_leaves_nothing(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let existing = PaymentDoc::from_record(&payment_record(claim, "m-old"));
        env.raw
            .create_item(claim.to_string(), &existing.id, &existing, None)
            .await
            .unwrap();

        let inbox = inbox_record(claim, "m-new", AttemptId::new());
        let result = store
            .claim(&inbox, &payment_record(claim, "m-new"))
            .await
            .unwrap();
        assert!(
            matches!(result, ClaimResult::PaymentExists(_)),
            "{result:?}"
        );
        let inbox_doc = inbox_id(CONSUMER, &inbox.message_id);
        assert_eq!(
            env.raw_json(claim, &inbox_doc).await,
            None,
            "op 0 of a refused batch must roll back"
        );
    }

    /// The unique key (docType, dedupKey) refuses a second payment for the same claim and
    /// purpose even under another id, so the guard does not rest on the id encoding.
    pub async fn unique_key_refuses_a_second_payment_under_another_id(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-uk", AttemptId::new());
        claimed_version(
            store
                .claim(&inbox, &payment_record(claim, "m-uk"))
                .await
                .unwrap(),
        );

        let mut impostor = PaymentDoc::from_record(&payment_record(claim, "m-other"));
        impostor.id = "payment:payout:v2".to_owned();
        let refused = env
            .raw
            .create_item(claim.to_string(), &impostor.id, &impostor, None)
            .await;
        assert_eq!(
            refused.map(|_| ()).unwrap_err().status().status_code(),
            StatusCode::Conflict
        );

        let mut inbox_impostor = InboxDoc::from_record(&inbox, 60);
        inbox_impostor.id = "inbox:legacy-encoding".to_owned();
        let refused = env
            .raw
            .create_item(claim.to_string(), &inbox_impostor.id, &inbox_impostor, None)
            .await;
        assert_eq!(
            refused.map(|_| ()).unwrap_err().status().status_code(),
            StatusCode::Conflict
        );

        // The key is scoped to the claim's partition: another claim may have its payout.
        let other_claim = ClaimId::random();
        let mut elsewhere = PaymentDoc::from_record(&payment_record(other_claim, "m-uk"));
        elsewhere.id = "payment:payout:v2".to_owned();
        env.raw
            .create_item(other_claim.to_string(), &elsewhere.id, &elsewhere, None)
            .await
            .unwrap();
    }

    /// Many deliveries of one message at the same moment: exactly one claims it; every
    /// other one sees the winner's inbox record.
    pub async fn concurrent_claims_of_one_message_claim_once(env: Arc<Env>) {
        const TASKS: usize = 8;
        let store = env.store().await;
        let claim = ClaimId::random();
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let inbox = inbox_record(claim, "m-race", AttemptId::new());
                let payment = payment_record(claim, "m-race");
                barrier.wait().await;
                (inbox.owner, store.claim(&inbox, &payment).await.unwrap())
            }));
        }
        let mut winners = Vec::new();
        let mut seen = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (owner, ClaimResult::Claimed { .. }) => winners.push(owner),
                (_, ClaimResult::InboxExists(existing)) => seen.push(existing.record.owner),
                (_, other) => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one delivery claims the message");
        assert_eq!(seen.len(), TASKS - 1);
        assert!(
            seen.iter().all(|owner| *owner == winners[0]),
            "losers see the winner's record"
        );
    }

    /// Two takeovers of one expired lease with the same version: one wins, one gets
    /// PreconditionFailed, and the record holds the winner.
    pub async fn takeover_race_has_one_winner(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-takeover", AttemptId::new());
        let version = claimed_version(
            store
                .claim(&inbox, &payment_record(claim, "m-takeover"))
                .await
                .unwrap(),
        );

        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let mut tasks = Vec::new();
        for delivery in [2, 3] {
            let (store, barrier, version) = (store.clone(), barrier.clone(), version.clone());
            let takeover = InboxRecord {
                owner: AttemptId::new(),
                last_delivery_count: delivery,
                lease_until: Some(now() + time::Duration::minutes(2)),
                updated_at: now(),
                ..inbox.clone()
            };
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let outcome = store.replace_inbox(&takeover, &version).await;
                (takeover, outcome)
            }));
        }
        let mut winner = None;
        let mut refused = 0;
        for task in tasks {
            match task.await.unwrap() {
                (record, Ok(version)) => winner = Some((record, version)),
                (_, Err(StoreError::PreconditionFailed)) => refused += 1,
                (_, Err(other)) => panic!("unexpected {other}"),
            }
        }
        let (record, version) = winner.expect("one takeover wins");
        assert_eq!(refused, 1, "the other takeover is refused");
        let stored = store.inbox(&inbox.key()).await.unwrap().unwrap();
        assert_eq!((stored.record, stored.version), (record, version));
    }

    /// The batch commits but its response is lost; the SDK re-sends it and the re-send
    /// meets our own documents (409). The claim reports `InboxExists` with a record whose
    /// owner is this attempt, which is how the consumer recognises its own write.
    pub async fn own_write_resent_after_ambiguous_timeout_is_recognisable(env: Arc<Env>) {
        let lost = rule(
            "lost-batch-response",
            FaultOperationType::BatchItem,
            FaultInjectionErrorType::ResponseTimeoutAfterService,
            Some(1),
        );
        let store = env.store_with(vec![lost.clone()]).await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-ambiguous", AttemptId::new());
        let payment = payment_record(claim, "m-ambiguous");
        match store.claim(&inbox, &payment).await.unwrap() {
            ClaimResult::InboxExists(existing) => {
                assert_eq!(
                    existing.record.owner, inbox.owner,
                    "the record is our own write"
                );
                assert_eq!(existing.record, inbox);
            }
            other => panic!("expected InboxExists after the SDK's re-send, got {other:?}"),
        }
        assert_eq!(lost.hit_count(), 1, "the fault was injected once");
        assert_eq!(
            store
                .payment(claim, Purpose::Payout)
                .await
                .unwrap()
                .unwrap()
                .record,
            payment
        );
    }

    /// The same for finalize: the first attempt commits, the SDK's re-send carries the old
    /// ETag and is refused. The store cannot tell this from a takeover and answers
    /// PreconditionFailed; the record the consumer re-reads is its own completed write.
    pub async fn finalize_resent_after_ambiguous_timeout_reports_precondition_failed(
        env: Arc<Env>,
    ) {
        let lost = rule(
            "lost-finalize-response",
            FaultOperationType::BatchItem,
            FaultInjectionErrorType::ResponseTimeoutAfterService,
            Some(1),
        );
        lost.disable();
        let store = env.store_with(vec![lost.clone()]).await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-final", AttemptId::new());
        let payment = payment_record(claim, "m-final");
        let version = claimed_version(store.claim(&inbox, &payment).await.unwrap());

        lost.enable();
        let (final_inbox, final_payment) = (completed(&inbox), paid(&payment));
        let outcome = store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &version,
                payment: &final_payment,
                payment_version: None,
            })
            .await;
        assert!(
            matches!(outcome, Err(StoreError::PreconditionFailed)),
            "{outcome:?}"
        );
        assert_eq!(lost.hit_count(), 1);
        let reread = store.inbox(&inbox.key()).await.unwrap().unwrap().record;
        assert_eq!(reread, final_inbox, "our own completed write");
        assert_eq!(
            store
                .payment(claim, Purpose::Payout)
                .await
                .unwrap()
                .unwrap()
                .record,
            final_payment
        );
    }

    /// The raw documents: inbox with `ttl` = retention, payment without `ttl`, both with the
    /// unique key paths; the container's policies as read back.
    pub async fn documents_carry_ttl_only_on_inbox(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-raw", AttemptId::new());
        let payment = payment_record(claim, "m-raw");
        claimed_version(store.claim(&inbox, &payment).await.unwrap());

        let raw_inbox = env
            .raw_json(claim, &inbox_id(CONSUMER, &inbox.message_id))
            .await
            .unwrap();
        assert_eq!(raw_inbox["ttl"], serde_json::json!(RETENTION.as_secs()));
        assert_eq!(raw_inbox["docType"], "inbox");
        assert_eq!(raw_inbox["dedupKey"], format!("{CONSUMER}/m-raw"));
        assert_eq!(raw_inbox["claimId"], claim.to_string());
        assert_eq!(raw_inbox["owner"], inbox.owner.to_string());

        let raw_payment = env
            .raw_json(claim, &payment_id(Purpose::Payout))
            .await
            .unwrap();
        assert!(
            raw_payment.get("ttl").is_none(),
            "payments never expire: {raw_payment}"
        );
        assert_eq!(raw_payment["docType"], "payment");
        assert_eq!(raw_payment["dedupKey"], "payout");
        assert_eq!(raw_payment["amount"], "1250.10");
        assert_eq!(
            raw_payment["payoutRequest"].as_str(),
            payment.payout_request.as_deref()
        );
        assert_eq!(raw_payment["status"], "in_progress");

        let properties: ContainerProperties =
            env.raw.read(None).await.unwrap().into_model().unwrap();
        assert_eq!(properties.default_ttl, TimeToLive::NoDefault);
        let unique: Vec<Vec<String>> = properties
            .unique_key_policy
            .clone()
            .expect("unique key policy")
            .unique_keys
            .into_iter()
            .map(|k| k.paths)
            .collect();
        assert_eq!(
            unique,
            vec![vec!["/docType".to_owned(), "/dedupKey".to_owned()]]
        );
        let pk: Vec<&str> = properties
            .partition_key
            .paths()
            .iter()
            .map(|p| p.as_ref())
            .collect();
        assert_eq!(pk, ["/claimId"]);
        // The indexing policy reads back as defined (up to what the service adds itself):
        // only the queried and unique-key paths, `/*` excluded.
        assert_eq!(
            indexing_policy_difference(&properties),
            None,
            "{:?}",
            properties.indexing_policy
        );
    }

    /// Persistent 429, 503, 408 and lost requests at the claim batch, the point reads and
    /// finalize: the SDK's bounded retries run out and the store answers Transient. Nothing
    /// is half-written.
    pub async fn injected_faults_become_transient_at_each_step(env: Arc<Env>) {
        let errors = [
            ("429", FaultInjectionErrorType::TooManyRequests),
            ("503", FaultInjectionErrorType::ServiceUnavailable),
            ("408", FaultInjectionErrorType::Timeout),
            ("timeout", FaultInjectionErrorType::ResponseTimeout),
            ("connection", FaultInjectionErrorType::ConnectionError),
        ];
        let clean = env.store().await;
        for (name, error) in errors {
            let claim = ClaimId::random();
            let inbox = inbox_record(claim, "m-fault", AttemptId::new());
            let payment = payment_record(claim, "m-fault");

            // The claim batch.
            let batch = rule(
                &format!("batch-{name}"),
                FaultOperationType::BatchItem,
                error,
                None,
            );
            let store = env.store_with(vec![batch.clone()]).await;
            let outcome = store.claim(&inbox, &payment).await;
            assert!(
                matches!(outcome, Err(StoreError::Transient(_))),
                "claim under {name}: {outcome:?}"
            );
            assert!(batch.hit_count() >= 1);
            assert_eq!(
                clean.inbox(&inbox.key()).await.unwrap(),
                None,
                "claim under {name} wrote nothing"
            );

            // Point reads.
            let version = claimed_version(clean.claim(&inbox, &payment).await.unwrap());
            let read = rule(
                &format!("read-{name}"),
                FaultOperationType::ReadItem,
                error,
                None,
            );
            let store = env.store_with(vec![read]).await;
            let outcome = store.inbox(&inbox.key()).await;
            assert!(
                matches!(outcome, Err(StoreError::Transient(_))),
                "inbox read under {name}: {outcome:?}"
            );
            let outcome = store.payment(claim, Purpose::Payout).await;
            assert!(
                matches!(outcome, Err(StoreError::Transient(_))),
                "payment read under {name}: {outcome:?}"
            );

            // Finalize.
            let batch = rule(
                &format!("finalize-{name}"),
                FaultOperationType::BatchItem,
                error,
                None,
            );
            let store = env.store_with(vec![batch]).await;
            let outcome = store
                .finalize(Finalize {
                    inbox: &completed(&inbox),
                    inbox_version: &version,
                    payment: &paid(&payment),
                    payment_version: None,
                })
                .await;
            assert!(
                matches!(outcome, Err(StoreError::Transient(_))),
                "finalize under {name}: {outcome:?}"
            );
            let stored = clean.inbox(&inbox.key()).await.unwrap().unwrap();
            assert_eq!(
                (stored.record, stored.version),
                (inbox, version),
                "finalize under {name} wrote nothing"
            );
        }
    }

    /// A 409 whose conflicting document cannot be read by its id (another instance's
    /// write not yet on the replica that serves the read, under Session or Bounded
    /// Staleness consistency; simulated by point reads answering 404): the store tries
    /// again a few times, then answers Transient, so the broker redelivers instead of
    /// dead-lettering the message as a store failure. A miss that clears is the record.
    pub async fn a_conflicting_document_not_readable_yet_is_transient(env: Arc<Env>) {
        let not_found = || {
            FaultInjectionResultBuilder::new()
                .with_custom_response(CustomResponseBuilder::new(StatusCode::NotFound).build())
                .build()
        };
        let read_misses = |id: &str, limit: Option<u32>| {
            let mut builder = FaultInjectionRuleBuilder::new(id, not_found()).with_condition(
                FaultInjectionConditionBuilder::new()
                    .with_operation_type(FaultOperationType::ReadItem)
                    .build(),
            );
            if let Some(limit) = limit {
                builder = builder.with_hit_limit(limit);
            }
            Arc::new(builder.build())
        };
        let clean = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-lag", AttemptId::new());
        let payment = payment_record(claim, "m-lag");
        claimed_version(clean.claim(&inbox, &payment).await.unwrap());

        // The same message again (inbox 409), the same claim under another message
        // (payment 409), and a business duplicate's inbox record: unreadable throughout.
        let second = inbox_record(claim, "m-lag-2", AttemptId::new());
        clean.record_handled(&completed(&second)).await.unwrap();
        let third = inbox_record(claim, "m-lag-3", AttemptId::new());
        for name in ["inbox", "payment", "record_handled"] {
            let misses = read_misses(&format!("miss-{name}"), None);
            let store = env.store_with(vec![misses.clone()]).await;
            let outcome = match name {
                "inbox" => store.claim(&inbox, &payment).await.map(|_| ()),
                "payment" => store
                    .claim(&third, &payment_record(claim, "m-lag-3"))
                    .await
                    .map(|_| ()),
                _ => store.record_handled(&completed(&second)).await.map(|_| ()),
            };
            assert!(
                matches!(&outcome, Err(StoreError::Transient(reason)) if reason.contains("409")),
                "{name}: {outcome:?}"
            );
            assert!(
                misses.hit_count() >= 2,
                "{name}: read again before giving up"
            );
        }
        assert_eq!(
            clean.inbox(&third.key()).await.unwrap(),
            None,
            "the refused batch wrote nothing"
        );

        // The replica catches up after two misses: the claim reports the record.
        let lagging = read_misses("miss-twice", Some(2));
        let store = env.store_with(vec![lagging.clone()]).await;
        match store.claim(&inbox, &payment).await.unwrap() {
            ClaimResult::InboxExists(existing) => assert_eq!(existing.record, inbox),
            other => panic!("expected InboxExists, got {other:?}"),
        }
        assert_eq!(lagging.hit_count(), 2);
    }

    /// A fault that happens once (or a 429 with a short retry-after) is absorbed by the
    /// SDK's retries: the operation succeeds.
    pub async fn faults_that_clear_are_retried_by_the_sdk(env: Arc<Env>) {
        let throttled = CustomResponseBuilder::new(StatusCode::TooManyRequests)
            .with_sub_status(3200)
            .with_header("x-ms-retry-after-ms", "50")
            .build();
        let throttled_once = Arc::new(
            FaultInjectionRuleBuilder::new(
                "429-retry-after",
                FaultInjectionResultBuilder::new()
                    .with_custom_response(throttled)
                    .build(),
            )
            .with_condition(
                FaultInjectionConditionBuilder::new()
                    .with_operation_type(FaultOperationType::BatchItem)
                    .build(),
            )
            .with_hit_limit(1)
            .build(),
        );
        let rules = vec![
            throttled_once.clone(),
            rule(
                "503-read",
                FaultOperationType::ReadItem,
                FaultInjectionErrorType::ServiceUnavailable,
                Some(1),
            ),
            rule(
                "408-replace",
                FaultOperationType::ReplaceItem,
                FaultInjectionErrorType::Timeout,
                Some(1),
            ),
        ];
        let store = env.store_with(rules.clone()).await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-clears", AttemptId::new());
        let payment = payment_record(claim, "m-clears");
        let version = claimed_version(store.claim(&inbox, &payment).await.unwrap());
        assert_eq!(
            store.inbox(&inbox.key()).await.unwrap().unwrap().record,
            inbox
        );
        let takeover = InboxRecord {
            owner: AttemptId::new(),
            ..inbox.clone()
        };
        let version = store.replace_inbox(&takeover, &version).await.unwrap();
        let connection_once = rule(
            "connection-finalize",
            FaultOperationType::BatchItem,
            FaultInjectionErrorType::ConnectionError,
            Some(1),
        );
        let store = env.store_with(vec![connection_once.clone()]).await;
        store
            .finalize(Finalize {
                inbox: &completed(&takeover),
                inbox_version: &version,
                payment: &paid(&payment),
                payment_version: None,
            })
            .await
            .unwrap();
        for rule in rules.iter().chain([&connection_once]) {
            assert_eq!(rule.hit_count(), 1, "rule {} fired once", rule.id());
        }
    }

    /// MessageIds with Cosmos-reserved characters or many multi-byte characters are
    /// encoded into legal ids and read back unchanged.
    pub async fn unusual_message_ids_round_trip(env: Arc<Env>) {
        let store = env.store().await;
        let ids = [
            "a/b?c#d\\e".to_owned(),
            "🦀".repeat(MessageId::MAX_CHARS),
            "ü".repeat(MessageId::MAX_CHARS),
            "100% ~ sure: yes".to_owned(),
        ];
        for raw in ids {
            let claim = ClaimId::random();
            let inbox = inbox_record(claim, &raw, AttemptId::new());
            claimed_version(
                store
                    .claim(&inbox, &payment_record(claim, &raw))
                    .await
                    .unwrap(),
            );
            let read = store
                .inbox(&inbox.key())
                .await
                .unwrap()
                .expect("read back by key");
            assert_eq!(read.record.message_id.as_str(), raw);
            assert_eq!(read.record, inbox);
            let again = InboxRecord {
                owner: AttemptId::new(),
                ..inbox.clone()
            };
            assert!(matches!(
                store
                    .claim(&again, &payment_record(claim, &raw))
                    .await
                    .unwrap(),
                ClaimResult::InboxExists(_)
            ));
            let id = inbox_id(CONSUMER, &inbox.message_id);
            assert!(
                id.chars().count() <= 255 && !id.contains(['/', '\\', '?', '#']),
                "{id}"
            );
            assert!(env.raw_json(claim, &id).await.is_some());
        }
    }

    pub async fn record_handled_and_replace_inbox(env: Arc<Env>) {
        let store = env.store().await;
        let claim = ClaimId::random();
        let inbox = inbox_record(claim, "m-handled", AttemptId::new());
        let version = match store.record_handled(&inbox).await.unwrap() {
            InsertResult::Inserted(version) => version,
            other => panic!("expected Inserted, got {other:?}"),
        };
        let released = InboxRecord {
            lease_until: None,
            updated_at: now(),
            ..inbox.clone()
        };
        let new_version = store.replace_inbox(&released, &version).await.unwrap();
        assert_ne!(new_version, version);
        let stale = store.replace_inbox(&inbox, &version).await;
        assert!(
            matches!(stale, Err(StoreError::PreconditionFailed)),
            "{stale:?}"
        );
        let missing = inbox_record(claim, "m-never-stored", AttemptId::new());
        let outcome = store.replace_inbox(&missing, &version).await;
        assert!(
            matches!(outcome, Err(StoreError::PreconditionFailed)),
            "{outcome:?}"
        );
        assert_eq!(
            store.purge_expired(now(), 100).await.unwrap(),
            0,
            "Cosmos expires inbox documents itself"
        );
    }

    pub async fn lists_are_oldest_first_and_bounded(env: Arc<Env>) {
        let store = env.store().await;
        let base = now() - time::Duration::hours(1);
        let mut expected = Vec::new();
        // Written newest first, across several claims (partitions).
        for age in [3, 1, 2] {
            let claim = ClaimId::random();
            let at = base + time::Duration::seconds(age);
            let msg = format!("m-list-{age}");
            let inbox = InboxRecord {
                created_at: at,
                ..inbox_record(claim, &msg, AttemptId::new())
            };
            let payment = PaymentRecord {
                created_at: at,
                ..payment_record(claim, &msg)
            };
            claimed_version(store.claim(&inbox, &payment).await.unwrap());
            expected.push((at, inbox, payment));
        }
        expected.sort_by_key(|(at, _, _)| *at);
        let payments = store.list_payments(2).await.unwrap();
        assert_eq!(
            payments,
            vec![Ok(expected[0].2.clone()), Ok(expected[1].2.clone())]
        );
        let inbox = store.list_inbox(10).await.unwrap();
        assert_eq!(
            inbox,
            expected
                .iter()
                .map(|(_, i, _)| Ok(i.clone()))
                .collect::<Vec<_>>()
        );
        assert!(store.list_payments(0).await.unwrap().is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// Definition, provisioning, connect, the emulator binary (local only)
// ---------------------------------------------------------------------------------------

#[test]
fn container_definition_equals_the_infra_file() {
    let infra: serde_json::Value =
        serde_json::from_str(include_str!("../../../../infra/cosmos-container.json"))
            .expect("infra/cosmos-container.json is JSON");
    assert_eq!(container_definition("payments"), infra);
    let text: serde_json::Value = serde_json::from_str(&container_definition_json()).unwrap();
    assert_eq!(text, infra);
}

#[tokio::test]
async fn provision_is_idempotent_and_refuses_a_different_container() {
    let emulator = InProcessEmulator::new().unwrap();
    let first = emulator.provision(DATABASE, CONTAINER).await.unwrap();
    assert!(first.database_created && first.container_created, "{first}");
    let second = emulator.provision(DATABASE, CONTAINER).await.unwrap();
    assert!(
        !second.database_created && !second.container_created,
        "{second}"
    );

    // A container created earlier without the unique key cannot be fixed in place.
    let client = emulator.client(Vec::new()).await.unwrap();
    let legacy = ContainerProperties::new("legacy".to_owned(), "/claimId".into())
        .with_default_ttl(TimeToLive::NoDefault);
    client
        .database_client(DATABASE)
        .create_container(legacy, None)
        .await
        .unwrap();
    let error = provision_with_client(&client, DATABASE, "legacy")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("uniqueKeyPolicy") && error.contains("legacy"),
        "{error}"
    );
    assert!(
        !error.contains("defaultTtl"),
        "only the real difference is named: {error}"
    );
}

/// A container deployed before the indexed paths were narrowed indexes every path. Provisioning (key auth)
/// replaces its indexing policy in place; the documents stay, the unique key still refuses
/// a second inbox or payment document, and the listings still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_narrows_an_outdated_indexing_policy_in_place() {
    let emulator = InProcessEmulator::new().unwrap();
    let client = emulator.client(Vec::new()).await.unwrap();
    client.create_database(DATABASE, None).await.unwrap();
    let mut legacy = container_definition(CONTAINER);
    legacy["indexingPolicy"] = serde_json::json!({
        "indexingMode": "consistent",
        "automatic": true,
        "includedPaths": [ { "path": "/*" } ],
        "excludedPaths": [ { "path": "/payoutRequest/?" }, { "path": "/\"_etag\"/?" } ]
    });
    let legacy: ContainerProperties = serde_json::from_value(legacy).unwrap();
    client
        .database_client(DATABASE)
        .create_container(legacy, None)
        .await
        .unwrap();
    let container = client
        .database_client(DATABASE)
        .container_client(CONTAINER, None)
        .await
        .unwrap();
    let read_properties = || async {
        let properties: ContainerProperties =
            container.read(None).await.unwrap().into_model().unwrap();
        properties
    };
    assert!(indexing_policy_difference(&read_properties().await).is_some());

    // A claim made under the old policy.
    let store = CosmosStore::from_container(container.clone(), RETENTION).unwrap();
    let claim = ClaimId::random();
    let inbox = inbox_record(claim, "m-before", AttemptId::new());
    let payment = payment_record(claim, "m-before");
    claimed_version(store.claim(&inbox, &payment).await.unwrap());

    let report = provision_with_client(&client, DATABASE, CONTAINER)
        .await
        .unwrap();
    assert!(
        report.indexing_policy_updated && !report.container_created,
        "{report}"
    );
    assert!(
        report.to_string().contains("indexing policy was updated"),
        "{report}"
    );
    assert_eq!(indexing_policy_difference(&read_properties().await), None);
    let again = provision_with_client(&client, DATABASE, CONTAINER)
        .await
        .unwrap();
    assert!(!again.indexing_policy_updated, "{again}");

    // The data is still there, and the unique key still refuses a second payment and a
    // second inbox document for the same keys under other ids.
    assert_eq!(
        store.inbox(&inbox.key()).await.unwrap().unwrap().record,
        inbox
    );
    let mut impostor = PaymentDoc::from_record(&payment_record(claim, "m-other"));
    impostor.id = "payment:payout:v2".to_owned();
    let refused = container
        .create_item(claim.to_string(), &impostor.id, &impostor, None)
        .await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().status().status_code(),
        StatusCode::Conflict
    );
    let mut inbox_impostor = InboxDoc::from_record(&inbox, 60);
    inbox_impostor.id = "inbox:other-encoding".to_owned();
    let refused = container
        .create_item(claim.to_string(), &inbox_impostor.id, &inbox_impostor, None)
        .await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().status().status_code(),
        StatusCode::Conflict
    );
    // A redelivery and a second message for the claim are still told apart.
    match store.claim(&inbox, &payment).await.unwrap() {
        ClaimResult::InboxExists(existing) => assert_eq!(existing.record, inbox),
        other => panic!("expected InboxExists, got {other:?}"),
    }
    let second = inbox_record(claim, "m-after", AttemptId::new());
    assert!(matches!(
        store
            .claim(&second, &payment_record(claim, "m-after"))
            .await
            .unwrap(),
        ClaimResult::PaymentExists(_)
    ));
    // The listings filter on docType and sort on createdAt, both still indexed.
    assert_eq!(store.list_payments(10).await.unwrap(), vec![Ok(payment)]);
    assert_eq!(store.list_inbox(10).await.unwrap(), vec![Ok(inbox)]);
}

/// Serves a fresh emulator over loopback HTTP in this process; returns its settings.
async fn served_emulator(
    provision: bool,
) -> (
    CosmosSettings,
    InProcessEmulator,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
    let emulator = InProcessEmulator::at(url.clone()).unwrap();
    if provision {
        emulator.provision(DATABASE, CONTAINER).await.unwrap();
    }
    let server = tokio::spawn(serve(emulator.clone(), listener));
    (
        CosmosSettings::for_emulator(url, EMULATOR_KEY),
        emulator,
        server,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_http_explains_what_is_wrong() {
    let (settings, emulator, server) = served_emulator(false).await;

    let missing = CosmosStore::connect(&settings, RETENTION)
        .await
        .err()
        .expect("no container yet")
        .to_string();
    assert!(
        missing.contains("does not exist") && missing.contains("payments"),
        "{missing}"
    );

    let client = emulator.client(Vec::new()).await.unwrap();
    client.create_database(DATABASE, None).await.unwrap();
    let wrong = ContainerProperties::new(CONTAINER.to_owned(), "/tenantId".into());
    client
        .database_client(DATABASE)
        .create_container(wrong, None)
        .await
        .unwrap();
    let mismatch = CosmosStore::connect(&settings, RETENTION)
        .await
        .err()
        .expect("wrong container")
        .to_string();
    assert!(
        mismatch.contains("partitionKey") && mismatch.contains("uniqueKeyPolicy"),
        "{mismatch}"
    );

    let zero = CosmosStore::connect(&settings, Duration::ZERO)
        .await
        .err()
        .expect("zero retention")
        .to_string();
    assert!(zero.contains("retention"), "{zero}");
    server.abort();

    // Nothing listens there any more: connect retries within the budget, then says so.
    let mut gone = settings.clone();
    gone.startup_budget = Duration::from_millis(600);
    let unreachable = CosmosStore::connect(&gone, RETENTION)
        .await
        .err()
        .expect("unreachable")
        .to_string();
    assert!(unreachable.contains("unreachable"), "{unreachable}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_http_serves_claims() {
    let (settings, _emulator, server) = served_emulator(true).await;
    let store = CosmosStore::connect(&settings, RETENTION).await.unwrap();
    let claim = ClaimId::random();
    let inbox = inbox_record(claim, "m-http", AttemptId::new());
    let payment = payment_record(claim, "m-http");
    let version = claimed_version(store.claim(&inbox, &payment).await.unwrap());
    assert!(matches!(
        store.claim(&inbox, &payment).await.unwrap(),
        ClaimResult::InboxExists(_)
    ));
    store
        .finalize(Finalize {
            inbox: &completed(&inbox),
            inbox_version: &version,
            payment: &paid(&payment),
            payment_version: None,
        })
        .await
        .unwrap();
    assert_eq!(
        store
            .payment(claim, Purpose::Payout)
            .await
            .unwrap()
            .unwrap()
            .record
            .status,
        PaymentStatus::Paid
    );
    server.abort();
}

/// Against a real account only: a wrong key is refused at connect with a clear message.
#[tokio::test]
async fn real_cosmos_wrong_key_is_a_clear_error() {
    let Some(mut settings) = real_settings() else {
        return;
    };
    settings.auth =
        claims_payments_cosmos::CosmosAuth::Key(azure_core::credentials::Secret::new(EMULATOR_KEY));
    let error = CosmosStore::connect(&settings, RETENTION)
        .await
        .err()
        .expect("wrong key refused")
        .to_string();
    assert!(error.contains("COSMOS_KEY"), "{error}");
}
