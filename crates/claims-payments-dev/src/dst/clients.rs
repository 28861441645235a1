//! The HTTP clients of `POST /api/payments`: one Idempotency-Key per intent, reused on
//! every retry, with timeouts, double submits, disconnects, a changed payload, and (with
//! signed-in callers) another caller's payment under the same key string.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use tokio::task::{AbortHandle, JoinSet};

use super::check::Violation;
use super::faults::Fault;
use super::invariants::HttpRequest;
use super::state::*;
use crate::trace_event;

/// An HTTP caller: a signed-in principal with the pay role (or, by function key, all
/// callers are one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Caller(u64);

impl Caller {
    /// The key as the service scopes it: per caller.
    pub(super) fn scoped(&self, key: &str) -> String {
        format!("{}/{key}", self.0)
    }

    /// App Service Authentication's `x-ms-client-principal` for this caller.
    pub(super) fn principal(&self) -> String {
        use base64::Engine;
        let principal = serde_json::json!({
            "auth_typ": "aad",
            "name_typ": "name",
            "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
            "claims": [
                {"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier",
                 "val": format!("00000000-0000-4000-8000-{:012}", self.0)},
                {"typ": "http://schemas.microsoft.com/identity/claims/tenantid",
                 "val": "72f988bf-86f1-41af-91ab-2d7cd011db47"},
                {"typ": "roles", "val": "Payments.Pay"},
            ],
        });
        base64::engine::general_purpose::STANDARD.encode(principal.to_string())
    }
}

/// A 409 that is final: the claim was paid by another request (a 409 also says "in
/// progress, retry").
fn already_paid(status: u16, answer: &[u8]) -> bool {
    status == 409 && String::from_utf8_lossy(answer).contains("claim-already-paid")
}

impl Sim {
    /// The HTTP clients: each intent one Idempotency-Key, reused on every retry.
    pub(super) async fn http_clients(self: Arc<Self>) {
        let mut clients = JoinSet::new();
        for n in 0..self.options.http_intents {
            tokio::time::sleep(self.dice.millis(0, 5_000)).await;
            clients.spawn(self.clone().http_intent(n));
        }
        while clients.join_next().await.is_some() {}
    }

    /// Intent `n` of the HTTP clients: a claim of its own.
    pub(super) async fn http_intent(self: Arc<Self>, n: usize) {
        let claim = uuid::Uuid::from_u64_pair(self.seed, 1 << 40 | n as u64).to_string();
        let key = format!("intent-{}-{n}", self.seed);
        let amount = format!(
            "{}.{:02}",
            self.dice.range(1, 5_000),
            self.dice.range(0, 99)
        );
        let body = self.payment_body(&claim, &amount);
        self.http_payment(n, key, claim, amount, body).await
    }

