//! Cosmos DB request units per message, **computed** from Microsoft's published
//! request-unit rules for the documents the service really writes, and what that costs
//! per million messages.
//!
//! The SDK's in-process emulator charges a constant figure (about 1.24 RU per batch operation,
//! whatever the document), so its figures say nothing about Azure's bill. Instead the bench
//! runs the real consumer (the state machine `serve` runs) in this process against the
//! emulator, through a [`RecordingStore`] that logs every Cosmos request the store sends,
//! with each document as the emulator stores it (system properties included), and prices
//! the log with [`price`]:
//!
//! - create: a size-based charge (5.0 RU up to 1 KiB; Microsoft's write-size table above
//!   that) plus 0.2 RU per indexed term;
//! - replace: the size-based charge of a delete plus that of an insert, plus 0.2 RU per
//!   indexed term removed and 0.2 per term added (a term is an indexed path with its value;
//!   `_ts` is counted as changed on every replace, though its one-second resolution may
//!   leave it equal);
//! - delete (the TTL expiry of an inbox document, which serverless bills like a delete):
//!   the size-based charge plus 0.2 RU per indexed term;
//! - point read: 1 RU per KiB, doubled under Strong consistency (the deployed level);
//! - a transactional batch: the sum of its operations (how Azure bills a batch is not
//!   published; the service reports one figure per batch);
//! - a refused request (409 conflict, 412 precondition): **not published**; counted, never
//!   priced. The unique-key surcharge ("slightly higher") is not published either.
//!
//! Indexed terms follow the container's indexing policy: scalar values on included paths
//! (the most precise matching path decides), plus `id` and `_ts`, which the service always
//! indexes; `_etag` and the other system properties are not indexed. A null value is a
//! term too. Sources and worked examples: `understand-request-unit-consumption.md`,
//! `index-policy.md`, `optimize-cost-reads-writes.md` (see the team's research notes A1-A6).

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_data_cosmos::ContainerClient;
use serde::Serialize;
use serde_json::Value;

use crate::emulator::InProcessEmulator;
use crate::sim::bank::{FakeBank, FakeBankSettings};
use claims_payments::seams::store::{
    ClaimResult, InboxRecord, InsertResult, PaymentRecord, Store, StoreCall, StoreDecorator,
    StoreError, StoreResult, Versioned,
};
use claims_payments::{ClaimApproved, ClaimId, MessageId};
use claims_payments_cosmos::container::{container_definition, DEFAULT_CONTAINER};
use claims_payments_cosmos::documents::{inbox_id, payment_id};
use claims_payments_cosmos::CosmosStore;
use claims_payments_settings::names;

/// RU per indexed term written or removed.
pub const RU_PER_TERM: f64 = 0.2;
/// Reads cost twice as much under Strong (and Bounded Staleness) consistency; the
/// deployed account is Strong (`infra/main.bicep`).
pub const STRONG_READ_FACTOR: f64 = 2.0;

/// The size-based part of a write (create, or each half of a replace, or a delete).
/// Microsoft's table for writes: 1 KB 4.95, 2 KB 6.29, 4 KB 6.67, 16 KB 9.52 RU; its
/// worked example of the formula uses 5.0 for 1 KB, which is used here. Above 16 KiB:
/// proportional (no document of this service comes near).
pub fn write_base(size_bytes: usize) -> f64 {
    let kib = size_bytes as f64 / 1024.0;
    if kib <= 1.0 {
        5.0
    } else if kib <= 2.0 {
        6.29
    } else if kib <= 4.0 {
        6.67
    } else if kib <= 16.0 {
        9.52
    } else {
        9.52 * kib / 16.0
    }
}

/// A point read of a stored document of this size, under Strong consistency.
pub fn read_charge(size_bytes: usize) -> f64 {
    (size_bytes as f64 / 1024.0).ceil().max(1.0) * STRONG_READ_FACTOR
}

/// Which paths an indexing policy indexes.
#[derive(Debug, Clone)]
pub struct IndexPolicy {
    included: Vec<String>,
    excluded: Vec<String>,
}

