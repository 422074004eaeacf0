#!/usr/bin/env python3
"""Every figure the docs and manifests cite from BENCHMARKS.md must be in its current tables.

    scripts/check-bench-citations.py [--repo DIR]

A citation is a paragraph that names BENCHMARKS.md: in Markdown (README.md, docs/**/*.md,
deploy/**/*.md) a block of lines between blank lines; in any other file under deploy/ (YAML,
TOML, shell) a run of comment lines. Its figures are the numbers with a unit of measurement
(MiB, KiB, GiB, %, ns, µs, us, ms, s, ×, x); a figure followed by "by default" or "(default"
is a setting, not a measurement, and is left alone. Each figure must appear, as that number,
in BENCHMARKS.md's "## Current results" section (up to the next "## " heading): a figure that
only the history (BENCHMARKS-history.md, or the runs in full further down) still has is stale.

Prints every stale figure with its file and line, and exits 1 when there is one; run by
scripts/test.sh before the tests.
"""
import argparse
import pathlib
import re
import sys

UNITS = r"(?:MiB|KiB|GiB|%|ns|µs|us|ms|s|×|x)"
# 1 000 and 32 990 (thin or plain spaces between digit groups), 0.2428, 2.4
NUMBER = r"\d{1,3}(?:[ \u2009\u202f]\d{3})+(?!\d)|\d+(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.])({NUMBER})\s?({UNITS})(?![\w])")
# Spellings of one unit.
SAME_UNIT = {"x": "(?:×|x)", "×": "(?:×|x)", "us": "(?:µs|us)", "µs": "(?:µs|us)"}
SETTING_AFTER = re.compile(r"^\s*(?:by\s+default|\(default)")


def normalise(number: str) -> str:
    return re.sub(r"[ \u2009\u202f]", "", number)


def current_results(benchmarks: str) -> str:
    m = re.search(r"^## Current results\s*$(.*?)(?=^## )", benchmarks, re.M | re.S)
    if not m:
        sys.exit("check-bench-citations: BENCHMARKS.md has no '## Current results' section")
    return m.group(1)


def present(number: str, unit: str, text: str) -> bool:
    """Whether `text` has this number with this unit (a table cell may carry the unit in its
    column header instead: the number alone then, in a row of a table whose header has it)."""
    n = re.escape(normalise(number))
    u = SAME_UNIT.get(unit, re.escape(unit))
    if re.search(rf"(?<![\d.]){n}\s?{u}(?![\w])", text):
        return True
    for table in re.findall(r"(?:^\|.*\n?)+", text, re.M):
        header = table.splitlines()[0]
        if re.search(rf"(?<![\w]){u}(?![\w])", header) and re.search(rf"(?<![\d.]){n}(?![\d])", table):
            return True
    return False


def paragraphs(path: pathlib.Path):
    """(first line number, text) of each paragraph that names BENCHMARKS.md."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    markdown = path.suffix == ".md"
    block, start = [], 0
    for i, line in enumerate(lines + [""], start=1):
        inside = line.strip() != "" if markdown else line.lstrip().startswith("#")
        if inside:
            if not block:
                start = i
            # a comment's marker is not part of its sentence ("(128 MiB by" / "# default)")
            block.append(line if markdown else line.lstrip().lstrip("#").strip())
            continue
        if block:
            text = "\n".join(block)
            if "BENCHMARKS.md" in text:
                yield start, text
            block = []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    args = ap.parse_args()
    repo = args.repo
    current = current_results((repo / "BENCHMARKS.md").read_text(encoding="utf-8"))
    current_flat = re.sub(r"[ \u2009\u202f](?=\d{3}(?!\d))", "", current)

    files = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    files += sorted(p for p in (repo / "deploy").rglob("*") if p.is_file())
    stale, cited = [], 0
    for path in files:
        for start, text in paragraphs(path):
            for m in FIGURE.finditer(text):
                if SETTING_AFTER.match(text[m.end():]):
                    continue
                cited += 1
                if not present(m.group(1), m.group(2), current_flat):
                    line = start + text[: m.start()].count("\n")
                    stale.append(f"{path.relative_to(repo)}:{line}: {m.group(0)!r} is not in BENCHMARKS.md's current results")
    for s in stale:
        print(s, file=sys.stderr)
    print(f"check-bench-citations: {cited} figures cited from BENCHMARKS.md, {len(stale)} not in its current results")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
