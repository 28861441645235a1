//! [`CosmosStore`]: the [`Store`] port on one Cosmos DB container.
//!
//! Every trait method is one request, except where a refusal is followed by the read that
//! returns the existing record (claim, record_handled); when that read misses, the write
//! and read are tried again a few times, then answered as transient (see
//! [`CONFLICT_READ_PAUSES`]: under Session or Bounded Staleness consistency another
//! instance's document may not be readable at once). Batches are judged by their
//! per-operation status codes: a refused batch comes back as `Ok` with status 207, whose
//! `is_success()` is true.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use azure_core::http::StatusCode;
use azure_data_cosmos::feed::FeedScope;
use azure_data_cosmos::models::{
    ItemResponse, TransactionalBatch, TransactionalBatchOperationResult,
};
use azure_data_cosmos::options::{BatchReplaceOptions, ItemWriteOptions, Precondition};
use azure_data_cosmos::{ContainerClient, CosmosError, Query};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use super::container::check_properties;
use super::documents::{
    effect_doc_type, effect_id, inbox_id, listed_effect, listed_inbox, listed_payment, payment_id,
    EffectDoc, InboxDoc, PaymentDoc, INBOX_DOC_TYPE, PAYMENT_DOC_TYPE,
};
use super::errors::{classify, describe, error_charge, is_transient_code, note, record_charge};
use super::settings::{CosmosAuth, CosmosSettings};
use claims_payments_engine::domain::{ClaimId, Purpose};
use claims_payments_engine::store::once::{Effect, EffectKind, OnceResult, OnceStore};
use claims_payments_engine::store::{
    ClaimResult, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, RoundTrips, Store, StoreError, StoreResult, Version, Versioned,
};
use claims_payments_engine::telemetry;

/// The Cosmos DB store. Cheap to share behind an `Arc`; the SDK client inside is
/// thread-safe and keeps its own connection pool.
pub struct CosmosStore {
    container: ContainerClient,
    inbox_ttl_seconds: i32,
    requests: RoundTrips,
}

/// What a claim batch found, before any follow-up read.
enum BatchOutcome {
    Committed(Version),
    InboxConflict,
    PaymentConflict,
}

impl CosmosStore {
    /// Wraps an existing container client (tests, the emulator, callers that built their
    /// own client). `retention` becomes the inbox documents' `ttl`.
    pub fn from_container(container: ContainerClient, retention: Duration) -> anyhow::Result<Self> {
        Ok(CosmosStore {
            container,
            inbox_ttl_seconds: ttl_seconds(retention)?,
            requests: RoundTrips::default(),
        })
    }

