#!/usr/bin/env bash
# Offline validation of the deployment side: Bicep and the three parameter files
# (public = infra/main.bicepparam, private = infra/main.private.bicepparam, the
# production one, landingzone = infra/main.landingzone.bicepparam, production in
# an Azure landing zone), each with both store kinds (storeKind cosmos, as the
# files are committed, and postgres, the same file with storeKind = 'postgres'),
# checkov on each profile and store with its values rendered into the Bicep, the
# landing-zone rules (NSGs, nothing of the platform team's deployed twice, private
# monitoring, diagnostic settings, signed-in callers) and the store's wiring
# (scripts/check_profile.py), the Cosmos container contract, the package layout,
# the settings, timing and alerts contracts (every alert has its heading in
# docs/runbook.md), and the documentation's line lengths and links (scripts/check_docs.py).
#
#   bash scripts/check-infra.sh [--binary PATH]
#   bash scripts/check-infra.sh --install-only   (the tools below, nothing checked)
#
# Run from anywhere; needs python3 (3.11) with venv and pip, and PyPI the first
# time (tools are installed into .venv-infra from scripts/requirements-infra.txt).
# Without --binary the package is assembled around a stand-in ELF executable and
# checked statically; with --binary (a real claims-payments build) the packaged
# binary is also started and every function folder must be a route it serves.
# Checks marked "self-test" feed a deliberately broken input to a checker and
# pass only if the checker goes red, so no check can silently pass everything.
# The last line is "N passed, M failed"; the exit code is 1 if anything failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

