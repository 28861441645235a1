//! The checks behind the verdict: what the producer asked for, what the broker settled, what the
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

use rust_decimal::Decimal;

use super::super::bank::Payout;
use super::super::queue::{EntryView, Settled};
use super::super::scenario::{CopyKind, Payload, Plan};
use super::{Check, CurrencyTotals, DeadLetterGroup, Evidence, LedgerRow, Verification};

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

/// What the verifier knows, indexed once for every check.
struct Facts<'a> {
    plan: &'a Plan,
    with_bank: bool,
    states: Vec<Option<Settled>>,
    rows: HashMap<String, Vec<&'a LedgerRow>>,
    payouts: HashMap<String, Vec<&'a Payout>>,
    known: BTreeSet<String>,
}

/// One claim of the plan as the checks see it.
struct ClaimView<'f, 'a> {
    id: String,
    /// Indexes of the producer copies of this claim.
    copies: Vec<usize>,
    /// Distinct payloads of its completed copies.
    distinct: BTreeSet<String>,
    completed_any: bool,
    rows: &'f [&'a LedgerRow],
    /// The payload the ledger should hold, if one can be named.
    expected: Option<&'a Payload>,
    payouts: &'f [&'a Payout],
    status: Option<&'f str>,
    in_paid_set: bool,
}

impl<'a> Facts<'a> {
    fn new(evidence: &Evidence<'a>) -> Facts<'a> {
        let plan = evidence.plan;
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
        Facts {
            plan,
            with_bank: evidence.bank.is_some(),
            states: final_states(evidence.entries, plan.copies.len()),
            rows,
            payouts,
            known: plan
                .claims
                .iter()
                .map(|c| canonical_claim(&c.claim_id))
                .collect(),
        }
    }

    fn completed(&self, copy: usize) -> bool {
        matches!(self.states[copy], Some(Settled::Completed { .. }))
    }

    /// Every claim of the plan, in the plan's order.
    fn claims(&self) -> Vec<ClaimView<'_, 'a>> {
        let plan = self.plan;
        plan.claims
            .iter()
            .enumerate()
            .map(|(ci, claim)| {
                let id = canonical_claim(&claim.claim_id);
                let copies: Vec<usize> = (0..plan.copies.len())
                    .filter(|&i| plan.copies[i].claim == Some(ci))
                    .collect();
                let completed: Vec<&Payload> = copies
                    .iter()
                    .filter(|&&i| self.completed(i))
                    .map(|&i| &claim.payloads[plan.copies[i].payload])
                    .collect();
                let distinct: BTreeSet<String> = completed.iter().map(|p| p.identity()).collect();
                let claim_rows = self.rows.get(&id).map(Vec::as_slice).unwrap_or(&[]);
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
                let status = claim_rows.first().map(|r| r.status.as_str());
                let in_paid_set = if self.with_bank {
                    status == Some("paid")
                } else {
                    status == Some("recorded")
                };
                ClaimView {
                    payouts: self.payouts.get(&id).map(Vec::as_slice).unwrap_or(&[]),
                    id,
                    copies,
                    completed_any: !completed.is_empty(),
                    distinct,
                    rows: claim_rows,
                    expected,
                    status,
                    in_paid_set,
                }
            })
            .collect()
    }
}

pub fn verify(evidence: &Evidence<'_>) -> Verification {
    let facts = Facts::new(evidence);
    let claims = facts.claims();
    let mut v = Verification {
        claims: facts.plan.claims.len(),
        ..Verification::default()
    };
    for row in evidence.ledger {
        *v.ledger_by_status.entry(row.status.clone()).or_default() += 1;
    }
    for c in &claims {
        match c.status {
            Some("rejected") => v.rejected_claims += 1,
            Some("needs_reconciliation") => v.needs_reconciliation_claims += 1,
            _ => {}
        }
    }
    // The amounts check counts the paid set, which the lost-claim check's detail shows.
    let amounts = amounts_match(&facts, &claims, &mut v);
    let double = no_double_payment(&claims, &mut v);
    let lost = no_lost_claim(&facts, &claims, &mut v);
    let in_progress = no_payout_left_in_progress(&facts, &claims, &mut v);
    let stray = no_payout_outside_the_paid_set(&facts, &claims);
    let permanent = permanent_failures_surfaced(&facts, &claims);
    v.checks = vec![double, lost, in_progress, amounts, stray, permanent];
    v.exactly_once = v.checks.iter().all(|c| c.passed);
    v.dead_letters = dead_letter_groups(&facts.states);
    v
}

/// Check 1: no claim has more than one payout at the bank or more than one payment in
/// the ledger.
fn no_double_payment(claims: &[ClaimView<'_, '_>], v: &mut Verification) -> Check {
    let mut double = Vec::new();
    for c in claims {
        let id = &c.id;
        if c.payouts.len() > 1 {
            v.claims_paid_twice_at_bank += 1;
            double.push(format!(
                "claim {id}: {} payouts at the bank",
                c.payouts.len()
            ));
        }
        if c.rows.len() > 1 {
            v.claims_with_two_ledger_payments += 1;
            double.push(format!(
                "claim {id}: {} payments in the ledger",
                c.rows.len()
            ));
        }
    }
    check(
        "no double payment",
        double,
        "no claim has more than one payout at the bank or more than one payment in the ledger"
            .into(),
        format!(
            "{} claim(s) paid more than once at the bank, {} with more than one ledger payment",
            v.claims_paid_twice_at_bank, v.claims_with_two_ledger_payments
        ),
    )
}

/// Check 2: every claim with a completed message has a final ledger payment; every other
/// claim was dead-lettered with a reason; the ledger holds nothing for unknown claims.
fn no_lost_claim(facts: &Facts<'_>, claims: &[ClaimView<'_, '_>], v: &mut Verification) -> Check {
    let plan = facts.plan;
    let with_bank = facts.with_bank;
    let mut lost = Vec::new();
    for c in claims {
        let id = &c.id;
        let final_ok = if with_bank {
            matches!(c.status, Some("paid" | "rejected" | "needs_reconciliation"))
        } else {
            c.status == Some("recorded")
        };
        if c.completed_any {
            if !final_ok {
                v.lost_claims += 1;
                let how: Vec<String> = c
                    .copies
                    .iter()
                    .filter_map(|&i| match &facts.states[i] {
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
                    c.status.unwrap_or("nothing")
                ));
            }
        } else {
            let all_dead = c.copies.iter().all(|&i| {
                matches!(&facts.states[i], Some(Settled::DeadLettered { last, .. }) if !last.kind.is_empty())
            });
            if all_dead {
                v.dead_lettered_claims += 1;
            } else {
                v.lost_claims += 1;
                lost.push(format!("claim {id}: neither completed nor dead-lettered"));
            }
        }
    }
    for (id, claim_rows) in &facts.rows {
        if !facts.known.contains(id) {
            lost.push(format!(
                "ledger has {} payment(s) for unknown claim {id}",
                claim_rows.len()
            ));
        }
    }
    let lost_count = lost.len();
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
    )
}

