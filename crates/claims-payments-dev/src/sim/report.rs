//! The reconciliation: what the producer asked for, what the broker settled, what the
//! ledger holds and what the bank paid, checked against each other.
//!
//! ## The exact rule behind "exactly once: yes"
//! Notation: a *claim* is a claim id the producer sent in at least one valid message;
//! a claim's *completed payload* is the payload of a message copy the broker completed
//! (a 2xx answer that held the lock). The verdict is yes iff all five checks pass:
//! 1. **no double payment**: no claim has more than one effective payout at the bank
//!    (whatever idempotency keys were used), and no claim has more than one payment
//!    in the ledger.
//! 2. **no lost claim**: every claim with a completed message has a ledger payment in
//!    a final state (`paid`/`rejected`/`needs_reconciliation` with a bank, `recorded`
//!    without one); every claim without a completed message had all its messages
//!    dead-lettered with a reason. The ledger and the bank hold nothing for claim ids
//!    the producer never sent validly.
//! 3. **amounts match**: for every claim in the *paid set* (ledger status `paid`, or
//!    `recorded` without a bank) the ledger amount and currency equal the completed
//!    payload's, and with a bank there is exactly one payout with that amount,
//!    currency and (if the ledger recorded it) payment id; the per-currency totals
//!    expected = ledger = bank over the paid set.
//! 4. **no payout outside the paid set**: every bank payout belongs to a claim the
//!    ledger calls `paid` (`needs_reconciliation` is allowed: an operator has it).
//! 5. **permanent failures surfaced**: no invalid message and no second payload under
//!    an already used MessageId was completed; at most one distinct payload per claim
//!    was completed (a conflict is never silently accepted).
//!
//! Amounts are `rust_decimal::Decimal` throughout; totals are printed as decimal strings.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use rust_decimal::Decimal;
use serde::Serialize;

use super::bank::{BankAnswer, BankLedger, Payout};
use super::driver::HostStats;
use super::queue::{DeadLetterCause, EntryView, Settled};
use super::scenario::{CopyKind, Payload, Plan};

/// One payment as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRow {
    pub claim_id: String,
    pub amount: Decimal,
    pub currency: String,
    pub status: String,
    pub message_id: String,
    pub bank_payment_id: Option<String>,
}

/// Everything the verifier looks at.
pub struct Evidence<'a> {
    pub plan: &'a Plan,
    pub entries: &'a [EntryView],
    pub ledger: &'a [LedgerRow],
    /// None in ledger-only mode.
    pub bank: Option<&'a BankLedger>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
    /// Up to ten examples of what failed (claim ids, message ids).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CurrencyTotals {
    pub currency: String,
    pub paid_claims: usize,
    pub expected: String,
    pub ledger: String,
    /// None in ledger-only mode.
    pub bank: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterGroup {
    pub reason: String,
    pub count: usize,
    pub example: String,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    pub exactly_once: bool,
    pub checks: Vec<Check>,
    pub totals: Vec<CurrencyTotals>,
    pub claims: usize,
    pub paid_claims: usize,
    pub rejected_claims: usize,
    pub needs_reconciliation_claims: usize,
    pub dead_lettered_claims: usize,
    /// Messages that ended in the dead-letter queue while their claim's payment was
    /// still `in_progress`: a payout that may have happened, left for nobody to finish.
    pub dead_lettered_in_progress: usize,
    pub claims_paid_twice_at_bank: usize,
    pub claims_with_two_ledger_payments: usize,
    pub lost_claims: usize,
    pub ledger_by_status: BTreeMap<String, usize>,
    /// Final dead-letter queue (after the re-drive), grouped by reason.
    pub dead_letters: Vec<DeadLetterGroup>,
}

fn canonical_claim(id: &str) -> String {
    uuid::Uuid::try_parse(id.trim())
        .map(|u| u.hyphenated().to_string())
        .unwrap_or_else(|_| id.to_owned())
}

fn check(
    name: &'static str,
    failures: Vec<String>,
    ok_detail: String,
    fail_detail: String,
) -> Check {
    Check {
        name,
        passed: failures.is_empty(),
        detail: if failures.is_empty() {
            ok_detail
        } else {
            fail_detail
        },
        examples: failures.into_iter().take(10).collect(),
    }
}

/// The final state of each producer copy: a copy re-driven from the dead-letter queue
/// ends as its re-drive ended.
fn final_states(entries: &[EntryView], copies: usize) -> Vec<Option<Settled>> {
    let mut states: Vec<Option<Settled>> = vec![None; copies];
    let mut completed = vec![false; copies];
    for entry in entries {
        let copy = entry.message.copy;
        if copy >= copies || completed[copy] {
            continue;
        }
        if let Some(settled) = &entry.settled {
            if matches!(settled, Settled::Completed { .. }) {
                completed[copy] = true;
            }
            // Entries are in send order, so a re-drive overrides its dead letter.
            states[copy] = Some(settled.clone());
        }
    }
    states
}

