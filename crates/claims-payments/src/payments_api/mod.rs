//! `POST /api/payments` with an `Idempotency-Key`: the consumer's guarantee for HTTP
//! clients that retry (draft-ietf-httpapi-idempotency-key-header).
//!
//! The money guard stays where it is for messages: the payment record in the claim's
//! partition, created by the consumer's claim step. In front of it sits a **key record**
//! per (caller scope, key): "this request is being or was handled". It is an inbox
//! record of the pseudo-consumer `payments-api` whose claim id and message id are derived
//! from a hash of scope and key, so on Cosmos it has a partition of its own (a key reused
//! for another claim is still found) and expires with the inbox retention setting
//! (`IDEMPOTENCY_KEY_RETENTION_HOURS`). It holds the request's fingerprint (the payload
//! hash the consumer uses), a lease, and, once done, the answer given.
//!
//! One request goes:
//! 0. who calls and may they pay ([`caller`]: 401, 403), is the body JSON (415) and
//!    within the limits (413, 408: the route in `functions` reads it and hands over the
//!    bytes), is the key a key ([`key`]) and the body one valid object (400): nothing is
//!    written for any of these, so no refusal of the request itself is ever stored under
//!    its key;
//! 1. open the key record ([`record`]): create it (in progress, our lease) with a
//!    conditional create; if it exists, [`record::next_action`] decides: another
//!    fingerprint → 422; completed → the stored answer, byte for byte, with
//!    `Idempotent-Replayed: true`; in progress under a live lease → 409 with
//!    `Retry-After`; under an expired lease → take it over (conditional replace);
//! 2. hand the payment to the consumer as a message whose MessageId is derived from the
//!    key record, `http-<scope tag>-<key hash>` (same claim, payout and finalize steps,
//!    same outcomes; the tag says which caller created the payment). Why not write the
//!    payment from here: the guard is the payment and an inbox record written in one
//!    atomic step in the claim's partition, while the key record lives in a partition of
//!    its own (so a key reused for another claim is still found by a point read). Two
//!    partitions cannot share a Cosmos batch, so the key record is a lease in front of
//!    the consumer's own guard, not a replacement for it;
//! 3. close the key record: store the answer (conditional on our lease) and send it; a
//!    5xx gives the lease back, a 400 gives the key back as never used.
//!
//! The key record's lease is an [`Lease`], taken and given back by the same
//! rule as a delivery's. The consumer hands back the payment it wrote, so the answer is
//! built without reading it again: a new key costs three store round trips in ledger-only
//! mode (key record, claim, stored answer) and four with a payout (plus the finalize).
//!
//! Steps 1 to 3 run on a task of the process ([`Work`]), which the request awaits: a
//! client that disconnects drops only the wait, never the payment half-way; the task
//! ends only with the process.
//!
//! A crash between any two steps leaves the key record in progress under a lease that
//! runs out: the client's retry takes it over and step 2 resumes where the consumer's
//! records say (a completed message is answered from its payment record, which gives
//! the same bytes). A transient failure gives the lease back at once and answers 503.
//! A transient answer to the key record's create or takeover may hide a write that
//! committed (the connection dropped after the commit): the record is read again and,
//! if it carries this request's owner, the request holds the key and carries on
//! ([`Lease::create`]), as the consumer's claim recognises its own record. Only if that
//! read fails too is the answer 503, and the key then waits for its lease as after a
//! crash.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};

use crate::ambient::Ambient;
use crate::consumer::{Consumer, Delivery, Outcome};
use crate::domain::{ClaimApproved, ClaimId, InvalidMessage, OutcomeKind, Purpose};
use crate::lease::liveness::Owners;
use crate::lease::{Lease, Terms};
use crate::services::{Services, Work};
use crate::store::{DynStore, StoreError};

mod answer;
mod caller;
mod key;
mod record;

pub(crate) use answer::{Answer, Problem};
pub use caller::CallerAuth;
pub(crate) use caller::{Action, Caller, Scope};
pub(crate) use key::ClientKey;

use answer::{answer_for, claim_already_paid, payment_not_found, store_failure, store_unavailable};
use key::{created_by, InvalidKey, KeyIdentity};
use record::Begin;

/// The pseudo-consumer under which key records are stored.
pub(crate) const KEY_CONSUMER: &str = "payments-api";

