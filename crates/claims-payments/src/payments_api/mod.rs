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
//! 0. who calls and may they pay ([`caller`]: 401, 403), is the body JSON (415), is the
//!    key a key ([`key`]) and the body one valid object (400): nothing is written for any
//!    of these, so no refusal of the request itself is ever stored under its key;
//! 1. create the key record (in progress, our lease) with a conditional create; if it
//!    exists: another fingerprint → 422; completed → the stored answer, byte for byte,
//!    with `Idempotent-Replayed: true`; in progress under a live lease → 409 with
//!    `Retry-After`; under an expired lease → take it over (conditional replace);
//! 2. hand the payment to the consumer as a message whose MessageId is derived from the
//!    key record, `http-<scope tag>-<key hash>` (same claim, payout and finalize steps,
//!    same outcomes; the tag says which caller created the payment);
//! 3. store the answer in the key record (conditional on our lease) and send it.
//!
//! The key record's lease is an [`idempotency::Lease`], taken and given back by the same
//! rule as a delivery's. The consumer hands back the payment it wrote, so the answer is
//! built without reading it again: a new key costs three store round trips in ledger-only
//! mode (key record, claim, stored answer) and four with a payout (plus the finalize).
//!
//! Steps 1 to 3 run on a task of their own, which the request awaits: a client that
//! disconnects drops only the wait, never the payment half-way.
//!
//! A crash between any two steps leaves the key record in progress under a lease that
//! runs out: the client's retry takes it over and step 2 resumes where the consumer's
//! records say (a completed message is answered from its payment record, which gives
//! the same bytes). A transient failure gives the lease back at once and answers 503.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use time::OffsetDateTime;

use crate::consumer::{Consumer, Delivery, Outcome};
use crate::http::{read_body, BodyError, BODY_READ_TIMEOUT, MAX_REQUEST_BYTES};
use crate::idempotency::{self, Created, Holder, Lease, Terms};
use crate::message::{ClaimApproved, ClaimId, PayloadHash, Purpose};
use crate::store::{AttemptId, InboxOutcome, InboxRecord, InboxStatus, StoreError};
use crate::telemetry;

mod answer;
mod caller;
mod key;

pub(crate) use answer::{Answer, Problem};
pub use caller::CallerAuth;
pub(crate) use caller::{Action, Caller, Scope};
pub(crate) use key::ClientKey;

use answer::{answer_for, claim_already_paid, payment_not_found, store_failure, store_unavailable};
use key::{created_by, KeyIdentity};

/// The pseudo-consumer under which key records are stored.
pub(crate) const KEY_CONSUMER: &str = "payments-api";

/// The HTTP payments API over the consumer.
#[derive(Clone)]
pub struct PaymentsApi {
    consumer: Consumer,
    auth: CallerAuth,
    retention: Duration,
}

fn invalid_key(detail: impl Into<String>) -> Answer {
    Problem::KeyInvalid.answer(detail)
}

fn invalid_body(detail: impl Into<String>) -> Answer {
    Problem::InvalidBody.answer(detail)
}

impl PaymentsApi {
    pub fn new(consumer: Consumer, auth: CallerAuth, retention: Duration) -> Self {
        PaymentsApi {
            consumer,
            auth,
            retention,
        }
    }

