#!/usr/bin/env python3
"""Planted defects: each is a small patch to the product that breaks one guarantee. For
each, this script applies it, builds the development binary, runs the deterministic
simulator (`claims-payments-dev dst`) for up to --seeds seeds, reports the first seed
that fails (and the invariant), and restores the file. A defect that survives every seed
means the simulator misses a fault or an invariant.

    python3 scripts/planted-defects.py [--seeds 1000] [--messages 60] [--only NAME]

Run it from a clean tree (it restores each file with `git checkout`).

Not planted, because they cost time and never money (each survived 1,000 seeds, and the
design says why; docs/service.md):
- a finalize without its version condition (reconcile's payment condition, or a consumer
  that finalizes again with whatever version is current after losing its lease): every
  writer settles from the bank's one answer under the same Idempotency-Key, so they agree;
- skipping the re-read after an unknown answer to a takeover: the attempt answers
  retry-later, and the next delivery finds the record and carries on.

Nor taking over a live lease. The design makes that safe (the takeover pays under
the same Idempotency-Key and the old attempt's final write is conditional on a version it
no longer holds), so it costs time, never money, and no invariant of the simulator can
tell it from a lease whose owner died; liveness relies on it (docs/service.md)."""
import argparse, os, re, subprocess, sys, time

SRC = "crates/claims-payments/src"
DEFECTS = [
    ("resend-after-the-key-window", f"{SRC}/bank/mod.rs",
     "if !window.key_window_open(self.ambient.now()) {", "if false {"),
    ("bank-key-from-the-attempt", f"{SRC}/consumer/mod.rs",
     "bank.pay(&payment.idempotency_key, &body, window)",
     "bank.pay(&crate::message::IdempotencyKey::for_payout(None, crate::message::ClaimId::parse(&a.id.to_string()).unwrap()), &body, window)"),
    ("an-error-for-a-duplicate", f"{SRC}/consumer/outcome.rs",
     "            Outcome::Conflict { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }",
     "            Outcome::Conflict { .. }\n                | Outcome::Duplicate { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }"),
    ("purge-removes-in-progress-records", f"{SRC}/functions/purge.rs",
     "store.purge_expired(now, BATCH)", "store.purge_expired(now + time::Duration::days(3650), BATCH)"),
    ("settle-from-a-failed-lookup", f"{SRC}/reconcile/mod.rs",
     "Lookup::Unknown { reason } => Finding::Unknown { reason },",
     "Lookup::Unknown { .. } => judge(p, &[]),"),
    ("a-lost-bank-answer-read-as-paid", f"{SRC}/bank/mod.rs",
     "            Err(e) => {\n                return Answer::Retry {\n                    error: self.transport_failure(e),\n                    after: None,\n                }\n            }\n        };\n        let BankAnswer {",
     "            Err(_) => {\n                return Answer::Done(PayoutOutcome::Paid { payment_id: \"unknown\".into() })\n            }\n        };\n        let BankAnswer {"),
    ("2xx-when-the-finalize-failed", f"{SRC}/consumer/mod.rs",
     "                Ok(Progress::Next(State::Seen(seen, self.attempt_wait())))\n            }\n            Err(e) => Err(e.into()),",
     "                Ok(Progress::Next(State::Seen(seen, self.attempt_wait())))\n            }\n            Err(_) => Ok(Progress::Done(outcome)),"),
    ("complete-a-poison-message", f"{SRC}/consumer/outcome.rs",
     "            Outcome::Conflict { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }\n                | Outcome::StoreFailure { .. }\n        )\n    }",
     "            Outcome::Conflict { .. }\n                | Outcome::RetryLater { .. }\n                | Outcome::StoreFailure { .. }\n        )\n    }"),
    ("retry-a-refusal-forever", f"{SRC}/consumer/mod.rs",
     "            PayoutOutcome::Rejected { reason, .. } => (\n                PaymentStatus::Rejected,",
     "            PayoutOutcome::Rejected { reason, .. } => {\n                self.release(&inbox, &version).await;\n                return retry_later(reason);\n            }\n            #[allow(unreachable_patterns)]\n            PayoutOutcome::Rejected { reason, .. } => (\n                PaymentStatus::Rejected,"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=60)
    ap.add_argument("--http-intents", type=int, default=8)
    ap.add_argument("--only")
    args = ap.parse_args()
    env = dict(os.environ, RUST_LIB_BACKTRACE="0")
    rows, survived = [], 0
    for name, path, old, new in DEFECTS:
        if args.only and args.only != name:
            continue
        text = open(path).read()
        if text.count(old) != 1:
            print(f"{name}: the patch no longer applies to {path} (the code moved); update this script")
            return 2
        open(path, "w").write(text.replace(old, new))
        try:
            build = subprocess.run(["cargo", "build", "-q", "-p", "claims-payments-dev", "--bin", "claims-payments-dev"],
                                   env=env, capture_output=True, text=True)
            if build.returncode != 0:
                print(f"{name}: does not build:\n{build.stderr[-2000:]}")
                return 2
            started = time.time()
            run = subprocess.run(["target/debug/claims-payments-dev", "dst", "--seed", "1", "--seeds", str(args.seeds),
                                  "--messages", str(args.messages), "--http-intents", str(args.http_intents)],
                                 env=env, capture_output=True, text=True)
        finally:
            subprocess.run(["git", "checkout", "--", path], check=True)
        failed = re.search(r"seed (\d+) FAILED", run.stdout)
        invariant = re.search(r"invariant: ([a-z0-9-]+)", run.stdout)
        if failed:
            n = int(failed.group(1))
            rows.append((name, f"caught at seed {n} ({n} seed(s))", invariant.group(1) if invariant else "?"))
        else:
            survived += 1
            rows.append((name, f"SURVIVED {args.seeds} seeds", "-"))
        print(f"{name}: {rows[-1][1]}; invariant {rows[-1][2]} ({time.time() - started:.0f} s)", flush=True)
    print()
    print("| planted defect | seeds to failure | invariant |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} |")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