    /// Connects to the container described by `settings`, retrying an unreachable endpoint
    /// within `settings.startup_budget` (the SDK's client build is eager, and an emulator in
    /// docker-compose may still be starting). Then checks what would otherwise fail on the
    /// first message: the container exists, matches the definition (partition key, unique
    /// key, default TTL), and the identity may read items in it. Wrong keys, missing
    /// containers and forbidden identities fail at once with a message saying what to fix.
    pub async fn connect(settings: &CosmosSettings, retention: Duration) -> anyhow::Result<Self> {
        let inbox_ttl_seconds = ttl_seconds(retention)?;
        let started = Instant::now();
        let mut delay = Duration::from_millis(250);
        loop {
            match try_connect(settings).await {
                Ok(container) => {
                    tracing::info!(
                        endpoint = %settings.endpoint,
                        database = %settings.database,
                        container = %settings.container,
                        auth = %settings.auth.describe(),
                        "connected to Cosmos DB"
                    );
                    return Ok(CosmosStore {
                        container,
                        inbox_ttl_seconds,
                        requests: RoundTrips::default(),
                    });
                }
                Err(ConnectError::Fatal(error)) => return Err(error),
                Err(ConnectError::Transient(reason)) => {
                    if started.elapsed() + delay > settings.startup_budget {
                        anyhow::bail!(
                            "Cosmos DB at {} is unreachable after {:?}: {reason}",
                            settings.endpoint,
                            started.elapsed()
                        );
                    }
                    tracing::warn!(endpoint = %settings.endpoint, %reason, "Cosmos DB not reachable yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(4));
                }
            }
        }
    }

    /// How many requests this store has sent to Cosmos DB (one per SDK operation; the
    /// SDK's own transparent retries of an operation are not counted separately).
    pub fn request_count(&self) -> u64 {
        self.requests.so_far()
    }

    /// The container this store writes to.
    pub fn container(&self) -> &ContainerClient {
        &self.container
    }

    fn fail(&self, op: &'static str, error: &CosmosError) -> StoreError {
        record_charge(
            op,
            error_charge(error),
            u16::from(error.status().status_code()),
        );
        note(classify(op, error))
    }

    async fn read_doc<T: DeserializeOwned>(
        &self,
        op: &'static str,
        claim: ClaimId,
        id: &str,
    ) -> StoreResult<Option<(T, Version)>> {
        self.requests.count();
        match self.container.read_item(claim.to_string(), id, None).await {
            Ok(response) => {
                let etag = answered(op, &response)?;
                let doc = response.into_model::<serde_json::Value>().map_err(|e| {
                    StoreError::Permanent(format!("cosmos {op}: unreadable body: {e}"))
                })?;
                let doc = serde_json::from_value::<T>(doc).map_err(|e| {
                    StoreError::Permanent(format!("cosmos {op}: corrupt document {id}: {e}"))
                })?;
                Ok(Some((doc, etag)))
            }
            Err(error) if error.status().is_not_found() => {
                record_charge(op, error_charge(&error), 404);
                Ok(None)
            }
            Err(error) => Err(self.fail(op, &error)),
        }
    }

    /// Sends `batch` and returns its per-operation results, or the failure of the whole
    /// request.
    async fn execute_batch(
        &self,
        op: &'static str,
        batch: TransactionalBatch,
        expected_ops: usize,
    ) -> StoreResult<Vec<TransactionalBatchOperationResult>> {
        self.requests.count();
        let response = match self
            .container
            .execute_transactional_batch(batch, None)
            .await
        {
            Ok(response) => response,
            Err(error) => return Err(self.fail(op, &error)),
        };
        let status = u16::from(response.status().status_code());
        let charge = either_charge(
            response.diagnostics().total_request_charge().value(),
            response.headers().request_charge().map(|c| c.value()),
        );
        record_charge(op, charge, status);
        let results = response.into_model().map_err(|e| {
            StoreError::Permanent(format!("cosmos {op}: unreadable batch response: {e}"))
        })?;
        let results = results.results().to_vec();
        if results.len() != expected_ops {
            return Err(StoreError::Permanent(format!(
                "cosmos {op}: batch answered {} results for {expected_ops} operations (status {status})",
                results.len()
            )));
        }
        Ok(results)
    }

    async fn claim_batch(
        &self,
        inbox: &InboxDoc,
        payment: &PaymentDoc,
    ) -> StoreResult<BatchOutcome> {
        const OP: &str = "claim";
        // The inbox goes first, so a redelivery is reported on operation 0 (and the
        // payment, which would conflict too, only as 424 Failed Dependency).
        let batch = TransactionalBatch::new(inbox.claim_id.clone())
            .create_item(inbox)
            .and_then(|b| b.create_item(payment))
            .map_err(|e| {
                StoreError::Permanent(format!("cosmos {OP}: cannot serialize documents: {e}"))
            })?;
        let results = self.execute_batch(OP, batch, 2).await?;
        if results.iter().all(|r| r.is_success()) {
            let etag = results[0].etag().ok_or_else(|| {
                StoreError::Permanent(format!("cosmos {OP}: created inbox document has no ETag"))
            })?;
            return Ok(BatchOutcome::Committed(Version(etag.to_owned())));
        }
        match culprit(&results) {
            Some((0, 409)) => Ok(BatchOutcome::InboxConflict),
            Some((1, 409)) => Ok(BatchOutcome::PaymentConflict),
            other => Err(note(batch_failure(OP, other, &results))),
        }
    }
}

/// The first operation that failed for its own reason (not 424 Failed Dependency).
fn culprit(results: &[TransactionalBatchOperationResult]) -> Option<(usize, u16)> {
    results
        .iter()
        .enumerate()
        .find(|(_, r)| !r.is_success() && r.status_code() != 424)
        .map(|(index, r)| (index, r.status_code()))
}

fn batch_failure(
    op: &'static str,
    culprit: Option<(usize, u16)>,
    results: &[TransactionalBatchOperationResult],
) -> StoreError {
    let codes: Vec<String> = results
        .iter()
        .map(|r| match r.substatus_code() {
            Some(sub) => format!("{}/{sub}", r.status_code()),
            None => r.status_code().to_string(),
        })
        .collect();
    let retry_after = results
        .iter()
        .filter_map(|r| r.retry_after())
        .max()
        .map(|d| format!(", server asked to retry after {} ms", d.as_millis()))
        .unwrap_or_default();
    let text = format!(
        "cosmos {op}: batch refused, operation statuses [{}]{retry_after}",
        codes.join(", ")
    );
    match culprit {
        Some((_, 412)) => StoreError::PreconditionFailed,
        Some((_, code)) if is_transient_code(code) => StoreError::Transient(text),
        _ => StoreError::Permanent(text),
    }
}

enum ConnectError {
    Transient(String),
    Fatal(anyhow::Error),
}

async fn try_connect(settings: &CosmosSettings) -> Result<ContainerClient, ConnectError> {
    let client = settings.build_client().await.map_err(|error| {
        match error.downcast_ref::<CosmosError>() {
            Some(cosmos) => connect_failure(settings, "connect", cosmos),
            None => ConnectError::Fatal(error),
        }
    })?;
    let container = client
        .database_client(settings.database.as_str())
        .container_client(settings.container.as_str(), None)
        .await
        .map_err(|e| connect_failure(settings, "open_container", &e))?;
    let properties = container
        .read(None)
        .await
        .and_then(|r| r.into_model())
        .map_err(|e| connect_failure(settings, "read_container", &e))?;
    check_properties(&settings.database, &settings.container, &properties)
        .map_err(ConnectError::Fatal)?;
    // A data-plane read proves the identity may read items, not only metadata. The item
    // does not exist; 404 is the expected answer.
    let probe_claim = uuid::Uuid::nil().to_string();
    match container
        .read_item(probe_claim, "connect-probe", None)
        .await
    {
        Ok(_) => {}
        Err(e) if e.status().is_not_found() => {}
        Err(e) => return Err(connect_failure(settings, "read_item", &e)),
    }
    Ok(container)
}

fn connect_failure(settings: &CosmosSettings, step: &str, error: &CosmosError) -> ConnectError {
    let status = error.status();
    let code = u16::from(status.status_code());
    let detail = describe(step, error);
    let hint = match code {
        401 => match settings.auth {
            CosmosAuth::Key(_) => "the account refused the key: check COSMOS_KEY".to_owned(),
            _ => format!("authentication failed with the {}", settings.auth.describe()),
        },
        403 => format!(
            "forbidden for the {}: grant it the 'Cosmos DB Built-in Data Contributor' data-plane role \
             on the account, and check the account's firewall / private endpoint settings",
            settings.auth.describe()
        ),
        404 => format!(
            "container {:?} in database {:?} does not exist at {}: deploy it with the Bicep \
             (infra/cosmos-container.json), or run `cosmos-emulator --provision` / provision() for an emulator",
            settings.container, settings.database, settings.endpoint
        ),
        _ if is_transient_code(code) => return ConnectError::Transient(detail),
        _ => "cannot use the Cosmos DB container".to_owned(),
    };
    ConnectError::Fatal(anyhow::anyhow!("{hint} ({detail})"))
}

fn ttl_seconds(retention: Duration) -> anyhow::Result<i32> {
    let seconds = retention.as_secs();
    if seconds == 0 {
        anyhow::bail!(
            "inbox retention must be at least one second (Cosmos DB ttl is in whole seconds)"
        );
    }
    i32::try_from(seconds).map_err(|_| {
        anyhow::anyhow!(
            "inbox retention of {seconds} s exceeds the Cosmos DB ttl maximum of {} s",
            i32::MAX
        )
    })
}

fn response_charge(response: &ItemResponse) -> f64 {
    either_charge(
        response.diagnostics().total_request_charge().value(),
        response.headers().request_charge().map(|c| c.value()),
    )
}

/// The charge the diagnostics total, else the `x-ms-request-charge` header's.
fn either_charge(diagnostics_total: f64, header: Option<f64>) -> f64 {
    if diagnostics_total > 0.0 {
        diagnostics_total
    } else {
        header.unwrap_or(0.0)
    }
}

/// Records a successful answer's charge and returns the ETag it carries.
fn answered(op: &'static str, response: &ItemResponse) -> StoreResult<Version> {
    record_charge(
        op,
        response_charge(response),
        u16::from(response.status().status_code()),
    );
    response
        .headers()
        .etag()
        .map(|etag| Version(etag.to_string()))
        .ok_or_else(|| StoreError::Permanent(format!("cosmos {op}: response has no ETag")))
}

/// The pauses before trying a refused write again when the document that refused it
/// (409) cannot be read. A miss has three causes, and only a later look tells them apart:
/// - a replica behind the write: under Session or Bounded Staleness consistency a read
///   by another client (another instance) may be served by a replica that has not yet
///   applied the write that caused the 409; it catches up within milliseconds normally;
/// - an inbox document whose TTL expired in between: the next batch simply commits;
/// - a document holding the same unique key (docType, dedupKey) under another id (written
///   by hand or by an older id encoding): it never becomes readable by our id.
///
/// Retrying within the delivery is bounded by these pauses (under a second in all).
/// After them the answer is transient, never permanent: the broker redelivers, and
/// only a document that stays unreadable over every delivery ends in the dead-letter
/// queue, as deliveries exhausted (with this reason in the log of each), not as a store
/// failure on the first look.
pub const CONFLICT_READ_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(150),
    Duration::from_millis(400),
];