    /// Handles `POST /api/payments` as the route receives it. Every path ends in an answer.
    ///
    /// Everything that can refuse the request without a write comes first (caller, role,
    /// media type, body, key), so no refusal of the request itself is ever stored under
    /// its key: a corrected request with the same key is a first request.
    pub(crate) async fn handle_post(&self, headers: &HeaderMap, body: Body) -> Answer {
        telemetry::counters().http_requests.inc();
        let caller = match self.payer(headers) {
            Ok(c) => c,
            Err(refused) => return refused,
        };
        if let Err(detail) = crate::http::json_request(headers) {
            return Problem::UnsupportedMediaType.answer(detail);
        }
        let body = match read_body(body).await {
            Ok(bytes) => bytes,
            Err(BodyError::TooLarge) => {
                return Problem::BodyTooLarge
                    .answer(format!("body: at most {MAX_REQUEST_BYTES} bytes"))
            }
            Err(BodyError::Timeout) => {
                return Problem::BodyTimeout.answer(format!(
                    "body: not received within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ))
            }
        };
        self.post_as(caller, headers, &body).await
    }

    /// A payment request whose body was read already (the conformance suite drives the
    /// engine this way): the caller's checks, then as [`Self::handle_post`]. The media
    /// type is the route's business and is not checked here.
    pub async fn post(&self, headers: &HeaderMap, body: &[u8]) -> Answer {
        match self.payer(headers) {
            Ok(caller) => self.post_as(caller, headers, body).await,
            Err(refused) => refused,
        }
    }

    /// The caller, if it may pay.
    fn payer(&self, headers: &HeaderMap) -> Result<Caller, Answer> {
        let caller = Caller::authenticate(self.auth, headers)?;
        caller.authorize(Action::Pay)?;
        Ok(caller)
    }

    async fn post_as(&self, caller: Caller, headers: &HeaderMap, body: &[u8]) -> Answer {
        let raw_key = match headers.get_all("idempotency-key").iter().collect::<Vec<_>>()[..] {
            [] => {
                return Problem::KeyMissing.answer(
                                        "send an Idempotency-Key header: one key per payment intent, the same on every retry",
                )
            }
            [one] => match one.to_str() {
                Ok(text) => text.to_owned(),
                Err(_) => return invalid_key("Idempotency-Key must be printable ASCII"),
            },
            _ => return invalid_key("send exactly one Idempotency-Key header"),
        };
        let client_key = match ClientKey::parse(&raw_key) {
            Ok(k) => k,
            Err(problem) => return invalid_key(format!("Idempotency-Key {problem}")),
        };
        let msg = match parse_body(body) {
            Ok(m) => m,
            Err(detail) => return invalid_body(detail),
        };
        // The one way the consumer refuses a well-formed body: checked here, before the
        // key record exists, so that this 400 is not stored either.
        if self.consumer.bank().is_some() && msg.payee.is_none() {
            return invalid_body("payee: is missing, and payouts are enabled");
        }
        let scope = caller.scope(&msg);
        let identity = KeyIdentity::new(&scope, &client_key);
        // The work runs on a task of its own: a client that goes away (its request
        // future is dropped) must not cut a payment between the bank's answer and the
        // stored one, or the key would stay in progress until its lease runs out
        // (issue 21 item 8). The task finishes and stores the answer for the retry.
        let api = self.clone();
        let work = tokio::spawn(async move { api.pay(caller, scope, msg, identity).await });
        match work.await {
            Ok(answer) => answer,
            Err(e) => {
                // A panic in the engine: the key record keeps its lease, and the retry
                // takes it over once it runs out.
                tracing::error!(error = %e, trigger = "http", "the payment task failed");
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
        let answer = match self.begin(&identity, &fingerprint).await {
            Ok(Begin::Answer(answer)) => answer,
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
            outcome = %outcome_of_answer(&answer),
            "invocation finished"
        );
        answer
    }

    /// Handles `GET /api/payments/{claimId}`: key holders and principals with
    /// [`READ_ROLE`] read every payment; a principal with only [`PAY_ROLE`] reads the
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
        match self
            .consumer
            .store()
            .payment(claim_id, Purpose::Payout)
            .await
        {
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
            Err(e) => self.store_failed(e),
        }
    }

    fn store_failed(&self, e: StoreError) -> Answer {
        match e {
            StoreError::Permanent(_) => store_failure(),
            _ => store_unavailable(),
        }
    }

    /// The lease and retention of key records.
    fn terms(&self) -> Terms {
        Terms {
            lease: self.consumer.policy().lease,
            retention: self.retention,
        }
    }

    /// Step 1: the key record, created or taken over, or the answer it already gives.
    async fn begin(
        &self,
        identity: &KeyIdentity,
        fingerprint: &PayloadHash,
    ) -> Result<Begin, StoreError> {
        let store = self.consumer.store().as_ref();
        let terms = self.terms();
        let now = OffsetDateTime::now_utc();
        let me = AttemptId::new();
        let fresh = idempotency::new_record(&identity.key, fingerprint, me, 1, terms, now, None);
        let seen = match Lease::create(store, fresh.clone()).await? {
            Created::Held(lease) => return Ok(Begin::Proceed(lease)),
            Created::Exists(seen) => seen,
        };
        let record = &seen.record;
        let expired = record.expires_at <= now;
        if !expired && record.payload_hash != *fingerprint {
            telemetry::counters().http_key_mismatches.inc();
            return Ok(Begin::Answer(Problem::KeyReused.answer(
                                "this Idempotency-Key was used with a different request; use a new key for a new payment",
            )));
        }
        if !expired && record.status == InboxStatus::Completed {
            if let Some(mut answer) = record.outcome.as_ref().and_then(|o| match o {
                InboxOutcome::HttpAnswer(json) => serde_json::from_str::<Answer>(json).ok(),
                _ => None,
            }) {
                telemetry::counters().http_replays.inc();
                answer.replayed = true;
                return Ok(Begin::Answer(answer));
            }
        }
        // A client's retry is not a broker delivery: only the lease decides (count 0).
        if let (false, Holder::Live(until)) = (expired, idempotency::holder(record, me, 0, now)) {
            telemetry::counters().http_in_flight.inc();
            let left = (until - now).whole_seconds().max(1) as u64;
            return Ok(Begin::Answer(in_flight(left.min(5))));
        }
        // The lease ran out (a crash, or a 503 that gave it back), or the key expired:
        // take it over with a write conditional on what we read.
        let attempt = record.last_delivery_count.saturating_add(1);
        let taken = if expired {
            InboxRecord {
                last_delivery_count: attempt,
                ..fresh
            }
        } else {
            idempotency::taken_over(record, me, attempt, terms, now)
        };
        Ok(match Lease::take_over(store, &seen, taken).await? {
            Some(lease) => Begin::Proceed(lease),
            None => Begin::Answer(in_flight(1)),
        })
    }

    /// Steps 2 and 3: the consumer's engine, then the answer kept in the key record.
    async fn process(
        &self,
        caller: &Caller,
        scope: &Scope,
        msg: &ClaimApproved,
        identity: &KeyIdentity,
        lease: Lease,
    ) -> Answer {
        let store = self.consumer.store().as_ref();
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
                    lease.release(store).await;
                    return self.store_failed(e);
                }
            },
        };
        let mut answer = answer_for(&outcome, payment.as_ref());
        // A principal sees a payment in an answer only if it created it: another
        // principal's payment of this claim is a 409 without its details.
        if let Some(p) = &payment {
            if caller.is_principal()
                && answer.location.is_some()
                && !created_by(&p.message_id, scope)
            {
                answer = claim_already_paid();
            }
        }
        if answer.status == 503 || answer.status == 500 {
            // Nothing final: the retry resumes under the same key.
            lease.release(store).await;
            return answer;
        }
        if answer.status == 400 {
            // A refusal of the request itself is never stored (the draft: the client
            // must correct it, and the corrected request is then processed): give the
            // key back, marked expired, which [`Self::begin`] treats as a key never
            // seen. Nothing was paid under it (the consumer refused the body before its
            // claim step).
            let now = OffsetDateTime::now_utc();
            let forgotten = InboxRecord {
                lease_until: None,
                expires_at: now,
                updated_at: now,
                ..lease.record.clone()
            };
            lease.give_back(store, forgotten).await;
            return answer;
        }
        let stored = serde_json::to_string(&answer)
            .ok()
            .map(InboxOutcome::HttpAnswer);
        if let Some(stored) = stored {
            if let Err(e) = lease.complete(store, stored).await {
                // The answer is still right: a retry recomputes it from the records.
                tracing::warn!(error = %e, messageId = %identity.key.message_id, "could not store the answer under its key");
            }
        }
        answer
    }
}

