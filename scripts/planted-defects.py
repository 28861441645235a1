#!/usr/bin/env python3
"""Planted defects: each is a small patch to the product that breaks one guarantee. For
each, this script applies it, builds the development binary, runs the deterministic
simulator (`claims-payments-dev dst`) for up to --seeds seeds, reports the first seed
that fails (and the invariant), and restores the file. A defect that survives every seed
means the simulator misses a fault or an invariant.

    python3 scripts/planted-defects.py [--seeds 1000] [--messages 60] [--only NAME] [--release]
    python3 scripts/planted-defects.py --check

`--check` (CI) only applies every patch and type-checks the product with them
(`cargo check` of the product, which checks the engine with it), patches that touch
different code together, without running the
simulator: it fails when a patch no longer matches the code or no longer builds, so the
list cannot rot unnoticed as the code moves. Each file is written back as it was found.

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
# The guarantee itself: most defects are planted in the engine crate.
ENGINE = "crates/claims-payments-engine/src"
DEFECTS = [
    ("resend-after-the-key-window", f"{ENGINE}/bank/mod.rs",
     "if !window.key_window_open(self.ambient.now()) {", "if false {"),
    ("bank-key-from-the-attempt", f"{ENGINE}/consumer/mod.rs",
     "bank.pay(&payment.idempotency_key, &body, window)",
     "bank.pay(&crate::domain::IdempotencyKey::for_payout(None, crate::domain::ClaimId::parse(&a.id.to_string()).unwrap()), &body, window)"),
    ("an-error-for-a-duplicate", f"{ENGINE}/consumer/outcome.rs",
     "            Outcome::Conflict { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }",
     "            Outcome::Conflict { .. }\n                | Outcome::Duplicate { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }"),
    ("purge-removes-in-progress-records", f"{SRC}/functions/purge.rs",
     "store.purge_expired(now, BATCH)", "store.purge_expired(now + time::Duration::days(3650), BATCH)"),
    ("settle-from-a-failed-lookup", f"{ENGINE}/reconcile/settle.rs",
     "Lookup::Unknown { reason } => Finding::Unknown { reason },",
     "Lookup::Unknown { .. } => judge(p, &[]),"),
    ("a-lost-bank-answer-read-as-paid", f"{ENGINE}/bank/mod.rs",
     "            Err(e) => {\n                return Answer::Retry {\n                    error: self.transport_failure(e),\n                    after: None,\n                }\n            }\n        };\n        self.clock.note(",
     "            Err(_) => {\n                return Answer::Done(PayoutOutcome::Paid { payment_id: \"unknown\".into() })\n            }\n        };\n        self.clock.note("),
    ("2xx-when-the-finalize-failed", f"{ENGINE}/consumer/mod.rs",
     "                Ok(Progress::Deferred)\n            }\n            Err(e) => Err(e.into()),",
     "                Ok(Progress::Deferred)\n            }\n            Err(_) => Ok(Progress::Done(outcome)),"),
    ("complete-a-poison-message", f"{ENGINE}/consumer/outcome.rs",
     "            Outcome::Conflict { .. }\n                | Outcome::InvalidMessage { .. }\n                | Outcome::RetryLater { .. }\n                | Outcome::StoreFailure { .. }\n        )\n    }",
     "            Outcome::Conflict { .. }\n                | Outcome::RetryLater { .. }\n                | Outcome::StoreFailure { .. }\n        )\n    }"),
    ("a-bank-failure-read-as-a-refusal", f"{ENGINE}/bank/answer.rs",
     "        400 | 402 => Answer::Done(PayoutOutcome::Rejected {",
     "        400 | 402 | 503 => Answer::Done(PayoutOutcome::Rejected {"),
    ("another-payload-taken-for-a-business-duplicate", f"{ENGINE}/consumer/decide.rs",
     "    if payment.payload_hash != a.hash {\n        return OnPayment::Finish(Outcome::Conflict {",
     "    if false && payment.payload_hash != a.hash {\n        return OnPayment::Finish(Outcome::Conflict {"),
    ("retry-a-refusal-forever", f"{ENGINE}/consumer/decide.rs",
     "        PayoutOutcome::Rejected { reason, .. } => (\n            PaymentStatus::Rejected,",
     "        PayoutOutcome::Rejected { reason, .. } => return AfterPayout::Release { reason },\n        #[allow(unreachable_patterns)]\n        PayoutOutcome::Rejected { reason, .. } => (\n            PaymentStatus::Rejected,"),
]


def patched(defects):
    """Applies `defects` one after another; returns {path: original text}, or raises
    ValueError naming the first patch whose text is not found exactly once."""
    originals = {}
    try:
        for name, path, old, new in defects:
            text = open(path).read()
            originals.setdefault(path, text)
            if text.count(old) != 1:
                raise ValueError(f"{name}: the patch no longer applies to {path} (the code moved); update this script")
            open(path, "w").write(text.replace(old, new))
    except BaseException:
        restore(originals)
        raise
    return originals


def restore(originals):
    for path, text in originals.items():
        open(path, "w").write(text)


def batches(defects):
    """Groups the defects so that each group applies at once: every patch still finds its
    text once the others of its group are in, and leaves theirs intact."""
    groups = []  # (defects, {path: text with them applied})
    for defect in defects:
        name, path, old, new = defect
        for members, texts in groups:
            text = texts.get(path) or open(path).read()
            if text.count(old) != 1:
                continue
            after = text.replace(old, new)
            if all(after.count(d[3]) >= 1 for d in members if d[1] == path):
                members.append(defect)
                texts[path] = after
                break
        else:
            groups.append(([defect], {path: open(path).read().replace(old, new)}))
    return [members for members, _ in groups]


def cargo_check(env):
    return subprocess.run(["cargo", "check", "--locked", "-q", "-p", "claims-payments", "--lib"],
                          env=env, capture_output=True, text=True)


def check(env):
    """Every patch applies to the code as it is, and the product builds with it."""
    for defect in DEFECTS:
        try:
            restore(patched([defect]))
        except ValueError as e:
            print(e)
            return 2
    failed = []
    for group in batches(DEFECTS):
        names = [d[0] for d in group]
        originals = patched(group)
        try:
            built = cargo_check(env)
        finally:
            restore(originals)
        if built.returncode == 0:
            print(f"builds with: {', '.join(names)}", flush=True)
            continue
        # Which of them: one at a time.
        for defect in group:
            originals = patched([defect])
            try:
                alone = cargo_check(env)
            finally:
                restore(originals)
            if alone.returncode != 0:
                failed.append(defect[0])
                print(f"{defect[0]}: does not build:\n{alone.stderr[-2000:]}")
    if failed:
        print(f"planted defects that no longer build: {', '.join(failed)}; update this script")
        return 2
    print(f"all {len(DEFECTS)} planted defects apply and build")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=60)
    ap.add_argument("--http-intents", type=int, default=8)
    ap.add_argument("--only")
    ap.add_argument("--release", action="store_true", help="build and run the simulator in release mode")
    ap.add_argument("--check", action="store_true",
                    help="only apply every patch and type-check the product (CI), without running the simulator")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    env = dict(os.environ, RUST_LIB_BACKTRACE="0")
    if args.check:
        return check(env)
    profile = ["--release"] if args.release else []
    binary = f"target/{'release' if args.release else 'debug'}/claims-payments-dev"
    rows, survived = [], 0
    for defect in DEFECTS:
        name = defect[0]
        if args.only and args.only != name:
            continue
        try:
            originals = patched([defect])
        except ValueError as e:
            print(e)
            return 2
        try:
            build = subprocess.run(["cargo", "build", "-q", *profile, "-p", "claims-payments-dev", "--bin", "claims-payments-dev"],
                                   env=env, capture_output=True, text=True)
            if build.returncode != 0:
                print(f"{name}: does not build:\n{build.stderr[-2000:]}")
                return 2
            started = time.time()
            run = subprocess.run([binary, "dst", "--seed", "1", "--seeds", str(args.seeds),
                                  "--messages", str(args.messages), "--http-intents", str(args.http_intents)],
                                 env=env, capture_output=True, text=True)
        finally:
            restore(originals)
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
