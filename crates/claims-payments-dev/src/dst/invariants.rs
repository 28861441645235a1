//! The strict invariants at the end of a run, on the ledger as the store holds it (any
//! store: they read `&[PaymentRecord]`), the bank's records and what the run sent:
//! - **the payload paid is the one accepted first**: a claim's payment keeps the payload
//!   of the first message or request the product accepted for it (the one whose claim
//!   step created the payment; the product cannot know of a copy it never stored, so a
//!   conflicting copy accepted while its original sat dead-lettered is the first one);
//!   that payload is one the producer or a client sent, the bank paid exactly it (amount,
//!   currency, payee), and every message completed and every request answered 2xx for the
//!   claim carries it. A copy with another payload is never paid in its place: it ends as
//!   a conflict;
//! - **`rejected` only where the bank refused**: a rejected payment has the bank's
//!   refusal of its key, and every refusal ends as a rejected payment;
//! - **a dead letter's reason follows from its kind**: an invalid body is
//!   `invalid-message`; a valid copy whose payload differs from its claim's payment, or
//!   whose MessageId another payload holds, is `conflict`; `store-failure` only when a
//!   permanent store fault was injected (none is, today);
//! - **transient dead letters are bounded**: see [`TransientBound`];
//! - **an HTTP answer is its own**: each key's final answer is about its own request (its
//!   claim, amount and currency, never another caller's or another key's payment); a
//!   2xx's payment is the one stored at the end; a claim already paid otherwise is 409
//!   `claim-already-paid` without that payment's details; every request answered
//!   2xx, and every request the service must accept, ends with a payment.

use std::collections::{BTreeMap, BTreeSet};

use claims_payments::seams::store::{PaymentRecord, PaymentStatus};
use claims_payments::ClaimApproved;
use claims_payments::PayloadHash;

use super::bank::{Payout, Refusal};
use crate::sim::scenario::CopyKind;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub claim: Option<String>,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: &'static str, claim: Option<&str>, detail: String) -> Self {
        Violation {
            invariant,
            claim: claim.map(str::to_owned),
            detail,
        }
    }
}

/// A message as the run left it.
pub struct Ended {
    pub message_id: String,
    pub claim: Option<String>,
    pub completed: bool,
    pub dead_lettered: bool,
    pub last_outcome: String,
    pub dead_lettered_calm: bool,
    pub kind: CopyKind,
    pub body: Vec<u8>,
    /// Why its deliveries failed (transient causes).
    pub failures: Vec<Cause>,
    /// The operator removed a dead letter of its MessageId (re-drove or discarded it): a
    /// later copy under that MessageId is answered by what the tool recorded (a discard
    /// completes a re-send as a duplicate), whatever its payload.
    pub operator_removed: bool,
}

/// One request of an HTTP client, and the final answer it got (`None`: the client
/// gave up, or the answer was not final).
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub caller: u64,
    pub key: String,
    pub claim: String,
    pub body: String,
    pub answer: Option<(u16, Vec<u8>)>,
    /// A changed payload under a key that already had its answer (must be refused).
    pub reused_key: bool,
}

/// What a run's end is judged on.
pub struct EndState<'a> {
    pub ledger: &'a [PaymentRecord],
    pub payouts: &'a [Payout],
    pub refusals: &'a [Refusal],
    pub queue: &'a [Ended],
    /// Every body the producer sent (some never reach the queue as a message of their
    /// own: duplicate detection drops a re-drive of two dead letters under one MessageId).
    pub sent: &'a [&'a [u8]],
    pub http: &'a [HttpRequest],
    /// Callers are signed in (`HTTP_AUTH=appservice`): a claim another caller paid is 409.
    pub signed_in: bool,
    /// A fault that makes the store fail for good was injected (none exists today).
    pub permanent_store_fault: bool,
}

/// A payload as the product reads it: the fields its payload hash covers.
fn parse(body: &[u8]) -> Option<ClaimApproved> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|b| ClaimApproved::parse(b).ok())
}

fn same_payload(m: &ClaimApproved, p: &PaymentRecord) -> bool {
    m.payload_hash() == p.payload_hash
}