/// Check 2b: no message was dead-lettered while its claim's payment was in_progress.
fn no_payout_left_in_progress(
    facts: &Facts<'_>,
    claims: &[ClaimView<'_, '_>],
    v: &mut Verification,
) -> Check {
    let mut in_progress_dead = Vec::new();
    for c in claims.iter().filter(|c| c.status == Some("in_progress")) {
        let stranded = c
            .copies
            .iter()
            .filter(|&&i| matches!(facts.states[i], Some(Settled::DeadLettered { .. })))
            .count();
        if stranded > 0 {
            v.dead_lettered_in_progress += stranded;
            in_progress_dead.push(format!(
                "claim {}: {stranded} message(s) dead-lettered while its payment is in_progress",
                c.id
            ));
        }
    }
    check(
        "no payout left in progress",
        in_progress_dead,
        "no message was dead-lettered while its payment was in_progress".into(),
        format!(
            "{} message(s) dead-lettered while their payment was in_progress",
            v.dead_lettered_in_progress
        ),
    )
}

/// Check 3: for every claim in the paid set the ledger holds the completed payload and
/// the bank paid it once, with the same payment id; the totals per currency agree.
/// Counts the paid set and fills the totals.
fn amounts_match(facts: &Facts<'_>, claims: &[ClaimView<'_, '_>], v: &mut Verification) -> Check {
    let with_bank = facts.with_bank;
    let mut mismatched = Vec::new();
    let mut expected_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut ledger_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut bank_total: BTreeMap<String, Decimal> = BTreeMap::new();
    let mut paid_count: BTreeMap<String, usize> = BTreeMap::new();
    for c in claims.iter().filter(|c| c.in_paid_set) {
        let id = &c.id;
        let row = *c.rows.first().expect("paid set implies a row");
        v.paid_claims += 1;
        *paid_count.entry(row.currency.clone()).or_default() += 1;
        *ledger_total.entry(row.currency.clone()).or_default() += row.amount;
        match c.expected {
            Some(p) => {
                *expected_total.entry(p.currency.to_owned()).or_default() += p.amount;
                if p.amount.normalize() != row.amount.normalize() || p.currency != row.currency {
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
            bank_matches(id, row, c.payouts, &mut mismatched);
        }
        for p in c.payouts {
            *bank_total.entry(p.currency.clone()).or_default() += p.amount;
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
    check(
        "amounts match",
        mismatched,
        if with_bank {
            "expected = ledger = bank for every paid claim and every currency".into()
        } else {
            "expected = ledger for every recorded claim and every currency".into()
        },
        "amounts or totals differ".into(),
    )
}

/// A paid claim's one payout against its ledger row.
fn bank_matches(id: &str, row: &LedgerRow, payouts: &[&Payout], mismatched: &mut Vec<String>) {
    match payouts {
        [p] => {
            if p.amount.normalize() != row.amount.normalize() || p.currency != row.currency {
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
        [] => mismatched.push(format!("claim {id}: ledger paid, no payout at the bank")),
        _ => {}
    }
}

/// Check 4: every bank payout belongs to a claim the ledger calls paid
/// (`needs_reconciliation` is allowed: an operator has it).
fn no_payout_outside_the_paid_set(facts: &Facts<'_>, claims: &[ClaimView<'_, '_>]) -> Check {
    let mut stray = Vec::new();
    for c in claims {
        if c.in_paid_set || c.status == Some("needs_reconciliation") {
            continue;
        }
        for p in c.payouts {
            stray.push(format!(
                "claim {}: bank paid {} {} ({}) but the ledger says {}",
                c.id,
                p.amount,
                p.currency,
                p.payment_id,
                c.status.unwrap_or("nothing")
            ));
        }
    }
    for (id, claim_payouts) in &facts.payouts {
        if !facts.known.contains(id) {
            stray.push(format!(
                "bank paid unknown claim {id} {} time(s)",
                claim_payouts.len()
            ));
        }
    }
    check(
        "no payout outside the paid set",
        stray,
        if facts.with_bank {
            "every bank payout belongs to a claim the ledger calls paid".into()
        } else {
            "no bank configured".into()
        },
        "the bank paid claims the ledger does not call paid".into(),
    )
}

/// Check 5: no invalid message and no second payload under a used MessageId was
/// completed; at most one distinct payload per claim was completed.
fn permanent_failures_surfaced(facts: &Facts<'_>, claims: &[ClaimView<'_, '_>]) -> Check {
    let plan = facts.plan;
    let mut accepted_bad = Vec::new();
    for c in claims.iter().filter(|c| c.distinct.len() > 1) {
        accepted_bad.push(format!(
            "claim {}: {} different payloads completed",
            c.id,
            c.distinct.len()
        ));
    }
    for (i, copy) in plan.copies.iter().enumerate() {
        if copy.kind == CopyKind::Invalid && facts.completed(i) {
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
        if let (Some(ci), Some(Settled::Completed { .. })) = (copy.claim, &facts.states[i]) {
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
    let invalid = plan.count(CopyKind::Invalid);
    let conflicting = plan.count(CopyKind::ConflictingPayload);
    check(
        "permanent failures surfaced",
        accepted_bad,
        format!(
            "{invalid} invalid messages and {conflicting} conflicting payloads sent; none completed, at most one payload per claim paid"
        ),
        "a permanent failure was completed (accepted) instead of dead-lettered".into(),
    )
}

/// The final dead-letter queue grouped by reason, largest group first.
fn dead_letter_groups(states: &[Option<Settled>]) -> Vec<DeadLetterGroup> {
    let mut groups: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for state in states.iter().flatten() {
        if let Settled::DeadLettered { last, .. } = state {
            let g = groups
                .entry(last.kind.clone())
                .or_insert((0, last.detail.clone()));
            g.0 += 1;
        }
    }
    let mut dead_letters: Vec<DeadLetterGroup> = groups
        .into_iter()
        .map(|(reason, (count, example))| DeadLetterGroup {
            reason,
            count,
            example,
        })
        .collect();
    dead_letters.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    dead_letters
}