pub fn verify(evidence: &Evidence<'_>) -> Verification {
    let plan = evidence.plan;
    let with_bank = evidence.bank.is_some();
    let states = final_states(evidence.entries, plan.copies.len());

    let mut rows: HashMap<String, Vec<&LedgerRow>> = HashMap::new();
    for row in evidence.ledger {
        rows.entry(canonical_claim(&row.claim_id))
            .or_default()
            .push(row);
    }
    let mut payouts: HashMap<String, Vec<&Payout>> = HashMap::new();
    if let Some(bank) = evidence.bank {
        for p in &bank.payouts {
            payouts
                .entry(canonical_claim(&p.claim_id))
                .or_default()
                .push(p);
        }
    }
    let known: BTreeSet<String> = plan
        .claims
        .iter()
        .map(|c| canonical_claim(&c.claim_id))
        .collect();

    let mut double = Vec::new();
    let mut lost = Vec::new();
    let mut mismatched = Vec::new();
    let mut stray = Vec::new();
    let mut accepted_bad = Vec::new();
    let mut in_progress_dead = Vec::new();
    let mut v = Verification {
        claims: plan.claims.len(),
        ..Verification::default()
    };
    for row in evidence.ledger {
        *v.ledger_by_status.entry(row.status.clone()).or_default() += 1;
    }

    let mut expected_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut ledger_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut bank_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut paid_count: BTreeMap<String, usize> = BTreeMap::new();

    for (ci, claim) in plan.claims.iter().enumerate() {
        let id = canonical_claim(&claim.claim_id);
        let copies: Vec<usize> = (0..plan.copies.len())
            .filter(|&i| plan.copies[i].claim == Some(ci))
            .collect();
        let completed: Vec<&Payload> = copies
            .iter()
            .filter(|&&i| matches!(states[i], Some(Settled::Completed { .. })))
            .map(|&i| &claim.payloads[plan.copies[i].payload])
            .collect();
        let distinct: BTreeSet<String> = completed.iter().map(|p| p.identity()).collect();
        if distinct.len() > 1 {
            accepted_bad.push(format!(
                "claim {id}: {} different payloads completed",
                distinct.len()
            ));
        }
        let claim_rows = rows.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let expected: Option<&Payload> = match (completed.first(), claim.payloads.len()) {
            (Some(p), _) if distinct.len() == 1 => Some(p),
            (None, 1) => claim.payloads.first(),
            // No message of the claim completed (all dead-lettered: say the first was
            // orphaned mid-payout and `reconcile` settled its payout, and the
            // conflicting copy was refused): whichever payload reached the store first
            // may be the paid one, as long as the producer sent it.
            (None, _) => claim_rows.first().and_then(|r| {
                claim.payloads.iter().find(|p| {
                    p.amount.normalize() == r.amount.normalize() && p.currency == r.currency
                })
            }),
            _ => None,
        };
        let claim_payouts = payouts.get(&id).map(Vec::as_slice).unwrap_or(&[]);

        if claim_payouts.len() > 1 {
            v.claims_paid_twice_at_bank += 1;
            double.push(format!(
                "claim {id}: {} payouts at the bank",
                claim_payouts.len()
            ));
        }
        if claim_rows.len() > 1 {
            v.claims_with_two_ledger_payments += 1;
            double.push(format!(
                "claim {id}: {} payments in the ledger",
                claim_rows.len()
            ));
        }

        let row = claim_rows.first();
        let status = row.map(|r| r.status.as_str());
        let final_ok = if with_bank {
            matches!(status, Some("paid" | "rejected" | "needs_reconciliation"))
        } else {
            status == Some("recorded")
        };
        if !completed.is_empty() {
            if !final_ok {
                v.lost_claims += 1;
                let how: Vec<String> = copies
                    .iter()
                    .filter_map(|&i| match &states[i] {
                        Some(Settled::Completed {
                            label,
                            delivery_count,
                        }) => Some(format!(
                            "MessageId {} as {label} at delivery {delivery_count}",
                            plan.copies[i].message_id
                        )),
                        _ => None,
                    })
                    .collect();
                lost.push(format!(
                    "claim {id}: a message was completed ({}) but the ledger says {}",
                    how.join("; "),
                    status.unwrap_or("nothing")
                ));
            }
        } else {
            let all_dead = copies.iter().all(|&i| {
                matches!(&states[i], Some(Settled::DeadLettered { last, .. }) if !last.kind.is_empty())
            });
            if all_dead {
                v.dead_lettered_claims += 1;
            } else {
                v.lost_claims += 1;
                lost.push(format!("claim {id}: neither completed nor dead-lettered"));
            }
        }
        if status == Some("in_progress") {
            let stranded = copies
                .iter()
                .filter(|&&i| matches!(states[i], Some(Settled::DeadLettered { .. })))
                .count();
            if stranded > 0 {
                v.dead_lettered_in_progress += stranded;
                in_progress_dead.push(format!(
                    "claim {id}: {stranded} message(s) dead-lettered while its payment is in_progress"
                ));
            }
        }
        match status {
            Some("rejected") => v.rejected_claims += 1,
            Some("needs_reconciliation") => v.needs_reconciliation_claims += 1,
            _ => {}
        }

        let in_paid_set = if with_bank {
            status == Some("paid")
        } else {
            status == Some("recorded")
        };
        if in_paid_set {
            let row = row.copied().expect("paid set implies a row");
            v.paid_claims += 1;
            *paid_count.entry(row.currency.clone()).or_default() += 1;
            *ledger_total.entry(row.currency.clone()).or_default() += row.amount;
            match expected {
                Some(p) => {
                    *expected_total.entry(p.currency.to_owned()).or_default() += p.amount;
                    if p.amount.normalize() != row.amount.normalize() || p.currency != row.currency
                    {
                        mismatched.push(format!(
                            "claim {id}: ledger {} {}, expected {} {}",
                            row.amount, row.currency, p.amount, p.currency
                        ));
                    }
                }
                None => mismatched.push(format!(
                    "claim {id}: paid, but no single payload was completed for it"
                )),
            }
            if with_bank {
                match claim_payouts {
                    [p] => {
                        if p.amount.normalize() != row.amount.normalize()
                            || p.currency != row.currency
                        {
                            mismatched.push(format!(
                                "claim {id}: bank paid {} {}, ledger says {} {}",
                                p.amount, p.currency, row.amount, row.currency
                            ));
                        }
                        if row
                            .bank_payment_id
                            .as_deref()
                            .is_some_and(|b| b != p.payment_id)
                        {
                            mismatched.push(format!(
                                "claim {id}: ledger payment id {:?}, bank {}",
                                row.bank_payment_id, p.payment_id
                            ));
                        }
                    }
                    [] => {
                        mismatched.push(format!("claim {id}: ledger paid, no payout at the bank"))
                    }
                    _ => {}
                }
            }
        }
        for p in claim_payouts {
            if in_paid_set {
                *bank_total.entry(p.currency.clone()).or_default() += p.amount;
            } else if status != Some("needs_reconciliation") {
                stray.push(format!(
                    "claim {id}: bank paid {} {} ({}) but the ledger says {}",
                    p.amount,
                    p.currency,
                    p.payment_id,
                    status.unwrap_or("nothing")
                ));
            }
        }
    }

    for (id, claim_rows) in &rows {
        if !known.contains(id) {
            lost.push(format!(
                "ledger has {} payment(s) for unknown claim {id}",
                claim_rows.len()
            ));
        }
    }
    for (id, claim_payouts) in &payouts {
        if !known.contains(id) {
            stray.push(format!(
                "bank paid unknown claim {id} {} time(s)",
                claim_payouts.len()
            ));
        }
    }

    for (i, copy) in plan.copies.iter().enumerate() {
        let completed = matches!(states[i], Some(Settled::Completed { .. }));
        if copy.kind == CopyKind::Invalid && completed {
            accepted_bad.push(format!(
                "invalid message {:?} ({}) was completed",
                copy.message_id,
                copy.invalid_reason.unwrap_or("invalid")
            ));
        }
    }
    // Each MessageId that carried two payloads may have completed only one of them.
    let mut by_message: HashMap<&str, BTreeSet<String>> = HashMap::new();
    for (i, copy) in plan.copies.iter().enumerate() {
        if let (Some(ci), Some(Settled::Completed { .. })) = (copy.claim, &states[i]) {
            by_message
                .entry(copy.message_id.as_str())
                .or_default()
                .insert(plan.claims[ci].payloads[copy.payload].identity());
        }
    }
    for (message_id, payloads) in by_message {
        if payloads.len() > 1 {
            accepted_bad.push(format!("MessageId {message_id:?}: both payloads completed"));
        }
    }

    let currencies: BTreeSet<String> = expected_total
        .keys()
        .chain(ledger_total.keys())
        .chain(bank_total.keys())
        .cloned()
        .collect();
    for currency in currencies {
        let e = expected_total.get(&currency).copied().unwrap_or_default();
        let l = ledger_total.get(&currency).copied().unwrap_or_default();
        let b = bank_total.get(&currency).copied().unwrap_or_default();
        if e != l || (with_bank && l != b) {
            mismatched.push(format!(
                "{currency} totals: expected {e}, ledger {l}, bank {b}"
            ));
        }
        v.totals.push(CurrencyTotals {
            paid_claims: paid_count.get(&currency).copied().unwrap_or(0),
            expected: e.to_string(),
            ledger: l.to_string(),
            bank: with_bank.then(|| b.to_string()),
            currency,
        });
    }

    let lost_count = lost.len();
    let invalid = plan.count(CopyKind::Invalid);
    let conflicting = plan.count(CopyKind::ConflictingPayload);
    v.checks = vec![
        check(
            "no double payment",
            double,
            "no claim has more than one payout at the bank or more than one payment in the ledger".into(),
            format!(
                "{} claim(s) paid more than once at the bank, {} with more than one ledger payment",
                v.claims_paid_twice_at_bank, v.claims_with_two_ledger_payments
            ),
        ),
        check(
            "no lost claim",
            lost,
            format!(
                "{} claims: {} {}, {} rejected by the bank, {} needs reconciliation, {} dead-lettered with a reason",
                v.claims,
                v.paid_claims,
                if with_bank { "paid" } else { "recorded" }, v.rejected_claims, v.needs_reconciliation_claims, v.dead_lettered_claims
            ),
            format!(
                "{} claim(s) lost, {} finding(s) in all (including payments for unknown claims)",
                v.lost_claims, lost_count
            ),
        ),
        check(
            "no payout left in progress",
            in_progress_dead,
            "no message was dead-lettered while its payment was in_progress".into(),
            format!(
                "{} message(s) dead-lettered while their payment was in_progress",
                v.dead_lettered_in_progress
            ),
        ),
        check(
            "amounts match",
            mismatched,
            if with_bank {
                "expected = ledger = bank for every paid claim and every currency".into()
            } else {
                "expected = ledger for every recorded claim and every currency".into()
            },
            "amounts or totals differ".into(),
        ),
        check(
            "no payout outside the paid set",
            stray,
            if with_bank {
                "every bank payout belongs to a claim the ledger calls paid".into()
            } else {
                "no bank configured".into()
            },
            "the bank paid claims the ledger does not call paid".into(),
        ),
        check(
            "permanent failures surfaced",
            accepted_bad,
            format!(
                "{invalid} invalid messages and {conflicting} conflicting payloads sent; none completed, at most one payload per claim paid"
            ),
            "a permanent failure was completed (accepted) instead of dead-lettered".into(),
        ),
    ];
    v.exactly_once = v.checks.iter().all(|c| c.passed);

    let mut groups: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for state in states.iter().flatten() {
        if let Settled::DeadLettered { last, .. } = state {
            let g = groups
                .entry(last.kind.clone())
                .or_insert((0, last.detail.clone()));
            g.0 += 1;
        }
    }
    v.dead_letters = groups
        .into_iter()
        .map(|(reason, (count, example))| DeadLetterGroup {
            reason,
            count,
            example,
        })
        .collect();
    v.dead_letters
        .sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    v
}