/// Every strict invariant at the end of a run.
pub fn at_end(end: &EndState<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    found.extend(paid_as_first_accepted(end));
    found.extend(rejected_only_where_refused(end));
    found.extend(dead_letters_follow_their_kind(end));
    found.extend(http_answers_are_their_own(end));
    found
}

/// The claim's payment, its payload sent by someone, paid exactly by the bank; every
/// success for the claim carries that payload.
pub fn paid_as_first_accepted(end: &EndState<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    let ledger: BTreeMap<String, &PaymentRecord> = end
        .ledger
        .iter()
        .map(|p| (p.claim_id.to_string(), p))
        .collect();
    // Every payload sent per claim: the queue's copies and the clients' requests.
    let mut sent: BTreeMap<String, Vec<ClaimApproved>> = BTreeMap::new();
    let bodies = end
        .queue
        .iter()
        .map(|m| m.body.as_slice())
        .chain(end.sent.iter().copied())
        .chain(end.http.iter().map(|r| r.body.as_bytes()));
    for body in bodies {
        if let Some(m) = parse(body) {
            sent.entry(m.claim_id.to_string()).or_default().push(m);
        }
    }
    // The bank's payouts per claim, in the order they were made.
    let mut payouts: BTreeMap<&str, Vec<&Payout>> = BTreeMap::new();
    for b in end.payouts {
        payouts.entry(b.claim_id.as_str()).or_default().push(b);
    }
    for (claim, p) in &ledger {
        let payee = p
            .payout_request
            .as_deref()
            .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
            .and_then(|v| v.get("payee").and_then(|x| x.as_str()).map(str::to_owned));
        let matching = sent
            .get(claim)
            .into_iter()
            .flatten()
            .find(|m| same_payload(m, p));
        match matching {
            None => found.push(Violation::new(
                "paid-payload-was-sent",
                Some(claim),
                format!(
                    "the payment holds {} {} to {:?}, a payload nobody sent for this claim",
                    p.money.amount_string(),
                    p.money.currency().code(),
                    payee
                ),
            )),
            Some(m) => {
                let request = p
                    .payout_request
                    .as_ref()
                    .is_none_or(|r| *r == m.payout_request_body());
                if m.money != p.money || m.payee != p.payee || m.tenant != p.tenant_id || !request {
                    found.push(Violation::new(
                        "paid-payload-was-sent",
                        Some(claim),
                        format!(
                            "the payment's hash is a sent payload's, its fields are not ({} {} to {:?}, sent {} {})",
                            p.money.amount_string(),
                            p.money.currency().code(),
                            payee,
                            m.money.amount_string(),
                            m.money.currency().code()
                        ),
                    ));
                }
            }
        }
        for b in payouts.get(claim.as_str()).into_iter().flatten() {
            let same = Some(&b.body) == p.payout_request.as_ref()
                && b.amount == p.money.amount_string()
                && b.currency == p.money.currency().code()
                && b.payee == payee;
            if !same {
                found.push(Violation::new(
                    "bank-paid-the-payment",
                    Some(claim),
                    format!(
                        "the bank paid {} {} {} to {:?}, the payment holds {} {} to {:?}",
                        b.payment_id,
                        b.amount,
                        b.currency,
                        b.payee,
                        p.money.amount_string(),
                        p.money.currency().code(),
                        payee
                    ),
                ));
            }
        }
    }
    for m in end
        .queue
        .iter()
        .filter(|m| m.completed && !m.operator_removed)
    {
        let Some(msg) = parse(&m.body) else { continue };
        let claim = msg.claim_id.to_string();
        if let Some(p) = ledger.get(&claim) {
            if !same_payload(&msg, p) {
                found.push(Violation::new(
                    "one-payload-per-claim",
                    Some(&claim),
                    format!(
                        "message {} ({:?}, {} {}) completed, the claim's payment holds {} {} (message {})",
                        m.message_id,
                        m.kind,
                        msg.money.amount_string(),
                        msg.money.currency().code(),
                        p.money.amount_string(),
                        p.money.currency().code(),
                        p.message_id.as_str()
                    ),
                ));
            }
        }
    }
    for r in end.http.iter() {
        let Some((status, _)) = &r.answer else {
            continue;
        };
        if !(200..300).contains(status) {
            continue;
        }
        let (Some(msg), Some(p)) = (parse(r.body.as_bytes()), ledger.get(&r.claim)) else {
            continue;
        };
        if !same_payload(&msg, p) {
            found.push(Violation::new(
                "one-payload-per-claim",
                Some(&r.claim),
                format!(
                    "key {} of caller {} answered {status} for {} {}, the claim's payment holds {} {}",
                    r.key,
                    r.caller,
                    msg.money.amount_string(),
                    msg.money.currency().code(),
                    p.money.amount_string(),
                    p.money.currency().code()
                ),
            ));
        }
    }
    found
}

