//! The store as dependencies: a decorator that makes every call a client span (a
//! dependency in Application Insights) with the database system, the outcome and, on
//! Cosmos, the request charge. Used only when telemetry is exported.

use std::sync::Arc;

use async_trait::async_trait;
use time::OffsetDateTime;
use tracing::Instrument;

use super::{
    ClaimResult, DynStore, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreError, StoreResult, Version, Versioned,
};
use crate::domain::{ClaimId, Purpose};
use crate::telemetry::{self, trace};

/// The store as dependencies: every call is a client span named after the operation,
/// with the database system, the outcome and, on Cosmos, the request charge.
pub(crate) struct TracedStore {
    inner: DynStore,
    system: &'static str,
    namespace: String,
}

impl TracedStore {
    /// Wraps `inner` when telemetry is exported; otherwise returns it unchanged.
    pub(crate) fn wrap(inner: DynStore, system: &'static str, namespace: String) -> DynStore {
        if !telemetry::enabled() {
            return inner;
        }
        Arc::new(TracedStore {
            inner,
            system,
            namespace,
        })
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        claim: Option<ClaimId>,
        work: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let span = tracing::info_span!(
            "store",
            otel.name = format!("{} {operation}", self.system),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            db.system.name = self.system,
            db.namespace = self.namespace.as_str(),
            db.operation.name = operation,
            claimId = tracing::field::Empty,
            db.cosmosdb.request_charge = tracing::field::Empty,
            store.result = tracing::field::Empty,
        );
        if let Some(claim) = claim {
            span.record("claimId", claim.to_string().as_str());
        }
        let (result, charge) = trace::charged(work.instrument(span.clone())).await;
        if charge > 0.0 {
            span.record("db.cosmosdb.request_charge", charge);
        }
        let (label, ok) = match &result {
            Ok(_) => ("ok", true),
            // A refused condition is an answer, not a failure of the dependency.
            Err(StoreError::PreconditionFailed) => ("precondition-failed", true),
            Err(StoreError::Transient(_)) => ("transient", false),
            Err(StoreError::Permanent(_)) => ("permanent", false),
        };
        span.record("store.result", label);
        if !ok {
            trace::fail(&span, label);
        }
        result
    }
}

#[async_trait]
impl Store for TracedStore {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        self.call(
            "claim",
            Some(inbox.claim_id),
            self.inner.claim(inbox, payment),
        )
        .await
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        self.call("read inbox", Some(key.claim_id), self.inner.inbox(key))
            .await
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        self.call(
            "read payment",
            Some(claim),
            self.inner.payment(claim, purpose),
        )
        .await
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        self.call(
            "record handled",
            Some(inbox.claim_id),
            self.inner.record_handled(inbox),
        )
        .await
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        self.call(
            "replace inbox",
            Some(inbox.claim_id),
            self.inner.replace_inbox(inbox, expected),
        )
        .await
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        self.call(
            "finalize",
            Some(write.inbox.claim_id),
            self.inner.finalize(write),
        )
        .await
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        self.call("list payments", None, self.inner.list_payments(limit))
            .await
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        self.call(
            "list unsettled payments",
            None,
            self.inner.unsettled_payments(limit),
        )
        .await
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        self.call(
            "count payments",
            None,
            self.inner.count_payments(status, limit),
        )
        .await
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        self.call("list inbox", None, self.inner.list_inbox(limit))
            .await
    }

    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        self.call("purge", None, self.inner.purge_expired(now, batch))
            .await
    }

    fn expires_by_itself(&self) -> bool {
        self.inner.expires_by_itself()
    }

    async fn failed(&self) -> String {
        self.inner.failed().await
    }
}