/// The answer when the document that refused `op` stayed unreadable through
/// [`CONFLICT_READ_PAUSES`]: transient, counted, and logged for operators.
fn conflict_unreadable(op: &'static str, document: &'static str, claim: ClaimId) -> StoreError {
    let tries = CONFLICT_READ_PAUSES.len() + 1;
    tracing::warn!(
        operation = op,
        claimId = %claim,
        document,
        tries,
        "cosmos: a write was refused with 409 but the conflicting document cannot be read by its id"
    );
    note(StoreError::Transient(format!(
        "cosmos {op} of claim {claim}: refused with 409 {tries} times, but the conflicting \
         {document} document cannot be read by its id (a replica not yet caught up under Session \
         or Bounded Staleness consistency, or a document holding the same (docType, dedupKey) \
         under another id); the next delivery tries again"
    )))
}

fn if_match(version: &Version) -> Precondition {
    Precondition::if_match(version.0.clone())
}

impl CosmosStore {
    /// The two documents of one transactional batch, which must share the claim's
    /// partition.
    fn documents(
        &self,
        op: &str,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<(InboxDoc, PaymentDoc)> {
        if inbox.claim_id != payment.claim_id {
            return Err(StoreError::Permanent(format!(
                "{op}: inbox record is for claim {} but payment record for claim {}",
                inbox.claim_id, payment.claim_id
            )));
        }
        Ok((
            InboxDoc::from_record(inbox, self.inbox_ttl_seconds),
            PaymentDoc::from_record(payment),
        ))
    }
}

#[async_trait]
impl Store for CosmosStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        let (inbox_doc, payment_doc) = self.documents("claim", inbox, payment)?;
        // A refusal is followed by a read of the record that caused it; a miss is tried
        // again, batch and read, after a short pause (see `CONFLICT_READ_PAUSES`).
        let mut pauses = CONFLICT_READ_PAUSES.iter();
        loop {
            let missed = match self.claim_batch(&inbox_doc, &payment_doc).await? {
                BatchOutcome::Committed(inbox_version) => {
                    return Ok(ClaimResult::Claimed { inbox_version })
                }
                BatchOutcome::InboxConflict => match self.inbox(&inbox.key()).await? {
                    Some(existing) => return Ok(ClaimResult::InboxExists(existing)),
                    None => "inbox",
                },
                BatchOutcome::PaymentConflict => {
                    match self.payment(payment.claim_id, payment.purpose).await? {
                        Some(existing) => return Ok(ClaimResult::PaymentExists(existing)),
                        None => "payment",
                    }
                }
            };
            match pauses.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return Err(conflict_unreadable("claim", missed, inbox.claim_id)),
            }
        }
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        let id = inbox_id(&key.consumer, &key.message_id);
        let Some((doc, version)) = self
            .read_doc::<InboxDoc>("read_inbox", key.claim_id, &id)
            .await?
        else {
            return Ok(None);
        };
        let record = doc.into_record(Some(key))?;
        Ok(Some(Versioned { record, version }))
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        let id = payment_id(purpose);
        let Some((doc, version)) = self
            .read_doc::<PaymentDoc>("read_payment", claim, &id)
            .await?
        else {
            return Ok(None);
        };
        let record = doc.into_record(Some(claim))?;
        if record.purpose != purpose {
            return Err(StoreError::Permanent(format!(
                "corrupt payment document {id}: holds purpose {}",
                record.purpose.as_str()
            )));
        }
        Ok(Some(Versioned { record, version }))
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        const OP: &str = "record_handled";
        let doc = InboxDoc::from_record(inbox, self.inbox_ttl_seconds);
        let mut pauses = CONFLICT_READ_PAUSES.iter();
        loop {
            self.requests.count();
            match self
                .container
                .create_item(doc.claim_id.clone(), &doc.id, &doc, None)
                .await
            {
                Ok(response) => {
                    return Ok(InsertResult::Inserted(answered(OP, &response)?));
                }
                Err(error) if error.status().is_conflict() => {
                    record_charge(OP, error_charge(&error), 409);
                    if let Some(existing) = self.inbox(&inbox.key()).await? {
                        return Ok(InsertResult::AlreadyExists(Box::new(existing)));
                    }
                }
                Err(error) => return Err(self.fail(OP, &error)),
            }
            match pauses.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return Err(conflict_unreadable(OP, "inbox", inbox.claim_id)),
            }
        }
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        const OP: &str = "replace_inbox";
        let doc = InboxDoc::from_record(inbox, self.inbox_ttl_seconds);
        let options = ItemWriteOptions::default().with_precondition(if_match(expected));
        self.requests.count();
        match self
            .container
            .replace_item(doc.claim_id.clone(), &doc.id, &doc, Some(options))
            .await
        {
            Ok(response) => answered(OP, &response),
            // The record no longer exists, so it no longer carries `expected` either.
            Err(error) if error.status().is_not_found() => {
                record_charge(OP, error_charge(&error), 404);
                Err(StoreError::PreconditionFailed)
            }
            Err(error) => Err(self.fail(OP, &error)),
        }
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        const OP: &str = "finalize";
        let (inbox_doc, payment_doc) = self.documents(OP, write.inbox, write.payment)?;
        let condition =
            BatchReplaceOptions::default().with_precondition(if_match(write.inbox_version));
        let batch = TransactionalBatch::new(inbox_doc.claim_id.clone())
            .replace_item(inbox_doc.id.clone(), &inbox_doc, Some(condition))
            .and_then(|b| {
                let settled = write
                    .payment_version
                    .map(|v| BatchReplaceOptions::default().with_precondition(if_match(v)));
                b.replace_item(payment_doc.id.clone(), &payment_doc, settled)
            })
            .map_err(|e| {
                StoreError::Permanent(format!("cosmos {OP}: cannot serialize documents: {e}"))
            })?;
        let results = self.execute_batch(OP, batch, 2).await?;
        if results.iter().all(|r| r.is_success()) {
            return Ok(());
        }
        match culprit(&results) {
            // The inbox changed (a takeover) or vanished since our version was read.
            Some((0, 412 | 404)) => Err(StoreError::PreconditionFailed),
            // The payment was settled by someone else since we read it.
            Some((1, 412)) if write.payment_version.is_some() => {
                Err(StoreError::PreconditionFailed)
            }
            other => Err(note(batch_failure(OP, other, &results))),
        }
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        let docs: Vec<serde_json::Value> = self
            .list("list_payments", PAYMENT_DOC_TYPE, "", limit)
            .await?;
        Ok(docs.into_iter().map(listed_payment).collect())
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        let docs: Vec<(PaymentDoc, Option<String>)> = self
            .list(
                "unsettled_payments",
                PAYMENT_DOC_TYPE,
                "AND (c.status = 'in_progress' OR c.status = 'needs_reconciliation')",
                limit,
            )
            .await?
            .into_iter()
            .map(|value: serde_json::Value| {
                let etag = value
                    .get("_etag")
                    .and_then(|e| e.as_str())
                    .map(str::to_owned);
                serde_json::from_value::<PaymentDoc>(value)
                    .map(|doc| (doc, etag))
                    .map_err(|e| {
                        StoreError::Permanent(format!(
                            "cosmos unsettled_payments: corrupt payment document: {e}"
                        ))
                    })
            })
            .collect::<StoreResult<_>>()?;
        docs.into_iter()
            .map(|(doc, etag)| {
                let etag = etag.ok_or_else(|| {
                    StoreError::Permanent(
                        "cosmos unsettled_payments: a document without _etag".into(),
                    )
                })?;
                Ok(Versioned {
                    record: doc.into_record(None)?,
                    version: Version(etag),
                })
            })
            .collect()
    }

    /// Counted by listing the documents (at most `limit`): a cross-partition aggregate
    /// is not something the SDK merges for us, and the set is small.
    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        let filter = match status {
            PaymentStatus::Recorded => "AND c.status = 'recorded'",
            PaymentStatus::InProgress => "AND c.status = 'in_progress'",
            PaymentStatus::Paid => "AND c.status = 'paid'",
            PaymentStatus::Rejected => "AND c.status = 'rejected'",
            PaymentStatus::NeedsReconciliation => "AND c.status = 'needs_reconciliation'",
            PaymentStatus::Mismatched => "AND c.status = 'mismatched'",
        };
        let docs: Vec<serde_json::Value> = self
            .list("count_payments", PAYMENT_DOC_TYPE, filter, limit)
            .await?;
        Ok(docs.len())
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        let docs: Vec<serde_json::Value> =
            self.list("list_inbox", INBOX_DOC_TYPE, "", limit).await?;
        Ok(docs.into_iter().map(listed_inbox).collect())
    }

    /// Cosmos DB deletes expired inbox documents itself: each carries `ttl` (the
    /// retention, counted from its last write) in a container with `defaultTtl = -1`.
    /// There is nothing to purge, and no request is sent.
    async fn purge_expired(&self, _now: OffsetDateTime, _batch: usize) -> StoreResult<u64> {
        Ok(0)
    }

    /// Inbox documents carry a `ttl`; Cosmos DB deletes them itself.
    fn expires_by_itself(&self) -> bool {
        true
    }
}