/// `rejected` if and only if the bank refused the payment's key.
pub fn rejected_only_where_refused(end: &EndState<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    let refused: BTreeSet<(&str, &str)> = end
        .refusals
        .iter()
        .map(|r| (r.claim_id.as_str(), r.key.as_str()))
        .collect();
    for p in end.ledger {
        let claim = p.claim_id.to_string();
        let was_refused = refused.contains(&(claim.as_str(), p.idempotency_key.as_str()));
        if p.status == PaymentStatus::Rejected && !was_refused {
            found.push(Violation::new(
                "rejected-only-where-refused",
                Some(&claim),
                format!(
                    "the payment is rejected ({}) and the bank never refused its key",
                    p.status_reason.as_deref().unwrap_or("-")
                ),
            ));
        }
        if was_refused && p.status != PaymentStatus::Rejected {
            found.push(Violation::new(
                "rejected-only-where-refused",
                Some(&claim),
                format!(
                    "the bank refused the payout and the payment ends {}",
                    p.status.as_str()
                ),
            ));
        }
    }
    found
}

/// What a dead letter's last answer must be, from the copy's kind and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    InvalidMessage,
    Conflict,
    /// The copy carries its claim's paid payload: a dead letter only for a transient
    /// cause (bounded while faults fire; never while calm or after the re-drive).
    Transient,
}

/// The reason a dead letter of `kind` must carry: `other_payload` says that its payload
/// differs from its claim's payment, or that another copy under its MessageId carries
/// another payload (the inbox record of the MessageId then holds that one).
pub fn expected_dead_letter(kind: CopyKind, other_payload: bool) -> Expected {
    match kind {
        CopyKind::Invalid => Expected::InvalidMessage,
        CopyKind::Original
        | CopyKind::ProducerResend
        | CopyKind::BusinessDuplicate
        | CopyKind::ConflictingPayload => {
            if other_payload {
                Expected::Conflict
            } else {
                Expected::Transient
            }
        }
    }
}

/// Whether an outcome label is a transient failure (the broker's retry may heal it).
fn is_transient(label: &str) -> bool {
    matches!(
        label,
        "retry-later" | "no-answer" | "function-timeout" | "lock-expired" | "-"
    )
}