/// The bank's side, summarised.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BankSummary {
    pub requests: usize,
    pub effective_payouts: usize,
    pub answers: BTreeMap<BankAnswer, usize>,
    pub injected_faults: usize,
    /// Requests for a key the bank had seen before (replays, 409s, refusals again).
    pub repeats_of_known_key: usize,
    /// Of those, how many carried the first request's exact bytes.
    pub repeats_byte_identical: usize,
}

pub fn bank_summary(ledger: &BankLedger) -> BankSummary {
    let mut s = BankSummary {
        requests: ledger.requests.len(),
        effective_payouts: ledger.payouts.len(),
        ..BankSummary::default()
    };
    for r in &ledger.requests {
        *s.answers.entry(r.answer).or_default() += 1;
        if r.answer.is_injected_fault() {
            s.injected_faults += 1;
        }
        if let Some(identical) = r.byte_identical {
            s.repeats_of_known_key += 1;
            if identical {
                s.repeats_byte_identical += 1;
            }
        }
    }
    s
}

/// What the producer sent.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProducerSummary {
    pub message_ids: usize,
    pub sends: usize,
    pub claims: usize,
    pub producer_resends: usize,
    pub business_duplicates: usize,
    pub conflicting_payloads: usize,
    pub invalid_messages: usize,
}