/// The HTTP payments API over the consumer.
#[derive(Clone)]
pub struct PaymentsApi {
    /// The engine that pays: the same consumer as the messages'.
    consumer: Consumer,
    store: DynStore,
    owners: Arc<Owners>,
    ambient: Ambient,
    /// Key records are leased as long as a delivery's attempt.
    lease: Duration,
    /// Whether a payment request must name a payee.
    pays_out: bool,
    auth: CallerAuth,
    retention: Duration,
    /// The process's tasks, where the work of a request runs.
    work: Work,
}

fn invalid_key(invalid: InvalidKey) -> Answer {
    Problem::KeyInvalid.answer(invalid.to_string())
}

fn invalid_body(detail: impl Into<String>) -> Answer {
    Problem::InvalidBody.answer(detail)
}

impl PaymentsApi {
    /// The API over `consumer`, on the services it was built from.
    pub fn new(
        consumer: Consumer,
        services: &Services,
        auth: CallerAuth,
        retention: Duration,
    ) -> Self {
        PaymentsApi {
            consumer,
            store: services.store.clone(),
            owners: services.owners.clone(),
            ambient: services.ambient.clone(),
            lease: services.policy.lease,
            pays_out: services.pays_out(),
            auth,
            retention,
            work: services.work.clone(),
        }
    }

    /// A payment request whose body was read already (the conformance suite drives the
    /// engine this way): the caller's checks, then as [`Self::post_as`]. The media type
    /// and the body's limits are the route's business and are not checked here.
    pub async fn post(&self, headers: &HeaderMap, body: &[u8]) -> Answer {
        match self.payer(headers) {
            Ok(caller) => {
                self.post_as(caller, headers, Bytes::copy_from_slice(body))
                    .await
            }
            Err(refused) => refused,
        }
    }

    /// The caller, if it may pay: checked first, before the route reads the body.
    pub(crate) fn payer(&self, headers: &HeaderMap) -> Result<Caller, Answer> {
        let caller = Caller::authenticate(self.auth, headers)?;
        caller.authorize(Action::Pay)?;
        Ok(caller)
    }

    /// `POST /api/payments` from a caller that may pay, with the body the route read
    /// within its limits. Every path ends in an answer.
    ///
    /// Everything that can refuse the request without a write comes first (caller, role,
    /// media type and body size at the route, then body and key here), so no refusal of
    /// the request itself is ever stored under its key: a corrected request with the
    /// same key is a first request.
    pub(crate) async fn post_as(&self, caller: Caller, headers: &HeaderMap, body: Bytes) -> Answer {
        let raw_key = match headers.get_all("idempotency-key").iter().collect::<Vec<_>>()[..] {
            [] => {
                return Problem::KeyMissing.answer(
                    "send an Idempotency-Key header: one key per payment intent, the same on every retry",
                )
            }
            [one] => match one.to_str() {
                Ok(text) => text,
                Err(_) => return invalid_key(InvalidKey::NotVisibleAscii),
            },
            _ => return invalid_key(InvalidKey::SentTwice),
        };
        let client_key = match ClientKey::parse(raw_key) {
            Ok(k) => k,
            Err(invalid) => return invalid_key(invalid),
        };
        let msg = match parse_body(&body) {
            Ok(m) => m,
            Err(invalid) => return invalid_body(invalid.to_string()),
        };
        // The one way the consumer refuses a well-formed body: checked here, before the
        // key record exists, so that this 400 is not stored either.
        if let Some(reason) = crate::consumer::decide::missing_payee(&msg, self.pays_out) {
            return invalid_body(reason);
        }
        let scope = caller.scope(&msg);
        let identity = KeyIdentity::new(&scope, &client_key);
        // The work runs on a task of its own: a client that goes away (its request
        // future is dropped) must not cut a payment between the bank's answer and the
        // stored one, or the key would stay in progress until its lease runs out. The
        // task finishes and stores the answer for the retry.
        // The task is the process's ([`Work`]): it ends with the process, as any work
        // of a process that dies does.
        let api = self.clone();
        let work = self
            .work
            .run(async move { api.pay(caller, scope, msg, identity).await });
        match work.await {
            Some(answer) => answer,
            None => {
                // A panic in the engine, or the process is ending: the key record keeps
                // its lease, and the retry takes it over once it runs out.
                tracing::error!(trigger = "http", "the payment task ended without an answer");
                Problem::InternalError.answer("retry later with the same Idempotency-Key")
            }
        }
    }

