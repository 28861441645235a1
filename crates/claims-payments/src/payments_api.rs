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
//! 1. create the key record (in progress, our lease) with a conditional create; if it
//!    exists: another fingerprint → 422; completed → the stored answer, byte for byte,
//!    with `Idempotent-Replayed: true`; in progress under a live lease → 409 with
//!    `Retry-After`; under an expired lease → take it over (conditional replace);
//! 2. hand the payment to the consumer as a message whose MessageId is derived from the
//!    key record (same claim, payout and finalize steps, same outcomes);
//! 3. store the answer in the key record (conditional on our lease) and send it.
//!
//! A crash between any two steps leaves the key record in progress under a lease that
//! runs out: the client's retry takes it over and step 2 resumes where the consumer's
//! records say (a completed message is answered from its payment record, which gives
//! the same bytes). A transient failure gives the lease back at once and answers 503.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::consumer::{Consumer, Delivery, Outcome};
use crate::message::{ClaimApproved, ClaimId, MessageId, PayloadHash, Purpose};
use crate::store::{
    AttemptId, InboxKey, InboxOutcome, InboxRecord, InboxStatus, InsertResult, PaymentRecord,
    StoreError, Version, Versioned,
};
use crate::telemetry;

/// The pseudo-consumer under which key records are stored.
pub(crate) const KEY_CONSUMER: &str = "payments-api";
/// Where problem types live (`type` of every problem answer).
const PROBLEM_BASE: &str = "https://claims-payments/problems/";

/// A client's `Idempotency-Key`: a Structured Field string (`"..."`) or, as most
/// clients send it, a bare token; printable ASCII, 1 to 255 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey(String);

impl ClientKey {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let text = if raw.starts_with('"') {
            let item = sfv::Parser::new(raw)
                .parse::<sfv::Item>()
                .map_err(|e| format!("is not a valid Structured Field string: {e}"))?;
            if !item.params.is_empty() {
                return Err("must be a plain string, without parameters".into());
            }
            item.bare_item
                .as_string()
                .map(|s| s.as_str().to_owned())
                .ok_or("must be a string")?
        } else {
            raw.to_owned()
        };
        if text.is_empty() || text.len() > 255 {
            return Err(format!("must be 1 to 255 characters, got {}", text.len()));
        }
        if !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err("must be printable ASCII".into());
        }
        Ok(ClientKey(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whose keys these are. With App Service Authentication the platform names the
/// caller (Entra tenant and object id); without it (function keys, local runs) the
/// caller is only known by the `tenantId` of the body. One scope can neither replay
/// nor block another scope's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(String);

/// How callers are told apart (`HTTP_AUTH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerAuth {
    /// Function keys (or nothing, locally): scope by the body's `tenantId`. The
    /// `X-MS-CLIENT-PRINCIPAL*` headers are ignored: without the platform's
    /// authentication in front, a client could forge them.
    FunctionKey,
    /// App Service Authentication (Entra ID) strips and sets the principal headers:
    /// scope by tenant and object id, and refuse a request without them.
    AppService,
}

impl Scope {
    fn from_request(
        auth: CallerAuth,
        headers: &HeaderMap,
        msg: &ClaimApproved,
    ) -> Result<Self, String> {
        match auth {
            CallerAuth::FunctionKey => Ok(Scope(match &msg.tenant {
                Some(t) => format!("tenant:{}", t.as_str()),
                None => "tenant:".into(),
            })),
            CallerAuth::AppService => {
                let oid = header(headers, "x-ms-client-principal-id")
                    .filter(|v| !v.is_empty())
                    .ok_or("X-MS-CLIENT-PRINCIPAL-ID is missing: App Service Authentication must sign the caller in")?;
                let tid = header(headers, "x-ms-client-principal")
                    .and_then(|p| tenant_of_principal(&p))
                    .unwrap_or_default();
                Ok(Scope(format!("entra:{tid}:{oid}")))
            }
        }
    }
}

/// The tenant id claim of App Service Authentication's `X-MS-CLIENT-PRINCIPAL`
/// (base64 JSON with a `claims` array of `{typ, val}`).
fn tenant_of_principal(encoded: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Principal {
        claims: Vec<Claim>,
    }
    #[derive(Deserialize)]
    struct Claim {
        typ: String,
        val: String,
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let principal: Principal = serde_json::from_slice(&bytes).ok()?;
    principal
        .claims
        .into_iter()
        .find(|c| {
            c.typ == "tid" || c.typ == "http://schemas.microsoft.com/identity/claims/tenantid"
        })
        .map(|c| c.val)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
}

/// An answer as it goes on the wire, and as a key record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    /// `Location` of a created payment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Seconds, for 409 and 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// Set on a replay of a stored answer; never stored.
    #[serde(skip)]
    pub replayed: bool,
}

impl Answer {
    pub fn problem(status: StatusCode, slug: &str, title: &str, detail: String) -> Self {
        let body = serde_json::json!({
            "type": format!("{PROBLEM_BASE}{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        Answer {
            status: status.as_u16(),
            content_type: "application/problem+json".into(),
            body: body.to_string(),
            location: None,
            retry_after: None,
            replayed: false,
        }
    }

    fn resource(status: StatusCode, payment: &PaymentRecord) -> Self {
        Answer {
            status: status.as_u16(),
            content_type: "application/json".into(),
            body: serde_json::to_string(&PaymentResource::from(payment))
                .unwrap_or_else(|_| "{}".into()),
            location: Some(format!("/api/payments/{}", payment.claim_id)),
            retry_after: None,
            replayed: false,
        }
    }

    fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// The HTTP response: status, headers, body.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, String) {
        let mut headers = HeaderMap::new();
        let put = |headers: &mut HeaderMap, name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(name, v);
            }
        };
        put(&mut headers, "content-type", &self.content_type);
        if let Some(location) = &self.location {
            put(&mut headers, "location", location);
        }
        if let Some(seconds) = self.retry_after {
            put(&mut headers, "retry-after", &seconds.to_string());
        }
        if self.replayed {
            put(&mut headers, "idempotent-replayed", "true");
        }
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, headers, self.body)
    }
}

