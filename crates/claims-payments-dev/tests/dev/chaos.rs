//! Chaos verification: the real handler binary (`claims-payments-dev serve`), driven by
//! the simulator over the custom-handler protocol with every fault kind switched on,
//! must pay each claim exactly once; the same run against the naive check-then-insert
//! handler must be caught paying twice, which proves the verifier can fail.
//!
//! Size: 2000 MessageIds per run (about 2200 queue messages and 3500 to 4000
//! deliveries). A run takes about a minute in a debug build, mostly waiting: each
//! handler killed in a crash loop is held back up to a second before it answers again
//! (`startup/restarts.rs`), as in production. So the runs go side by side, not one at a
//! time (three at once: 66 s, against about 140 s in turn). The tests assert outcomes
//! only, never timings. Set `CHAOS_MESSAGES` to run larger or smaller.

use claims_payments_dev::sim::bank::BankAnswer;
use claims_payments_dev::sim::report::Report;
use claims_payments_dev::sim::{self, HandlerKind, SimulateArgs};

fn messages(default: usize) -> usize {
    std::env::var("CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every fault kind on, at the simulator's defaults (see `SimulateArgs`), with the
/// short timings: thousands of messages in seconds. The deployed timings are the
/// default of `simulate` itself (the README's main command) and of the e2e test that
/// kills the handler mid-payout.
fn chaos_args(handler: HandlerKind) -> SimulateArgs {
    SimulateArgs {
        messages: messages(2000),
        handler,
        short_timings: true,
        seed: Some(20_260_101),
        exe: Some(env!("CARGO_BIN_EXE_claims-payments-dev").into()),
        ..SimulateArgs::default()
    }
}

fn answers(report: &Report, kind: BankAnswer) -> usize {
    report
        .bank
        .as_ref()
        .and_then(|b| b.answers.get(&kind).copied())
        .unwrap_or(0)
}

fn dead_letter_reasons(report: &Report) -> Vec<&str> {
    report
        .verification
        .dead_letters
        .iter()
        .map(|g| g.reason.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_pays_every_claim_exactly_once_under_every_fault() {
    let report = sim::run(chaos_args(HandlerKind::Consumer))
        .await
        .expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");

    // The faults really happened, so the verdict below is not vacuous.
    let p = &report.producer;
    assert!(
        p.producer_resends > 0 && p.business_duplicates > 0,
        "{text}"
    );
    assert!(
        p.conflicting_payloads > 0 && p.invalid_messages > 0,
        "{text}"
    );
    assert!(report.processes.crash_after_commit > 0, "{text}");
    assert!(report.processes.chaos_kills > 0, "{text}");
    assert!(report.host.lock_expiries > 0, "{text}");
    assert!(answers(&report, BankAnswer::Injected5xx) > 0, "{text}");
    assert!(answers(&report, BankAnswer::Injected429) > 0, "{text}");
    assert!(
        answers(&report, BankAnswer::LostAfterPay)
            + answers(&report, BankAnswer::CutAfterPay)
            + answers(&report, BankAnswer::LostWhileProcessing)
            > 0,
        "{text}"
    );
    assert!(answers(&report, BankAnswer::Rejected) > 0, "{text}");
    assert!(
        report.host.outcomes.get("duplicate").copied().unwrap_or(0) > 0,
        "{text}"
    );
    assert!(
        report
            .host
            .outcomes
            .get("business-duplicate")
            .copied()
            .unwrap_or(0)
            > 0,
        "{text}"
    );

    // Zero double payments, zero lost claims, totals equal.
    let v = &report.verification;
    assert_eq!(v.claims_paid_twice_at_bank, 0, "{text}");
    assert_eq!(v.claims_with_two_ledger_payments, 0, "{text}");
    assert_eq!(v.lost_claims, 0, "{text}");
    assert!(!v.totals.is_empty());
    for t in &v.totals {
        assert_eq!(t.expected, t.ledger, "{text}");
        assert_eq!(Some(&t.ledger), t.bank.as_ref(), "{text}");
    }
    // Permanent failures went to the dead-letter queue with their reason.
    let reasons = dead_letter_reasons(&report);
    assert!(reasons.contains(&"422 conflict"), "{text}");
    assert!(reasons.contains(&"422 invalid-message"), "{text}");
    assert_eq!(report.processes.unexpected_exits, 0, "{text}");
    assert!(report.exactly_once, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_handler_is_caught_paying_twice() {
    // Messages only: the point is the naive message handler.
    let report = sim::run(SimulateArgs {
        http_share: 0.0,
        ..chaos_args(HandlerKind::Naive)
    })
    .await
    .expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");
    assert!(report.verification.claims_paid_twice_at_bank > 0, "{text}");
    let double = report
        .verification
        .checks
        .iter()
        .find(|c| c.name == "no double payment")
        .unwrap();
    assert!(!double.passed && !double.examples.is_empty(), "{text}");
    assert!(!report.exactly_once, "{text}");
}

/// Ledger-only mode through the other envelope encoding (no dataType: the body
/// JSON-encoded twice), with a slow store and a handler killed far more often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_only_survives_frequent_kills_and_a_slow_store() {
    let report = sim::run(SimulateArgs {
        messages: messages(2000) / 5,
        ledger_only: true,
        data_type: sim::driver::DataType::String,
        kill_rate: 0.02,
        // Messages only: a request cut by a kill holds its key for the deployed lease.
        http_share: 0.0,
        slow_store_ms: 2,
        seed: Some(7),
        exe: Some(env!("CARGO_BIN_EXE_claims-payments-dev").into()),
        ..SimulateArgs::default()
    })
    .await
    .expect("the simulation ran");
    let text = report.render_text();
    println!("{text}");
    assert!(report.bank.is_none());
    assert!(report.processes.chaos_kills > 0, "{text}");
    assert_eq!(
        report
            .verification
            .ledger_by_status
            .keys()
            .collect::<Vec<_>>(),
        vec!["recorded"],
        "{text}"
    );
    assert_eq!(report.verification.lost_claims, 0, "{text}");
    assert!(report.exactly_once, "{text}");
}