    /// The key record, the consumer and the stored answer: everything after the request
    /// was accepted, on its own task.
    async fn pay(
        self,
        caller: Caller,
        scope: Scope,
        msg: ClaimApproved,
        identity: KeyIdentity,
    ) -> Answer {
        let fingerprint = msg.payload_hash();
        let store = self.store.as_ref();
        let (answer, outcome) = match record::open(
            store,
            &self.owners,
            &identity,
            &fingerprint,
            self.terms(),
            &self.ambient,
        )
        .await
        {
            Ok(Begin::Answer(answer, label)) => (answer, label),
            Ok(Begin::Proceed(lease)) => {
                self.process(&caller, &scope, &msg, &identity, lease).await
            }
            Err(e) => self.store_failed(e),
        };
        tracing::info!(
            trigger = "http",
            claimId = %msg.claim_id,
            messageId = %identity.key.message_id,
            status = answer.status,
            replayed = answer.replayed,
            outcome,
            "invocation finished"
        );
        answer
    }

    /// Handles `GET /api/payments/{claimId}`: key holders and principals with
    /// [`READ_ROLE`](caller::READ_ROLE) read every payment; a principal with only [`PAY_ROLE`](caller::PAY_ROLE) reads the
    /// payments it created, and any other claim is "not found" to it (so it learns
    /// nothing about other callers' claims).
    pub(crate) async fn get(&self, headers: &HeaderMap, claim: &str) -> Answer {
        let caller = match Caller::authenticate(self.auth, headers)
            .and_then(|c| c.authorize(Action::Read).map(|()| c))
        {
            Ok(c) => c,
            Err(refused) => return refused,
        };
        let claim_id = match ClaimId::parse(claim) {
            Ok(c) => c,
            Err(e) => return Problem::InvalidClaimId.answer(e.to_string()),
        };
        match self.store.payment(claim_id, Purpose::Payout).await {
            Ok(Some(p)) => {
                let own = caller
                    .principal_scope()
                    .is_none_or(|scope| created_by(&p.record.message_id, scope));
                if caller.reads_only_own() && !own {
                    return payment_not_found();
                }
                let mut a = Answer::resource(StatusCode::OK, &p.record);
                a.location = None;
                a
            }
            Ok(None) => payment_not_found(),
            Err(e) => self.store_failed(e).0,
        }
    }

    /// The answer to a store error, with its log label.
    fn store_failed(&self, e: StoreError) -> (Answer, &'static str) {
        match e {
            StoreError::Permanent(_) => (store_failure(), OutcomeKind::StoreFailure.as_str()),
            _ => (store_unavailable(), OutcomeKind::RetryLater.as_str()),
        }
    }

    /// The lease and retention of key records.
    fn terms(&self) -> Terms {
        Terms {
            lease: self.lease,
            retention: self.retention,
        }
    }

    /// Steps 2 and 3: the consumer's engine, then the answer kept in the key record.
    /// Returns the answer and its log label (the consumer's outcome).
    async fn process(
        &self,
        caller: &Caller,
        scope: &Scope,
        msg: &ClaimApproved,
        identity: &KeyIdentity,
        lease: Lease,
    ) -> (Answer, &'static str) {
        let store = self.store.as_ref();
        let delivery = Delivery {
            message_id: identity.key.message_id.clone(),
            delivery_count: lease.record.last_delivery_count,
        };
        let (outcome, written) = self.consumer.handle_with_payment(msg, &delivery).await;
        let payment = match (&outcome, written) {
            (Outcome::RetryLater { .. } | Outcome::StoreFailure { .. }, _) => None,
            (_, Some(payment)) => Some(payment),
            // Answered without touching the payment (a duplicate): read it.
            (_, None) => match store.payment(msg.claim_id, Purpose::Payout).await {
                Ok(p) => p.map(|p| p.record),
                Err(e) => {
                    lease.release(store, self.ambient.now()).await;
                    return self.store_failed(e);
                }
            },
        };
        let mut answer = answer_for(&outcome, payment.as_ref());
        let mut label = outcome.label();
        // A principal sees a payment in an answer only if it created it: another
        // principal's payment of this claim is a 409 without its details.
        if let Some(p) = &payment {
            if caller.is_principal()
                && answer.location.is_some()
                && !created_by(&p.message_id, scope)
            {
                answer = claim_already_paid();
                label = OutcomeKind::Conflict.as_str();
            }
        }
        let now = self.ambient.now();
        record::close(store, lease, &answer, &identity.key, now).await;
        (answer, label)
    }
}

