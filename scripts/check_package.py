#!/usr/bin/env python3
"""Check an Azure Functions custom-handler package (a directory or a .zip).

Static checks:
  - host.json at the package root, valid, with customHandler.description.defaultExecutablePath
    and the extension bundle; functionTimeout shorter than serviceBus.maxAutoLockRenewalDuration;
  - every function folder (a top-level folder holding function.json) has a valid function.json
    with exactly one trigger binding;
  - the executable named in host.json exists, is executable (in a zip: Unix mode bits with the
    exec bit, as one-deploy and run-from-package need), and is a Linux x86-64 ELF file;
  - nothing local or secret: no local.settings*.json, no SQLite files, no .git, no .env.
Route check (skipped with --static-only): starts the packaged executable the way the Functions
host does (host.json arguments, FUNCTIONS_CUSTOMHANDLER_PORT=<free port>), polls GET / until
it answers, POSTs {"Data":{},"Metadata":{}} to /<FolderName> for each function folder, and
fails on a 404 (the folder name is not a route the binary serves). Any other answer counts.

Standard library only. Exit code 0 if every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

FORBIDDEN_NAME = re.compile(r"^(local\.settings.*\.json|.*\.db|.*\.db-wal|.*\.db-shm|\.env|\.env\..*)$", re.I)
FORBIDDEN_DIR = {".git", ".venv", ".venv-infra", "__pycache__"}
# Service settings the route probe must not inherit from the caller's environment:
# the probe runs the embedded SQLite store in a temp file, whatever the shell has set.
SCRUBBED_ENV_PREFIXES = ("PAYMENTS_", "COSMOS_", "BANK_", "AZURE_COSMOS_")
SCRUBBED_ENV = {"INBOX_RETENTION_DAYS", "CONSUMER_NAME", "RETRY_BUDGET_MS", "LEASE_MS", "INFLIGHT_WAIT_MS", "LOG_FORMAT", "CLAIM_APPROVED_QUEUE"}
ELF_MACHINE_X86_64 = 0x3E
# Debian 12 (bookworm) ships glibc 2.36; a newer requirement may not load on the Functions host image.
GLIBC_WARN_ABOVE = (2, 36)


@dataclass
class Report:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def ok(self, message: str) -> None:
        self.passed.append(message)
        print(f"  PASS  {message}")

    def fail(self, message: str) -> None:
        self.failed.append(message)
        print(f"  FAIL  {message}")

    def note(self, message: str) -> None:
        self.notes.append(message)
        print(f"  NOTE  {message}")


class Package:
    """Read-only view of a package directory or zip, keyed by POSIX relative path."""

    def __init__(self, path: Path):
        self.path = path
        self.is_zip = path.is_file()
        self.files: dict[str, int | None] = {}  # relative path -> Unix mode (None: zip entry without Unix mode)
        self.dirs: set[str] = set()
        if self.is_zip:
            self.zip = zipfile.ZipFile(path)
            for info in self.zip.infolist():
                name = info.filename
                parts = PurePosixPath(name).parts
                if name.startswith("/") or ".." in parts or "\\" in name:
                    raise ValueError(f"unsafe zip entry name {name!r}")
                for i in range(1, len(parts)):
                    self.dirs.add("/".join(parts[:i]))
                if info.is_dir():
                    self.dirs.add(name.rstrip("/"))
                    continue
                mode = (info.external_attr >> 16) & 0xFFFF if info.create_system == 3 else None
                self.files[name] = mode or None
        else:
            for root, dirnames, filenames in os.walk(path):
                rel_root = Path(root).relative_to(path)
                for d in dirnames:
                    self.dirs.add((rel_root / d).as_posix())
                for f in filenames:
                    full = Path(root) / f
                    self.files[(rel_root / f).as_posix()] = full.lstat().st_mode

    def read(self, name: str) -> bytes:
        if self.is_zip:
            return self.zip.read(name)
        return (self.path / name).read_bytes()

    def head(self, name: str, size: int) -> bytes:
        if self.is_zip:
            with self.zip.open(name) as fh:
                return fh.read(size)
        with open(self.path / name, "rb") as fh:
            return fh.read(size)

    def top_level_dirs(self) -> list[str]:
        return sorted(d for d in self.dirs if "/" not in d)


def parse_timespan(value: str) -> float | None:
    """Seconds of a .NET TimeSpan such as 00:05:00 or 1.00:00:00; None if not parseable."""
    m = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d+))?", value.strip())
    if not m:
        return None
    days, hours, minutes, seconds, frac = m.groups()
    total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    return total + (float(f"0.{frac}") if frac else 0.0)


def check_host_json(pkg: Package, rep: Report) -> dict | None:
    if "host.json" not in pkg.files:
        nested = sorted(f for f in pkg.files if f.endswith("/host.json"))
        hint = f" (found {nested[0]}: zip the folder's contents, not the folder)" if nested else ""
        rep.fail(f"host.json is not at the package root{hint}")
        return None
    try:
        host = json.loads(pkg.read("host.json"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        rep.fail(f"host.json is not valid JSON: {exc}")
        return None
    if host.get("version") != "2.0":
        rep.fail(f'host.json version is {host.get("version")!r}, expected "2.0"')
    desc = (host.get("customHandler") or {}).get("description") or {}
    exe = desc.get("defaultExecutablePath")
    args = desc.get("arguments", [])
    if not isinstance(exe, str) or not exe.strip():
        rep.fail("host.json has no customHandler.description.defaultExecutablePath")
        return None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        rep.fail("host.json customHandler.description.arguments must be a list of strings")
        return None
    rep.ok(f"host.json at the root: customHandler runs {' '.join([exe, *args])}")
    bundle = host.get("extensionBundle") or {}
    if bundle.get("id") != "Microsoft.Azure.Functions.ExtensionBundle" or not bundle.get("version"):
        rep.fail("host.json extensionBundle must be Microsoft.Azure.Functions.ExtensionBundle with a version range")
    else:
        rep.ok(f"extension bundle {bundle['id']} {bundle['version']}")
    timeout = host.get("functionTimeout")
    renew = ((host.get("extensions") or {}).get("serviceBus") or {}).get("maxAutoLockRenewalDuration")
    if timeout is not None and renew is not None:
        t, r = parse_timespan(str(timeout)), parse_timespan(str(renew))
        if t is None or r is None:
            rep.fail(f"cannot parse functionTimeout {timeout!r} or maxAutoLockRenewalDuration {renew!r}")
        elif t >= r:
            rep.fail(f"functionTimeout {timeout} must be shorter than maxAutoLockRenewalDuration {renew} (else the lock can lapse mid-invocation)")
        else:
            rep.ok(f"functionTimeout {timeout} < maxAutoLockRenewalDuration {renew}")
    return host


def function_folders(pkg: Package) -> list[str]:
    return [d for d in pkg.top_level_dirs() if f"{d}/function.json" in pkg.files]


def probe_of(pkg: Package, host: dict | None, folder: str) -> tuple[str, str]:
    """The request that reaches this function's code in the handler.

    A Service Bus or timer function is invoked as POST /<FunctionName> with a JSON
    envelope. An HTTP function whose request the host forwards unchanged
    (customHandler.enableForwardingHttpRequest) arrives on its own method and route
    under /api/; route parameters are filled with a value the handler can refuse.
    """
    try:
        spec = json.loads(pkg.read(f"{folder}/function.json"))
        trigger = next(b for b in spec["bindings"] if str(b.get("type", "")).endswith("Trigger"))
    except (KeyError, StopIteration, json.JSONDecodeError, UnicodeDecodeError, TypeError):
        return "POST", f"/{folder}"
    forwarding = bool(((host or {}).get("customHandler") or {}).get("enableForwardingHttpRequest"))
    if trigger.get("type") == "httpTrigger" and forwarding:
        method = str((trigger.get("methods") or ["post"])[0]).upper()
        route = re.sub(r"\{[^}]*\}", "route-probe", str(trigger.get("route") or folder))
        return method, f"/api/{route}"
    return "POST", f"/{folder}"


def check_functions(pkg: Package, rep: Report) -> list[str]:
    folders = function_folders(pkg)
    if not folders:
        rep.fail("no function folder (a top-level folder with function.json)")
        return []
    for folder in folders:
        name = f"{folder}/function.json"
        try:
            spec = json.loads(pkg.read(name))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            rep.fail(f"{name} is not valid JSON: {exc}")
            continue
        bindings = spec.get("bindings") if isinstance(spec, dict) else None
        if not isinstance(bindings, list) or not bindings:
            rep.fail(f"{name} has no bindings")
            continue
        bad = [b for b in bindings if not isinstance(b, dict) or not all(isinstance(b.get(k), str) and b.get(k) for k in ("name", "type", "direction"))]
        triggers = [b for b in bindings if isinstance(b, dict) and str(b.get("type", "")).endswith("Trigger")]
        if bad:
            rep.fail(f"{name}: every binding needs string name, type and direction")
        elif len(triggers) != 1:
            rep.fail(f"{name}: expected exactly one trigger binding, found {len(triggers)}")
        elif triggers[0].get("direction") != "in":
            rep.fail(f"{name}: the trigger binding must have direction 'in'")
        else:
            t = triggers[0]
            rep.ok(f"{name}: {t['type']} '{t['name']}' (route POST /{folder})")
    others = [d for d in pkg.top_level_dirs() if d not in folders]
    if others:
        rep.note(f"top-level folders without function.json: {', '.join(others)}")
    return folders


def glibc_requirement(data: bytes) -> tuple[int, int] | None:
    versions = {tuple(int(x) for x in m.groups()) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)", data)}
    return max(versions) if versions else None


def check_executable(pkg: Package, host: dict, rep: Report, allow_non_elf: bool) -> str | None:
    exe = host["customHandler"]["description"]["defaultExecutablePath"]
    rel = PurePosixPath(exe.replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts:
        rep.fail(f"defaultExecutablePath {exe!r} must be a path inside the package")
        return None
    name = rel.as_posix()
    if name not in pkg.files:
        rep.fail(f"executable {name!r} named in host.json is not in the package")
        return None
    mode = pkg.files[name]
    if mode is None:
        rep.fail(f"{name}: zip entry carries no Unix mode (made on Windows?); the host could not execute it")
        return name
    if not stat.S_ISREG(mode):
        rep.fail(f"{name} is not a regular file (mode {oct(mode)})")
        return name
    if not mode & stat.S_IXUSR or (not pkg.is_zip and not os.access(pkg.path / name, os.X_OK)):
        where = "zip entry" if pkg.is_zip else "file"
        rep.fail(f"{name}: {where} is not executable (mode {stat.filemode(mode)})")
    else:
        rep.ok(f"{name} is executable ({stat.filemode(mode)})")
    head = pkg.head(name, 64)
    is_elf64_x86 = len(head) >= 20 and head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1 and int.from_bytes(head[18:20], "little") == ELF_MACHINE_X86_64
    if is_elf64_x86:
        rep.ok(f"{name} is a Linux x86-64 ELF executable")
        need = glibc_requirement(pkg.read(name))
        if need is None:
            rep.note(f"{name} references no glibc symbol versions (static or musl build)")
        elif need > GLIBC_WARN_ABOVE:
            rep.note(f"{name} needs glibc {need[0]}.{need[1]}, newer than Debian 12's 2.36: it may not start on the Functions host; build on an older distribution or for musl")
        else:
            rep.note(f"{name} needs glibc {need[0]}.{need[1]} or newer")
    elif allow_non_elf:
        rep.note(f"{name} is not a Linux x86-64 ELF file (allowed by --allow-non-elf)")
    else:
        rep.fail(f"{name} is not a Linux x86-64 ELF executable; the Functions host runs linux-x64")
    return name


def check_nothing_local(pkg: Package, rep: Report) -> None:
    bad = sorted(f for f in pkg.files if FORBIDDEN_NAME.match(PurePosixPath(f).name))
    bad_dirs = sorted(d for d in pkg.dirs if PurePosixPath(d).name in FORBIDDEN_DIR)
    if bad or bad_dirs:
        rep.fail(f"local or secret files in the package: {', '.join(bad + [d + '/' for d in bad_dirs])}")
    else:
        rep.ok("no local.settings*.json, SQLite files, .env or .git in the package")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_request(port: int, method: str, path: str, body: bytes | None, timeout: float) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def extract_zip(zip_path: Path, dest: Path) -> None:
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            target = dest / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if info.create_system == 3 and mode:
                target.chmod(mode)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("        " + line for line in text[-lines:])


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=grace)


def check_routes(pkg: Package, host: dict, exe: str, folders: list[str], rep: Report, startup_timeout: float, request_timeout: float) -> None:
    desc = host["customHandler"]["description"]
    with tempfile.TemporaryDirectory(prefix="check-package-") as tmp:
        tmpdir = Path(tmp)
        if pkg.is_zip:
            root = tmpdir / "app"
            root.mkdir()
            extract_zip(pkg.path, root)
        else:
            root = pkg.path.resolve()
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV and not k.startswith(SCRUBBED_ENV_PREFIXES)}
        env.update(
            FUNCTIONS_CUSTOMHANDLER_PORT=str(port),
            PAYMENTS_SQLITE_PATH=str(tmpdir / "probe.db"),
            RUST_LIB_BACKTRACE="0",
        )
        cmd = [str(root / exe), *desc.get("arguments", [])]
        out_path, err_path = tmpdir / "stdout.log", tmpdir / "stderr.log"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            except OSError as exc:
                rep.fail(f"cannot start {' '.join(cmd)}: {exc}")
                return
            try:
                deadline = time.monotonic() + startup_timeout
                ready = None
                while time.monotonic() < deadline:
                    if proc.poll() is not None:
                        break
                    try:
                        ready = http_request(port, "GET", "/", None, timeout=2.0)
                        break
                    except OSError:
                        time.sleep(0.2)
                if ready is None:
                    why = f"exited with code {proc.returncode}" if proc.poll() is not None else f"did not answer GET / within {startup_timeout:.0f}s"
                    rep.fail(f"'{' '.join([exe, *desc.get('arguments', [])])}' {why} (FUNCTIONS_CUSTOMHANDLER_PORT={port})\n      stderr:\n{tail(err_path)}\n      stdout:\n{tail(out_path)}")
                    return
                rep.ok(f"handler started and answered GET / with {ready} on port {port}")
                body = json.dumps({"Data": {}, "Metadata": {}}).encode()
                for folder in folders:
                    method, path = probe_of(pkg, host, folder)
                    try:
                        status = http_request(port, method, path, body if method == "POST" else None, timeout=request_timeout)
                    except OSError as exc:
                        rep.fail(f"{method} {path}: no HTTP answer ({exc})")
                        continue
                    if status == 404:
                        rep.fail(f"{method} {path} answered 404: the binary does not serve the route of function folder {folder}")
                    else:
                        rep.ok(f"{method} {path} is served (answered {status} to a probe)")
            finally:
                stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description="Check an Azure Functions custom-handler package (directory or zip).")
    ap.add_argument("package", type=Path, help="package directory (dist/functionapp) or zip (dist/functionapp.zip)")
    ap.add_argument("--static-only", action="store_true", help="skip starting the executable")
    ap.add_argument("--allow-non-elf", action="store_true", help="accept an executable that is not a Linux x86-64 ELF file (stand-in scripts in self-tests)")
    ap.add_argument("--startup-timeout", type=float, default=30.0, help="seconds to wait for GET / (the host waits 30 s)")
    ap.add_argument("--request-timeout", type=float, default=15.0, help="seconds to wait for each POST")
    args = ap.parse_args()

    if not args.package.exists():
        print(f"{args.package}: no such file or directory")
        return 1
    print(f"checking {args.package}")
    rep = Report()
    try:
        pkg = Package(args.package)
    except (zipfile.BadZipFile, ValueError) as exc:
        rep.fail(f"cannot read package: {exc}")
        pkg = None
    if pkg is not None:
        host = check_host_json(pkg, rep)
        folders = check_functions(pkg, rep)
        exe = check_executable(pkg, host, rep, args.allow_non_elf) if host else None
        check_nothing_local(pkg, rep)
        if args.static_only:
            rep.note("route check skipped (--static-only)")
        elif rep.failed:
            rep.note("route check skipped because a static check failed")
        elif host and exe and folders:
            check_routes(pkg, host, exe, folders, rep, args.startup_timeout, args.request_timeout)
    print(f"{len(rep.passed)} passed, {len(rep.failed)} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