pub fn producer_summary(plan: &Plan) -> ProducerSummary {
    ProducerSummary {
        message_ids: plan.distinct_message_ids(),
        sends: plan.copies.len(),
        claims: plan.claims.len(),
        producer_resends: plan.count(CopyKind::ProducerResend),
        business_duplicates: plan.count(CopyKind::BusinessDuplicate),
        conflicting_payloads: plan.count(CopyKind::ConflictingPayload),
        invalid_messages: plan.count(CopyKind::Invalid),
    }
}

/// How the handler processes fared.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessSummary {
    pub starts: u64,
    pub crash_after_commit: u64,
    pub chaos_kills: u64,
    pub mid_payout_kills: u64,
    pub timeout_restarts: u64,
    pub unexpected_exits: u64,
    pub unexpected_exit_statuses: Vec<String>,
    /// Exits after which the real host would have stopped itself instead of restarting
    /// the handler: the third within 30 minutes (see `process::HostRestartLimit`).
    pub host_stops: u64,
    /// Restarts that failed (the store unreachable) and were tried again.
    pub failed_starts: u64,
    pub startup_median_ms: f64,
}

/// One handler instance (one `serve` process at a time, restarted by its own
/// supervisor): how often it started and died, what the host delivered to it and
/// what it answered.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSummary {
    /// 1-based, as in the table.
    pub instance: usize,
    pub starts: u64,
    pub deliveries: u64,
    pub completed: u64,
    pub failed: u64,
    /// Deliveries it got while another instance still worked on an earlier delivery
    /// of the same message (that delivery's lock had expired).
    pub cross_instance_redeliveries: u64,
    /// Locks that expired while it worked on the delivery.
    pub lock_expiries: u64,
    /// Leases of an earlier attempt it took over (the log line "took over the lease of
    /// an earlier attempt", counted over all its processes).
    pub takeovers: u64,
    pub crash_after_commit: u64,
    pub chaos_kills: u64,
    pub mid_payout_kills: u64,
    pub timeout_restarts: u64,
    pub unexpected_exits: u64,
    /// Its answers' `outcome` labels.
    pub outcomes: BTreeMap<String, u64>,
}

/// The broker's side of the run.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerSummary {
    pub dead_lettered_first_pass: usize,
    pub redriven: usize,
    pub recovered_by_redrive: usize,
    pub dead_lettered_final: usize,
    pub max_delivery_count: u32,
    pub highest_delivery_count: u32,
    /// Every dead-lettering (the first pass and the re-drive), by cause.
    pub dead_letter_causes: DeadLetterCauses,
}

/// Dead-lettered messages by [`DeadLetterCause`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterCauses {
    pub handler_answers: usize,
    /// Every delivery spent without an answer: a handler restart alone dead-lettered it.
    pub transport_only: usize,
    pub mixed: usize,
    /// Of the mixed ones, the deliveries that got no answer.
    pub mixed_unanswered_deliveries: u64,
    pub lock_expiries_only: usize,
    pub orphaned: usize,
}

impl DeadLetterCauses {
    fn add(&mut self, cause: DeadLetterCause, unanswered: u32) {
        match cause {
            DeadLetterCause::HandlerAnswers => self.handler_answers += 1,
            DeadLetterCause::TransportOnly => self.transport_only += 1,
            DeadLetterCause::Mixed => {
                self.mixed += 1;
                self.mixed_unanswered_deliveries += u64::from(unanswered);
            }
            DeadLetterCause::LockExpiries => self.lock_expiries_only += 1,
            DeadLetterCause::Orphaned => self.orphaned += 1,
        }
    }
}

pub fn broker_summary(entries: &[EntryView], max_delivery_count: u32) -> BrokerSummary {
    let mut s = BrokerSummary {
        max_delivery_count,
        ..BrokerSummary::default()
    };
    for e in entries {
        s.highest_delivery_count = s.highest_delivery_count.max(e.delivery_count);
        if let Some(Settled::DeadLettered {
            cause, failures, ..
        }) = &e.settled
        {
            s.dead_letter_causes.add(*cause, failures.unanswered);
        }
        let dead = matches!(e.settled, Some(Settled::DeadLettered { .. }));
        if e.message.redrive {
            s.redriven += 1;
            match e.settled {
                Some(Settled::Completed { .. }) => s.recovered_by_redrive += 1,
                Some(Settled::DeadLettered { .. }) => s.dead_lettered_final += 1,
                None => {}
            }
        } else if dead {
            s.dead_lettered_first_pass += 1;
            if !e.redriven {
                s.dead_lettered_final += 1;
            }
        }
    }
    s
}

/// What reconciling with the bank did: the unsettled payments before the end phase
/// and after it, and what every run settled.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    pub runs_during_deliveries: usize,
    pub runs_at_end: usize,
    pub needs_reconciliation_before: usize,
    pub needs_reconciliation_after: usize,
    pub orphaned_in_progress_before: usize,
    pub in_progress_after: usize,
    pub settled_during_deliveries: usize,
    pub paid_by_lookup: usize,
    pub paid_now: usize,
    pub rejected: usize,
    pub mismatches: usize,
    pub unknown_answers: usize,
}