/// The payment resource (`GET /api/payments/{claimId}` and the answers that create one).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentResource {
    pub claim_id: String,
    pub amount: String,
    pub currency: String,
    pub status: &'static str,
    pub bank_payment_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&PaymentRecord> for PaymentResource {
    fn from(p: &PaymentRecord) -> Self {
        let at = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
        PaymentResource {
            claim_id: p.claim_id.to_string(),
            amount: p.money.amount_string(),
            currency: p.money.currency().code().to_owned(),
            status: p.status.as_str(),
            bank_payment_id: p.bank_payment_id.clone(),
            created_at: at(p.created_at),
            updated_at: at(p.updated_at),
        }
    }
}

/// The HTTP payments API over the consumer.
#[derive(Clone)]
pub struct PaymentsApi {
    consumer: Consumer,
    auth: CallerAuth,
    retention: Duration,
}

/// The key record's identity, derived from scope and key.
struct KeyIdentity {
    key: InboxKey,
}

impl KeyIdentity {
    fn new(scope: &Scope, client_key: &ClientKey) -> Self {
        let digest = Sha256::digest(format!("{}\n{}", scope.0, client_key.as_str()).as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        // A UUID whose version says "custom" (8): its own partition on Cosmos.
        let uuid = uuid::Builder::from_custom_bytes(id).into_uuid();
        let claim_id = ClaimId::parse(&uuid.to_string()).expect("a hash is never the nil UUID");
        let message_id = MessageId::parse(&format!("http-{}", hex::encode(&digest[..20])))
            .expect("a short hex id is a valid MessageId");
        KeyIdentity {
            key: InboxKey {
                consumer: KEY_CONSUMER.into(),
                claim_id,
                message_id,
            },
        }
    }
}

impl PaymentsApi {
    pub fn new(consumer: Consumer, auth: CallerAuth, retention: Duration) -> Self {
        PaymentsApi {
            consumer,
            auth,
            retention,
        }
    }