/// Each dead letter's reason is the one its kind and the ledger call for; a message
/// that carries another payload never completes.
pub fn dead_letters_follow_their_kind(end: &EndState<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    let ledger: BTreeMap<String, &PaymentRecord> = end
        .ledger
        .iter()
        .map(|p| (p.claim_id.to_string(), p))
        .collect();
    // MessageId -> the payload hashes its copies carry.
    let mut per_id: BTreeMap<&str, Vec<PayloadHash>> = BTreeMap::new();
    for m in end.queue {
        if let Some(msg) = parse(&m.body) {
            let hashes = per_id.entry(m.message_id.as_str()).or_default();
            let hash = msg.payload_hash();
            if !hashes.contains(&hash) {
                hashes.push(hash);
            }
        }
    }
    for m in end.queue {
        let parsed = parse(&m.body);
        let other_payload = match &parsed {
            None => false,
            Some(msg) => {
                let differs = ledger
                    .get(&msg.claim_id.to_string())
                    .is_some_and(|p| !same_payload(msg, p));
                differs
                    || per_id
                        .get(m.message_id.as_str())
                        .is_some_and(|h| h.len() > 1)
            }
        };
        let kind = if parsed.is_none() {
            CopyKind::Invalid
        } else {
            m.kind
        };
        let expected = expected_dead_letter(kind, other_payload);
        if m.completed && !m.operator_removed && expected == Expected::Conflict {
            let differs = parsed.as_ref().is_some_and(|msg| {
                ledger
                    .get(&msg.claim_id.to_string())
                    .is_some_and(|p| !same_payload(msg, p))
            });
            if differs {
                found.push(Violation::new(
                    "conflict-never-completes",
                    m.claim.as_deref(),
                    format!(
                        "message {} ({:?}) carries another payload than its claim's payment and was completed",
                        m.message_id, m.kind
                    ),
                ));
            }
        }
        if !m.dead_lettered {
            continue;
        }
        let label = m.last_outcome.as_str();
        let fits = match expected {
            Expected::InvalidMessage => label == "invalid-message",
            Expected::Conflict => label == "conflict",
            Expected::Transient => is_transient(label),
        } || (label == "store-failure" && end.permanent_store_fault);
        if !fits {
            found.push(Violation::new(
                "dead-letter-reason-fits-kind",
                m.claim.as_deref(),
                format!(
                    "message {} ({:?}) was dead-lettered after '{label}', its kind calls for {expected:?}",
                    m.message_id, m.kind
                ),
            ));
        }
    }
    found
}

/// The payment fields a 2xx answer of `POST /api/payments` carries.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resource {
    claim_id: String,
    amount: String,
    currency: String,
    status: String,
    bank_payment_id: Option<String>,
}