impl ReconcileReport {
    pub fn new(
        (needs_before, in_progress_before): (usize, usize),
        (needs_after, in_progress_after): (usize, usize),
        during: &[claims_payments::reconcile::Summary],
        at_end: &[claims_payments::reconcile::Summary],
    ) -> Self {
        let mut r = ReconcileReport {
            runs_during_deliveries: during.len(),
            runs_at_end: at_end.len(),
            needs_reconciliation_before: needs_before,
            needs_reconciliation_after: needs_after,
            orphaned_in_progress_before: in_progress_before,
            in_progress_after,
            ..ReconcileReport::default()
        };
        for s in during {
            r.settled_during_deliveries += s.paid_by_lookup + s.paid_now + s.rejected;
        }
        for s in during.iter().chain(at_end) {
            r.paid_by_lookup += s.paid_by_lookup;
            r.paid_now += s.paid_now;
            r.rejected += s.rejected;
            r.mismatches += s.mismatches;
            r.unknown_answers += s.still_unknown;
        }
        r
    }

    /// Nothing left unknown, nothing left hanging.
    pub fn settled(&self) -> bool {
        self.needs_reconciliation_after == 0 && self.in_progress_after == 0 && self.mismatches == 0
    }
}

/// The simulator's report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub exactly_once: bool,
    pub seed: u64,
    pub handler: String,
    pub mode: String,
    pub data_type: String,
    pub concurrency: usize,
    pub timings: super::Timings,
    pub faults: BTreeMap<String, String>,
    pub producer: ProducerSummary,
    pub host: HostStats,
    pub broker: BrokerSummary,
    pub processes: ProcessSummary,
    /// `sqlite`, `cosmos` (the `cosmos-emulator` binary) or `postgres`.
    pub store: String,
    /// Restarts of the PostgreSQL server during the run (`--restart-store-at`).
    pub store_restarts: Vec<super::pg::StoreRestart>,
    /// Per handler instance (one entry when a single instance ran).
    pub instances: Vec<InstanceSummary>,
    pub bank: Option<BankSummary>,
    pub payments: usize,
    /// Payments the store's listing did not return but a point read of their claim
    /// did (Cosmos; always 0 for SQLite). Counted in `payments`.
    pub ledger_unlisted: usize,
    pub verification: Verification,
    /// `claims-payments reconcile` during and after the deliveries (with a bank).
    pub reconcile: Option<ReconcileReport>,
    /// `POST /api/payments` clients mixed with the deliveries.
    pub http: super::http_client::HttpStats,
    pub duration_ms: u64,
    pub deliveries_per_second: f64,
}

