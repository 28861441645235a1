#!/usr/bin/env python3
"""Check that the Cosmos DB container declared in Bicep equals infra/cosmos-container.json.

The partition key and the unique key policy of a Cosmos container cannot be
changed after it is created, and the idempotency guard depends on both. The
Rust provisioning code is compared with the same JSON file by a Rust test, so
Bicep, code and JSON cannot drift apart unnoticed.

Usage: check_container_definition.py [--bicep FILE ...] [--expected JSON]
Without --bicep, every .bicep file under infra/ is searched; exactly one
container resource must exist. The indexing policy must also exclude /*, stay
consistent (TTL) and index the unique key paths. Needs pycep-parser (scripts/requirements-infra.txt).
Exit code 0 when equal, 1 on a mismatch (with a diff), 2 on usage or parse errors.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

CONTAINER_TYPE = "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers"
REPO_ROOT = Path(__file__).resolve().parent.parent
COMPARED_FIELDS = ("id", "partitionKey", "defaultTtl", "uniqueKeyPolicy", "indexingPolicy")


class NotLiteral(Exception):
    """A Bicep value that is an expression, not a literal."""


def to_literal(node, where: str):
    """Turn pycep's JSON for a Bicep value into a plain JSON value.

    pycep renders literals as plain values, except a negative number, which is
    the unary operator `minus`. Any other operator or function is an
    expression that the comparison cannot evaluate, so it is rejected: the
    container definition must be written out literally.
    """
    if isinstance(node, dict):
        if set(node) == {"operator"}:
            op = node["operator"]
            operands = op.get("operands") if isinstance(op, dict) else None
            if (
                isinstance(op, dict)
                and op.get("type") == "minus"
                and isinstance(operands, dict)
                and set(operands) == {"integer_value"}
                and isinstance(operands["integer_value"], int)
            ):
                return -operands["integer_value"]
            raise NotLiteral(f"{where}: expression {json.dumps(node)[:200]}")
        if set(node) == {"function"}:
            raise NotLiteral(f"{where}: function call {json.dumps(node)[:200]}")
        return {key: to_literal(value, f"{where}.{key}") for key, value in node.items()}
    if isinstance(node, list):
        return [to_literal(value, f"{where}[{i}]") for i, value in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        raise NotLiteral(f"{where}: interpolated string {node!r}")
    return node


def find_containers(files: list[Path]) -> list[tuple[Path, str, dict]]:
    try:
        from pycep import BicepParser
    except ImportError:
        print("pycep-parser is not installed: pip install -r scripts/requirements-infra.txt", file=sys.stderr)
        sys.exit(2)
    parser = BicepParser()
    found = []
    for path in files:
        try:
            parsed = parser.parse(file_path=path)
        except Exception as exc:  # pycep raises lark errors of several types
            print(f"cannot parse {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(2)
        for symbol, resource in (parsed.get("resources") or {}).items():
            if resource.get("type") == CONTAINER_TYPE and not resource.get("existing"):
                found.append((path, symbol, resource))
    return found


def indexing_problems(definition: dict) -> list[str]:
    """What is wrong with the indexing policy itself, whatever Bicep says.

    Every indexed value costs request units on every write, so the policy lists
    what the queries and the unique key need and excludes everything else with
    `/*`. Indexing mode `none` is incompatible with TTL (inbox documents expire).
    The unique key paths stay indexed: whether a unique key works on excluded
    paths is not documented.
    """
    policy = definition.get("indexingPolicy")
    if not isinstance(policy, dict):
        return ["indexingPolicy is missing (the service default indexes every path)"]
    problems = []
    if policy.get("indexingMode") != "consistent":
        problems.append(f"indexingMode is {policy.get('indexingMode')!r}, not 'consistent' (TTL needs it)")
    included = [p.get("path") for p in policy.get("includedPaths") or [] if isinstance(p, dict)]
    excluded = [p.get("path") for p in policy.get("excludedPaths") or [] if isinstance(p, dict)]
    if "/*" not in excluded:
        problems.append("excludedPaths does not exclude /* (every path would be indexed and paid for)")
    if "/*" in included:
        problems.append("includedPaths includes /*")
    for key in (definition.get("uniqueKeyPolicy") or {}).get("uniqueKeys") or []:
        for path in key.get("paths") or []:
            if f"{path}/?" not in included:
                problems.append(f"unique key path {path} is not indexed ({path}/? missing from includedPaths)")
    return problems


def pretty(value) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True).splitlines(keepends=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bicep", action="append", type=Path, help="Bicep file(s) to search (default: infra/**/*.bicep)")
    ap.add_argument("--expected", type=Path, default=REPO_ROOT / "infra" / "cosmos-container.json")
    args = ap.parse_args()

    files = args.bicep or sorted((REPO_ROOT / "infra").rglob("*.bicep"))
    if not files:
        print("no .bicep files found", file=sys.stderr)
        return 2
    try:
        expected = json.loads(args.expected.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read {args.expected}: {exc}", file=sys.stderr)
        return 2

    containers = find_containers(files)
    if len(containers) != 1:
        names = ", ".join(f"{p}:{s}" for p, s, _ in containers) or "none"
        print(f"expected exactly one {CONTAINER_TYPE} resource, found {len(containers)}: {names}")
        return 1
    path, symbol, resource = containers[0]
    label = f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} resource '{symbol}'"

    config = resource.get("config") or {}
    try:
        name = to_literal(config.get("name"), "name")
        block = to_literal((config.get("properties") or {}).get("resource"), "properties.resource")
    except NotLiteral as exc:
        print(f"MISMATCH {label}: the container must be written literally in Bicep ({exc})")
        return 1
    if not isinstance(block, dict):
        print(f"MISMATCH {label}: properties.resource is missing or not an object")
        return 1

    problems = [f"{args.expected.name}: {p}" for p in indexing_problems(expected)]
    if name != expected.get("id"):
        problems.append(f"resource name {name!r} != expected id {expected.get('id')!r}")
    for field in COMPARED_FIELDS:
        if block.get(field) != expected.get(field):
            problems.append(f"{field}: bicep {json.dumps(block.get(field))} != expected {json.dumps(expected.get(field))}")
    extra = sorted(set(block) - set(expected))
    missing = sorted(set(expected) - set(block))
    if extra:
        problems.append(f"fields in Bicep but not in {args.expected.name}: {', '.join(extra)}")
    if missing:
        problems.append(f"fields in {args.expected.name} but not in Bicep: {', '.join(missing)}")

    if problems:
        print(f"MISMATCH between {label} and {args.expected}:")
        for problem in problems:
            print(f"  - {problem}")
        print("diff (expected -> bicep):")
        sys.stdout.writelines(
            difflib.unified_diff(pretty(expected), pretty(block), fromfile=str(args.expected), tofile=label)
        )
        return 1
    print(
        f"OK {label} equals {args.expected.name} (id, partitionKey, defaultTtl, uniqueKeyPolicy, indexingPolicy); "
        "the indexing policy excludes /* and indexes the unique key paths"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