impl IndexPolicy {
    /// The policy of a container definition (`indexingPolicy` of the REST JSON).
    pub fn of_definition(definition: &Value) -> Self {
        let paths = |key: &str| -> Vec<String> {
            definition["indexingPolicy"][key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p["path"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        IndexPolicy {
            included: paths("includedPaths"),
            excluded: paths("excludedPaths"),
        }
    }

    /// The policy this service deployed before the indexed paths were narrowed to the
    /// queried ones: every path but the payout request.
    pub fn everything_but_payout_request() -> Self {
        IndexPolicy {
            included: vec!["/*".into()],
            excluded: vec!["/payoutRequest/?".into(), "/\"_etag\"/?".into()],
        }
    }

    /// The policy in `infra/cosmos-container.json` (the code's definition, kept equal).
    pub fn deployed() -> Self {
        Self::of_definition(&container_definition(DEFAULT_CONTAINER))
    }

    /// How precisely `pattern` matches the scalar at `path`, if it does: `/a/?` matches
    /// only the value at `/a`; `/a/*` everything at and below `/a`. More segments win, and
    /// an exact `?` beats a `*` with the same prefix.
    fn precision(pattern: &str, path: &str) -> Option<(usize, u8)> {
        if let Some(prefix) = pattern.strip_suffix("/?") {
            (prefix == path).then(|| (prefix.matches('/').count(), 1))
        } else if let Some(prefix) = pattern.strip_suffix("/*") {
            let under =
                prefix.is_empty() || path == prefix || path.starts_with(&format!("{prefix}/"));
            under.then(|| (prefix.matches('/').count(), 0))
        } else {
            None
        }
    }

    fn indexes(&self, path: &str) -> bool {
        let best = |patterns: &[String]| {
            patterns
                .iter()
                .filter_map(|p| Self::precision(p, path))
                .max()
        };
        match (best(&self.included), best(&self.excluded)) {
            (Some(i), Some(e)) => i > e,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The indexed terms of a stored document: `(path, value)` for every indexed scalar
    /// (a null too), plus `id` and `_ts` whatever the policy says.
    pub fn terms(&self, doc: &Value) -> BTreeSet<(String, String)> {
        let mut leaves = Vec::new();
        if let Some(object) = doc.as_object() {
            for (key, value) in object {
                // System properties are not indexed, except `_ts` (below).
                if !key.starts_with('_') {
                    collect_leaves(&format!("/{key}"), value, &mut leaves);
                }
            }
        }
        let mut terms: BTreeSet<(String, String)> = leaves
            .into_iter()
            .filter(|(path, _)| path == "/id" || self.indexes(path))
            .collect();
        terms.insert(("/_ts".into(), doc["_ts"].to_string()));
        terms
    }
}

fn collect_leaves(path: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                collect_leaves(&format!("{path}/{key}"), value, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_leaves(&format!("{path}/[]"), item, out);
            }
        }
        scalar => out.push((path.to_owned(), scalar.to_string())),
    }
}

fn size(doc: &Value) -> usize {
    serde_json::to_vec(doc).map_or(0, |b| b.len())
}

/// One Cosmos request the store sent, with the documents as stored.
#[derive(Debug, Clone)]
pub enum Request {
    /// A committed create (alone or in a batch).
    Create(Value),
    /// A committed replace: the document before and after.
    Replace(Value, Value),
    /// A point read; `None` when the document did not exist (priced as a 1 KiB read).
    Read(Option<Value>),
    /// A write or batch the service refused (409, 412): its charge is not published.
    Refused,
}

/// The computed charge of some requests under one indexing policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Priced {
    /// Request units of the committed writes and the reads.
    pub request_units: f64,
    /// Requests whose charge is not published (refused batches and writes).
    pub refused: f64,
}

/// Prices `requests` under `policy`.
pub fn price(requests: &[Request], policy: &IndexPolicy) -> Priced {
    let mut priced = Priced::default();
    for request in requests {
        match request {
            Request::Create(doc) => {
                priced.request_units +=
                    write_base(size(doc)) + RU_PER_TERM * policy.terms(doc).len() as f64;
            }
            Request::Replace(before, after) => {
                let (old, new) = (policy.terms(before), policy.terms(after));
                let mut changed = old.symmetric_difference(&new).count();
                // `_ts` has one-second resolution, so a replace within the second of the
                // create leaves it equal; a write sets it anew all the same, and the bank
                // call between claim and finalize takes longer in production than with
                // the sandbox. Counted as changed on every replace (the higher figure).
                if before["_ts"] == after["_ts"] {
                    changed += 2;
                }
                priced.request_units += write_base(size(before))
                    + write_base(size(after))
                    + RU_PER_TERM * changed as f64;
            }
            Request::Read(doc) => {
                priced.request_units += read_charge(doc.as_ref().map_or(0, size));
            }
            Request::Refused => priced.refused += 1.0,
        }
    }
    priced
}

/// The TTL delete of a stored document (billed on serverless like a delete).
pub fn delete_charge(doc: &Value, policy: &IndexPolicy) -> f64 {
    write_base(size(doc)) + RU_PER_TERM * policy.terms(doc).len() as f64
}

/// A [`StoreDecorator`] around a [`CosmosStore`] that logs each request the store sends, with the
/// stored documents read back raw from the container (the reads are not part of the log).
pub struct RecordingStore {
    inner: Arc<CosmosStore>,
    raw: ContainerClient,
    log: Mutex<Vec<Request>>,
    /// The last stored version of every document written through this store.
    docs: Mutex<HashMap<(ClaimId, String), Value>>,
    /// Inbox documents created since the last [`RecordingStore::take`] (they expire later).
    created_inbox: Mutex<Vec<(ClaimId, String)>>,
}

/// What one case's messages made the store do.
#[derive(Debug, Default)]
pub struct Recorded {
    pub requests: Vec<Request>,
    /// The final stored version of each inbox document the case created.
    pub expiring: Vec<Value>,
}

impl RecordingStore {
    pub fn new(inner: Arc<CosmosStore>) -> Self {
        RecordingStore {
            raw: inner.container().clone(),
            inner,
            log: Mutex::new(Vec::new()),
            docs: Mutex::new(HashMap::new()),
            created_inbox: Mutex::new(Vec::new()),
        }
    }

    /// Requests sent to Cosmos so far (the store's own count).
    pub fn request_count(&self) -> u64 {
        self.inner.request_count()
    }

    /// Everything logged since the last call.
    pub fn take(&self) -> Recorded {
        let requests = std::mem::take(&mut *lock(&self.log));
        let created = std::mem::take(&mut *lock(&self.created_inbox));
        let docs = lock(&self.docs);
        Recorded {
            requests,
            expiring: created
                .iter()
                .filter_map(|key| docs.get(key).cloned())
                .collect(),
        }
    }

    fn push(&self, request: Request) {
        lock(&self.log).push(request);
    }

    /// The stored document, read raw (and remembered).
    async fn stored(&self, claim: ClaimId, id: &str) -> Option<Value> {
        let doc: Option<Value> = match self.raw.read_item(claim.to_string(), id, None).await {
            Ok(response) => response.into_model().ok(),
            Err(_) => None,
        };
        if let Some(doc) = &doc {
            lock(&self.docs).insert((claim, id.to_owned()), doc.clone());
        }
        doc
    }

    async fn known(&self, claim: ClaimId, id: &str) -> Option<Value> {
        let remembered = lock(&self.docs).get(&(claim, id.to_owned())).cloned();
        match remembered {
            Some(doc) => Some(doc),
            None => self.stored(claim, id).await,
        }
    }

    async fn created(&self, claim: ClaimId, id: &str, inbox: bool) {
        if let Some(doc) = self.stored(claim, id).await {
            self.push(Request::Create(doc));
        }
        if inbox {
            lock(&self.created_inbox).push((claim, id.to_owned()));
        }
    }

    async fn replaced(&self, claim: ClaimId, id: &str, before: Option<Value>) {
        if let (Some(before), Some(after)) = (before, self.stored(claim, id).await) {
            self.push(Request::Replace(before, after));
        }
    }

    /// A create refused because the document exists: the store then reads it.
    async fn refused_then_read(&self, claim: ClaimId, id: &str) {
        self.push(Request::Refused);
        let doc = self.known(claim, id).await;
        self.push(Request::Read(doc));
    }

    async fn read(&self, claim: ClaimId, id: &str, answer: Answer) {
        match answer {
            Answer::Done => {
                let doc = self.known(claim, id).await;
                self.push(Request::Read(doc));
            }
            Answer::Absent => self.push(Request::Read(None)),
            _ => {}
        }
    }

    /// Logs what a call sent, from its answer; `before` holds the documents of
    /// [`replaced_documents`] as they were before the call.
    async fn record(&self, call: StoreCall<'_>, answer: Answer, before: Vec<Option<Value>>) {
        match call {
            StoreCall::Claim { inbox, payment } => {
                let (claim, inbox_id) = inbox_document(inbox);
                let payment_id = payment_id(payment.purpose);
                match answer {
                    Answer::Done => {
                        self.created(claim, &inbox_id, true).await;
                        self.created(claim, &payment_id, false).await;
                    }
                    Answer::InboxExists => self.refused_then_read(claim, &inbox_id).await,
                    Answer::PaymentExists => self.refused_then_read(claim, &payment_id).await,
                    _ => {}
                }
            }
            StoreCall::RecordHandled(inbox) => {
                let (claim, id) = inbox_document(inbox);
                match answer {
                    Answer::Done => self.created(claim, &id, true).await,
                    Answer::InboxExists => self.refused_then_read(claim, &id).await,
                    _ => {}
                }
            }
            StoreCall::Inbox(key) => {
                let id = inbox_id(&key.consumer, &key.message_id);
                self.read(key.claim_id, &id, answer).await;
            }
            StoreCall::Payment { claim, purpose } => {
                self.read(claim, &payment_id(purpose), answer).await;
            }
            StoreCall::ReplaceInbox { .. } | StoreCall::Finalize(_) => match answer {
                Answer::Done => {
                    for ((claim, id), before) in replaced_documents(&call).into_iter().zip(before) {
                        self.replaced(claim, &id, before).await;
                    }
                }
                Answer::Refused => self.push(Request::Refused),
                // A replace of an inbox record is logged as refused whatever failed it
                // (a condition is all that fails it here); a finalize only on its condition.
                Answer::Failed if matches!(call, StoreCall::ReplaceInbox { .. }) => {
                    self.push(Request::Refused)
                }
                _ => {}
            },
            // The listings and the purge are not on a message's path: not priced.
            _ => {}
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The partition and id of an inbox record's document.
fn inbox_document(inbox: &InboxRecord) -> (ClaimId, String) {
    (inbox.claim_id, inbox_id(&inbox.consumer, &inbox.message_id))
}

/// The documents a call replaces when it succeeds, in the order it writes them.
fn replaced_documents(call: &StoreCall<'_>) -> Vec<(ClaimId, String)> {
    match call {
        StoreCall::ReplaceInbox { inbox, .. } => vec![inbox_document(inbox)],
        StoreCall::Finalize(write) => vec![
            inbox_document(write.inbox),
            (write.inbox.claim_id, payment_id(write.payment.purpose)),
        ],
        _ => Vec::new(),
    }
}

/// What a store answer says about the documents, told apart by the answer's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The write happened, or the read found its document.
    Done,
    /// The read found nothing.
    Absent,
    /// A create found the inbox document already there.
    InboxExists,
    /// A claim found the payment document already there.
    PaymentExists,
    /// A condition refused the write.
    Refused,
    /// Any other failure.
    Failed,
}

impl Answer {
    fn of<T: 'static>(result: &StoreResult<T>) -> Answer {
        let answer: &dyn Any = match result {
            Ok(answer) => answer,
            Err(StoreError::PreconditionFailed) => return Answer::Refused,
            Err(_) => return Answer::Failed,
        };
        if let Some(claimed) = answer.downcast_ref::<ClaimResult>() {
            return match claimed {
                ClaimResult::Claimed { .. } => Answer::Done,
                ClaimResult::InboxExists(_) => Answer::InboxExists,
                ClaimResult::PaymentExists(_) => Answer::PaymentExists,
            };
        }
        if let Some(InsertResult::AlreadyExists(_)) = answer.downcast_ref::<InsertResult>() {
            return Answer::InboxExists;
        }
        let absent = answer
            .downcast_ref::<Option<Versioned<InboxRecord>>>()
            .is_some_and(Option::is_none)
            || answer
                .downcast_ref::<Option<Versioned<PaymentRecord>>>()
                .is_some_and(Option::is_none);
        if absent {
            Answer::Absent
        } else {
            Answer::Done
        }
    }
}

impl StoreDecorator for RecordingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let mut before = Vec::new();
        for (claim, id) in replaced_documents(&call) {
            before.push(self.known(claim, &id).await);
        }
        let result = work.await;
        self.record(call, Answer::of(&result), before).await;
        result
    }
}

/// The cases the issue prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    FreshLedgerOnly,
    FreshWithPayout,
    DuplicateFromMemory,
    DuplicateAtStore,
    BusinessDuplicate,
}

