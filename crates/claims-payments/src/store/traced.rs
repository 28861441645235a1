//! The store as dependencies: a decorator that makes every call a client span (a
//! dependency in Application Insights) with the database system, the outcome and, on
//! Cosmos, the request charge. Used only when telemetry is exported.

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use super::{DynStore, Store, StoreCall, StoreDecorator, StoreError, StoreResult};
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
}

/// The span's operation name (`db.operation.name`) of each call.
fn operation(call: &StoreCall<'_>) -> &'static str {
    match call {
        StoreCall::Claim { .. } => "claim",
        StoreCall::Inbox(_) => "read inbox",
        StoreCall::Payment { .. } => "read payment",
        StoreCall::RecordHandled(_) => "record handled",
        StoreCall::ReplaceInbox { .. } => "replace inbox",
        StoreCall::Finalize(_) => "finalize",
        StoreCall::ListPayments { .. } => "list payments",
        StoreCall::UnsettledPayments { .. } => "list unsettled payments",
        StoreCall::CountPayments { .. } => "count payments",
        StoreCall::ListInbox { .. } => "list inbox",
        StoreCall::PurgeExpired { .. } => "purge",
    }
}

impl StoreDecorator for TracedStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let operation = operation(&call);
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
        if let Some(claim) = call.claim_id() {
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
