#!/usr/bin/env bash
# The browser tests of web/ (the Angular payment page and its idempotent client) against
# the real `claims-payments serve` and the sandbox bank, each a separate process:
# 1. double click, a dropped answer, a bank outage (503), one payment and one payout
#    (HTTP_AUTH=functionkey, the local default);
# 2. signed in: a second `serve` with HTTP_AUTH=appservice behind web/e2e/swa-standin.mjs
#    (a local stand-in for Static Web Apps' sign-in and principal forwarding); two payers
#    and a reader, each sees and replays only their own keys, a user without
#    Payments.Pay is refused.
# Installs what it needs: Debian's chromium (no browser download) and web/'s npm packages
# (`--install-only` does only that, as .ci/run does while Rust builds).
set -euo pipefail
cd "$(dirname "$0")/.."
INSTALL_ONLY=0
if [[ "${1:-}" == --install-only ]]; then INSTALL_ONLY=1; shift; fi
export RUST_LIB_BACKTRACE=0

if [[ ! -x /usr/bin/chromium ]]; then
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
# `npm ci` starts from an empty node_modules each time; skip it when node_modules was
# installed from this very lockfile.
lock_sum=$(sha256sum web/package-lock.json | cut -d' ' -f1)
if [[ "$(cat web/node_modules/.installed-from 2>/dev/null || true)" != "$lock_sum" ]]; then
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >web/node_modules/.installed-from
fi
[[ $INSTALL_ONLY -eq 0 ]] || exit 0

BIN=$(realpath "${1:-target/debug/claims-payments}")
# The sandbox bank is a dev tool, in the binary beside the product's.
DEV_BIN=$(realpath "${2:-$(dirname "$BIN")/claims-payments-dev}")

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$DEV_BIN" sandbox-bank >"$work/bank.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^ready$' "$work/bank.out" 2>/dev/null && break; sleep 0.1; done
bank_url=$(sed -n 's/^BANK_API_URL=//p' "$work/bank.out")
[[ -n "$bank_url" ]] || { echo "the sandbox bank did not start:"; cat "$work/bank.out"; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A retry budget of one request: the sandbox bank's scripted 503s carry Retry-After: 1,
# which the service honours, so each page request meets exactly one of them and the
# outage reaches the page as 503 (the deployed budget of 60 s would absorb it).
FUNCTIONS_CUSTOMHANDLER_PORT=$port PAYMENTS_SQLITE_PATH="$work/payments.db" BANK_API_URL="$bank_url" \
  BANK_TIMEOUT_MS=1000 RETRY_BUDGET_MS=1000 LOG_FORMAT=text "$BIN" serve >"$work/serve.log" 2>&1 &
pids+=($!)
python3 - "$port" <<'PY'
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
PY

export SERVICE_URL="http://127.0.0.1:$port"
export BANK_CONTROL_URL="$bank_url/_control/fail-next"
export BANK_PAYOUTS_URL="$bank_url/_control/payouts"
export E2E_BANK_FAILURES=2
export LEDGER_CHECK_CMD="PAYMENTS_SQLITE_PATH='$work/payments.db' '$BIN' ledger --json --limit 100000 | python3 -c 'import json,sys; print(sum(1 for l in sys.stdin if json.loads(l)[\"claimId\"] == \"{claimId}\"))'"
if ! (cd web && npm run --silent e2e); then
  echo "== serve log (tail)"; tail -n 40 "$work/serve.log"
  exit 1
fi

echo "== signed in: serve with HTTP_AUTH=appservice behind the Static Web Apps stand-in"
port2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
FUNCTIONS_CUSTOMHANDLER_PORT=$port2 PAYMENTS_SQLITE_PATH="$work/payments-signed-in.db" BANK_API_URL="$bank_url" \
  HTTP_AUTH=appservice LOG_FORMAT=text "$BIN" serve >"$work/serve-signed-in.log" 2>&1 &
pids+=($!)
python3 - "$port2" <<'PY'
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
PY
export SERVICE_URL="http://127.0.0.1:$port2"
export LEDGER_CHECK_CMD="PAYMENTS_SQLITE_PATH='$work/payments-signed-in.db' '$BIN' ledger --json --limit 100000 | python3 -c 'import json,sys; print(sum(1 for l in sys.stdin if json.loads(l)[\"claimId\"] == \"{claimId}\"))'"
if ! (cd web && npm run --silent e2e:signed-in); then
  echo "== serve (HTTP_AUTH=appservice) log (tail)"; tail -n 40 "$work/serve-signed-in.log"
  exit 1
fi