impl Case {
    pub const ALL: [Case; 5] = [
        Case::FreshLedgerOnly,
        Case::FreshWithPayout,
        Case::DuplicateFromMemory,
        Case::DuplicateAtStore,
        Case::BusinessDuplicate,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Case::FreshLedgerOnly => "fresh, ledger-only",
            Case::FreshWithPayout => "fresh, with payout",
            Case::DuplicateFromMemory => "duplicate from memory",
            Case::DuplicateAtStore => "duplicate at the store",
            Case::BusinessDuplicate => "business duplicate",
        }
    }
}

/// Computed figures of one case, per message.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseCost {
    pub case: Case,
    pub messages: usize,
    /// Requests the store sent (round trips), per message.
    pub round_trips: f64,
    /// Under the deployed indexing policy.
    pub request_units: f64,
    /// The later TTL delete of the inbox document the message created (serverless bills it).
    pub ttl_delete_request_units: f64,
    /// Under the policy deployed before (every path but the payout request).
    pub before_request_units: f64,
    pub before_ttl_delete_request_units: f64,
    /// Refused requests per message, whose charge is not published (not in the figures).
    pub refused_requests: f64,
    /// Indexed terms per created document under the deployed policy / before.
    pub terms_per_document: f64,
    pub before_terms_per_document: f64,
    /// Largest stored document the case wrote, bytes (system properties included).
    pub largest_document_bytes: usize,
}