    /// Handles `POST /api/payments`. Every path ends in an answer.
    pub async fn post(&self, headers: &HeaderMap, body: &[u8]) -> Answer {
        telemetry::counters().http_requests.inc();
        let raw_key = match headers.get_all("idempotency-key").iter().collect::<Vec<_>>()[..] {
            [] => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-missing",
                    "Idempotency-Key is missing",
                    "send an Idempotency-Key header: one key per payment intent, the same on every retry".into(),
                )
            }
            [one] => one.to_str().unwrap_or("\u{0}").to_owned(),
            _ => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-invalid",
                    "Idempotency-Key is invalid",
                    "send exactly one Idempotency-Key header".into(),
                )
            }
        };
        let client_key = match ClientKey::parse(&raw_key) {
            Ok(k) => k,
            Err(problem) => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-invalid",
                    "Idempotency-Key is invalid",
                    format!("Idempotency-Key {problem}"),
                )
            }
        };
        let text = match std::str::from_utf8(body) {
            Ok(t) => t,
            Err(_) => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "invalid-body",
                    "The request body is invalid",
                    "body: is not UTF-8 JSON".into(),
                )
            }
        };
        let msg = match ClaimApproved::parse(text) {
            Ok(m) => m,
            Err(e) => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "invalid-body",
                    "The request body is invalid",
                    e.to_string(),
                )
            }
        };
        let scope = match Scope::from_request(self.auth, headers, &msg) {
            Ok(s) => s,
            Err(problem) => {
                return Answer::problem(
                    StatusCode::UNAUTHORIZED,
                    "caller-unknown",
                    "The caller is not authenticated",
                    problem,
                )
            }
        };
        let identity = KeyIdentity::new(&scope, &client_key);
        let fingerprint = msg.payload_hash();
        let answer = match self.begin(&identity, &fingerprint).await {
            Ok(Begin::Answer(answer)) => answer,
            Ok(Begin::Proceed(record, version)) => {
                self.process(&msg, &identity, record, version).await
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

    /// Handles `GET /api/payments/{claimId}`.
    pub async fn get(&self, claim: &str) -> Answer {
        let claim_id = match ClaimId::parse(claim) {
            Ok(c) => c,
            Err(e) => {
                return Answer::problem(
                    StatusCode::BAD_REQUEST,
                    "invalid-claim-id",
                    "The claim id is invalid",
                    e.to_string(),
                )
            }
        };
        match self
            .consumer
            .store()
            .payment(claim_id, Purpose::Payout)
            .await
        {
            Ok(Some(p)) => {
                let mut a = Answer::resource(StatusCode::OK, &p.record);
                a.location = None;
                a
            }
            Ok(None) => Answer::problem(
                StatusCode::NOT_FOUND,
                "payment-not-found",
                "No payment for this claim",
                format!("claim {claim_id} has no payment"),
            ),
            Err(e) => self.store_failed(e),
        }
    }

    fn store_failed(&self, e: StoreError) -> Answer {
        match e {
            StoreError::Permanent(_) => Answer::problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store-failure",
                "The store failed",
                "the payments store failed in a way retrying cannot heal; the operators are alerted".into(),
            ),
            _ => Answer::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Temporarily unavailable",
                "the payments store is unavailable; retry with the same Idempotency-Key".into(),
            )
            .retry_after(1),
        }
    }

    /// Step 1: the key record, created or taken over, or the answer it already gives.
    async fn begin(
        &self,
        identity: &KeyIdentity,
        fingerprint: &PayloadHash,
    ) -> Result<Begin, StoreError> {
        let store = self.consumer.store();
        let lease = self.consumer.policy().lease;
        let now = OffsetDateTime::now_utc();
        let me = AttemptId::new();
        let fresh = InboxRecord {
            consumer: identity.key.consumer.clone(),
            claim_id: identity.key.claim_id,
            message_id: identity.key.message_id.clone(),
            payload_hash: fingerprint.clone(),
            status: InboxStatus::InProgress,
            outcome: None,
            owner: me,
            lease_until: Some(now + lease),
            first_delivery_count: 1,
            last_delivery_count: 1,
            created_at: now,
            updated_at: now,
            expires_at: now + self.retention,
        };
        let seen = match store.record_handled(&fresh).await? {
            InsertResult::Inserted(version) => return Ok(Begin::Proceed(fresh, version)),
            InsertResult::AlreadyExists(seen) => *seen,
        };
        let record = &seen.record;
        let expired = record.expires_at <= now;
        if !expired && record.payload_hash != *fingerprint {
            telemetry::counters().http_key_mismatches.inc();
            return Ok(Begin::Answer(Answer::problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key is already used",
                "this Idempotency-Key was used with a different request; use a new key for a new payment".into(),
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
        if !expired && record.lease_alive(now) {
            telemetry::counters().http_in_flight.inc();
            let left = (record.lease_until.unwrap_or(now) - now)
                .whole_seconds()
                .max(1) as u64;
            return Ok(Begin::Answer(
                Answer::problem(
                    StatusCode::CONFLICT,
                    "request-in-flight",
                    "A request with this Idempotency-Key is in progress",
                    "retry later with the same Idempotency-Key".into(),
                )
                .retry_after(left.min(5)),
            ));
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
            InboxRecord {
                owner: me,
                lease_until: Some(now + lease),
                last_delivery_count: attempt,
                updated_at: now,
                ..record.clone()
            }
        };
        match store.replace_inbox(&taken, &seen.version).await {
            Ok(version) => Ok(Begin::Proceed(taken, version)),
            Err(StoreError::PreconditionFailed) => Ok(Begin::Answer(
                Answer::problem(
                    StatusCode::CONFLICT,
                    "request-in-flight",
                    "A request with this Idempotency-Key is in progress",
                    "retry later with the same Idempotency-Key".into(),
                )
                .retry_after(1),
            )),
            Err(e) => Err(e),
        }
    }

    /// Steps 2 and 3: the consumer's engine, then the answer kept in the key record.
    async fn process(
        &self,
        msg: &ClaimApproved,
        identity: &KeyIdentity,
        record: InboxRecord,
        version: Version,
    ) -> Answer {
        let delivery = Delivery {
            message_id: identity.key.message_id.clone(),
            delivery_count: record.last_delivery_count,
        };
        let outcome = self.consumer.handle(msg, &delivery).await;
        let payment = match outcome {
            Outcome::RetryLater { .. } | Outcome::StoreFailure { .. } => None,
            _ => match self
                .consumer
                .store()
                .payment(msg.claim_id, Purpose::Payout)
                .await
            {
                Ok(p) => p.map(|p: Versioned<PaymentRecord>| p.record),
                Err(e) => {
                    self.release(record, &version).await;
                    return self.store_failed(e);
                }
            },
        };
        let answer = answer_for(&outcome, payment.as_ref());
        if answer.status == 503 || answer.status == 500 {
            // Nothing final: the retry resumes under the same key.
            self.release(record, &version).await;
            return answer;
        }
        let now = OffsetDateTime::now_utc();
        let done = InboxRecord {
            status: InboxStatus::Completed,
            outcome: serde_json::to_string(&answer)
                .ok()
                .map(InboxOutcome::HttpAnswer),
            lease_until: None,
            updated_at: now,
            ..record
        };
        if let Err(e) = self.consumer.store().replace_inbox(&done, &version).await {
            // The answer is still right: a retry recomputes it from the records.
            tracing::warn!(error = %e, messageId = %identity.key.message_id, "could not store the answer under its key");
        }
        answer
    }

    async fn release(&self, record: InboxRecord, version: &Version) {
        let now = OffsetDateTime::now_utc();
        let released = InboxRecord {
            lease_until: Some(now),
            updated_at: now,
            ..record
        };
        if let Err(e) = self
            .consumer
            .store()
            .replace_inbox(&released, version)
            .await
        {
            tracing::warn!(error = %e, "could not release the key lease; it will expire");
        }
    }
}

enum Begin {
    Answer(Answer),
    Proceed(InboxRecord, Version),
}

/// What the client is told for each way a payment can end.
fn answer_for(outcome: &Outcome, payment: Option<&PaymentRecord>) -> Answer {
    let unavailable = |detail: String| {
        Answer::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Temporarily unavailable",
            format!("{detail}; retry with the same Idempotency-Key"),
        )
        .retry_after(2)
    };
    match (outcome, payment) {
        (Outcome::RetryLater { reason }, _) => unavailable(reason.clone()),
        (Outcome::StoreFailure { .. }, _) => Answer::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store-failure",
            "The store failed",
            "the payments store failed in a way retrying cannot heal; the operators are alerted"
                .into(),
        ),
        (Outcome::InvalidMessage { reason }, _) => Answer::problem(
            StatusCode::BAD_REQUEST,
            "invalid-body",
            "The request body is invalid",
            reason.clone(),
        ),
        (Outcome::Conflict { reason }, _) => Answer::problem(
            StatusCode::CONFLICT,
            "claim-already-paid",
            "The claim already has a payment",
            format!("{reason}; a payment for a claim is made once"),
        ),
        (Outcome::BusinessDuplicate { .. }, Some(p)) => Answer::resource(StatusCode::OK, p),
        (Outcome::NeedsReconciliation { .. }, Some(p)) => Answer::resource(StatusCode::ACCEPTED, p),
        (_, Some(p)) => Answer::resource(StatusCode::CREATED, p),
        (other, None) => unavailable(format!("no payment after {}", other.label())),
    }
}

