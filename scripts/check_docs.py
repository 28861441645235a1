#!/usr/bin/env python3
"""Checks the documentation: no line in docs/*.md over 120 characters outside tables and fenced
code blocks, and every relative link to a Markdown file (`](file.md)`, `](file.md#anchor)`,
`](#anchor)`) in README.md and docs/*.md names a file that exists and a heading anchor it has
(GitHub's rule: lowercase, punctuation other than `-` and `_` dropped, spaces to `-`, repeats
numbered -1, -2, ...). Prints the longest prose line and every failure; exits 1 on a failure.

    python3 scripts/check_docs.py [ROOT]      (ROOT: the repository, by default this script's)
"""
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
LIMIT = 120


def prose_lines(text):
    fence = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if fence or line.strip().startswith("|"):
            continue
        yield number, line


def anchors(path):
    seen, result = {}, set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = m.group(1).strip().lower()
        slug = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", slug)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", slug).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def main():
    failures = []
    longest = (0, "")
    docs = sorted((ROOT / "docs").glob("*.md"))
    for path in docs:
        for number, line in prose_lines(path.read_text()):
            where = f"{path.relative_to(ROOT)}:{number}"
            if len(line) > longest[0]:
                longest = (len(line), where)
            if len(line) > LIMIT:
                failures.append(f"{where}: {len(line)} characters (limit {LIMIT} outside tables and code)")
    links = 0
    for path in [ROOT / "README.md", *docs]:
        text = path.read_text()
        # drop fenced code, where brackets are not links
        text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
        for m in re.finditer(r"\]\(([^)\s]*)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            if file and not file.endswith(".md"):
                continue
            links += 1
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}: ]({target})"
            if not dest.exists():
                failures.append(f"{where}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            elif anchor and anchor not in anchors(dest):
                failures.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    print(f"longest line outside tables and code in docs/: {longest[0]} ({longest[1]})")
    print(f"relative Markdown links checked: {links}, broken: {sum('anchor' in f or 'no file' in f for f in failures)}")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