fn per_message(recorded: &Recorded, messages: usize, round_trips: u64, case: Case) -> CaseCost {
    let (now, before) = (
        IndexPolicy::deployed(),
        IndexPolicy::everything_but_payout_request(),
    );
    let n = messages.max(1) as f64;
    let (priced, priced_before) = (
        price(&recorded.requests, &now),
        price(&recorded.requests, &before),
    );
    let ttl = |policy: &IndexPolicy| {
        recorded
            .expiring
            .iter()
            .map(|doc| delete_charge(doc, policy))
            .sum::<f64>()
            / n
            + 0.0 // an empty f64 sum is -0.0
    };
    let created: Vec<&Value> = recorded
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::Create(doc) => Some(doc),
            _ => None,
        })
        .collect();
    let terms = |policy: &IndexPolicy| {
        if created.is_empty() {
            0.0
        } else {
            created
                .iter()
                .map(|d| policy.terms(d).len() as f64)
                .sum::<f64>()
                / created.len() as f64
        }
    };
    let largest = recorded
        .requests
        .iter()
        .flat_map(|r| match r {
            Request::Create(doc) | Request::Read(Some(doc)) => vec![size(doc)],
            Request::Replace(a, b) => vec![size(a), size(b)],
            _ => vec![],
        })
        .max()
        .unwrap_or(0);
    CaseCost {
        case,
        messages,
        round_trips: round_trips as f64 / n,
        request_units: priced.request_units / n,
        ttl_delete_request_units: ttl(&now),
        before_request_units: priced_before.request_units / n,
        before_ttl_delete_request_units: ttl(&before),
        refused_requests: priced.refused / n,
        terms_per_document: terms(&now),
        before_terms_per_document: terms(&before),
        largest_document_bytes: largest,
    }
}