/// 409: another request with the key is being handled.
fn in_flight(retry_after: u64) -> Answer {
    Problem::RequestInFlight
        .answer("retry later with the same Idempotency-Key")
        .retry_after(retry_after)
}

enum Begin {
    Answer(Answer),
    Proceed(Lease),
}

/// The request body as a `ClaimApproved`. It must be one JSON object: serde would read a
/// JSON array positionally into the same fields (`["<claim>","12.00","EUR"]`), which no
/// client means and the contract does not allow.
fn parse_body(body: &[u8]) -> Result<ClaimApproved, String> {
    let text = std::str::from_utf8(body).map_err(|_| "body: is not UTF-8 JSON".to_owned())?;
    let first = text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .chars()
        .next();
    if first != Some('{') {
        return Err("body: must be one JSON object".into());
    }
    ClaimApproved::parse(text).map_err(|e| e.to_string())
}

fn outcome_of_answer(answer: &Answer) -> &'static str {
    match answer.status {
        200 => "business-duplicate",
        201 | 202 => "created",
        409 => "conflict",
        422 => "key-reused",
        401 | 403 => "refused-caller",
        400 | 408 | 413 | 415 => "invalid-request",
        503 => "retry-later",
        _ => "store-failure",
    }
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
            assert_eq!(
                parse_body(bad.as_bytes()).unwrap_err(),
                "body: must be one JSON object",
                "{bad}"
            );
        }
    }
}