impl Report {
    /// The compact human-readable form.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let v = &self.verification;
        let p = &self.producer;
        let h = &self.host;
        let b = &self.broker;
        let _ = writeln!(
            o,
            "claims-payments-dev simulate: seed {}, handler {}, {}, {} workers{}, dataType {}",
            self.seed,
            self.handler,
            self.mode,
            self.concurrency,
            if self.instances.len() > 1 {
                " per instance"
            } else {
                ""
            },
            self.data_type
        );
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let t = &self.timings;
        let _ = writeln!(
            o,
            "timings    lease {} ms, in-flight wait {} ms, bank timeout {} ms, retry budget {} ms, function timeout {} ms, MaxDeliveryCount {}",
            t.lease_ms, t.inflight_wait_ms, t.bank_timeout_ms, t.retry_budget_ms, t.function_timeout_ms, self.broker.max_delivery_count
        );
        let _ = writeln!(o, "faults     {}", faults.join(", "));
        let _ = writeln!(
            o,
            "producer   {} message ids for {} claims ({} invalid, {} business duplicates) -> {} sends ({} producer re-sends, {} conflicting payloads)",
            p.message_ids, p.claims, p.invalid_messages, p.business_duplicates, p.sends, p.producer_resends, p.conflicting_payloads
        );
        let _ = writeln!(
            o,
            "broker     {} deliveries: {} completed, {} failed and abandoned, {} lock expiries ({} late answers refused), highest DeliveryCount {} of {}",
            h.deliveries, h.completed, h.failed, h.lock_expiries, h.lock_lost, b.highest_delivery_count, b.max_delivery_count
        );
        let _ = writeln!(
            o,
            "dlq        {} dead-lettered, re-driven {}: {} recovered, {} dead-lettered for good",
            b.dead_lettered_first_pass, b.redriven, b.recovered_by_redrive, b.dead_lettered_final
        );
        let c = &b.dead_letter_causes;
        let _ = writeln!(
            o,
            "dlq causes {} {}, {} {}, {} {} ({} deliveries unanswered), {} {}, {} {}",
            c.handler_answers,
            DeadLetterCause::HandlerAnswers.as_str(),
            c.transport_only,
            DeadLetterCause::TransportOnly.as_str(),
            c.mixed,
            DeadLetterCause::Mixed.as_str(),
            c.mixed_unanswered_deliveries,
            c.lock_expiries_only,
            DeadLetterCause::LockExpiries.as_str(),
            c.orphaned,
            DeadLetterCause::Orphaned.as_str(),
        );
        let pr = &self.processes;
        let _ = writeln!(
            o,
            "handler    {} starts (median start-up {:.1} ms): {} crash-after-commit, {} chaos kills, {} kills mid-payout, {} timeout restarts, {} unexpected exits{}",
            pr.starts,
            pr.startup_median_ms,
            pr.crash_after_commit,
            pr.chaos_kills,
            pr.mid_payout_kills,
            pr.timeout_restarts,
            pr.unexpected_exits,
            if pr.unexpected_exit_statuses.is_empty() {
                String::new()
            } else {
                format!(" ({})", pr.unexpected_exit_statuses.join("; "))
            }
        );
        if pr.failed_starts > 0 {
            let _ = writeln!(
                o,
                "           {} restarts failed (the store was unreachable) and were tried again",
                pr.failed_starts
            );
        }
        if pr.host_stops > 0 {
            let _ = writeln!(
                o,
                "           a real host would have stopped itself {} times (3 handler exits without a 30-minute gap); here every exit is restarted",
                pr.host_stops
            );
        }
        for r in &self.store_restarts {
            let _ = writeln!(
                o,
                "store      PostgreSQL restarted (pg_ctl restart -m immediate) at {:.1} s, {} of {} messages settled (--restart-store-at {}): back after {} ms",
                r.at_secs, r.settled, r.of, r.at, r.took_ms
            );
        }
        let outcomes: Vec<String> = h.outcomes.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(o, "answers    {}", outcomes.join(", "));
        let failures: Vec<String> = h.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
        if !failures.is_empty() {
            let _ = writeln!(o, "failures   {}", failures.join(", "));
        }
        if self.instances.len() > 1 {
            self.render_instances(&mut o);
        }
        if !v.dead_letters.is_empty() {
            let _ = writeln!(o, "dead letters (final):");
            for g in &v.dead_letters {
                let example: String = g.example.chars().take(100).collect();
                let _ = writeln!(o, "  {:>5}  {:<32} e.g. {example}", g.count, g.reason);
            }
        }
        if let Some(bank) = &self.bank {
            let a = |k: BankAnswer| bank.answers.get(&k).copied().unwrap_or(0);
            let _ = writeln!(
                o,
                "bank       {} requests, {} effective payouts: {} paid, {} replays, {} x 409 in progress, {} x 422 key reuse, {} x 402 rejected, {} x 400 invalid; {} repeats of a known key, {} byte-identical",
                bank.requests,
                bank.effective_payouts,
                a(BankAnswer::Paid),
                a(BankAnswer::Replayed),
                a(BankAnswer::KeyInProgress),
                a(BankAnswer::KeyReused),
                a(BankAnswer::Rejected) + a(BankAnswer::RejectedReplay),
                a(BankAnswer::InvalidRequest),
                bank.repeats_of_known_key,
                bank.repeats_byte_identical
            );
            let _ = writeln!(
                o,
                "           injected: {} x 503, {} x 429, {} answers lost after paying ({} late, {} cut), {} stalled past the client timeout",
                a(BankAnswer::Injected5xx),
                a(BankAnswer::Injected429),
                a(BankAnswer::LostAfterPay) + a(BankAnswer::CutAfterPay),
                a(BankAnswer::LostAfterPay),
                a(BankAnswer::CutAfterPay),
                a(BankAnswer::LostWhileProcessing)
            );
        }
        let statuses: Vec<String> = v
            .ledger_by_status
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            o,
            "ledger     {} payments: {}{}",
            self.payments,
            statuses.join(", "),
            if self.ledger_unlisted > 0 {
                format!(
                    " ({} found only by a point read of the claim: the store's listing missed them)",
                    self.ledger_unlisted
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            o,
            "totals     {:<8} {:>7} {:>18} {:>18} {:>18}",
            "currency", "claims", "expected", "ledger", "bank"
        );
        for t in &v.totals {
            let _ = writeln!(
                o,
                "           {:<8} {:>7} {:>18} {:>18} {:>18}",
                t.currency,
                t.paid_claims,
                t.expected,
                t.ledger,
                t.bank.as_deref().unwrap_or("n/a")
            );
        }
        let _ = writeln!(o, "checks");
        for c in &v.checks {
            let _ = writeln!(
                o,
                "  [{}] {}: {}",
                if c.passed { "ok" } else { "FAIL" },
                c.name,
                c.detail
            );
            for e in &c.examples {
                let _ = writeln!(o, "         {e}");
            }
        }
        {
            let h = &self.http;
            let answers: Vec<String> = h.answers.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                o,
                "http       {} intents ({} double submits), {} requests: {}; {} succeeded; checked {} replays, {} key reuses, {} cross-scope keys ({} replayed their own lost answer)  [{}]",
                h.intents,
                h.double_submits,
                h.requests,
                answers.join(", "),
                h.succeeded,
                h.replays_checked,
                h.key_reuses_checked,
                h.cross_scope_checked,
                h.cross_scope_own_replays,
                if h.violations.is_empty() && h.succeeded == h.intents { "ok".to_owned() } else { format!("FAIL: {}", h.violations.join("; ")) }
            );
        }
        if let Some(r) = &self.reconcile {
            let _ = writeln!(
                o,
                "reconcile  needs reconciliation: {} -> {}, orphaned in progress: {} -> {}; {} runs during deliveries (settled {}), {} at the end: {} paid by lookup, {} paid now, {} rejected, {} mismatches, {} unknown answers retried  [{}]",
                r.needs_reconciliation_before,
                r.needs_reconciliation_after,
                r.orphaned_in_progress_before,
                r.in_progress_after,
                r.runs_during_deliveries,
                r.settled_during_deliveries,
                r.runs_at_end,
                r.paid_by_lookup,
                r.paid_now,
                r.rejected,
                r.mismatches,
                r.unknown_answers,
                if r.settled() { "ok" } else { "FAIL: payments left unknown" }
            );
        }
        let _ = writeln!(
            o,
            "run        {:.1} s, {:.0} deliveries/s",
            self.duration_ms as f64 / 1000.0,
            self.deliveries_per_second
        );
        let _ = writeln!(
            o,
            "exactly once: {}",
            if self.exactly_once { "yes" } else { "no" }
        );
        o
    }
}

