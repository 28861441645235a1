//! On any store: payment rows edited by hand into something that does
//! not parse (an amount `80.5` for EUR). `ledger` names each with its claim and column,
//! still lists the others and exits 4; the consumer answers `store-failure` for such a
//! claim (a person must repair it) and never pays it again. The store-specific part is
//! only the edit, which each store's test passes in.

use std::future::Future;
use std::process::{Command, Output, Stdio};

use claims_payments::seams::store::DynStore;
use claims_payments::seams::Step;

use crate::bank::FakeBank;
use crate::fixtures as common;

/// `ledger`'s documented exit code for rows that could not be read.
pub const EXIT_UNREADABLE_ROWS: i32 = 4;

/// The amount every corrupted row gets: two fraction digits are canonical for EUR.
pub const NON_CANONICAL_AMOUNT: &str = "80.5";

fn run(exe: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(exe);
    for key in crate::process::controlled_env() {
        cmd.env_remove(key);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

/// Runs the scenario on `store` (which `exe` reaches with `env`); `corrupt(claim)` sets
/// the stored amount of that claim's payment to [`NON_CANONICAL_AMOUNT`].
pub async fn corrupt_payments_are_named_and_never_paid_again<F, Fut>(
    exe: &str,
    env: &[(&str, &str)],
    store: DynStore,
    corrupt: F,
) where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let ledger = common::ledger_consumer(store.clone());
    let (good, bad) = (common::new_claim(), common::new_claim());
    for (claim, message) in [(&good, "m-good"), (&bad, "m-bad")] {
        let msg = common::message(claim, "80.50");
        assert_eq!(common::deliver(&ledger, &msg, message, 1).await, "recorded");
    }
    // A payout whose attempt died after the claim: the payment is in progress, owed.
    let bank = FakeBank::start().await;
    let owed = common::new_claim();
    let owed_msg = common::message(&owed, "80.50");
    let crashing = common::bank_consumer(store.clone(), &bank)
        .with_crash_hook(common::crash_once_at(Step::AfterClaim));
    assert_eq!(
        common::deliver(&crashing, &owed_msg, "m-owed", 1).await,
        "retry-later"
    );
    corrupt(bad.clone()).await;
    corrupt(owed.clone()).await;

    // The store lists every row, the corrupt ones as what they are.
    let listed = store.list_payments(10).await.expect("the listing reads");
    assert_eq!(listed.len(), 3, "{listed:?}");
    let mut unreadable: Vec<(String, &str)> = listed
        .iter()
        .filter_map(|row| row.as_ref().err())
        .map(|c| (c.claim_id.clone(), c.column))
        .collect();
    unreadable.sort();
    let mut expected = vec![(bad.clone(), "amount"), (owed.clone(), "amount")];
    expected.sort();
    assert_eq!(unreadable, expected, "{listed:?}");

    // `ledger`: the good row listed, the corrupt ones named with claim and column.
    for args in [&["ledger"][..], &["ledger", "--json"][..]] {
        let out = run(exe, args, env);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(EXIT_UNREADABLE_ROWS),
            "{args:?}: {stdout}{stderr}"
        );
        assert!(stdout.contains(&good), "{args:?}: {stdout}");
        for corrupt in [&bad, &owed] {
            assert!(!stdout.contains(corrupt.as_str()), "{args:?}: {stdout}");
            let named = stderr.lines().any(|l| {
                l.contains(corrupt.as_str()) && l.contains("amount") && l.contains("canonical form")
            });
            assert!(named, "{args:?}: {corrupt} not named: {stderr}");
        }
        assert!(
            stderr.contains("2 stored row(s) could not be read"),
            "{stderr}"
        );
    }
    let json = run(exe, &["ledger", "--json"], env);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["claimId"], good.as_str());
    // Nothing unreadable in the inbox: exit 0.
    let inbox = run(exe, &["inbox"], env);
    assert_eq!(inbox.status.code(), Some(0), "{inbox:?}");

    // The consumer: a corrupt payment needs a person, it is never taken for absent.
    let another = common::message(&bad, "80.50");
    assert_eq!(
        common::deliver(&ledger, &another, "m-bad-2", 1).await,
        "store-failure"
    );
    let payer = common::bank_consumer(store.clone(), &bank);
    assert_eq!(
        common::deliver(&payer, &owed_msg, "m-owed", 2).await,
        "store-failure"
    );
    assert!(
        bank.requests().is_empty(),
        "no payout: {:?}",
        bank.requests()
    );
    assert_eq!(
        store.list_payments(10).await.unwrap().len(),
        3,
        "no payment written"
    );
}