REAL_BINARY=""
INSTALL_ONLY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) [[ $# -ge 2 ]] || { echo "--binary needs a path" >&2; exit 2; }; REAL_BINARY="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

VENV="$ROOT/.venv-infra"
PY="$VENV/bin/python"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-infra.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
PASSED=0
FAILED=0
N=0
LAST_OK=0

# check NAME CMD...: passes when CMD exits 0; prints CMD's output only on failure.
check() {
  local name="$1"; shift
  N=$((N + 1))
  local log="$WORK/check-$N.log"
  if "$@" >"$log" 2>&1; then
    PASSED=$((PASSED + 1)); LAST_OK=1; echo "PASS  $name"
  else
    FAILED=$((FAILED + 1)); LAST_OK=0; echo "FAIL  $name"; sed 's/^/      /' "$log"
  fi
}

# expect_red NAME REGEX CMD...: self-test; passes only when CMD fails and its
# output matches REGEX (red for the right reason, not because something else broke).
expect_red() {
  local name="$1" reason="$2"; shift 2
  N=$((N + 1))
  local log="$WORK/check-$N.log"
  if "$@" >"$log" 2>&1; then
    FAILED=$((FAILED + 1)); echo "FAIL  $name (the checker accepted a broken input)"; sed 's/^/      /' "$log"
  elif grep -Eq -- "$reason" "$log"; then
    PASSED=$((PASSED + 1)); echo "PASS  $name"
  else
    FAILED=$((FAILED + 1)); echo "FAIL  $name (failed, but not with /$reason/)"; sed 's/^/      /' "$log"
  fi
}

echo "== tools (.venv-infra)"
if [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV"
fi
want="$(sha256sum scripts/requirements-infra.txt | cut -d' ' -f1)"
if [[ "$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)" != "$want" ]]; then
  "$VENV/bin/pip" install --disable-pip-version-check -q -r scripts/requirements-infra.txt
  echo "$want" >"$VENV/.requirements.sha256"
fi
"$PY" -c 'import sys, importlib.metadata as m; print("python", sys.version.split()[0], "| checkov", m.version("checkov"), "| pycep-parser", m.version("pycep-parser"))'
[[ $INSTALL_ONLY -eq 0 ]] || exit 0

echo "== (a) Bicep parses (pycep)"
mapfile -t BICEP_FILES < <(find infra -name '*.bicep' | sort)
[[ ${#BICEP_FILES[@]} -gt 0 ]] || { echo "no .bicep files under infra/" >&2; exit 1; }
for f in "${BICEP_FILES[@]}"; do
  check "parse $f" "$PY" -c '
import sys
from pathlib import Path
from pycep import BicepParser
try:
    BicepParser().parse(file_path=Path(sys.argv[1]))
except Exception as exc:  # lark reports UnexpectedToken/UnexpectedCharacters with line and column
    sys.exit(f"{sys.argv[1]}: {type(exc).__name__}: {str(exc).strip()[:1500]}")
' "$f"
done

# The deployment profiles: one parameter file each.
#   public      = infra/main.bicepparam              (development and evaluation)
#   private     = infra/main.private.bicepparam      (production, its own network)
#   landingzone = infra/main.landingzone.bicepparam  (production in a landing zone)
PROFILES=(public private landingzone)
declare -A PARAM_FILE=([public]=infra/main.bicepparam [private]=infra/main.private.bicepparam [landingzone]=infra/main.landingzone.bicepparam)
# The store kinds (storeKind): every profile is checked with each.
STORES=(cosmos postgres)

# store_file PROFILE STORE: the profile's parameter file with storeKind set to STORE
# (a copy in $WORK; what an operator gets by editing that one line). Prints its path.
store_file() {
  local out="$WORK/${1}-${2}.bicepparam"
  if [[ ! -f "$out" ]]; then
    sed "s#^param storeKind = .*#param storeKind = '$2'#" "${PARAM_FILE[$1]}" >"$out"
    grep -q "^param storeKind = '$2'\$" "$out" || { echo "${PARAM_FILE[$1]} sets no storeKind" >&2; return 1; }
  fi
  echo "$out"
}

# check_param_file FILE: the file uses main.bicep, sets only declared parameters with
# values of the right type within @allowed/@min/@max, sets every parameter that has no
# default, and feeds @secure() parameters only from the environment (never a literal).
check_param_file() {
  "$PY" - "$1" <<'PY'
import re, sys
from pathlib import Path
from pycep import BicepParser

path = Path(sys.argv[1])
params = BicepParser().parse(file_path=Path("infra/main.bicep"))["parameters"]
text = path.read_text()
if not re.search(r"^using\s+'main\.bicep'\s*$", text, re.M):
    sys.exit(f"{path} must start with: using 'main.bicep'")

ENV = re.compile(r"readEnvironmentVariable\(\s*'([A-Z0-9_]+)'\s*(?:,\s*'((?:[^'\\]|\\.)*)'\s*)?\)")

def literal(raw):
    raw = raw.strip()
    if raw in ("true", "false"):
        return raw == "true", "bool"
    if re.fullmatch(r"-?\d+", raw):
        return int(raw), "int"
    m = re.fullmatch(r"'((?:[^'\\]|\\.)*)'", raw)
    if m:
        return m.group(1), "string"
    m = ENV.fullmatch(raw)
    if m:  # decided at deployment; only its default (if any) can be checked here
        return m.group(2), "env"
    sys.exit(f"unsupported value in {path} (only literals and readEnvironmentVariable are checked): {raw}")

errors, assigned = [], set()
for name, raw in re.findall(r"^param\s+(\w+)\s*=\s*(.+?)\s*$", text, re.M):
    assigned.add(name)
    if name not in params:
        errors.append(f"{name}: not a parameter of main.bicep")
        continue
    value, kind = literal(raw)
    decl = params[name]
    decorators = {d["type"]: d.get("argument") for d in decl.get("decorators", [])}
    if "secure" in decorators and kind != "env":
        errors.append(f"{name}: a @secure() parameter must come from readEnvironmentVariable, never a literal in a file")
    if kind == "env":
        if decl["type"] != "string":
            errors.append(f"{name}: readEnvironmentVariable gives a string, the parameter is {decl['type']}")
        if value is None:
            continue
        kind = "string"
    if decl["type"] != kind:
        errors.append(f"{name}: {kind} value for a {decl['type']} parameter")
    for t, arg in decorators.items():
        if t == "allowed" and value not in arg:
            errors.append(f"{name}: {value!r} not in @allowed {arg}")
        if t == "min_value" and value < int(arg):
            errors.append(f"{name}: {value} below @minValue({arg})")
        if t == "max_value" and value > int(arg):
            errors.append(f"{name}: {value} above @maxValue({arg})")
        if t == "min_length" and len(value) < int(arg):
            errors.append(f"{name}: shorter than @minLength({arg})")
        if t == "max_length" and len(value) > int(arg):
            errors.append(f"{name}: longer than @maxLength({arg})")
missing = [n for n, d in params.items() if d.get("default") is None and n not in assigned]
if missing:
    errors.append(f"parameters without default and not set: {', '.join(missing)}")
if errors:
    sys.exit("\n".join(f"{path}: {e}" for e in errors))
print(f"{path}: {len(assigned)} parameters set, all declared and within their constraints")
PY
}
for profile in "${PROFILES[@]}"; do
  check "${PARAM_FILE[$profile]} ($profile) uses main.bicep, sets only declared params within their constraints, secrets only from the environment" \
    check_param_file "${PARAM_FILE[$profile]}"
done
literal_secret() {
  sed "s#^param bankApiKey = .*#param bankApiKey = 'not-a-real-key'#" "${PARAM_FILE[private]}" >"$WORK/literal-secret.bicepparam"
  check_param_file "$WORK/literal-secret.bicepparam"
}
expect_red "self-test: a secret written as a literal in a parameter file is reported" "bankApiKey: a @secure\(\) parameter must come from readEnvironmentVariable" literal_secret

# check_production FILE: what production cannot do without. Pure text checks on the
# parameter file, so a missing receiver is caught before anyone deploys.
check_production() {
  "$PY" - "$1" <<'PY'
import re, sys
from pathlib import Path

path = Path(sys.argv[1])
values = dict(re.findall(r"^param\s+(\w+)\s*=\s*(.+?)\s*$", path.read_text(), re.M))
errors = []
def want(name, expected, why):
    if values.get(name) != expected:
        errors.append(f"{name} must be {expected} ({why}), is {values.get(name)}")
want("networkProfile", "'private'", "production runs in the private network profile")
want("planZoneRedundant", "true", "zone-redundant plan")
want("cosmosZoneRedundant", "true", "zone-redundant Cosmos DB; fixed when the account is created")
want("storageSkuName", "'Standard_ZRS'", "a zone-redundant plan needs zone-redundant host storage")
want("cosmosDeleteLock", "true", "the payment ledger is permanent")
# storeKind postgres (checked whatever the file's storeKind: switching it must not be the
# moment production loses its standby or its lock).
want("postgresHighAvailability", "'ZoneRedundant'", "PostgreSQL with a standby in another zone")
if values.get("postgresSkuTier") not in ("'GeneralPurpose'", "'MemoryOptimized'"):
    errors.append(f"postgresSkuTier must be 'GeneralPurpose' or 'MemoryOptimized' (high availability is not offered on Burstable), is {values.get('postgresSkuTier')}")
want("postgresDeleteLock", "true", "the payment ledger is permanent")
if not re.fullmatch(r"'(cosmos|postgres)'", values.get("storeKind", "")):
    errors.append(f"storeKind must be set in the file, to 'cosmos' or 'postgres' (a deployment decides its store once), is {values.get('storeKind')}")
# Alerts must reach someone: an existing action group, a literal address, or an address
# the deployment cannot start without (readEnvironmentVariable with no default).
group = values.get("alertActionGroupId", "''")
email = values.get("alertEmailAddress", "''")
has_group = re.fullmatch(r"'/subscriptions/[^']+/providers/microsoft\.insights/actiongroups/[^']+'", group, re.I) \
    or re.fullmatch(r"readEnvironmentVariable\(\s*'[A-Z0-9_]+'\s*\)", group)
has_email = re.fullmatch(r"'[^'@\s]+@[^'@\s]+\.[^'@\s]+'", email) or re.fullmatch(r"readEnvironmentVariable\(\s*'[A-Z0-9_]+'\s*\)", email)
if not (has_group or has_email):
    errors.append("alerts would reach no one: set alertActionGroupId to an action group id, or alertEmailAddress to an "
                  "address or to readEnvironmentVariable('NAME') without a default (the deployment then needs it)")
if errors:
    sys.exit("\n".join(f"{path}: {e}" for e in errors))
print(f"{path}: private profile, zone-redundant plan/Cosmos/PostgreSQL (HA)/storage, ledger locks, storeKind {values['storeKind']}, alerts reach {'an action group' if has_group else 'an e-mail receiver'}")
PY
}
for profile in private landingzone; do
  check "production (${PARAM_FILE[$profile]}): private profile, zone redundancy (plan, Cosmos DB, PostgreSQL HA), ZRS storage, ledger delete locks, storeKind set, alerts reach a receiver" \
    check_production "${PARAM_FILE[$profile]}"
done
no_receiver() {
  sed "s#^param alertEmailAddress = .*#param alertEmailAddress = readEnvironmentVariable('ALERT_EMAIL_ADDRESS', '')#" \
    "${PARAM_FILE[private]}" >"$WORK/no-receiver.bicepparam"
  check_production "$WORK/no-receiver.bicepparam"
}
expect_red "self-test: a production file whose alerts reach no one is reported" "alerts would reach no one" no_receiver
no_standby() {
  sed "s#^param postgresHighAvailability = .*#param postgresHighAvailability = 'Disabled'#" \
    "${PARAM_FILE[landingzone]}" >"$WORK/no-standby.bicepparam"
  check_production "$WORK/no-standby.bicepparam"
}
expect_red "self-test: a production file without PostgreSQL zone-redundant high availability is reported" "postgresHighAvailability must be 'ZoneRedundant'" no_standby
for profile in public; do
  check "${PARAM_FILE[$profile]} ($profile) sets storeKind to cosmos or postgres" grep -Eq "^param storeKind = '(cosmos|postgres)'\$" "${PARAM_FILE[$profile]}"
done

echo "== (b) checkov (offline, bicep), per profile"
# checkov reads no .bicepparam file, evaluates no expression and scans every module
# file on its own, so each profile's values are first rendered into a copy of infra/.
cat >"$WORK/render_profile.py" <<'PY'
"""Render infra/ for one parameter file, so checkov sees that profile's values.

checkov's Bicep support substitutes a parameter's *default* where a property names
the parameter directly, but it reads no .bicepparam file, evaluates no expression
(`cond ? 'a' : 'b'`), scans each module file on its own, and checks a conditional
resource (`= if (c) {`) with an empty body. So this copies every .bicep file and:
  - writes the parameter file's values as main.bicep's defaults;
  - writes, as a module parameter's default, the value main.bicep passes when it can
    be evaluated from literals, parameters and variables (==, !=, !, &&, ||, ?:,
    empty()) and every call of that module agrees; anything else (resource outputs,
    interpolation) stays as it is;
  - scans conditional resources as deployed (drops the `if (...)`).
@secure() parameters are never rendered. Modules therefore take the security-relevant
values (publicNetworkAccess, firewall defaults, zone redundancy) as plain parameters
that main.bicep computes from networkProfile.

usage: render_profile.py INFRA_DIR PARAM_FILE OUT_DIR
"""
import re
import shutil
import sys
from pathlib import Path

from pycep import BicepParser
from pycep.transformer import BicepElement

UNSET = object()
CONDITIONAL_RESOURCE = re.compile(r"^(resource\s+\w+\s+'[^']+'\s*=\s*)if\s*\(.*\)\s*\{[ \t]*$", re.M)


class Unknown(Exception):
    pass


def param_file_values(path):
    values = {}
    for name, raw in re.findall(r"^param\s+(\w+)\s*=\s*(.+?)\s*$", path.read_text(), re.M):
        raw = raw.strip()
        if raw in ("true", "false"):
            values[name] = raw == "true"
        elif re.fullmatch(r"-?\d+", raw):
            values[name] = int(raw)
        elif m := re.fullmatch(r"'((?:[^'\\]|\\.)*)'", raw):
            values[name] = m.group(1).replace("\\'", "'").replace("\\\\", "\\")
        elif m := re.fullmatch(r"readEnvironmentVariable\(\s*'([^']+)'\s*(?:,\s*'((?:[^'\\]|\\.)*)'\s*)?\)", raw):
            values[name] = m.group(2) if m.group(2) is not None else UNSET  # known only at deployment
        else:
            sys.exit(f"{path}: cannot read the value of {name}: {raw}")
    return values


class Evaluator:
    def __init__(self, params, variables, values):
        self.params, self.variables, self.values, self.memo = params, variables, values, {}

    def identifier(self, name):
        if name in self.values:
            if self.values[name] is UNSET:
                raise Unknown(name)
            return self.values[name]
        if name in self.params:
            default = self.params[name].get("default")
            if isinstance(default, (bool, int)) or (isinstance(default, str) and not isinstance(default, BicepElement) and "${" not in default):
                return default
            raise Unknown(name)
        if name in self.variables:
            if name not in self.memo:
                self.memo[name] = self.eval(self.variables[name]["value"])
            return self.memo[name]
        raise Unknown(name)

    def eval(self, node):
        if isinstance(node, (bool, int)):
            return node
        if isinstance(node, BicepElement):
            return self.identifier(str(node))
        if isinstance(node, str):
            if "${" in node:
                raise Unknown(node)
            return node
        if isinstance(node, dict) and "operator" in node:
            kind, args = node["operator"]["type"], node["operator"]["operands"]
            if kind == "conditional":
                return self.eval(args["true_value"] if self.eval(args["condition"]) else args["false_value"])
            if kind == "not":
                return not self.eval(args["bool_value"])
            if kind in ("equals", "not_equals"):
                equal = self.eval(args["operand_1"]) == self.eval(args["operand_2"])
                return equal if kind == "equals" else not equal
            if kind == "and":
                return self.eval(args["operand_1"]) and self.eval(args["operand_2"])
            if kind == "or":
                return self.eval(args["operand_1"]) or self.eval(args["operand_2"])
            raise Unknown(kind)
        if isinstance(node, dict) and "function" in node and node["function"]["type"] == "empty":
            return len(self.eval(node["function"]["parameters"]["item_to_test"])) == 0
        raise Unknown(repr(node)[:80])


def literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def secure_params(parsed):
    return {n for n, d in parsed["parameters"].items() if any(x["type"] == "secure" for x in d.get("decorators", []))}


def set_defaults(path, values, secure):
    text, done = path.read_text(), []
    for name, value in values.items():
        if name in secure:
            continue
        pattern = re.compile(rf"^(param\s+{name}\s+(?:string|int|bool))(?:\s*=\s*[^\n]*)?$", re.M)
        text, n = pattern.subn(lambda m: f"{m.group(1)} = {literal(value)}", text)
        if n == 1:
            done.append(name)
    path.write_text(text)
    return done


def main():
    infra, param_file, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    if out.exists():
        shutil.rmtree(out)
    unwrapped = 0
    for src in infra.rglob("*.bicep"):
        dst = out / src.relative_to(infra)
        dst.parent.mkdir(parents=True, exist_ok=True)
        text, n = CONDITIONAL_RESOURCE.subn(r"\1{", src.read_text())
        unwrapped += n
        dst.write_text(text)

    parsed = BicepParser().parse(file_path=infra / "main.bicep")
    params, variables = parsed["parameters"], parsed.get("variables", {})
    values = param_file_values(param_file)
    stray = sorted(set(values) - set(params))
    if stray:
        sys.exit(f"{param_file}: not parameters of main.bicep: {stray}")
    known = {n: v for n, v in values.items() if v is not UNSET}
    rendered = set_defaults(out / "main.bicep", known, secure_params(parsed))
    print(f"rendered {param_file}: main.bicep {len(rendered)} parameters; {unwrapped} conditional resources scanned as deployed")

    evaluator, calls = Evaluator(params, variables, values), {}
    for mod in parsed.get("modules", {}).values():
        if mod.get("type") != "local" or "loop_type" in mod["config"]:
            continue
        config = mod["config"].get("config", mod["config"])  # `= if (cond) {...}` nests the body
        for pname, node in config.get("params", {}).items():
            try:
                value = evaluator.eval(node)
            except Unknown:
                value = UNSET
            calls.setdefault(mod["detail"]["path"], {}).setdefault(pname, []).append(value)
    for target, by_param in sorted(calls.items()):
        agreed = {p: v[0] for p, v in by_param.items()
                  if UNSET not in v and all(x == v[0] and type(x) is type(v[0]) for x in v)}
        done = set_defaults(out / target, agreed, secure_params(BicepParser().parse(file_path=infra / target)))
        if done:
            print(f"  {target}: " + ", ".join(f"{n}={agreed[n]!r}" for n in sorted(done)))


if __name__ == "__main__":
    main()
PY

# run_checkov PROFILE [PARAM_FILE [LABEL]]: render, scan, and judge against the profile's
# accepted findings in infra/checkov-skips.txt (they hold for both store kinds). Prints
# every passed check and every accepted failure with its reason.
# scan_checkov PARAM_FILE LABEL: render and scan only (what takes the time), so that
# several scans can run at once; run_checkov then judges a finished scan.
scan_checkov() {
  local params="$1" label="$2"
  local out="$WORK/checkov-$label.json" rendered="$WORK/rendered-$label"
  "$PY" "$WORK/render_profile.py" infra "$params" "$rendered" >"$WORK/render-$label.log" 2>&1 || return 1
  # checkov exits 1 when a check fails; the verdict is ours (accepted findings), so ignore its code.
  BC_SKIP_MAPPING=TRUE "$VENV/bin/checkov" -d "$rendered" --framework bicep --skip-download --compact \
    -o json >"$out" 2>"$WORK/checkov-$label.err" || true
  touch "$WORK/checkov-$label.scanned"
}
run_checkov() {
  local profile="$1" params="${2:-${PARAM_FILE[$1]}}" label="${3:-$1}"
  local out="$WORK/checkov-$label.json"
  if [[ ! -e "$WORK/checkov-$label.scanned" ]]; then
    scan_checkov "$params" "$label" || { cat "$WORK/render-$label.log"; return 1; }
  fi
  "$PY" - "$out" infra/checkov-skips.txt "$profile" <<'PY'
import json, re, sys
from pathlib import Path

out, skips_file, profile = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
try:
    data = json.loads(out.read_text())
except json.JSONDecodeError:
    sys.exit("checkov produced no JSON:\n" + out.read_text()[:2000] + Path(str(out).replace(".json", ".err")).read_text()[-2000:])
reports = data if isinstance(data, list) else [data]
if not reports or all(r.get("check_type") != "bicep" for r in reports):
    sys.exit(f"checkov reported no bicep results: {json.dumps(data)[:500]}")
skips, listed = {}, set()
for n, line in enumerate(skips_file.read_text().splitlines(), 1):
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    # CKV_ID applies to every resource; CKV_ID@TYPE.NAME (checkov's resource) to that one only.
    m = re.fullmatch(r"\s*(CKV2?_[A-Z0-9_]+(?:@\S+)?)\s+((?:public|private|landingzone)(?:,(?:public|private|landingzone))*)\s+#\s*(\S.*)", line)
    if not m:
        sys.exit(f"{skips_file}:{n}: expected 'CKV_...[@RESOURCE]  PROFILE[,PROFILE...]  # reason' (public, private, landingzone), got: {line}")
    if m.group(1) in listed:
        sys.exit(f"{skips_file}:{n}: {m.group(1)} listed twice")
    listed.add(m.group(1))
    if profile in m.group(2).split(","):
        skips[m.group(1)] = m.group(3)
failed, passed, errors = [], [], []
for r in reports:
    results = r.get("results", {})
    passed += results.get("passed_checks", [])
    failed += results.get("failed_checks", [])
    errors += results.get("parsing_errors", []) or []
if errors:
    sys.exit(f"checkov could not parse: {errors}")
def accepted_by(c):
    for key in (f"{c['check_id']}@{c['resource']}", c["check_id"]):
        if key in skips:
            return key
    return None
unaccepted = [c for c in failed if accepted_by(c) is None]
stale = sorted(set(skips) - {accepted_by(c) for c in failed})
passed_ids = sorted({c["check_id"] for c in passed}, key=lambda s: int(re.sub(r"\D", "", s)))
print(f"  passed: {len(passed)} results of {len(passed_ids)} checks: " + ", ".join(passed_ids))
for c in sorted(failed, key=lambda c: c["check_id"]):
    if accepted_by(c):
        print(f"  accepted {c['check_id']} {c['resource']}: {c['check_name']}\n           reason: {skips[accepted_by(c)]}")
    else:
        print(f"  FAILED   {c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}")
if stale:
    print(f"  listed for {profile} in {skips_file} but no longer failing (remove them): {', '.join(stale)}")
print(f"  checkov ({profile}): {len(passed)} passed, {len(failed)} failed, {len(failed) - len(unaccepted)} of them accepted, 0 skipped by checkov")
sys.exit(1 if unaccepted or stale else 0)
PY
}
# checkov has no check of its own for Microsoft.DBforPostgreSQL/flexibleServers (its
# PostgreSQL checks are for the retired single server, Microsoft.DBforPostgreSQL/servers);
# the server's contract is checked by scripts/check_profile.py store below.
# The scans first, two at a time (checkov is single-threaded; CI has two cores).
scans=()
for profile in "${PROFILES[@]}"; do
  for store in "${STORES[@]}"; do
    scan_checkov "$(store_file "$profile" "$store")" "$profile-$store" &
    scans+=($!)
    if (( ${#scans[@]} % 2 == 0 )); then wait "${scans[@]: -2}" || true; fi
  done
done
wait "${scans[@]}" 2>/dev/null || true
for profile in "${PROFILES[@]}"; do
  for store in "${STORES[@]}"; do
    params="$(store_file "$profile" "$store")"
    check "checkov, $profile profile, storeKind $store (${PARAM_FILE[$profile]}): no failure outside infra/checkov-skips.txt, every listed one still applies" \
      run_checkov "$profile" "$params" "$profile-$store"
    [[ $LAST_OK -eq 1 ]] && sed 's/^/      /' "$WORK/check-$N.log"
  done
done
public_values_in_private() {
  sed "s#^param networkProfile = .*#param networkProfile = 'public'#" "${PARAM_FILE[private]}" >"$WORK/private-made-public.bicepparam"
  run_checkov private "$WORK/private-made-public.bicepparam"
}
expect_red "self-test: the private profile with public endpoints is reported (rendering reaches checkov)" "FAILED   CKV_AZURE_101 " public_values_in_private

echo "== (b2) landing zone: NSGs, bring-your-own, private monitoring, diagnostic settings, signed-in callers, the store"
# check_profile.py keeps its parses here (by file content), so its many runs parse each file once.
export CHECK_PROFILE_CACHE="$WORK/pycep-cache"
# scripts/check_profile.py decides, per parameter file, which resources are deployed.
check "NSGs (${PARAM_FILE[private]}): every subnet the template creates has one; inbound from the internet denied, only named ports allowed" \
  "$PY" scripts/check_profile.py nsg "${PARAM_FILE[private]}"
for store in "${STORES[@]}"; do
  check "landing zone (${PARAM_FILE[landingzone]}, storeKind $store): no VNet, NSG, NAT gateway, public IP, private DNS zone, workspace, private link scope or action group of its own" \
    "$PY" scripts/check_profile.py landingzone "$(store_file landingzone "$store")"
  for profile in private landingzone; do
    check "private monitoring, diagnostic settings, signed-in callers (${PARAM_FILE[$profile]}, storeKind $store): App Insights through a private link scope only; the store, storage, app, Service Bus, Key Vault to the workspace; App Service Authentication" \
      "$PY" scripts/check_profile.py private "$(store_file "$profile" "$store")"
  done
  check "diagnostic settings and signed-in callers (${PARAM_FILE[public]}, storeKind $store)" "$PY" scripts/check_profile.py everywhere "$(store_file public "$store")"
done
# The store each profile deploys with each storeKind, and only that one (password auth off,
# public access off in the private profiles, zone-redundant HA in production, app settings
# that name the server): scripts/check_profile.py store.
for profile in "${PROFILES[@]}"; do
  for store in "${STORES[@]}"; do
    check "store (${PARAM_FILE[$profile]}, storeKind $store): the $store store alone is deployed and wired to the app" \
      "$PY" scripts/check_profile.py store "$(store_file "$profile" "$store")"
    [[ $LAST_OK -eq 1 ]] && sed 's/^/      /' "$WORK/check-$N.log"
  done
done
# broken_copy NAME: a copy of infra/ to break one thing in; prints its path.
broken_copy() { rm -rf "$WORK/$1" && cp -a infra "$WORK/$1" && echo "$WORK/$1"; }
nsg_removed() {
  local dir; dir=$(broken_copy infra-no-nsg)
  "$PY" - "$dir/modules/network.bicep" <<'PY'
import re, sys
from pathlib import Path
p = Path(sys.argv[1]); t = p.read_text()
t, n = re.subn(r"\n\s*networkSecurityGroup: \{\n\s*id: peNsg\.id\n\s*\}", "", t)
assert n == 1, "could not remove the NSG of snet-pe"
p.write_text(t)
PY
  "$PY" scripts/check_profile.py --infra "$dir" nsg "${PARAM_FILE[private]}"
}
expect_red "self-test: a subnet without its NSG is reported" "subnet snet-pe has no network security group" nsg_removed
nsg_open() {
  local dir; dir=$(broken_copy infra-nsg-open)
  sed -i "0,/sourceAddressPrefix: 'VirtualNetwork'/s//sourceAddressPrefix: 'Internet'/" "$dir/modules/network.bicep"
  "$PY" scripts/check_profile.py --infra "$dir" nsg "${PARAM_FILE[private]}"
}
expect_red "self-test: an NSG rule allowing inbound from the internet is reported" "inbound allowed from the internet" nsg_open
own_network_in_landing_zone() {
  sed "s#^param existingAppSubnetId = .*#param existingAppSubnetId = ''#" "${PARAM_FILE[landingzone]}" >"$WORK/lz-own-vnet.bicepparam"
  "$PY" scripts/check_profile.py landingzone "$WORK/lz-own-vnet.bicepparam"
}
expect_red "self-test: a landing-zone file without the existing subnet (the template would build its VNet) is reported" "deploys its own virtual network: network/vnet" own_network_in_landing_zone
public_app_insights() {
  local dir; dir=$(broken_copy infra-public-appi)
  "$PY" - "$dir/main.bicep" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1]); t = p.read_text()
old = "    retentionInDays: logRetentionDays\n    publicNetworkAccess: publicAccess\n"
assert old in t, "could not find the monitoring module's publicNetworkAccess"
p.write_text(t.replace(old, "    retentionInDays: logRetentionDays\n    publicNetworkAccess: 'Enabled'\n"))
PY
  "$PY" scripts/check_profile.py --infra "$dir" private "${PARAM_FILE[private]}"
}
expect_red "self-test: Application Insights with public ingestion and query in the private profile is reported" "publicNetworkAccessForIngestion is 'Enabled'" public_app_insights
no_private_link_scope() {
  local dir; dir=$(broken_copy infra-no-ampls)
  sed -i "s#^module monitorPrivateLink 'modules/monitor-private-link.bicep' = if (.*) {#module monitorPrivateLink 'modules/monitor-private-link.bicep' = if (false) {#" "$dir/main.bicep"
  grep -q "monitor-private-link.bicep' = if (false)" "$dir/main.bicep" || { echo "could not remove the private link scope"; return 0; }
  "$PY" scripts/check_profile.py --infra "$dir" private "${PARAM_FILE[private]}"
}
expect_red "self-test: the private profile without its Azure Monitor private link scope is reported" "no Azure Monitor private link scope" no_private_link_scope
no_cosmos_diagnostics() {
  local dir; dir=$(broken_copy infra-no-cosmos-diag)
  "$PY" - "$dir/modules/cosmos.bicep" <<'PY'
import re, sys
from pathlib import Path
p = Path(sys.argv[1]); t = p.read_text()
t, n = re.subn(r"resource diagnostics 'Microsoft\.Insights/diagnosticSettings@[^']+' = \{.*?\n\}\n", "", t, flags=re.S)
assert n == 1, "could not remove the Cosmos DB diagnostic setting"
p.write_text(t)
PY
  "$PY" scripts/check_profile.py --infra "$dir" private "${PARAM_FILE[landingzone]}"
}
expect_red "self-test: Cosmos DB without its diagnostic setting is reported" "cosmos.bicep: no diagnostic setting sends account" no_cosmos_diagnostics
no_app_service_auth() {
  local dir; dir=$(broken_copy infra-no-auth)
  sed -i "s#^resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (.*) {#resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (false) {#" "$dir/modules/functionapp.bicep"
  grep -q "config@2024-04-01' = if (false)" "$dir/modules/functionapp.bicep" || { echo "could not remove App Service Authentication"; return 0; }
  "$PY" scripts/check_profile.py --infra "$dir" private "${PARAM_FILE[private]}"
}
expect_red "self-test: the function app without App Service Authentication is reported" "no App Service Authentication" no_app_service_auth
postgres_password_auth() {
  local dir; dir=$(broken_copy infra-pg-password)
  sed -i "s#passwordAuth: 'Disabled'#passwordAuth: 'Enabled'#" "$dir/modules/postgres.bicep"
  grep -q "passwordAuth: 'Enabled'" "$dir/modules/postgres.bicep" || { echo "could not enable password auth"; return 0; }
  "$PY" scripts/check_profile.py --infra "$dir" store "$(store_file public postgres)"
}
expect_red "self-test: a PostgreSQL server with password authentication on is reported" "password authentication must be off" postgres_password_auth
postgres_public_in_private() {
  local dir; dir=$(broken_copy infra-pg-public)
  sed -i "s#^    publicNetworkAccess: publicAccess\$#    publicNetworkAccess: 'Enabled'#" "$dir/main.bicep"
  [[ $(grep -c "publicNetworkAccess: 'Enabled'" "$dir/main.bicep") -ge 1 ]] || { echo "could not open the server"; return 0; }
  "$PY" scripts/check_profile.py --infra "$dir" store "$(store_file landingzone postgres)"
}
expect_red "self-test: PostgreSQL with public network access in a private profile is reported" "postgres, private profile: network.publicNetworkAccess must be 'Disabled'" postgres_public_in_private
postgres_settings_to_cosmos() {
  local dir; dir=$(broken_copy infra-pg-settings)
  sed -i "s#usePostgres ? postgresSettings : cosmosSettings#usePostgres ? cosmosSettings : postgresSettings#" "$dir/modules/functionapp.bicep"
  grep -q "usePostgres ? cosmosSettings" "$dir/modules/functionapp.bicep" || { echo "could not swap the settings"; return 0; }
  "$PY" scripts/check_profile.py --infra "$dir" store "$(store_file private postgres)"
}
expect_red "self-test: app settings that point a postgres deployment at Cosmos DB are reported" "PAYMENTS_STORE is 'cosmos', the file's storeKind is 'postgres'" postgres_settings_to_cosmos
postgres_database_first() {
  local dir; dir=$(broken_copy infra-pg-db-first)
  "$PY" - "$dir/modules/postgres.bicep" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1]); t = p.read_text()
old = "    collation: 'en_US.utf8'\n  }\n  dependsOn: [\n    administrator\n  ]\n"
assert old in t, "could not find the database's dependsOn"
p.write_text(t.replace(old, "    collation: 'en_US.utf8'\n  }\n"))
PY
  "$PY" scripts/check_profile.py --infra "$dir" store "$(store_file public postgres)"
}
expect_red "self-test: a database created before the Entra administrator (owned by azuresu) is reported" "created after the Entra administrator" postgres_database_first

echo "== (c) Cosmos container contract"
# The operators' dead-letter tool: Data Receiver and Data Sender on the queue for the
# operators' group, in every profile (docs/runbook.md, "Dead letters and re-drive").
for profile in "${PROFILES[@]}"; do
  check "operators (${PARAM_FILE[$profile]}): the operators' group has Azure Service Bus Data Receiver and Data Sender on the queue (dead-letters)" \
    "$PY" scripts/check_profile.py operators "${PARAM_FILE[$profile]}"
done
no_sender_grant() {
  local dir="$WORK/infra-no-sender"
  rm -rf "$dir"; cp -r infra "$dir"
  "$PY" - "$dir/modules/rbac.bicep" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
s, n = re.subn(r"\nresource operatorsSender .*?\n}\n", "\n", s, flags=re.S)
assert n == 1, "the sender grant was not found"
open(p, "w").write(s)
PY
  "$PY" scripts/check_profile.py --infra "$dir" operators "${PARAM_FILE[private]}"
}
expect_red "self-test: a profile whose operators' group cannot send (no Data Sender) is reported" "no Azure Service Bus Data Sender" no_sender_grant

check "infra container resource equals infra/cosmos-container.json" "$PY" scripts/check_container_definition.py
broken_container() {
  sed "s#'/claimId'#'/policyId'#" infra/modules/cosmos.bicep >"$WORK/cosmos-broken.bicep"
  grep -q "'/policyId'" "$WORK/cosmos-broken.bicep" || { echo "could not break the partition key"; return 0; }
  "$PY" scripts/check_container_definition.py --bicep "$WORK/cosmos-broken.bicep"
}
expect_red "self-test: a different partition key in Bicep is reported" "partitionKey: bicep .*/policyId" broken_container

echo "== (d) package layout (scripts/package.sh + scripts/check_package.py)"
if [[ -n "$REAL_BINARY" ]]; then
  PKG_BINARY="$REAL_BINARY"
  echo "packaging $REAL_BINARY"
else
  # Stand-in: any Linux x86-64 ELF executable; the static checks look at the layout, not the code.
  PKG_BINARY="$WORK/stand-in-claims-payments"
  cp "$(type -P true)" "$PKG_BINARY"
fi
check "scripts/package.sh assembles dist layout and zip" bash scripts/package.sh --binary "$PKG_BINARY" --out "$WORK/dist"
if [[ -n "$REAL_BINARY" ]]; then
  check "package (zip) incl. route check: the binary serves every function folder" python3 scripts/check_package.py "$WORK/dist/functionapp.zip"
  check "package (directory) incl. route check" python3 scripts/check_package.py "$WORK/dist/functionapp"
else
  check "package (zip), static checks" python3 scripts/check_package.py --static-only "$WORK/dist/functionapp.zip"
  check "package (directory), static checks" python3 scripts/check_package.py --static-only "$WORK/dist/functionapp"
fi

no_exec_bit() {
  rm -rf "$WORK/pkg-noexec" && cp -a "$WORK/dist/functionapp" "$WORK/pkg-noexec"
  chmod a-x "$WORK/pkg-noexec/claims-payments"
  python3 scripts/check_package.py --static-only "$WORK/pkg-noexec"
}
expect_red "self-test: a package whose executable lost its exec bit is reported" "FAIL  claims-payments: file is not executable" no_exec_bit
local_settings_inside() {
  rm -rf "$WORK/pkg-local" && cp -a "$WORK/dist/functionapp" "$WORK/pkg-local"
  cp local.settings.sample.json "$WORK/pkg-local/local.settings.json"
  python3 scripts/check_package.py --static-only "$WORK/pkg-local"
}
expect_red "self-test: a package containing local.settings.json is reported" "FAIL  local or secret files in the package: local.settings.json" local_settings_inside
zip_without_modes() {
  python3 - "$WORK/dist/functionapp.zip" "$WORK/nomode.zip" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w") as dst:
    for info in src.infolist():
        clone = zipfile.ZipInfo(info.filename, info.date_time)
        clone.create_system = 0  # as a Windows zip tool writes it: no Unix mode, no exec bit
        dst.writestr(clone, src.read(info))
PY
  python3 scripts/check_package.py --static-only "$WORK/nomode.zip"
}
expect_red "self-test: a zip without Unix exec bits (Windows-made) is reported" "FAIL  claims-payments: zip entry carries no Unix mode" zip_without_modes

# The route check needs a running handler; a tiny stand-in handler replaces the Rust server
# so the probe logic (start, poll GET /, POST per folder, 404 verdict, kill) is tested here.
cat >"$WORK/standin-handler" <<'PY'
#!/usr/bin/env python3
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

if sys.argv[1:] != ["serve"]:
    sys.exit(f"expected 'serve', got {sys.argv[1:]}")
routes = {r for r in os.environ.get("STANDIN_ROUTES", "").split(",") if r}

class Handler(BaseHTTPRequestHandler):
    def answer(self, code):
        body = b"{}"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.answer(200 if self.path == "/" else 400 if "GET " + self.path in routes else 404)

    def do_POST(self):
        json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.answer(400 if "POST " + self.path in routes else 404)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(os.environ["FUNCTIONS_CUSTOMHANDLER_PORT"])), Handler).serve_forever()
PY
chmod +x "$WORK/standin-handler"
standin_package() {
  bash scripts/package.sh --binary "$WORK/standin-handler" --out "$WORK/standin" --allow-non-elf >/dev/null
}
standin_serves_route() {
  standin_package && STANDIN_ROUTES="POST /ClaimApproved,POST /Reconcile,POST /Purge,POST /api/payments,GET /api/payments/route-probe" python3 scripts/check_package.py --allow-non-elf --startup-timeout 20 "$WORK/standin/functionapp.zip"
}
check "route check: a handler serving every function's route passes (stand-in handler)" standin_serves_route
standin_misses_route() {
  standin_package && STANDIN_ROUTES="POST /Reconcile,POST /Purge,POST /api/payments,GET /api/payments/route-probe" python3 scripts/check_package.py --allow-non-elf --startup-timeout 20 "$WORK/standin/functionapp.zip"
}
expect_red "self-test: a handler answering 404 on POST /ClaimApproved is reported" "FAIL  POST /ClaimApproved answered 404" standin_misses_route

echo "== (e) settings contract (function.json, Bicep app settings, local.settings.sample.json)"
check "app settings (storeKind cosmos and postgres): identity-based connections, every service setting, the store's own and not the other's, nothing Flex forbids; local sample complete" "$PY" - <<'PY'
import json, re, sys
from pathlib import Path
from pycep import BicepParser

REQUIRED = [
    "AzureWebJobsStorage__credential", "AzureWebJobsStorage__clientId", "AzureWebJobsStorage__blobServiceUri",
    "AzureWebJobsStorage__queueServiceUri", "AzureWebJobsStorage__tableServiceUri",
    "CLAIM_APPROVED_QUEUE", "PAYMENTS_STORE", "INBOX_RETENTION_DAYS", "CONSUMER_NAME", "BANK_API_URL", "BANK_API_KEY", "BANK_TIMEOUT_MS",
    "BANK_KEY_WINDOW_HOURS", "RETRY_BUDGET_MS", "LEASE_MS", "INFLIGHT_WAIT_MS", "MAX_DELIVERY_COUNT", "LOG_FORMAT", "RUST_LIB_BACKTRACE",
    "APPLICATIONINSIGHTS_CONNECTION_STRING", "PURGE_SCHEDULE",
]
# Per storeKind: the store's own settings, and none of the other store's.
STORE_SETTINGS = {
    "cosmos": ["COSMOS_ENDPOINT", "COSMOS_DATABASE", "COSMOS_CONTAINER", "COSMOS_MANAGED_IDENTITY_CLIENT_ID"],
    "postgres": ["PAYMENTS_POSTGRES_URL", "PAYMENTS_POSTGRES_AUTH", "PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID"],
}
FIXED = {"LOG_FORMAT": "json", "RUST_LIB_BACKTRACE": "0"}
STORE_FIXED = {"cosmos": {"PAYMENTS_STORE": "cosmos"}, "postgres": {"PAYMENTS_STORE": "postgres", "PAYMENTS_POSTGRES_AUTH": "entra"}}
# Flex Consumption rejects or ignores the platform ones; AzureWebJobsStorage or COSMOS_KEY would be
# secrets; the dev/fault knobs are read only by claims-payments-dev (the product refuses to start with one).
FORBIDDEN = re.compile(r"^(FUNCTIONS_WORKER_RUNTIME|FUNCTIONS_EXTENSION_VERSION|WEBSITE_RUN_FROM_PACKAGE|WEBSITE_CONTENT.*|SCM_DO_BUILD_DURING_DEPLOYMENT|ENABLE_ORYX_BUILD|AzureWebJobsStorage|COSMOS_KEY|PAYMENTS_SQLITE_PATH|PAYMENTS_DEV_.*|PAYMENTS_FAULT_.*)$")
LOCAL_REQUIRED = {
    "AzureWebJobsStorage": None, "FUNCTIONS_WORKER_RUNTIME": "custom", "CLAIM_APPROVED_QUEUE": None,
    "PAYMENTS_STORE": None, "PAYMENTS_SQLITE_PATH": None, "COSMOS_ENDPOINT": None, "COSMOS_DATABASE": None,
    "COSMOS_CONTAINER": None, "COSMOS_KEY": None, "INBOX_RETENTION_DAYS": None, "CONSUMER_NAME": None,
    "BANK_API_URL": None, "BANK_TIMEOUT_MS": None, "BANK_KEY_WINDOW_HOURS": None, "RETRY_BUDGET_MS": None,
    "LEASE_MS": None, "INFLIGHT_WAIT_MS": None, "LOG_FORMAT": None, "RUST_LIB_BACKTRACE": None,
}
errors = []

# What the trigger binding needs, read from function.json rather than assumed.
needed_settings, connections = set(), set()
for fj in sorted(Path("function-app").glob("*/function.json")):
    for b in json.loads(fj.read_text())["bindings"]:
        for value in b.values():
            if isinstance(value, str):
                needed_settings.update(re.findall(r"%([^%]+)%", value))
        if b.get("connection"):
            connections.add(b["connection"])
        if b.get("type") == "serviceBusTrigger" and b.get("dataType") != "binary":
            errors.append(f"{fj}: serviceBusTrigger must use dataType binary (body fields would leak into Metadata)")

bicep = BicepParser().parse(file_path=Path("infra/modules/functionapp.bicep"))
sites = [r for r in bicep["resources"].values() if r["type"] == "Microsoft.Web/sites"]
if len(sites) != 1:
    sys.exit(f"expected one Microsoft.Web/sites resource in functionapp.bicep, found {len(sites)}")
props = sites[0]["config"]["properties"]

def settings_for(store):
    """The app settings with storeKind = store: concat(commonSettings, usePostgres ? postgresSettings : cosmosSettings)."""
    def resolve(node):
        if isinstance(node, list):
            return node
        if isinstance(node, str) and str(node) in bicep.get("variables", {}):
            return resolve(bicep["variables"][str(node)]["value"])
        if isinstance(node, dict) and node.get("function", {}).get("type") == "concat":
            return [s for arg in node["function"]["parameters"].values() for s in resolve(arg)]
        if isinstance(node, dict) and node.get("operator", {}).get("type") == "conditional":
            ops = node["operator"]["operands"]
            if str(ops["condition"]) != "usePostgres":
                sys.exit(f"functionapp.bicep: app settings chosen by an unknown condition: {ops['condition']}")
            return resolve(ops["true_value"] if store == "postgres" else ops["false_value"])
        sys.exit(f"functionapp.bicep: cannot read the app settings: {repr(node)[:200]}")
    if not re.search(r"^var usePostgres = storeKind == 'postgres'$", Path("infra/modules/functionapp.bicep").read_text(), re.M):
        sys.exit("functionapp.bicep: usePostgres must be: var usePostgres = storeKind == 'postgres'")
    return resolve(props["siteConfig"]["appSettings"])

for store in ("cosmos", "postgres"):
    settings = settings_for(store)
    names = [s["name"] for s in settings]
    values = {s["name"]: s["value"] for s in settings}
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        errors.append(f"storeKind {store}: duplicate app settings: {dupes}")
    required = set(REQUIRED) | needed_settings | set(STORE_SETTINGS[store])
    for c in connections:
        required |= {f"{c}__fullyQualifiedNamespace", f"{c}__credential", f"{c}__clientId"}
        if c in values:
            errors.append(f"app setting {c} would be read as a connection string and override the identity-based {c}__* settings")
    for n in sorted(required - set(names)):
        errors.append(f"storeKind {store}: missing app setting {n}")
    other = [n for s, ns in STORE_SETTINGS.items() if s != store for n in ns]
    for n in sorted(set(other) & set(names)):
        errors.append(f"storeKind {store}: app setting {n} belongs to the other store")
    for n in names:
        if FORBIDDEN.match(n):
            errors.append(f"app setting {n} must not be set on Flex Consumption / in Azure")
    for n, v in {**FIXED, **STORE_FIXED[store]}.items():
        if values.get(n) != v:
            errors.append(f"storeKind {store}: app setting {n} must be {v!r}, is {values.get(n)!r}")
    for n, v in values.items():
        if n.endswith("__credential") and v != "managedidentity":
            errors.append(f"{n} must be 'managedidentity'")
# The bank credential is a Key Vault reference resolved with the app's user-assigned identity.
if not str(values.get("BANK_API_KEY", "")).startswith("@Microsoft.KeyVault(SecretUri="):
    errors.append(f"BANK_API_KEY must be a Key Vault reference (@Microsoft.KeyVault(SecretUri=...)), is {values.get('BANK_API_KEY')!r}")
if str(props.get("keyVaultReferenceIdentity")) != "identityId":
    errors.append("keyVaultReferenceIdentity must be the user-assigned identity (identityId): the app has no system-assigned identity")
runtime = props.get("functionAppConfig", {}).get("runtime")
if runtime != {"name": "custom", "version": "1.0"}:
    errors.append(f"functionAppConfig.runtime must be custom 1.0, is {runtime}")
if sites[0]["config"].get("kind") != "functionapp,linux":
    errors.append("function app kind must be 'functionapp,linux'")

local = json.loads(Path("local.settings.sample.json").read_text())
if local.get("IsEncrypted") is not False:
    errors.append("local.settings.sample.json: IsEncrypted must be false")
lv = local.get("Values", {})
for n, v in LOCAL_REQUIRED.items():
    if n not in lv:
        errors.append(f"local.settings.sample.json: missing {n}")
    elif v is not None and lv[n] != v:
        errors.append(f"local.settings.sample.json: {n} must be {v!r}")
for n in needed_settings | connections:
    if n not in lv:
        errors.append(f"local.settings.sample.json: missing {n} (used by function.json)")

# Same defaults on both sides for the service settings that main.bicep parameterises.
main_params = BicepParser().parse(file_path=Path("infra/main.bicep"))["parameters"]
for setting, param in {"INBOX_RETENTION_DAYS": "inboxRetentionDays", "CONSUMER_NAME": "consumerName",
                       "BANK_API_URL": "bankApiUrl", "BANK_TIMEOUT_MS": "bankTimeoutMs",
                       "BANK_KEY_WINDOW_HOURS": "bankKeyWindowHours", "RETRY_BUDGET_MS": "retryBudgetMs",
                       "LEASE_MS": "leaseMs", "INFLIGHT_WAIT_MS": "inflightWaitMs",
                       "CLAIM_APPROVED_QUEUE": "queueName"}.items():
    default = main_params[param].get("default")
    if str(default) != lv.get(setting):
        errors.append(f"default of {setting} differs: local sample {lv.get(setting)!r}, main.bicep {param} = {default!r}")
if errors:
    sys.exit("\n".join(errors))
print(f"app settings checked for storeKind cosmos ({len(settings_for('cosmos'))}) and postgres ({len(settings_for('postgres'))}); local sample has {len(lv)} values")
PY

check "local/: compose files parse; the Service Bus emulator declares CLAIM_APPROVED_QUEUE within its limits" "$PY" - <<'PY'
import json, re, sys
from pathlib import Path
import yaml

errors = []
for f in ("local/docker-compose.yml", "local/servicebus/docker-compose.yml"):
    services = (yaml.safe_load(Path(f).read_text()) or {}).get("services") or {}
    if not services:
        errors.append(f"{f}: no services")
    for name, svc in services.items():
        if not svc.get("image"):
            errors.append(f"{f}: service {name} has no image")

def seconds(v):
    m = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?", v)
    if not m:
        sys.exit(f"cannot parse {v!r}")
    h, mi, s = (int(x or 0) for x in m.groups())
    return h * 3600 + mi * 60 + s

queue = json.loads(Path("local.settings.sample.json").read_text())["Values"]["CLAIM_APPROVED_QUEUE"]
config = json.loads(Path("local/servicebus/Config.json").read_text())["UserConfig"]
ns = config["Namespaces"]
if len(ns) != 1 or ns[0]["Name"] != "sbemulatorns":
    errors.append("the emulator supports exactly one namespace, named sbemulatorns")
if config.get("Logging", {}).get("Type") not in ("File", "Console", "File,Console", "Console,File"):
    errors.append("Logging.Type must be File, Console or both")
queues = {q["Name"]: q.get("Properties", {}) for q in ns[0].get("Queues", [])}
if queue not in queues:
    errors.append(f"local/servicebus/Config.json does not declare queue {queue!r}")
else:
    p = queues[queue]
    if not 1 <= p.get("MaxDeliveryCount", 3) <= 10:
        errors.append("MaxDeliveryCount must be 1..10 in the emulator")
    if not 5 <= seconds(p.get("LockDuration", "PT1M")) <= 300:
        errors.append("LockDuration must be PT5S..PT5M")
    if not 300 <= seconds(p.get("DefaultMessageTimeToLive", "PT1H")) <= 3600:
        errors.append("DefaultMessageTimeToLive must be PT5M..PT1H in the emulator")
    if not 5 <= seconds(p.get("DuplicateDetectionHistoryTimeWindow", "PT20S")) <= 300:
        errors.append("DuplicateDetectionHistoryTimeWindow must be PT5S..PT5M in the emulator")
    if p.get("RequiresDuplicateDetection") is not True or p.get("DeadLetteringOnMessageExpiration") is not True:
        errors.append("the emulator queue should mirror Azure: duplicate detection and dead-lettering on expiry on")
if errors:
    sys.exit("\n".join(errors))
PY

echo "== (f) timing contract (host.json, queue, service settings)"
check "own work < LEASE_MS < functionTimeout < maxAutoLockRenewalDuration; worst invocation < functionTimeout; INFLIGHT_WAIT_MS x (deliveries - 1) > LEASE_MS; lockDuration <= PT5M" "$PY" - <<'PY'
import json, re, sys
from pathlib import Path
from pycep import BicepParser

# Margin for the store round trips of one invocation (claim, re-reads, finalize, 429 back-off).
STORE_MARGIN_S = 10
# PAYMENTS_POSTGRES_OUTAGE_WAIT_MS's default (crates/claims-payments-postgres/src/settings.rs): how long one
# PostgreSQL call waits for an unreachable server. The claim's wait comes out of the lease;
# the claim's and the finalize's both out of the invocation.
POSTGRES_OUTAGE_WAIT_S = 20
KEYS = ("retryBudgetMs", "bankTimeoutMs", "leaseMs", "inflightWaitMs", "lockDuration", "maxDeliveryCount")

def timespan(v):
    m = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})", v)
    if not m:
        sys.exit(f"cannot parse TimeSpan {v!r}")
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s

def iso(v):
    m = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", v)
    if not m or v in ("P", "PT"):
        sys.exit(f"cannot parse ISO 8601 duration {v!r}")
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s

host = json.loads(Path("host.json").read_text())
T = timespan(host["functionTimeout"])
R = timespan(host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"])
params = BicepParser().parse(file_path=Path("infra/main.bicep"))["parameters"]
def overrides(path):
    return dict(re.findall(r"^param\s+(\w+)\s*=\s*'?([^'\n]*?)'?\s*$", Path(path).read_text(), re.M))
local = json.loads(Path("local.settings.sample.json").read_text())["Values"]
sets = {
    "main.bicep defaults": {k: params[k]["default"] for k in KEYS},
    **{Path(f).name: {k: overrides(f).get(k, params[k]["default"]) for k in KEYS}
       for f in ("infra/main.bicepparam", "infra/main.private.bicepparam", "infra/main.landingzone.bicepparam")},
    "local.settings.sample.json": {"retryBudgetMs": local["RETRY_BUDGET_MS"], "bankTimeoutMs": local["BANK_TIMEOUT_MS"],
                                   "leaseMs": local["LEASE_MS"], "inflightWaitMs": local["INFLIGHT_WAIT_MS"],
                                   "lockDuration": params["lockDuration"]["default"],
                                   "maxDeliveryCount": local.get("MAX_DELIVERY_COUNT", params["maxDeliveryCount"]["default"])},
}
errors = []
if not T < R:
    errors.append(f"functionTimeout {T}s must be shorter than maxAutoLockRenewalDuration {R}s, or the lock lapses mid-invocation")
for label, v in sets.items():
    # Work done under one lease: the whole retry budget, the bank call started at its very end, store trips.
    own = (int(v["retryBudgetMs"]) + int(v["bankTimeoutMs"])) / 1000 + STORE_MARGIN_S + POSTGRES_OUTAGE_WAIT_S
    # Whole invocation: first the bounded wait on a live attempt of the same message, then its
    # own work, and the finalize's outage wait after the bank.
    worst = own + int(v["inflightWaitMs"]) / 1000 + POSTGRES_OUTAGE_WAIT_S
    lease = int(v["leaseMs"]) / 1000
    lock = iso(v["lockDuration"])
    print(f"{label}: own work {own:.0f}s, worst invocation {worst:.0f}s, lease {lease:.0f}s, "
          f"functionTimeout {T}s, lock renewal {R}s, lockDuration {lock}s")
    if not own <= lease:
        errors.append(f"{label}: LEASE_MS {lease:.0f}s must cover one attempt's work ({own:.0f}s), or a live payout is taken over")
    if not lease < T:
        errors.append(f"{label}: LEASE_MS {lease:.0f}s must end before functionTimeout {T}s, so the redelivery after a timeout can resume at once")
    if not worst < T:
        errors.append(f"{label}: a worst-case invocation ({worst:.0f}s) must finish before functionTimeout {T}s, which restarts the handler")
    if not 5 <= lock <= 300:
        errors.append(f"{label}: lockDuration must be PT5S..PT5M (Service Bus limit)")
    # A re-sent or re-driven message (DeliveryCount from 1 again) can free a dead attempt's
    # message only by waiting its lease out; the remaining deliveries must outlast it
    # (the handler refuses to start otherwise: crates/claims-payments/src/config/mod.rs).
    deliveries = int(v["maxDeliveryCount"])
    if not int(v["inflightWaitMs"]) * (deliveries - 1) > int(v["leaseMs"]):
        errors.append(f"{label}: INFLIGHT_WAIT_MS x (maxDeliveryCount - 1) = {int(v['inflightWaitMs']) * (deliveries - 1)} ms "
                      f"must exceed LEASE_MS {v['leaseMs']} ms (the handler refuses to start otherwise)")
if errors:
    sys.exit("\n".join(errors))
PY

echo "== (g) alerts contract (infra/modules/alerts.bicep and workbook.bicep, docs/runbook.md, the handler's metrics)"
# check_alerts ALERTS_BICEP: every rule notifies the action group, has a runbook entry in
# docs/runbook.md, and every log query returns rows only when something needs attention.
check_alerts() {
  "$PY" - "$1" <<'PY'
import os, re, sys
from pathlib import Path
from pycep import BicepParser

path = Path(sys.argv[1])
parsed = BicepParser().parse(file_path=path)
runbook_path = os.environ.get("RUNBOOK", "docs/runbook.md")
docs = Path(runbook_path).read_text()
rules = parsed["variables"]["logRules"]["value"]
errors = []
resources = parsed["resources"]
alert_resources = [r for r in resources.values() if r["type"] in ("Microsoft.Insights/metricAlerts", "Microsoft.Insights/scheduledQueryRules")]
keys = []
for name, r in resources.items():
    body = r["config"].get("config", r["config"])
    if r["type"] == "Microsoft.Insights/metricAlerts":
        keys.append(re.sub(r"^\$\{namePrefix\}-", "", body["name"]))
        actions = body["properties"].get("actions", [])
        if [str(a.get("actionGroupId")) for a in actions] != ["notify"]:
            errors.append(f"{name}: must notify exactly the action group (notify)")
    elif r["type"] == "Microsoft.Insights/scheduledQueryRules":
        props = body["properties"]
        if [str(g) for g in props["actions"]["actionGroups"]] != ["notify"]:
            errors.append(f"{name}: must notify exactly the action group (notify)")
for rule in rules:
    key, query = rule["key"], rule["query"]
    keys.append(key)
    if not rule["description"].endswith("${runbook} " + key + "."):
        errors.append(f"{key}: description must end with its runbook entry: ${{runbook}} {key}.")
    # A summarize without `by` returns one row even over no input, which would fire the alert.
    for part in re.split(r"\|", query):
        if re.match(r"\s*summarize\b", part) and not re.search(r"\bby\b", part):
            errors.append(f"{key}: a summarize without `by` returns a row even when nothing happened: {part.strip()[:80]}")
for key in keys:
    if not re.search(rf"^### `{re.escape(key)}`", docs, re.M):
        errors.append(f"{key}: no runbook entry (### `{key}`: ...) in {runbook_path}")
# The alerts and the workbook read the handler's telemetry, never the text of a log line:
# no query reads traces or cuts JSON out of a message, and every metric they name
# (claims_payments.*) is one the product declares (crates/claims-payments/src/telemetry/metrics.rs,
# and the engine's counters in crates/claims-payments-engine/src/telemetry.rs), as is every
# span attribute they read.
metrics_rs = Path("crates/claims-payments/src/telemetry/metrics.rs").read_text() + \
    Path("crates/claims-payments-engine/src/telemetry.rs").read_text()
declared = set(re.findall(r'"(claims_payments\.[a-z_.]+)"', metrics_rs))
trace_rs = Path("crates/claims-payments/src/telemetry/trace.rs").read_text()
workbook = Path(path.parent / "workbook.bicep")
queries = [(rule["key"], rule["query"]) for rule in rules]
if workbook.exists():
    queries += [("workbook", q) for q in re.findall(r"query: '((?:[^'\\]|\\.)*)'", workbook.read_text())]
for key, query in queries:
    if re.search(r"\btraces\b", str(query)) or "substring(message" in str(query) or "parse_json(" in str(query):
        errors.append(f"{key}: reads log text (traces, substring(message), parse_json); read the metrics or span attributes")
    for short in re.findall(r"replace\(m(?:etric)?, '__METRIC__', '([a-z_.]+)'\)", str(query)):
        if f"claims_payments.{short}" not in declared:
            errors.append(f"{key}: metric claims_payments.{short} is not declared in telemetry/metrics.rs or the engine's telemetry.rs")
    for full in re.findall(r"claims_payments\.[a-z][a-z_]*(?:\.[a-z][a-z_]*)*", str(query)):
        if full not in declared:
            errors.append(f"{key}: metric {full} is not declared in telemetry/metrics.rs or the engine's telemetry.rs")
    for attribute in re.findall(r'customDimensions\["([a-z_.]+)"\]', str(query)):
        # A `tracing` span's field, or an attribute of a record built late (store and bank calls).
        written = rf'{re.escape(attribute)} =|KeyValue::new\(\s*"{re.escape(attribute)}"'
        if not re.search(written, trace_rs):
            errors.append(f"{key}: span attribute {attribute} is not written by telemetry/trace.rs")
if errors:
    sys.exit("\n".join(errors))
print(f"{len(alert_resources)} alert resources, {len(keys)} rules with runbooks: {', '.join(keys)}")
PY
}
check "alerts: every rule notifies the action group, has a runbook in docs/runbook.md, queries return rows only on trouble, read metrics and span attributes the product declares, never log text" \
  check_alerts infra/modules/alerts.bicep
missing_runbook_entry() {
  sed 's/^### `payments-stuck`/### payments that are stuck/' docs/runbook.md >"$WORK/runbook.md"
  grep -q '^### payments that are stuck' "$WORK/runbook.md" || { echo "could not remove the heading"; return 0; }
  RUNBOOK="$WORK/runbook.md" check_alerts infra/modules/alerts.bicep
}
expect_red "self-test: an alert rule without its heading in the runbook is reported" "payments-stuck: no runbook entry" missing_runbook_entry
summarize_without_by() {
  cp infra/modules/workbook.bicep "$WORK/workbook.bicep"
  sed 's/ by bankStatus = toint(resultCode)//' infra/modules/alerts.bicep >"$WORK/alerts-no-by.bicep"
  grep -q "take_any(operation_Id)'" "$WORK/alerts-no-by.bicep" || { echo "could not remove the by clause"; return 0; }
  check_alerts "$WORK/alerts-no-by.bicep"
}
expect_red "self-test: a log query whose summarize has no by clause is reported" "bank-service-fault: a summarize without .by." summarize_without_by
log_text_query() {
  cp infra/modules/workbook.bicep "$WORK/workbook.bicep"
  sed "s/query: 'dependencies | where tostring(customDimensions\[\"bank.answer\"\])/query: 'traces | extend line = parse_json(substring(message, indexof(message, \"{\"))) | where tostring(line.event) == \"bank-service-fault\" | where tostring(customDimensions[\"bank.answer\"])/" infra/modules/alerts.bicep >"$WORK/alerts-log-text.bicep"
  grep -q "substring(message" "$WORK/alerts-log-text.bicep" || { echo "could not write a log-text query"; return 0; }
  check_alerts "$WORK/alerts-log-text.bicep"
}
expect_red "self-test: a query that cuts JSON out of traces.message is reported" "bank-service-fault: reads log text" log_text_query
undeclared_metric() {
  cp infra/modules/workbook.bicep "$WORK/workbook.bicep"
  sed "s/'__METRIC__', 'starts'/'__METRIC__', 'restarts'/" infra/modules/alerts.bicep >"$WORK/alerts-undeclared.bicep"
  grep -q "'restarts'" "$WORK/alerts-undeclared.bicep" || { echo "could not rename the metric"; return 0; }
  check_alerts "$WORK/alerts-undeclared.bicep"
}
expect_red "self-test: an alert on a metric the product does not declare is reported" "claims_payments.restarts is not declared" undeclared_metric

echo "== (h) documentation (README.md, docs/*.md)"
check "docs: no line over 120 characters outside tables and code in docs/, every relative link names a file and a heading that exist" \
  "$PY" scripts/check_docs.py
broken_doc_link() {
  mkdir -p "$WORK/docs-root/docs" "$WORK/docs-root/web"
  cp README.md "$WORK/docs-root/" && cp docs/*.md "$WORK/docs-root/docs/" && cp web/README.md "$WORK/docs-root/web/"
  sed -i 's/(runbook.md#5-dead-letters-and-re-drive)/(runbook.md#5-dead-letters-and-redrive)/' "$WORK/docs-root/docs/service.md"
  grep -q 'redrive)' "$WORK/docs-root/docs/service.md" || { echo "could not break a link"; return 0; }
  "$PY" scripts/check_docs.py "$WORK/docs-root"
}
expect_red "self-test: a link to a heading that does not exist is reported" "no heading with anchor #5-dead-letters-and-redrive" broken_doc_link

echo "== done in $((SECONDS - START))s"
echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