/// Each final answer belongs to its own request; a 2xx is the stored payment; a claim
/// paid by someone else (or with another payload) is 409 without details; a request
/// answered 2xx, or one the service had to accept, ends with a payment.
pub fn http_answers_are_their_own(end: &EndState<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    let ledger: BTreeMap<String, &PaymentRecord> = end
        .ledger
        .iter()
        .map(|p| (p.claim_id.to_string(), p))
        .collect();
    for r in end.http {
        let Some((status, answer)) = &r.answer else {
            continue;
        };
        let text = String::from_utf8_lossy(answer);
        let own =
            |what: String| Violation::new("other-callers-answer-is-its-own", Some(&r.claim), what);
        let sent = parse(r.body.as_bytes());
        let payment = ledger.get(&r.claim);
        match *status {
            200..=202 => {
                let Ok(res) = serde_json::from_slice::<Resource>(answer) else {
                    found.push(own(format!(
                        "key {} of caller {} answered {status} without a payment: {text}",
                        r.key, r.caller
                    )));
                    continue;
                };
                let Some(m) = &sent else { continue };
                let amount_matches = res
                    .amount
                    .parse::<rust_decimal::Decimal>()
                    .is_ok_and(|a| a == m.money.amount());
                if res.claim_id != r.claim
                    || !amount_matches
                    || res.currency != m.money.currency().code()
                {
                    found.push(own(format!(
                        "key {} of caller {} asked {} {} for claim {} and was answered {status} with {} {} for claim {}",
                        r.key,
                        r.caller,
                        m.money.amount_string(),
                        m.money.currency().code(),
                        r.claim,
                        res.amount,
                        res.currency,
                        res.claim_id
                    )));
                    continue;
                }
                let Some(p) = payment else {
                    found.push(Violation::new(
                        "http-claim-recorded",
                        Some(&r.claim),
                        format!("key {} answered {status} and no payment is stored", r.key),
                    ));
                    continue;
                };
                // 202: the payout needed reconciliation then; it settles later.
                let settled_as_answered = *status == 202
                    || (res.status == p.status.as_str()
                        && res.bank_payment_id == p.bank_payment_id);
                if !settled_as_answered {
                    found.push(Violation::new(
                        "http-answer-is-the-stored-payment",
                        Some(&r.claim),
                        format!(
                            "key {} answered {status} {} {:?}, the payment ends {} {:?}",
                            r.key,
                            res.status,
                            res.bank_payment_id,
                            p.status.as_str(),
                            p.bank_payment_id
                        ),
                    ));
                }
                let by_queue = !p.message_id.as_str().starts_with("http-");
                if end.signed_in && by_queue && !r.reused_key {
                    found.push(own(format!(
                        "key {} of caller {} answered {status} with the payment of a queue message (a signed-in caller gets 409 claim-already-paid)",
                        r.key, r.caller
                    )));
                }
            }
            409 if text.contains("claim-already-paid") => {
                if text.contains("bankPaymentId") || text.contains("\"amount\"") {
                    found.push(own(format!(
                        "key {} of caller {}: claim-already-paid names the payment: {text}",
                        r.key, r.caller
                    )));
                }
                if payment.is_none() {
                    found.push(Violation::new(
                        "http-claim-recorded",
                        Some(&r.claim),
                        format!(
                            "key {} answered claim-already-paid and the claim has no payment",
                            r.key
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    // Every request with a valid payment that got a final answer other than a refusal
    // of the request itself ends with a payment of its claim.
    for r in end.http {
        let Some((status, _)) = &r.answer else {
            continue;
        };
        if r.reused_key || !(200..=202).contains(status) || parse(r.body.as_bytes()).is_none() {
            continue;
        }
        if !ledger.contains_key(&r.claim) {
            found.push(Violation::new(
                "http-claim-recorded",
                Some(&r.claim),
                format!(
                    "key {} answered {status} and the claim ends without a payment",
                    r.key
                ),
            ));
        }
    }
    found
}

/// The bound on transient dead letters in the chaos phase.
///
/// A message goes to the dead-letter queue for a transient cause only after
/// `maxDeliveryCount` (10) deliveries that all failed, and with the faults off no delivery
/// fails (the calm phase fails a run that dead-letters anything then). So each such dead
/// letter spends 10 failed deliveries, and each of them met a fault: an injected store or
/// bank fault named in its answer, or the host's side (a crash, a cut invocation, a lost
/// lock). Hence per run: transient dead letters <= failed deliveries that met a fault / 10,
/// and every one of a transient dead letter's failed deliveries names its fault.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransientBound {
    /// Messages dead-lettered for a transient cause while faults fired.
    pub dead_letters: u64,
    /// Failed deliveries in the chaos phase whose cause is a fault.
    pub faulted_deliveries: u64,
}

impl TransientBound {
    pub fn bound(&self) -> u64 {
        self.faulted_deliveries / u64::from(super::timings::MAX_DELIVERY_COUNT)
    }

    pub fn holds(&self) -> bool {
        self.dead_letters <= self.bound()
    }
}

/// Why a delivery failed, read from its answer (`ReturnValue.outcome` and `.detail`) or
/// from the host's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// A store call failed as `dst/store.rs` makes it fail (window, throttling, a lost
    /// answer, a failing read).
    Store,
    /// The bank did not pay within the retry budget (its faults, or it is dark).
    Bank,
    /// Another attempt held the message or the claim's payout past the in-flight wait.
    OtherAttempt,
    /// The handler died, or the host cut the invocation.
    HostCut,
    /// The lock ran out while the invocation worked.
    LockLost,
    /// The instance's clock was too far from the bank's to start a payout (a clock fault).
    Clock,
    /// A permanent answer (conflict, invalid): not a transient failure, and its message is
    /// no transient dead letter.
    Permanent,
    /// A transient failure no injected fault explains.
    Unexplained,
}

/// The texts `dst/store.rs` puts in the store errors it injects.
const STORE_FAULT_TEXTS: &[&str] = &[
    "the store cannot be reached",
    "the server is read-only (failover)",
    "throttled (429)",
    "the write may have committed",
    "the write may still commit",
    "read timed out",
    // The Cosmos DB SDK's own fault injection (`dst --store cosmos`) marks what it injects.
    "Injected fault",
];

impl Cause {
    /// `label`: the outcome and status (`retry-later 503`) or the host's word
    /// (`no-answer`, `function-timeout`); `detail`: the answer's reason.
    pub fn of(label: &str, detail: &str) -> Cause {
        let outcome = label.split(' ').next().unwrap_or("-");
        match outcome {
            "no-answer" | "function-timeout" => Cause::HostCut,
            "conflict" | "invalid-message" => Cause::Permanent,
            "retry-later" => {
                if STORE_FAULT_TEXTS.iter().any(|t| detail.contains(t)) {
                    Cause::Store
                } else if detail.contains("another attempt is processing")
                    || detail.contains("has a payout in progress from message")
                {
                    Cause::OtherAttempt
                } else if detail.contains("bank unavailable after") {
                    Cause::Bank
                } else if detail.contains("no payout starts on it") {
                    Cause::Clock
                } else {
                    Cause::Unexplained
                }
            }
            _ => Cause::Unexplained,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use claims_payments::seams::consumer::{Consumer, Delivery};
    use claims_payments::seams::store::AttemptId;
    use claims_payments::MessageId;

    use super::*;

    const CLAIM: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn body(amount: &str) -> String {
        format!(
            r#"{{"claimId":"{CLAIM}","amount":"{amount}","currency":"EUR","payee":"NL91ABNA0417164300"}}"#
        )
    }

    /// The payment the consumer writes for `body` under `message`, paid as `pay-1`.
    fn paid(body: &str, message: &str) -> PaymentRecord {
        let msg = ClaimApproved::parse(body).expect("a valid body");
        let consumer = Consumer::new(
            Arc::new(crate::memory_store::MemoryStore::new()),
            None,
            super::super::state::policy(),
        );
        let delivery = Delivery {
            message_id: MessageId::parse(message).expect("a MessageId"),
            delivery_count: 1,
        };
        let now = time::OffsetDateTime::UNIX_EPOCH;
        let (_, mut p) = consumer.first_records(&msg, &delivery, AttemptId::new(), now);
        p.payout_request = Some(msg.payout_request_body());
        p.status = PaymentStatus::Paid;
        p.bank_payment_id = Some("pay-1".into());
        p
    }

    fn payout_of(p: &PaymentRecord) -> Payout {
        let request = p.payout_request.clone().expect("a payout request");
        let v: serde_json::Value = serde_json::from_str(&request).expect("JSON");
        let field = |n: &str| v[n].as_str().map(str::to_owned);
        Payout {
            payment_id: "pay-1".into(),
            claim_id: CLAIM.into(),
            amount: field("amount").unwrap_or_default(),
            currency: field("currency").unwrap_or_default(),
            payee: field("payee"),
            reference: field("reference").unwrap_or_default(),
            key: p.idempotency_key.as_str().to_owned(),
            body: request,
            at_ms: 0,
        }
    }

    fn message(id: &str, kind: CopyKind, body: &str, completed: bool, last: &str) -> Ended {
        Ended {
            operator_removed: false,
            message_id: id.into(),
            claim: Some(CLAIM.into()),
            completed,
            dead_lettered: !completed,
            last_outcome: last.into(),
            dead_lettered_calm: false,
            kind,
            body: body.as_bytes().to_vec(),
            failures: Vec::new(),
        }
    }

    fn end<'a>(
        ledger: &'a [PaymentRecord],
        payouts: &'a [Payout],
        refusals: &'a [Refusal],
        queue: &'a [Ended],
        http: &'a [HttpRequest],
    ) -> EndState<'a> {
        EndState {
            ledger,
            payouts,
            refusals,
            queue,
            sent: &[],
            http,
            signed_in: false,
            permanent_store_fault: false,
        }
    }

    fn names(found: &[Violation]) -> Vec<&'static str> {
        found.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn the_first_accepted_payload_paid_as_sent_passes() {
        let (original, conflicting) = (body("100.00"), body("110.00"));
        let ledger = [paid(&original, "m-1")];
        let payouts = [payout_of(&ledger[0])];
        let queue = [
            message("m-1", CopyKind::Original, &original, true, "paid"),
            message(
                "m-1",
                CopyKind::ConflictingPayload,
                &conflicting,
                false,
                "conflict",
            ),
        ];
        let found = at_end(&end(&ledger, &payouts, &[], &queue, &[]));
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_conflicting_copy_paid_in_place_of_a_completed_original_is_found() {
        let (original, conflicting) = (body("100.00"), body("110.00"));
        // The conflicting copy's payload is paid, while the original was completed.
        let ledger = [paid(&conflicting, "m-1")];
        let payouts = [payout_of(&ledger[0])];
        let queue = [
            message("m-1", CopyKind::Original, &original, true, "paid"),
            message(
                "m-1",
                CopyKind::ConflictingPayload,
                &conflicting,
                false,
                "conflict",
            ),
        ];
        let found = at_end(&end(&ledger, &payouts, &[], &queue, &[]));
        assert!(
            names(&found).contains(&"one-payload-per-claim"),
            "{found:?}"
        );
        assert!(
            names(&found).contains(&"conflict-never-completes"),
            "{found:?}"
        );
    }

    #[test]
    fn a_payload_nobody_sent_and_a_bank_paying_another_amount_are_found() {
        let ledger = [paid(&body("100.00"), "m-1")];
        let queue = [message(
            "m-1",
            CopyKind::Original,
            &body("99.00"),
            false,
            "conflict",
        )];
        let found = paid_as_first_accepted(&end(&ledger, &[], &[], &queue, &[]));
        assert_eq!(names(&found), ["paid-payload-was-sent"], "{found:?}");

        let ledger = [paid(&body("100.00"), "m-1")];
        let mut payout = payout_of(&ledger[0]);
        payout.amount = "1.00".into();
        let queue = [message(
            "m-1",
            CopyKind::Original,
            &body("100.00"),
            true,
            "paid",
        )];
        let found = paid_as_first_accepted(&end(&ledger, &[payout], &[], &queue, &[]));
        assert_eq!(names(&found), ["bank-paid-the-payment"], "{found:?}");
    }

    #[test]
    fn rejected_without_the_banks_refusal_and_a_refusal_not_recorded_are_found() {
        let mut p = paid(&body("100.00"), "m-1");
        p.status = PaymentStatus::Rejected;
        p.bank_payment_id = None;
        let found = rejected_only_where_refused(&end(&[p.clone()], &[], &[], &[], &[]));
        assert_eq!(names(&found), ["rejected-only-where-refused"]);
        let refusal = Refusal {
            claim_id: CLAIM.into(),
            key: p.idempotency_key.as_str().to_owned(),
        };
        let refusals = [refusal];
        assert!(rejected_only_where_refused(&end(&[p], &[], &refusals, &[], &[])).is_empty());
        let paid = paid(&body("100.00"), "m-1");
        let found = rejected_only_where_refused(&end(&[paid], &[], &refusals, &[], &[]));
        assert_eq!(names(&found), ["rejected-only-where-refused"]);
    }

    #[test]
    fn a_dead_letter_is_judged_by_its_kind_not_its_label() {
        let original = body("100.00");
        let ledger = [paid(&original, "m-1")];
        let bad = [
            // An invalid body must be invalid-message.
            Ended {
                operator_removed: false,
                claim: None,
                ..message("m-9", CopyKind::Invalid, "not json", false, "retry-later")
            },
            // A conflicting copy must be a conflict, never a store failure.
            message(
                "m-1",
                CopyKind::ConflictingPayload,
                &body("110.00"),
                false,
                "store-failure",
            ),
            // A business duplicate of the paid payload is no conflict.
            message(
                "m-2",
                CopyKind::BusinessDuplicate,
                &original,
                false,
                "conflict",
            ),
        ];
        let found = dead_letters_follow_their_kind(&end(&ledger, &[], &[], &bad, &[]));
        assert_eq!(
            names(&found),
            ["dead-letter-reason-fits-kind"; 3],
            "{found:?}"
        );
        let good = [
            Ended {
                operator_removed: false,
                claim: None,
                ..message(
                    "m-9",
                    CopyKind::Invalid,
                    "not json",
                    false,
                    "invalid-message",
                )
            },
            message(
                "m-1",
                CopyKind::ConflictingPayload,
                &body("110.00"),
                false,
                "conflict",
            ),
            message(
                "m-2",
                CopyKind::BusinessDuplicate,
                &original,
                true,
                "business-duplicate",
            ),
        ];
        assert!(dead_letters_follow_their_kind(&end(&ledger, &[], &[], &good, &[])).is_empty());
        assert_eq!(
            expected_dead_letter(CopyKind::ConflictingPayload, true),
            Expected::Conflict
        );
    }

    fn request(key: &str, body: &str, status: u16, answer: &str) -> HttpRequest {
        HttpRequest {
            caller: 1,
            key: key.into(),
            claim: CLAIM.into(),
            body: body.into(),
            answer: Some((status, answer.as_bytes().to_vec())),
            reused_key: false,
        }
    }

    #[test]
    fn an_answer_about_another_request_or_naming_anothers_payment_is_found() {
        let sent = body("100.00");
        let ledger = [paid(&sent, "http-abc-def")];
        let own = format!(
            r#"{{"claimId":"{CLAIM}","amount":"100.00","currency":"EUR","status":"paid","bankPaymentId":"pay-1"}}"#
        );
        let ok = [request("k1", &sent, 201, &own)];
        assert!(http_answers_are_their_own(&end(&ledger, &[], &[], &[], &ok)).is_empty());
        // Another request's payment (another amount) in this key's 201.
        let other = own.replace("100.00", "77.00");
        let found = http_answers_are_their_own(&end(
            &ledger,
            &[],
            &[],
            &[],
            &[request("k1", &sent, 201, &other)],
        ));
        assert_eq!(
            names(&found),
            ["other-callers-answer-is-its-own"],
            "{found:?}"
        );
        // A 201 whose payment later differs from the stored one.
        let stale = own.replace("pay-1", "pay-2");
        let found = http_answers_are_their_own(&end(
            &ledger,
            &[],
            &[],
            &[],
            &[request("k1", &sent, 201, &stale)],
        ));
        assert_eq!(
            names(&found),
            ["http-answer-is-the-stored-payment"],
            "{found:?}"
        );
        // claim-already-paid that names the payment.
        let leak =
            r#"{"type":"https://claims-payments/problems/claim-already-paid","amount":"100.00"}"#;
        let found = http_answers_are_their_own(&end(
            &ledger,
            &[],
            &[],
            &[],
            &[request("k2", &sent, 409, leak)],
        ));
        assert_eq!(
            names(&found),
            ["other-callers-answer-is-its-own"],
            "{found:?}"
        );
        // A 2xx and no payment at the end.
        let found = http_answers_are_their_own(&end(&[], &[], &[], &[], &ok));
        assert!(names(&found).contains(&"http-claim-recorded"), "{found:?}");
    }

    #[test]
    fn transient_failures_name_their_fault_and_the_bound_counts_ten_per_dead_letter() {
        assert_eq!(
            Cause::of("retry-later 503", "claim: the store cannot be reached"),
            Cause::Store
        );
        assert_eq!(
            Cause::of(
                "retry-later 503",
                "bank unavailable after 4 attempts: timeout"
            ),
            Cause::Bank
        );
        assert_eq!(Cause::of("no-answer", ""), Cause::HostCut);
        assert_eq!(
            Cause::of("conflict 422", "payload differs"),
            Cause::Permanent
        );
        assert_eq!(
            Cause::of(
                "retry-later 503",
                "bank refused the service's request (401)"
            ),
            Cause::Unexplained
        );
        assert_eq!(
            Cause::of("store-failure 500", "corrupt"),
            Cause::Unexplained
        );
        let within = TransientBound {
            dead_letters: 2,
            faulted_deliveries: 25,
        };
        assert!(within.holds());
        let beyond = TransientBound {
            dead_letters: 3,
            faulted_deliveries: 25,
        };
        assert!(!beyond.holds());
    }
}