/// Why a request body is not a payment request: the detail of a 400 `invalid-body`.
#[derive(Debug, thiserror::Error)]
enum InvalidBody {
    #[error("body: is not UTF-8 JSON")]
    NotUtf8,
    #[error("body: must be one JSON object")]
    NotAnObject,
    #[error(transparent)]
    Message(#[from] InvalidMessage),
}

/// The request body as a `ClaimApproved`. It must be one JSON object: serde would read a
/// JSON array positionally into the same fields (`["<claim>","12.00","EUR"]`), which no
/// client means and the contract does not allow.
fn parse_body(body: &[u8]) -> Result<ClaimApproved, InvalidBody> {
    let text = std::str::from_utf8(body).map_err(|_| InvalidBody::NotUtf8)?;
    let first = text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .chars()
        .next();
    if first != Some('{') {
        return Err(InvalidBody::NotAnObject);
    }
    Ok(ClaimApproved::parse(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_must_be_one_json_object() {
        let claim = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert!(parse_body(
            format!(r#" {{"claimId":"{claim}","amount":"1.00","currency":"EUR"}}"#).as_bytes()
        )
        .is_ok());
        for bad in [
            format!(r#"["{claim}","1.00","EUR"]"#),
            "\"x\"".to_owned(),
            String::new(),
        ] {
            assert!(
                matches!(parse_body(bad.as_bytes()), Err(InvalidBody::NotAnObject)),
                "{bad}"
            );
        }
    }
}

/// The work of a request and the process that runs it.
#[cfg(test)]
mod work_tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::{Notify, Semaphore};

    use super::*;
    use crate::store::{Store, StoreCall, StoreDecorator, StoreResult};

    /// A store whose claims wait at a gate, and that tells when one is waiting and
    /// whether a waiting claim was dropped where it waited.
    struct Gated {
        inner: DynStore,
        gate: Semaphore,
        waiting: Notify,
        dropped: AtomicBool,
    }

    /// Marks the claim dropped unless it got through the gate.
    struct Waiting<'a>(&'a AtomicBool, bool);

    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            if !self.1 {
                self.0.store(true, Ordering::SeqCst);
            }
        }
    }

    impl StoreDecorator for Gated {
        fn inner(&self) -> &dyn Store {
            self.inner.as_ref()
        }

        async fn around<T: Send + 'static>(
            &self,
            call: StoreCall<'_>,
            work: impl Future<Output = StoreResult<T>> + Send,
        ) -> StoreResult<T> {
            if matches!(call, StoreCall::Claim { .. }) {
                let mut waiting = Waiting(&self.dropped, false);
                self.waiting.notify_one();
                let _permit = self.gate.acquire().await;
                waiting.1 = true;
            }
            work.await
        }
    }

    #[tokio::test]
    async fn a_payment_s_work_ends_with_the_process_that_started_it() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = crate::store::sqlite::SqliteStore::open(dir.path().join("p.db")).unwrap();
        let gated = Arc::new(Gated {
            inner: sqlite,
            gate: Semaphore::new(0),
            waiting: Notify::new(),
            dropped: AtomicBool::new(false),
        });
        let policy = crate::configuration::Settings::from_lookup(|_| None)
            .unwrap()
            .policy();
        let services = Services::new(
            gated.clone(),
            None,
            policy,
            crate::ambient::Ambient::system(),
        );
        let api = PaymentsApi::new(
            services.consumer(),
            &services,
            CallerAuth::FunctionKey,
            Duration::from_secs(86_400),
        );
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "intent-1".parse().unwrap());
        let body = r#"{"claimId":"c0ffee00-0000-4000-8000-000000000001","amount":"12.50","currency":"EUR"}"#;
        let request = tokio::spawn(async move { api.post(&headers, body.as_bytes()).await });
        gated.waiting.notified().await;
        // The client goes away: its request ends, the payment's work goes on.
        request.abort();
        let _ = request.await;
        assert!(!gated.dropped.load(Ordering::SeqCst));
        // The process ends: so does every task it started, where it waits.
        services.work().abort_all();
        services.work().drain().await;
        assert!(
            gated.dropped.load(Ordering::SeqCst),
            "the payment's work outlived the process that started it"
        );
        assert_eq!(services.work().running(), 0);
    }
}
