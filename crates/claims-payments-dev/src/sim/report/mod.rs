//! The reconciliation: what the producer asked for, what the broker settled, what the
//! ledger holds and what the bank paid, checked against each other ([`verify`], whose
//! doc states the exact rule behind "exactly once: yes"), and the report that shows it
//! ([`render`]).

mod render;
mod verify;

pub use verify::verify;

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::Serialize;

use super::bank::{BankAnswer, BankLedger};
use super::driver::HostStats;
use super::queue::{DeadLetterCause, EntryView, Settled};
use super::scenario::{CopyKind, Plan};

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

/// What `dead-letters resubmit --all` said and did in the re-drive.
#[derive(Debug, Clone, Default)]
pub struct ToolVerdicts {
    /// Every dead letter by the command's verdict.
    pub by_verdict: BTreeMap<String, usize>,
    /// Those it did not send (refused, waiting, a failed send), by verdict.
    pub not_sent: BTreeMap<String, usize>,
    /// The verdict of each MessageId it sent.
    pub verdict_of: BTreeMap<String, String>,
    /// The queue entries whose dead letter it sent again.
    pub resent: Vec<usize>,
    /// Discarded by `dead-letters discard` (one permanent one, its warning line written).
    pub discarded: usize,
    /// Dead letters `dead-letters list` shows afterwards.
    pub left_in_dlq: usize,
}

/// The command's verdicts beside what happened after the re-drive.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterToolReport {
    pub verdicts: BTreeMap<String, usize>,
    /// Not sent, by verdict (permanent ones refused, ...).
    pub not_sent: BTreeMap<String, usize>,
    /// `verdict -> outcome` for every re-sent message: its label when it completed
    /// (`paid`, `recorded`, `duplicate`, ...) or `dead-lettered again`.
    pub after: BTreeMap<String, usize>,
    pub discarded: usize,
    pub left_in_dlq: usize,
}

/// Joins the command's verdicts to the re-sent messages' settlements.
pub fn dead_letter_tool(tool: &ToolVerdicts, entries: &[EntryView]) -> DeadLetterToolReport {
    let mut after = BTreeMap::new();
    for e in entries.iter().filter(|e| e.message.redrive) {
        let verdict = tool
            .verdict_of
            .get(&*e.message.message_id)
            .map_or("?", String::as_str);
        let outcome = match &e.settled {
            Some(Settled::Completed { label, .. }) => label.clone(),
            Some(Settled::DeadLettered { .. }) => "dead-lettered again".to_owned(),
            None => "unsettled".to_owned(),
        };
        *after.entry(format!("{verdict} -> {outcome}")).or_default() += 1;
    }
    DeadLetterToolReport {
        verdicts: tool.by_verdict.clone(),
        not_sent: tool.not_sent.clone(),
        after,
        discarded: tool.discarded,
        left_in_dlq: tool.left_in_dlq,
    }
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
        during: &[claims_payments::seams::reconcile::Summary],
        at_end: &[claims_payments::seams::reconcile::Summary],
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
    /// The re-drive through `dead-letters resubmit` (none when nothing was dead-lettered).
    pub dead_letter_tool: Option<DeadLetterToolReport>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::bank::{BankLedger, Payout};
    use crate::sim::queue::{Failure, FailureTally, Message, LOCK_EXPIRED};
    use crate::sim::scenario::{Claim, MessageCopy, Payload};
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
