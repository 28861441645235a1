//! The invariants, with the bank as ground truth: checked while the run goes (a 2xx
//! stands for a durable record, an Idempotency-Key replays one answer byte for byte, a
//! changed payload under a key is refused) and at its end, after the faults stopped and
//! reconciliation ran (at most one payout per claim; ledger = bank; a settled payment
//! never changed; nothing left
//! unsettled; every message completed or dead-lettered for a permanent reason; nothing
//! dead-lettered for transient causes while the run was calm).

use std::collections::BTreeMap;
use std::sync::Mutex;

use claims_payments::seams::store::{PaymentRecord, PaymentStatus};
use rust_decimal::Decimal;

use super::bank::SimBank;
pub use super::invariants::{Ended, Violation};
use crate::sim::scenario::{CopyKind, Plan};

#[derive(Default)]
pub struct Checks {
    violations: Mutex<Vec<Violation>>,
    /// Idempotency-Key -> the first final answer (status, body).
    answers: Mutex<BTreeMap<String, (u16, Vec<u8>)>>,
    /// Every HTTP request's payment and final answer, for the checks at the end.
    http: Mutex<Vec<super::invariants::HttpRequest>>,
}

impl Checks {
    pub fn fail(&self, violation: Violation) {
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(violation);
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether `key` has a final answer.
    pub fn answered(&self, key: &str) -> bool {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// An HTTP request as it ended (with its final answer, or none).
    pub fn http_request(&self, request: super::invariants::HttpRequest) {
        self.http
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request);
    }

    pub fn http_requests(&self) -> Vec<super::invariants::HttpRequest> {
        self.http.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A final answer under `key` (same payload): the first one, or the same bytes.
    pub fn http_answer(&self, key: &str, claim: &str, status: u16, body: &[u8]) {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        match answers.get(key) {
            None => {
                answers.insert(key.to_owned(), (status, body.to_vec()));
            }
            Some((first, first_body)) if *first != status || first_body != body => {
                let violation = Violation::new(
                    "key-replays-one-answer",
                    Some(claim),
                    format!(
                        "key {key} answered {first} {} and later {status} {}",
                        String::from_utf8_lossy(first_body),
                        String::from_utf8_lossy(body)
                    ),
                );
                drop(answers);
                self.fail(violation);
            }
            Some(_) => {}
        }
    }
}

fn same_amount(a: &str, b: &str) -> bool {
    match (a.parse::<Decimal>(), b.parse::<Decimal>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The checks after the run, on `ledger`: every payment the store holds, as its listing
/// read them back (the settled-never-rewritten check is the store watch's, see
/// `stores::SettledWatch`).
pub fn at_end(
    checks: &Checks,
    ledger: &[PaymentRecord],
    bank: &SimBank,
    plan: &Plan,
    queue: Vec<Ended>,
    signed_in: bool,
) {
    for claim in bank.double_payments() {
        checks.fail(Violation::new(
            "at-most-one-payout",
            Some(&claim),
            "the bank made a second payout for this claim".into(),
        ));
    }
    let payouts = bank.payouts();
    let mut by_claim: BTreeMap<String, Vec<&super::bank::Payout>> = BTreeMap::new();
    for p in &payouts {
        by_claim.entry(p.claim_id.clone()).or_default().push(p);
    }
    let mut ledger_claims = BTreeMap::new();
    for p in ledger {
        let claim = p.claim_id.to_string();
        ledger_claims.insert(claim.clone(), p);
        let held = by_claim.get(&claim).map(Vec::as_slice).unwrap_or(&[]);
        match p.status {
            PaymentStatus::Paid => {
                let matching = held.iter().any(|b| {
                    Some(&b.payment_id) == p.bank_payment_id.as_ref()
                        && same_amount(&b.amount, &p.money.amount_string())
                        && b.currency == p.money.currency().code()
                });
                if !matching {
                    checks.fail(Violation::new(
                        "ledger-equals-bank",
                        Some(&claim),
                        format!(
                            "ledger says paid {:?} {} {}, the bank holds {:?}",
                            p.bank_payment_id,
                            p.money.amount_string(),
                            p.money.currency().code(),
                            held.iter()
                                .map(|b| (&b.payment_id, &b.amount, &b.currency))
                                .collect::<Vec<_>>()
                        ),
                    ));
                }
            }
            PaymentStatus::Rejected => {
                if !held.is_empty() {
                    checks.fail(Violation::new(
                        "nothing-paid-when-rejected",
                        Some(&claim),
                        format!("ledger says rejected, the bank paid {}", held[0].payment_id),
                    ));
                }
            }
            other => checks.fail(Violation::new(
                "settled-at-end",
                Some(&claim),
                format!(
                    "payment still {} after the faults stopped and reconcile ran ({})",
                    other.as_str(),
                    p.status_reason.as_deref().unwrap_or("-")
                ),
            )),
        }
    }
    for (claim, held) in &by_claim {
        if !ledger_claims.contains_key(claim) {
            checks.fail(Violation::new(
                "ledger-equals-bank",
                Some(claim),
                format!(
                    "the bank paid {} and the ledger has no payment",
                    held[0].payment_id
                ),
            ));
        }
    }
    for m in &queue {
        if !m.completed && !m.dead_lettered {
            checks.fail(Violation::new(
                "every-message-ends",
                m.claim.as_deref(),
                format!(
                    "message {} ({:?}) neither completed nor dead-lettered",
                    m.message_id, m.kind
                ),
            ));
        }
        // Permanent reasons are judged by kind (`invariants`); a transient one only here.
        if m.dead_lettered && !is_permanent(&m.last_outcome) {
            checks.fail(Violation::new(
                "dead-letters-are-permanent",
                m.claim.as_deref(),
                format!(
                    "message {} ({:?}) ended in the dead-letter queue after '{}'{}",
                    m.message_id,
                    m.kind,
                    m.last_outcome,
                    if m.dead_lettered_calm {
                        ", while no fault fired"
                    } else {
                        ", even after its re-drive"
                    }
                ),
            ));
        }
        if m.completed && m.kind == CopyKind::Invalid {
            checks.fail(Violation::new(
                "invalid-never-completes",
                None,
                format!("invalid message {} was completed", m.message_id),
            ));
        }
    }
    let refusals = bank.refusals();
    for v in super::invariants::at_end(&super::invariants::EndState {
        ledger,
        payouts: &payouts,
        refusals: &refusals,
        queue: &queue,
        sent: &plan
            .copies
            .iter()
            .map(|c| c.body.as_slice())
            .collect::<Vec<_>>(),
        http: &checks.http_requests(),
        signed_in,
        permanent_store_fault: false,
    }) {
        checks.fail(v);
    }
    // Every valid claim the producer sent ends with a payment.
    let sent: std::collections::BTreeSet<&str> =
        queue.iter().filter_map(|m| m.claim.as_deref()).collect();
    for claim in &plan.claims {
        if sent.contains(claim.claim_id.as_str()) && !ledger_claims.contains_key(&claim.claim_id) {
            checks.fail(Violation::new(
                "every-claim-recorded",
                Some(&claim.claim_id),
                "a claim the producer sent has no payment".into(),
            ));
        }
    }
}

fn is_permanent(label: &str) -> bool {
    matches!(label, "conflict" | "invalid-message" | "store-failure")
}