/// A message body as the bench's load generator sends it, parsed.
fn message(n: usize, run: &str) -> anyhow::Result<ClaimApproved> {
    let body = super::claim_body(n as u64, run);
    ClaimApproved::parse(std::str::from_utf8(&body)?)
        .map_err(|e| anyhow::anyhow!("bench message does not parse: {e}"))
}

fn delivery(id: &str, count: u32) -> anyhow::Result<claims_payments::seams::consumer::Delivery> {
    Ok(claims_payments::seams::consumer::Delivery {
        message_id: MessageId::parse(id).map_err(|e| anyhow::anyhow!("{e}"))?,
        delivery_count: count,
    })
}

/// Runs `messages` messages of every case through the real consumer on the in-process
/// emulator and prices what the store sent.
pub async fn computed(messages: usize) -> anyhow::Result<Vec<CaseCost>> {
    const DATABASE: &str = "payments";
    let emulator = InProcessEmulator::new()?;
    emulator.provision(DATABASE, DEFAULT_CONTAINER).await?;
    let retention = Duration::from_secs(30 * 24 * 3600);
    let bank = FakeBank::start_with(FakeBankSettings::default()).await?;
    let consumer_name = "ClaimApprovedHandler";
    let store = Arc::new(RecordingStore::new(Arc::new(
        emulator
            .store(DATABASE, DEFAULT_CONTAINER, retention, Vec::new())
            .await?,
    )));
    let settings = |bank_url: Option<String>| {
        claims_payments::seams::configuration::Settings::from_lookup(|name| match name {
            names::BANK_API_URL => bank_url.clone(),
            names::CONSUMER_NAME => Some(consumer_name.to_owned()),
            _ => None,
        })
        .map_err(|e| anyhow::anyhow!("bench settings: {e}"))
    };
    let consumer = |settings: claims_payments::seams::configuration::Settings| {
        claims_payments::seams::startup::Composition::new(
            &settings,
            store.clone(),
            claims_payments::seams::Seams::default(),
        )
        .map(|parts| parts.services.consumer())
    };
    let ledger = consumer(settings(None)?)?;
    // A second instance (or this one after a restart): same store, empty memory.
    let other_instance = consumer(settings(None)?)?;
    let payout = consumer(settings(Some(bank.url()))?)?;

    let ids: Vec<String> = (0..messages)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let second_ids: Vec<String> = (0..messages)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let payout_ids: Vec<String> = (0..messages)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let bodies: Vec<ClaimApproved> = (0..messages)
        .map(|n| message(n, "ru-ledger"))
        .collect::<anyhow::Result<_>>()?;
    let payout_bodies: Vec<ClaimApproved> = (0..messages)
        .map(|n| message(n, "ru-payout"))
        .collect::<anyhow::Result<_>>()?;

    let mut costs = Vec::new();
    for case in Case::ALL {
        let (consumer, ids, bodies, count, expected) = match case {
            Case::FreshLedgerOnly => (&ledger, &ids, &bodies, 1, "recorded"),
            Case::DuplicateFromMemory => (&ledger, &ids, &bodies, 2, "duplicate"),
            Case::DuplicateAtStore => (&other_instance, &ids, &bodies, 2, "duplicate"),
            Case::BusinessDuplicate => (&ledger, &second_ids, &bodies, 1, "business-duplicate"),
            Case::FreshWithPayout => (&payout, &payout_ids, &payout_bodies, 1, "paid"),
        };
        let _ = store.take();
        let requests_before = store.request_count();
        for (id, body) in ids.iter().zip(bodies) {
            let outcome = consumer.handle(body, &delivery(id, count)?).await;
            anyhow::ensure!(
                outcome.label() == expected,
                "RU computation, case {}: expected {expected}, got {outcome:?}",
                case.label()
            );
        }
        let round_trips = store.request_count() - requests_before;
        costs.push(per_message(&store.take(), messages, round_trips, case));
    }
    Ok(costs)
}