fn outcome_of_answer(answer: &Answer) -> &'static str {
    match answer.status {
        200 => "business-duplicate",
        201 | 202 => "created",
        409 => "conflict",
        422 => "key-reused",
        400 | 401 | 413 => "invalid-request",
        503 => "retry-later",
        _ => "store-failure",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sf_strings_or_bare_tokens_of_printable_ascii() {
        assert_eq!(ClientKey::parse("abc-123").unwrap().as_str(), "abc-123");
        assert_eq!(
            ClientKey::parse("\"8e03978e-40d5\"").unwrap().as_str(),
            "8e03978e-40d5"
        );
        assert_eq!(ClientKey::parse(r#""a\"b""#).unwrap().as_str(), "a\"b");
        for bad in [
            "",
            "\"\"",
            "\"unterminated",
            "\"a\";p=1",
            "é",
            &"x".repeat(256),
        ] {
            assert!(ClientKey::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ClientKey::parse(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn the_principal_header_names_the_tenant() {
        let principal = base64::engine::general_purpose::STANDARD.encode(
            r#"{"auth_typ":"aad","claims":[{"typ":"http://schemas.microsoft.com/identity/claims/tenantid","val":"t-1"}]}"#,
        );
        assert_eq!(tenant_of_principal(&principal).as_deref(), Some("t-1"));
        assert_eq!(tenant_of_principal("not base64!"), None);
    }

    #[test]
    fn scopes_and_keys_make_distinct_records() {
        let k = ClientKey::parse("same").unwrap();
        let a = KeyIdentity::new(&Scope("tenant:a".into()), &k);
        let b = KeyIdentity::new(&Scope("tenant:b".into()), &k);
        assert_ne!(a.key, b.key);
        let again = KeyIdentity::new(&Scope("tenant:a".into()), &k);
        assert_eq!(a.key, again.key);
    }
}