impl Report {
    /// The per-instance table (runs with several instances).
    fn render_instances(&self, o: &mut String) {
        let h = &self.host;
        let takeovers: u64 = self.instances.iter().map(|i| i.takeovers).sum();
        let _ = writeln!(
            o,
            "instances  {} serve processes on one {} store, deliveries spread over the live ones: {} overlaps (a redelivery after a lock expiry reached an instance while another still worked on the message), {} leases of an earlier attempt taken over",
            self.instances.len(),
            self.store,
            h.cross_instance_redeliveries,
            takeovers
        );
        let _ = writeln!(
            o,
            "  {:>2} {:>6} {:>10} {:>9} {:>6} {:>11} {:>8} {:>9}  {:<29}  outcomes",
            "#",
            "starts",
            "deliveries",
            "completed",
            "failed",
            "lock expiry",
            "overlaps",
            "takeovers",
            "kills crash/chaos/mid/timeout"
        );
        for i in &self.instances {
            let outcomes: Vec<String> =
                i.outcomes.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let kills = format!(
                "{}/{}/{}/{}{}",
                i.crash_after_commit,
                i.chaos_kills,
                i.mid_payout_kills,
                i.timeout_restarts,
                if i.unexpected_exits > 0 {
                    format!(" +{} unexpected", i.unexpected_exits)
                } else {
                    String::new()
                }
            );
            let _ = writeln!(
                o,
                "  {:>2} {:>6} {:>10} {:>9} {:>6} {:>11} {:>8} {:>9}  {:<29}  {}",
                i.instance,
                i.starts,
                i.deliveries,
                i.completed,
                i.failed,
                i.lock_expiries,
                i.cross_instance_redeliveries,
                i.takeovers,
                kills,
                outcomes.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::bank::{BankLedger, Payout};
    use crate::sim::queue::{Failure, FailureTally, Message, LOCK_EXPIRED};
    use crate::sim::scenario::{Claim, MessageCopy};
    use std::sync::Arc;

    const C1: &str = "11111111-1111-4111-8111-111111111111";
    const C2: &str = "22222222-2222-4222-8222-222222222222";

    fn payload(claim: &str, cents: i64) -> Payload {
        Payload {
            claim_id: claim.into(),
            amount: Decimal::new(cents, 2),
            currency: "EUR",
            tenant: None,
            payee: Some("NL00SIMB0000000001".into()),
        }
    }

    fn copy(id: &str, kind: CopyKind, claim: Option<usize>, payload: usize) -> MessageCopy {
        MessageCopy {
            message_id: id.into(),
            body: b"{}".to_vec(),
            kind,
            claim,
            payload,
            invalid_reason: (kind == CopyKind::Invalid).then_some("body is not JSON"),
        }
    }

    /// Two claims (C2 also got a conflicting payload under its MessageId) and one
    /// invalid message.
    fn plan() -> Plan {
        Plan {
            claims: vec![
                Claim {
                    claim_id: C1.into(),
                    payloads: vec![payload(C1, 12_550)],
                },
                Claim {
                    claim_id: C2.into(),
                    payloads: vec![payload(C2, 1_000), payload(C2, 2_000)],
                },
            ],
            copies: vec![
                copy("m1", CopyKind::Original, Some(0), 0),
                copy("m1", CopyKind::ProducerResend, Some(0), 0),
                copy("m2", CopyKind::Original, Some(1), 0),
                copy("m2", CopyKind::ConflictingPayload, Some(1), 1),
                copy("bad", CopyKind::Invalid, None, 0),
            ],
            send_order: vec![0, 1, 2, 3, 4],
        }
    }

    fn entry(copy: usize, settled: Settled) -> EntryView {
        EntryView {
            message: Message {
                sequence_number: copy as u64 + 1,
                copy,
                message_id: Arc::from("m"),
                body: Arc::from(&b"{}"[..]),
                enqueued_at: time::OffsetDateTime::UNIX_EPOCH,
                redrive: false,
            },
            delivery_count: 1,
            settled: Some(settled),
            redriven: false,
        }
    }

    fn done(label: &str) -> Settled {
        Settled::Completed {
            label: label.into(),
            delivery_count: 1,
        }
    }

    fn dead(kind: &str) -> Settled {
        let last = Failure {
            kind: kind.into(),
            detail: "why".into(),
        };
        let mut failures = FailureTally::default();
        match (kind == LOCK_EXPIRED, last.answered()) {
            (true, _) => failures.lock_expiries = 10,
            (false, true) => failures.answered = 10,
            (false, false) => failures.unanswered = 10,
        }
        Settled::DeadLettered {
            last,
            delivery_count: 10,
            cause: failures.cause(),
            failures,
        }
    }

    fn entries() -> Vec<EntryView> {
        vec![
            entry(0, done("paid")),
            entry(1, done("duplicate")),
            entry(2, done("paid")),
            entry(3, dead("422 conflict")),
            entry(4, dead("422 invalid-message")),
        ]
    }

    fn row(claim: &str, cents: i64, status: &str, payment: &str) -> LedgerRow {
        LedgerRow {
            claim_id: claim.into(),
            amount: Decimal::new(cents, 2),
            currency: "EUR".into(),
            status: status.into(),
            message_id: "m".into(),
            bank_payment_id: Some(payment.into()),
        }
    }

    fn payout(claim: &str, cents: i64, id: &str) -> Payout {
        Payout {
            payment_id: id.into(),
            idempotency_key: format!("claim-payment-{claim}"),
            reference: Some(format!("claim-payment-{claim}")),
            claim_id: claim.into(),
            amount: Decimal::new(cents, 2),
            currency: "EUR".into(),
            payee: Some("NL00SIMB0000000001".into()),
        }
    }

    fn ledger() -> Vec<LedgerRow> {
        vec![row(C1, 12_550, "paid", "p1"), row(C2, 1_000, "paid", "p2")]
    }

    fn bank() -> BankLedger {
        BankLedger {
            payouts: vec![payout(C1, 12_550, "p1"), payout(C2, 1_000, "p2")],
            requests: Vec::new(),
        }
    }

    fn failed(v: &Verification) -> Vec<&'static str> {
        v.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name)
            .collect()
    }

    fn run(entries: &[EntryView], ledger: &[LedgerRow], bank: Option<&BankLedger>) -> Verification {
        verify(&Evidence {
            plan: &plan(),
            entries,
            ledger,
            bank,
        })
    }

    #[test]
    fn a_clean_run_is_exactly_once_with_equal_totals() {
        let v = run(&entries(), &ledger(), Some(&bank()));
        assert!(v.exactly_once, "{:?}", v.checks);
        assert_eq!(v.totals.len(), 1);
        let t = &v.totals[0];
        assert_eq!(
            (t.expected.as_str(), t.ledger.as_str()),
            ("135.50", "135.50")
        );
        assert_eq!(t.bank.as_deref(), Some("135.50"));
        assert_eq!(v.dead_letters.len(), 2);
    }

    #[test]
    fn a_second_payout_for_a_claim_is_a_double_payment_whatever_its_key() {
        let mut b = bank();
        let mut again = payout(C1, 12_550, "p3");
        again.idempotency_key = "a-fresh-key".into();
        b.payouts.push(again);
        let v = run(&entries(), &ledger(), Some(&b));
        assert!(!v.exactly_once);
        assert_eq!(v.claims_paid_twice_at_bank, 1);
        assert!(failed(&v).contains(&"no double payment"));
        assert!(
            failed(&v).contains(&"amounts match"),
            "bank total differs too"
        );
    }

    #[test]
    fn a_completed_message_without_a_final_payment_is_a_lost_claim() {
        let mut l = ledger();
        l[0].status = "in_progress".into();
        let v = run(&entries(), &l, Some(&bank()));
        assert_eq!(v.lost_claims, 1);
        assert!(failed(&v).contains(&"no lost claim"));
        let v = run(&entries(), &ledger()[1..], Some(&bank()));
        assert!(failed(&v).contains(&"no lost claim"));
    }

    #[test]
    fn a_claim_neither_completed_nor_dead_lettered_is_lost() {
        let mut e = entries();
        e[0].settled = None;
        e[1].settled = None;
        let v = run(&e, &ledger(), Some(&bank()));
        assert!(failed(&v).contains(&"no lost claim"));
    }

    #[test]
    fn a_wrong_amount_in_the_ledger_or_at_the_bank_fails() {
        let mut l = ledger();
        l[0].amount = Decimal::new(12_500, 2);
        let v = run(&entries(), &l, Some(&bank()));
        assert_eq!(failed(&v), vec!["amounts match"]);
        let mut b = bank();
        b.payouts[1].amount = Decimal::new(2_000, 2);
        let v = run(&entries(), &ledger(), Some(&b));
        assert_eq!(failed(&v), vec!["amounts match"]);
    }

    #[test]
    fn a_payout_for_a_claim_the_ledger_does_not_call_paid_is_stray() {
        let mut l = ledger();
        l[1].status = "rejected".into();
        let v = run(&entries(), &l, Some(&bank()));
        assert!(failed(&v).contains(&"no payout outside the paid set"));
        // needs_reconciliation is visible to an operator, so it is allowed.
        l[1].status = "needs_reconciliation".into();
        let v = run(&entries(), &l, Some(&bank()));
        assert!(v.exactly_once, "{:?}", v.checks);
        assert_eq!(v.needs_reconciliation_claims, 1);
    }

    #[test]
    fn an_accepted_invalid_message_or_conflict_fails() {
        let mut e = entries();
        e[4].settled = Some(done("recorded"));
        let v = run(&e, &ledger(), Some(&bank()));
        assert_eq!(failed(&v), vec!["permanent failures surfaced"]);
        let mut e = entries();
        e[3].settled = Some(done("paid"));
        let v = run(&e, &ledger(), Some(&bank()));
        assert!(failed(&v).contains(&"permanent failures surfaced"));
    }

    #[test]
    fn the_conflicting_payload_may_win_the_race_if_only_it_completes() {
        let mut e = entries();
        e[2].settled = Some(dead("422 conflict"));
        e[3].settled = Some(done("paid"));
        let mut l = ledger();
        l[1].amount = Decimal::new(2_000, 2);
        let mut b = bank();
        b.payouts[1].amount = Decimal::new(2_000, 2);
        let v = run(&e, &l, Some(&b));
        assert!(v.exactly_once, "{:?}", v.checks);
    }

    #[test]
    fn a_paid_claim_without_a_completed_message_may_have_either_payload_but_no_other() {
        // C2's first copy was orphaned mid-payout and reconciled as paid; the
        // conflicting copy was refused: nothing of C2 completed.
        let mut e = entries();
        e[2].settled = Some(dead("lock expired"));
        let v = run(&e, &ledger(), Some(&bank()));
        assert!(v.exactly_once, "{:?}", v.checks);
        assert_eq!(v.totals[0].expected, "135.50");
        // The conflicting payload may be the one that reached the store first.
        let mut l = ledger();
        l[1].amount = Decimal::new(2_000, 2);
        let mut b = bank();
        b.payouts[1].amount = Decimal::new(2_000, 2);
        assert!(run(&e, &l, Some(&b)).exactly_once);
        // An amount the producer never sent is still a mismatch.
        l[1].amount = Decimal::new(3_000, 2);
        b.payouts[1].amount = Decimal::new(3_000, 2);
        let v = run(&e, &l, Some(&b));
        assert_eq!(failed(&v), vec!["amounts match"]);
    }

    #[test]
    fn a_dead_lettered_claim_is_accounted_for_and_a_redrive_overrides_its_dead_letter() {
        let mut e = entries();
        e[0].settled = Some(dead("503 retry-later"));
        e[1].settled = Some(dead("503 retry-later"));
        let v = run(
            &e,
            &ledger()[1..],
            Some(&BankLedger {
                payouts: vec![payout(C2, 1_000, "p2")],
                requests: Vec::new(),
            }),
        );
        assert!(v.exactly_once, "{:?}", v.checks);
        assert_eq!(v.dead_lettered_claims, 1);
        // The re-drive of copy 0 completes: now the claim must be in the ledger.
        let mut redriven = entry(0, done("paid"));
        redriven.message.redrive = true;
        e.push(redriven);
        let v = run(&e, &ledger()[1..], Some(&bank()));
        assert!(failed(&v).contains(&"no lost claim"));
    }

    #[test]
    fn ledger_only_runs_need_recorded_payments_and_no_bank() {
        let l: Vec<LedgerRow> = ledger()
            .into_iter()
            .map(|mut r| {
                r.status = "recorded".into();
                r.bank_payment_id = None;
                r
            })
            .collect();
        let v = run(&entries(), &l, None);
        assert!(v.exactly_once, "{:?}", v.checks);
        assert_eq!(v.totals[0].bank, None);
        let mut twice = l.clone();
        twice.push(l[0].clone());
        let v = run(&entries(), &twice, None);
        assert_eq!(v.claims_with_two_ledger_payments, 1);
        assert!(!v.exactly_once);
    }
}