/// List prices (US, single write region; check the region's price), from the team's
/// research notes A6 (`understand-your-bill.md`, the autoscale FAQ).
pub mod prices {
    /// Serverless: dollars per million request units consumed.
    pub const SERVERLESS_PER_MILLION_RU: f64 = 0.25;
    /// Provisioned (manual): dollars per 100 RU/s per hour.
    pub const MANUAL_PER_100_RUS_HOUR: f64 = 0.008;
    /// Autoscale bills 1.5 times the manual rate (single write region).
    pub const AUTOSCALE_FACTOR: f64 = 1.5;
    /// Smallest manual throughput, RU/s.
    pub const MANUAL_MINIMUM_RUS: f64 = 400.0;
    /// Hours in the month the figures use.
    pub const HOURS_PER_MONTH: f64 = 720.0;
}

/// What a million messages of one kind cost, and where provisioned throughput breaks even.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CostPerMillion {
    pub request_units_per_message: f64,
    /// Serverless: every RU billed.
    pub serverless: f64,
    /// Manual throughput kept fully busy (the floor of any provisioned bill).
    pub manual_at_full_use: f64,
    /// Autoscale at its maximum, fully busy.
    pub autoscale_at_full_use: f64,
    /// Messages a month at which serverless costs as much as the smallest manual
    /// throughput (400 RU/s all month).
    pub break_even_messages_per_month: f64,
    /// Most messages per second the smallest manual throughput sustains.
    pub manual_minimum_messages_per_second: f64,
}