#[async_trait]
impl OnceStore for CosmosStore {
    /// One transactional batch in the claim's partition, as the claim: the inbox document
    /// first (a redelivery is reported on operation 0), then the effect's.
    async fn record_once(&self, inbox: &InboxRecord, effect: &Effect) -> StoreResult<OnceResult> {
        const OP: &str = "record_once";
        if inbox.claim_id != effect.claim_id {
            return Err(StoreError::Permanent(format!(
                "{OP}: inbox record is for claim {} but the effect for claim {}",
                inbox.claim_id, effect.claim_id
            )));
        }
        let inbox_doc = InboxDoc::from_record(inbox, self.inbox_ttl_seconds);
        let effect_doc = EffectDoc::from_record(effect);
        let mut pauses = CONFLICT_READ_PAUSES.iter();
        loop {
            let batch = TransactionalBatch::new(inbox_doc.claim_id.clone())
                .create_item(&inbox_doc)
                .and_then(|b| b.create_item(&effect_doc))
                .map_err(|e| {
                    StoreError::Permanent(format!("cosmos {OP}: cannot serialize documents: {e}"))
                })?;
            let results = self.execute_batch(OP, batch, 2).await?;
            if results.iter().all(|r| r.is_success()) {
                return Ok(OnceResult::Recorded);
            }
            let missed = match culprit(&results) {
                Some((0, 409)) => match self.inbox(&inbox.key()).await? {
                    Some(existing) => return Ok(OnceResult::InboxExists(existing)),
                    None => "inbox",
                },
                Some((1, 409)) => match self.effect(effect).await? {
                    Some(existing) => return Ok(OnceResult::EffectExists(existing)),
                    None => "effect",
                },
                other => return Err(note(batch_failure(OP, other, &results))),
            };
            match pauses.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return Err(conflict_unreadable(OP, missed, inbox.claim_id)),
            }
        }
    }

    async fn effects(&self, kind: &EffectKind, limit: usize) -> StoreResult<Vec<Listed<Effect>>> {
        let docs: Vec<serde_json::Value> = self
            .list("list_effects", &effect_doc_type(kind), "", limit)
            .await?;
        Ok(docs.into_iter().map(listed_effect).collect())
    }
}

