#!/usr/bin/env bash
# Build the deployable Azure Functions package of claims-payments.
#
#   scripts/package.sh [--binary PATH] [--out DIR] [--allow-non-elf]
#
# Without --binary: builds the Linux x86-64 release binary without the
# development crates (emulator code must not ship). With --binary: packages the
# given executable instead (tests pass a debug build; CI a stand-in).
# Output (default DIR = dist):
#   DIR/functionapp/      host.json, one folder per function, the executable,
#                         .funcignore  -> cd there and `func azure functionapp publish <app>`
#   DIR/functionapp.zip   the same without .funcignore, host.json at the zip root,
#                         exec bit kept -> `az functionapp deployment source config-zip`
# The package is checked with scripts/check_package.py --static-only before it
# is reported; --allow-non-elf passes through for script stand-ins in self-tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BINARY=""
OUT="$ROOT/dist"
CHECK_ARGS=(--static-only)

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) [[ $# -ge 2 ]] || { echo "--binary needs a path" >&2; exit 2; }; BINARY="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || { echo "--out needs a directory" >&2; exit 2; }; OUT="$2"; shift 2 ;;
    --allow-non-elf) CHECK_ARGS+=(--allow-non-elf); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

cd "$ROOT"

if [[ -z "$BINARY" ]]; then
  # The Functions host runs linux-x64; a binary built elsewhere would not start.
  if [[ "$(uname -s)" != "Linux" || "$(uname -m)" != "x86_64" ]]; then
    echo "build on Linux x86-64, or cross-compile and pass --binary PATH" >&2
    exit 2
  fi
  # The product crate alone (with what it depends on: the engine, the settings crate and the
  # three store adapters): nothing of claims-payments-dev or the testkit can be in it.
  cargo build --release --locked -p claims-payments --bin claims-payments
  BINARY="${CARGO_TARGET_DIR:-$ROOT/target}/release/claims-payments"
fi
[[ -f "$BINARY" ]] || { echo "binary not found: $BINARY" >&2; exit 2; }

# The packaged file name is whatever host.json tells the host to start.
EXE_NAME="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["customHandler"]["description"]["defaultExecutablePath"])' host.json)"

APP="$OUT/functionapp"
ZIP="$OUT/functionapp.zip"
rm -rf "$APP" "$ZIP"
mkdir -p "$APP"

cp host.json "$APP/host.json"
cp .funcignore "$APP/.funcignore"
found=0
for dir in function-app/*/; do
  [[ -f "$dir/function.json" ]] || continue
  name="$(basename "$dir")"
  mkdir -p "$APP/$name"
  cp "$dir/function.json" "$APP/$name/function.json"
  found=$((found + 1))
done
[[ $found -gt 0 ]] || { echo "no function folders with function.json under function-app/" >&2; exit 1; }
install -m 0755 "$BINARY" "$APP/$EXE_NAME"

# zipfile with explicit Unix modes: the exec bit must survive into the zip, and
# entry order and timestamps are fixed so the same inputs give the same zip.
python3 - "$APP" "$ZIP" <<'PY'
import os, stat, sys, zipfile
from pathlib import Path

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # default 1980-01-01, the zip minimum
stamp = __import__("time").gmtime(max(epoch, 315532800))[:6]
skip = {".funcignore"}  # only meaningful to func publish from the directory
with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if rel in skip:
            continue
        if path.is_dir():
            info = zipfile.ZipInfo(rel + "/", date_time=stamp)
            info.create_system = 3
            info.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10  # 0x10: MS-DOS directory flag
            zf.writestr(info, b"")
            continue
        mode = 0o755 if os.access(path, os.X_OK) else 0o644
        info = zipfile.ZipInfo(rel, date_time=stamp)
        info.create_system = 3  # Unix, so external_attr carries the mode
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(path, "rb") as fh:
            zf.writestr(info, fh.read())
PY

python3 scripts/check_package.py "${CHECK_ARGS[@]}" "$APP"
python3 scripts/check_package.py "${CHECK_ARGS[@]}" "$ZIP"
echo "package: $APP"
echo "zip:     $ZIP ($(du -h "$ZIP" | cut -f1))"
