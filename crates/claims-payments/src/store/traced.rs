//! The store as dependencies: a decorator that records every call as a client span (a
//! dependency in Application Insights) with the database system, the outcome and, on
//! Cosmos, the request charge. Used only when telemetry is exported.
//!
//! A call is timed around it rather than run in a `tracing` span
//! ([`trace::observe_call`]): a delivery makes two or three store calls, and a span's
//! creation, its enter and exit at every poll and its close cost more than the rest of
//! the delivery's telemetry together.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use opentelemetry::{KeyValue, StringValue};

use super::{DynStore, Store, StoreCall, StoreDecorator, StoreError, StoreResult};
use crate::telemetry::trace::STORE_OPERATIONS as OPERATIONS;
use crate::telemetry::{self, trace};

/// The store as dependencies: every call is a client span named after the operation,
/// with the database system, the outcome and, on Cosmos, the request charge.
pub(crate) struct TracedStore {
    inner: DynStore,
    system: &'static str,
    namespace: StringValue,
    /// Each operation's span name (`<system> <operation>`), made once per store (a
    /// process opens one), so that a call copies none.
    names: [&'static str; OPERATIONS.len()],
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
            namespace: StringValue::from(Arc::<str>::from(namespace)),
            names: OPERATIONS
                .map(|operation| &*Box::leak(format!("{system} {operation}").into_boxed_str())),
        })
    }
}

/// The index in [`OPERATIONS`] of each call.
fn operation(call: &StoreCall<'_>) -> usize {
    match call {
        StoreCall::Claim { .. } => 0,
        StoreCall::Inbox(_) => 1,
        StoreCall::Payment { .. } => 2,
        StoreCall::RecordHandled(_) => 3,
        StoreCall::ReplaceInbox { .. } => 4,
        StoreCall::Finalize(_) => 5,
        StoreCall::ListPayments { .. } => 6,
        StoreCall::UnsettledPayments { .. } => 7,
        StoreCall::CountPayments { .. } => 8,
        StoreCall::ListInbox { .. } => 9,
        StoreCall::PurgeExpired { .. } => 10,
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
        let index = operation(&call);
        let claim = call.claim_id().map(|claim| claim.to_string());
        let (result, observed) = trace::observe_call(work).await;
        let (label, failed) = match &result {
            Ok(_) => ("ok", None),
            // A refused condition is an answer, not a failure of the dependency.
            Err(StoreError::PreconditionFailed) => ("precondition-failed", None),
            Err(StoreError::Transient(_)) => ("transient", Some("transient")),
            Err(StoreError::Permanent(_)) => ("permanent", Some("permanent")),
        };
        // The attributes in the order the span's fields were declared.
        let mut attributes = Vec::with_capacity(6);
        attributes.push(KeyValue::new("db.system.name", self.system));
        attributes.push(KeyValue::new("db.namespace", self.namespace.clone()));
        attributes.push(KeyValue::new("db.operation.name", OPERATIONS[index]));
        if let Some(claim) = claim {
            attributes.push(KeyValue::new("claimId", claim));
        }
        if observed.charge > 0.0 {
            attributes.push(KeyValue::new("db.cosmosdb.request_charge", observed.charge));
        }
        attributes.push(KeyValue::new("store.result", label));
        trace::record_call(
            Cow::Borrowed(self.names[index]),
            attributes,
            observed,
            failed,
        );
        result
    }
}