impl CosmosStore {
    /// The stored effect under `effect`'s (kind, claim, key), if any.
    async fn effect(&self, effect: &Effect) -> StoreResult<Option<Effect>> {
        let id = effect_id(&effect.kind, &effect.key);
        let Some((doc, _)) = self
            .read_doc::<EffectDoc>("read_effect", effect.claim_id, &id)
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(doc.into_record()?))
    }
}

impl CosmosStore {
    /// A cross-partition query for one document type, oldest first. Timestamps are
    /// fixed-width UTC strings, so ordering by the string orders by time.
    async fn list<T: DeserializeOwned>(
        &self,
        op: &'static str,
        doc_type: &str,
        filter: &'static str,
        limit: usize,
    ) -> StoreResult<Vec<T>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // TOP takes a 32-bit integer (a larger one is answered 400): past that, the query
        // has no TOP and the pages are read up to the limit below.
        let top = match i32::try_from(limit) {
            Ok(n) => format!("TOP {n} "),
            Err(_) => String::new(),
        };
        let query = Query::from(format!(
            "SELECT {top}* FROM c WHERE c.docType = @docType {filter} ORDER BY c.createdAt ASC"
        ))
        .with_parameter("@docType", doc_type)
        .map_err(|e| StoreError::Permanent(format!("cosmos {op}: cannot build query: {e}")))?;
        self.requests.count();
        let pages = match self
            .container
            .query_items::<serde_json::Value>(query, FeedScope::full_container(), None)
            .await
        {
            Ok(items) => items.into_pages(),
            Err(error) => return Err(self.fail(op, &error)),
        };
        futures::pin_mut!(pages);
        let mut docs = Vec::new();
        let mut charge = 0.0;
        while let Some(page) = pages.next().await {
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    telemetry::counters().cosmos_request_units.add(charge);
                    return Err(self.fail(op, &error));
                }
            };
            charge += page.diagnostics().total_request_charge().value();
            for value in page.into_items() {
                let doc = serde_json::from_value::<T>(value).map_err(|e| {
                    StoreError::Permanent(format!("cosmos {op}: corrupt {doc_type} document: {e}"))
                })?;
                docs.push(doc);
                if docs.len() == limit {
                    break;
                }
            }
            if docs.len() == limit {
                break;
            }
        }
        record_charge(op, charge, u16::from(StatusCode::Ok));
        Ok(docs)
    }
}