    /// One payment intent under `key` (its `body` asks `amount` for `claim`); `n` names
    /// the claim another caller pays under the same key string.
    pub(super) async fn http_payment(
        self: Arc<Self>,
        n: usize,
        key: String,
        claim: String,
        amount: String,
        body: String,
    ) {
        let caller = Caller(self.dice.range(1, 3));
        let mut submits = JoinSet::new();
        let double = self.chaos.fires(Fault::DoubleSubmit, &key);
        for _ in 0..if double { 2 } else { 1 } {
            submits.spawn(
                self.clone()
                    .submit(caller, claim.clone(), key.clone(), body.clone()),
            );
        }
        if self.signed_in && self.chaos.fires(Fault::OtherCallersKey, &key) {
            // Another caller, the same key string, its own payment: its own answer.
            let other = Caller(caller.0 % 3 + 1);
            let claim = uuid::Uuid::from_u64_pair(self.seed, 2 << 40 | n as u64).to_string();
            let body = self.payment_body(&claim, "77.00");
            submits.spawn(self.clone().submit(other, claim, key.clone(), body));
        }
        while submits.join_next().await.is_some() {}
        if self.dice.hit(0.1) && self.checks.answered(&caller.scoped(&key)) {
            // The same key with another amount, once the key has its answer: refused.
            let changed = body.replace(&format!(r#""amount":"{amount}""#), r#""amount":"1.23""#);
            let answer = self
                .send_once(caller, &claim, &key, &changed, Duration::from_secs(60))
                .await;
            self.checks.http_request(HttpRequest {
                caller: caller.0,
                key: key.clone(),
                claim: claim.clone(),
                body: changed.clone(),
                answer: answer.clone(),
                reused_key: true,
            });
            if let Some((status, _)) = answer {
                if status < 400 {
                    self.checks.fail(Violation::new(
                        "key-reuse-refused",
                        Some(&claim),
                        format!("a changed payload under key {key} answered {status}"),
                    ));
                }
            }
        }
    }

    pub(super) fn payment_body(&self, claim: &str, amount: &str) -> String {
        format!(
            r#"{{"claimId":"{claim}","amount":"{amount}","currency":"EUR","payee":"NL{:02}SIMB{:010}"}}"#,
            self.dice.range(10, 99),
            self.dice.range(0, 9_999_999_999)
        )
    }

    /// One intent's submission: retried under the same key until a final answer.
    pub(super) async fn submit(
        self: Arc<Self>,
        caller: Caller,
        claim: String,
        key: String,
        body: String,
    ) {
        for attempt in 0..12u32 {
            let timeout = if self.chaos.fires(Fault::Disconnect, &key) {
                self.dice.millis(1, 300)
            } else if self.chaos.fires(Fault::ClientTimeout, &key) {
                self.dice.millis(500, 10_000)
            } else {
                Duration::from_secs(100)
            };
            match self.send_once(caller, &claim, &key, &body, timeout).await {
                Some((status, answer))
                    if !matches!(status, 409 | 429 | 500..=599)
                        || already_paid(status, &answer) =>
                {
                    self.checks
                        .http_answer(&caller.scoped(&key), &claim, status, &answer);
                    self.checks.http_request(HttpRequest {
                        caller: caller.0,
                        key: key.clone(),
                        claim: claim.clone(),
                        body: body.clone(),
                        answer: Some((status, answer.clone())),
                        reused_key: false,
                    });
                    if (status == 200 || status == 201)
                        && !String::from_utf8_lossy(&answer).contains(&claim)
                    {
                        self.checks.fail(Violation::new(
                            "key-replays-one-answer",
                            Some(&claim),
                            format!(
                                "key {key} of caller {} answered {status} about another claim",
                                caller.0
                            ),
                        ));
                    }
                    if status == 200 || status == 201 {
                        let stored = self.durable(&claim, None).await.1;
                        if !stored {
                            self.checks.fail(Violation::new(
                                "2xx-is-durable",
                                Some(&claim),
                                format!(
                                    "POST /api/payments answered {status} and no payment is stored"
                                ),
                            ));
                        }
                    }
                    return;
                }
                _ => {
                    let backoff = Duration::from_millis(250 << attempt.min(6));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
        trace_event!(self.trace, "http gave up key {key} claim {claim}");
        self.checks.http_request(HttpRequest {
            caller: caller.0,
            key,
            claim,
            body,
            answer: None,
            reused_key: false,
        });
    }

    /// One request on a live instance; `None` when the client gave up waiting or the
    /// connection broke (the server's work is then dropped where it waits).
    pub(super) async fn send_once(
        &self,
        caller: Caller,
        claim: &str,
        key: &str,
        body: &str,
        timeout: Duration,
    ) -> Option<(u16, Vec<u8>)> {
        let mut request = Request::post("/api/payments")
            .header("content-type", "application/json")
            .header("idempotency-key", key);
        if self.signed_in {
            request = request.header("x-ms-client-principal", caller.principal());
        }
        let request = request
            .body(Body::from(body.to_owned()))
            .expect("a request");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle: AbortHandle = {
            let mut books = self.books();
            books.http_requests += 1;
            let slots = books.instances.len();
            let first = self.dice.range(0, slots as u64 - 1) as usize;
            let slot = (0..slots)
                .map(|k| (first + k) % slots)
                .find(|&s| books.instances[s].alive)?;
            let router = books.instances[slot].router.clone()?;
            let (flights, claim) = (self.flights.clone(), claim.to_owned());
            books.instances[slot].tasks.spawn(async move {
                let _flight = Flights::begin(&flights, &claim, false);
                let answered = call(router, request).await;
                let _ = tx.send(answered);
            })
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => {
                if let Some((status, body)) = &answer {
                    let detail = if *status >= 400 {
                        String::from_utf8_lossy(&body[..body.len().min(160)]).into_owned()
                    } else {
                        String::new()
                    };
                    trace_event!(self.trace, "http key {key} answered {status} {detail}");
                }
                answer
            }
            _ => {
                handle.abort();
                trace_event!(self.trace, "http key {key} cut");
                None
            }
        }
    }
}