pub fn cost_per_million(request_units_per_message: f64) -> CostPerMillion {
    use prices::*;
    let ru_millions = request_units_per_message; // per million messages, in millions of RU
    let manual_per_million_ru = MANUAL_PER_100_RUS_HOUR / (100.0 * 3600.0) * 1e6;
    let manual_floor_month = MANUAL_MINIMUM_RUS / 100.0 * MANUAL_PER_100_RUS_HOUR * HOURS_PER_MONTH;
    let serverless_per_message = request_units_per_message * SERVERLESS_PER_MILLION_RU / 1e6;
    CostPerMillion {
        request_units_per_message,
        serverless: ru_millions * SERVERLESS_PER_MILLION_RU,
        manual_at_full_use: ru_millions * manual_per_million_ru,
        autoscale_at_full_use: ru_millions * manual_per_million_ru * AUTOSCALE_FACTOR,
        break_even_messages_per_month: if serverless_per_message > 0.0 {
            manual_floor_month / serverless_per_message
        } else {
            0.0
        },
        manual_minimum_messages_per_second: if request_units_per_message > 0.0 {
            MANUAL_MINIMUM_RUS / request_units_per_message
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(extra: Value) -> Value {
        let mut d = json!({
            "id": "payment:payout", "claimId": "c", "docType": "payment", "dedupKey": "payout",
            "status": "recorded", "createdAt": "2026-01-01T00:00:00.000000000Z", "note": null,
            "_rid": "r", "_self": "s", "_etag": "\"e\"", "_attachments": "attachments/", "_ts": 1
        });
        if let (Some(d), Some(extra)) = (d.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    }

    #[test]
    fn microsoft_worked_examples() {
        // "1 KB with 10 indexed terms = 5.0 + 0.2 x 10 = 7 RU"
        assert!((write_base(1000) + RU_PER_TERM * 10.0 - 7.0).abs() < 1e-9);
        // "replace, 1 KB with 2 changed terms = 10.8 RU"
        let before = doc(json!({}));
        let after = doc(json!({"status": "paid", "_ts": 2}));
        let p = price(&[Request::Replace(before, after)], &IndexPolicy::deployed());
        assert!((p.request_units - 10.8).abs() < 1e-9, "{p:?}");
        assert_eq!(write_base(1500), 6.29);
        assert_eq!(read_charge(100), 2.0, "1 KiB read, doubled under Strong");
        assert_eq!(read_charge(1025), 4.0);
    }

    #[test]
    fn terms_follow_the_policy() {
        let d = doc(json!({"nested": {"a": 1, "b": [1, 2]}, "payoutRequest": "x"}));
        let deployed = IndexPolicy::deployed().terms(&d);
        let paths: Vec<&str> = deployed.iter().map(|(p, _)| p.as_str()).collect();
        // id and _ts always; docType, dedupKey, createdAt, status from the policy.
        assert_eq!(
            paths,
            [
                "/_ts",
                "/createdAt",
                "/dedupKey",
                "/docType",
                "/id",
                "/status"
            ]
        );
        let everything = IndexPolicy::everything_but_payout_request().terms(&d);
        let paths: BTreeSet<&str> = everything.iter().map(|(p, _)| p.as_str()).collect();
        assert!(paths.contains("/note"), "null is a term");
        assert!(paths.contains("/nested/b/[]") && paths.contains("/nested/a"));
        assert!(!paths.contains("/payoutRequest") && !paths.contains("/_etag"));
        assert!(!paths.contains("/_rid"));
        // id, claimId, docType, dedupKey, status, createdAt, note, nested/a, 2 x nested/b/[]
        // (one per element; equal values collapse in the set), _ts
        assert_eq!(everything.len(), 11, "{everything:?}");
    }

    #[test]
    fn the_more_precise_path_wins() {
        let policy = IndexPolicy {
            included: vec!["/a/*".into(), "/b/c/?".into()],
            excluded: vec!["/*".into(), "/a/x/?".into()],
        };
        assert!(policy.indexes("/a/y"));
        assert!(!policy.indexes("/a/x"));
        assert!(policy.indexes("/b/c"));
        assert!(!policy.indexes("/b/d"));
        assert!(!policy.indexes("/z"));
    }

    #[test]
    fn refusals_are_counted_not_priced() {
        let p = price(
            &[Request::Refused, Request::Read(None)],
            &IndexPolicy::deployed(),
        );
        assert_eq!(
            p,
            Priced {
                request_units: 2.0,
                refused: 1.0
            }
        );
    }

    /// The real consumer on the in-process emulator: each case makes the requests the
    /// design says, and the computed charges follow from the documents' terms and sizes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cases_make_the_expected_requests() {
        let costs = computed(3).await.unwrap();
        let case = |c: Case| costs.iter().find(|x| x.case == c).unwrap().clone();
        let fresh = case(Case::FreshLedgerOnly);
        assert_eq!(fresh.round_trips, 1.0, "one claim batch");
        assert_eq!(fresh.terms_per_document, 6.0, "id, _ts + 4 indexed paths");
        assert!(fresh.largest_document_bytes < 1024, "{fresh:?}");
        // Two creates of under 1 KiB with 6 terms each.
        assert!(
            (fresh.request_units - 2.0 * (5.0 + 0.2 * 6.0)).abs() < 1e-9,
            "{fresh:?}"
        );
        assert!(
            fresh.before_request_units > fresh.request_units + 4.0,
            "{fresh:?}"
        );
        assert_eq!(fresh.refused_requests, 0.0);
        let memory = case(Case::DuplicateFromMemory);
        assert_eq!((memory.round_trips, memory.request_units), (0.0, 0.0));
        let store = case(Case::DuplicateAtStore);
        assert_eq!(store.round_trips, 2.0, "refused batch + read");
        assert_eq!((store.request_units, store.refused_requests), (2.0, 1.0));
        assert_eq!(store.ttl_delete_request_units, 0.0, "writes nothing");
        let business = case(Case::BusinessDuplicate);
        assert_eq!(
            business.round_trips, 3.0,
            "refused batch + read + inbox create"
        );
        assert!(business.ttl_delete_request_units > 0.0);
        let payout = case(Case::FreshWithPayout);
        assert_eq!(payout.round_trips, 2.0, "claim batch + finalize batch");
        // Claim 12.4; finalize: two replaces changing status and _ts (4 terms each).
        assert!(
            (payout.request_units - (12.4 + 2.0 * (10.0 + 0.2 * 4.0))).abs() < 1e-9,
            "{payout:?}"
        );
    }

    #[test]
    fn cost_per_million_from_the_price_list() {
        let c = cost_per_million(10.0);
        assert!((c.serverless - 2.5).abs() < 1e-9);
        // 100 RU/s for an hour is 360,000 RU for $0.008: $0.0222 per million RU.
        assert!((c.manual_at_full_use - 0.2222).abs() < 1e-3);
        assert!((c.autoscale_at_full_use - 0.3333).abs() < 1e-3);
        // 400 RU/s for 720 h = $23.04 buys 92.16 M serverless RU = 9.216 M messages.
        assert!((c.break_even_messages_per_month - 9.216e6).abs() < 1.0);
        assert!((c.manual_minimum_messages_per_second - 40.0).abs() < 1e-9);
    }
}
