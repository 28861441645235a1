//! The one way to wrap a store: a [`StoreDecorator`] names the store it wraps and one
//! hook around each call, and the `impl Store` below forwards every method through it.
//! A method added to [`Store`] is forwarded here, once, for every decorator (the
//! product's telemetry, the development crate's fault and measuring layers).
//!
//! A trait rather than a macro or a delegation crate: a decorator reads as its hook, not
//! as a list of methods, and the hook returns `impl Future` (not a boxed one), so it is
//! inlined into the forwarded method and costs what its own work costs, nothing more.

use std::future::Future;

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{
    ClaimResult, Finalize, InboxKey, InboxRecord, InsertResult, Listed, PaymentRecord,
    PaymentStatus, Store, StoreResult, Version, Versioned,
};
use crate::domain::{ClaimId, Purpose};

/// One call of a [`Store`] method, with its arguments, as a decorator's hook sees it.
#[derive(Debug, Clone, Copy)]
pub enum StoreCall<'a> {
    Claim {
        inbox: &'a InboxRecord,
        payment: &'a PaymentRecord,
    },
    Inbox(&'a InboxKey),
    Payment {
        claim: ClaimId,
        purpose: Purpose,
    },
    RecordHandled(&'a InboxRecord),
    ReplaceInbox {
        inbox: &'a InboxRecord,
        expected: &'a Version,
    },
    Finalize(Finalize<'a>),
    ListPayments {
        limit: usize,
    },
    UnsettledPayments {
        limit: usize,
    },
    CountPayments {
        status: PaymentStatus,
        limit: usize,
    },
    ListInbox {
        limit: usize,
    },
    PurgeExpired {
        now: OffsetDateTime,
        batch: usize,
    },
}

impl StoreCall<'_> {
    /// The claim the call is about; none for the listings and the purge.
    pub fn claim_id(&self) -> Option<ClaimId> {
        match self {
            StoreCall::Claim { inbox, .. }
            | StoreCall::RecordHandled(inbox)
            | StoreCall::ReplaceInbox { inbox, .. } => Some(inbox.claim_id),
            StoreCall::Inbox(key) => Some(key.claim_id),
            StoreCall::Payment { claim, .. } => Some(*claim),
            StoreCall::Finalize(write) => Some(write.inbox.claim_id),
            StoreCall::ListPayments { .. }
            | StoreCall::UnsettledPayments { .. }
            | StoreCall::CountPayments { .. }
            | StoreCall::ListInbox { .. }
            | StoreCall::PurgeExpired { .. } => None,
        }
    }
}

/// A store that wraps another: implement this, and the type is a [`Store`] whose every
/// call goes through [`around`](Self::around) to [`inner`](Self::inner).
/// [`Store::expires_by_itself`] and [`Store::failed`] are the inner store's.
pub trait StoreDecorator: Send + Sync + 'static {
    /// The store every call goes on to.
    fn inner(&self) -> &dyn Store;

    /// Runs each call. `work` is the same call on [`inner`](Self::inner), not started:
    /// the hook may act before it, await it or not, and look at or replace its answer.
    /// Every store answer is an owned type (`'static`), so a hook may also tell them
    /// apart by type.
    fn around<T: Send + 'static>(
        &self,
        call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> impl Future<Output = StoreResult<T>> + Send;
}

#[async_trait]
impl<D: StoreDecorator> Store for D {
    async fn claim(
        &self,
        inbox: &InboxRecord,
        payment: &PaymentRecord,
    ) -> StoreResult<ClaimResult> {
        let call = StoreCall::Claim { inbox, payment };
        self.around(call, self.inner().claim(inbox, payment)).await
    }

    async fn inbox(&self, key: &InboxKey) -> StoreResult<Option<Versioned<InboxRecord>>> {
        self.around(StoreCall::Inbox(key), self.inner().inbox(key))
            .await
    }

    async fn payment(
        &self,
        claim: ClaimId,
        purpose: Purpose,
    ) -> StoreResult<Option<Versioned<PaymentRecord>>> {
        let call = StoreCall::Payment { claim, purpose };
        self.around(call, self.inner().payment(claim, purpose))
            .await
    }

    async fn record_handled(&self, inbox: &InboxRecord) -> StoreResult<InsertResult> {
        let call = StoreCall::RecordHandled(inbox);
        self.around(call, self.inner().record_handled(inbox)).await
    }

    async fn replace_inbox(&self, inbox: &InboxRecord, expected: &Version) -> StoreResult<Version> {
        let call = StoreCall::ReplaceInbox { inbox, expected };
        self.around(call, self.inner().replace_inbox(inbox, expected))
            .await
    }

    async fn finalize(&self, write: Finalize<'_>) -> StoreResult<()> {
        self.around(StoreCall::Finalize(write), self.inner().finalize(write))
            .await
    }

    async fn list_payments(&self, limit: usize) -> StoreResult<Vec<Listed<PaymentRecord>>> {
        let call = StoreCall::ListPayments { limit };
        self.around(call, self.inner().list_payments(limit)).await
    }

    async fn unsettled_payments(&self, limit: usize) -> StoreResult<Vec<Versioned<PaymentRecord>>> {
        let call = StoreCall::UnsettledPayments { limit };
        self.around(call, self.inner().unsettled_payments(limit))
            .await
    }

    async fn count_payments(&self, status: PaymentStatus, limit: usize) -> StoreResult<usize> {
        let call = StoreCall::CountPayments { status, limit };
        self.around(call, self.inner().count_payments(status, limit))
            .await
    }

    async fn list_inbox(&self, limit: usize) -> StoreResult<Vec<Listed<InboxRecord>>> {
        let call = StoreCall::ListInbox { limit };
        self.around(call, self.inner().list_inbox(limit)).await
    }

    async fn purge_expired(&self, now: OffsetDateTime, batch: usize) -> StoreResult<u64> {
        let call = StoreCall::PurgeExpired { now, batch };
        self.around(call, self.inner().purge_expired(now, batch))
            .await
    }

    fn expires_by_itself(&self) -> bool {
        self.inner().expires_by_itself()
    }

    async fn failed(&self) -> String {
        self.inner().failed().await
    }
}
