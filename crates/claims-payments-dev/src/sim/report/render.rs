//! The report as text: the compact human-readable form `simulate` prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::super::bank::BankAnswer;
use super::super::queue::DeadLetterCause;
use super::Report;

impl Report {
    /// The compact human-readable form.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        self.render_configuration(&mut o);
        self.render_handler(&mut o);
        if self.instances.len() > 1 {
            self.render_instances(&mut o);
        }
        self.render_ledger(&mut o);
        self.render_clients(&mut o);
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

    /// The run's configuration, the producer, the broker and the dead-letter queue.
    fn render_configuration(&self, o: &mut String) {
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
        if let Some(t) = &self.dead_letter_tool {
            let counts = |m: &BTreeMap<String, usize>| {
                m.iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let none = |s: String| if s.is_empty() { "none".to_owned() } else { s };
            let _ = writeln!(
                o,
                "dlq tool   dead-letters resubmit --all: verdicts {}; not sent {}; after the re-drive {}; discard {}; list: {} left in the dead-letter queue",
                none(counts(&t.verdicts)),
                none(counts(&t.not_sent)),
                none(counts(&t.after)),
                t.discarded,
                t.left_in_dlq
            );
        }
    }

    /// The dead letters by cause, the handler processes, store restarts and answers.
    fn render_handler(&self, o: &mut String) {
        let h = &self.host;
        let b = &self.broker;
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
    }

    /// The final dead letters, the bank, the ledger, the totals and the checks.
    fn render_ledger(&self, o: &mut String) {
        let v = &self.verification;
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
    }

    /// The HTTP clients and `reconcile`.
    fn render_clients(&self, o: &mut String) {
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
