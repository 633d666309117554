"""The benchmark pages (docs/benchmarks/*.md) open with their bench's current result table, generated
from the bench's `--json` output, kept beside the pages in docs/benchmarks/results/NAME.json. A page
marks the table's place:

    <!-- results: NAME.json -->
    (the table, written by this module)
    <!-- /results -->

    .venv/bin/python bench/pages.py --check   # exit 1 naming each page whose table is stale
    .venv/bin/python bench/pages.py --write   # rewrite the tables from the JSON files

A result file: {"command": the bench's command line, "date": "YYYY-MM-DD", "load": the load average
beside the timings, "columns": [names], "rows": [[cells]], "notes": [lines, optional]}. A bench writes
it with `write_result` (`from bench.pages import write_result`), never by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
from pathlib import Path

PAGES = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
RESULTS = PAGES / "results"
BLOCK = re.compile(r"<!-- results: (?P<file>[\w.-]+\.json) -->\n(?P<body>.*?)<!-- /results -->", re.S)
KEYS = ("command", "date", "load", "columns", "rows")


def write_result(path: str | Path, columns: list, rows: list, notes: list[str] | None = None,
                 command: str | None = None, **extra) -> dict:
    """Write a bench's results for its page: its own command line, today's date, the load average now
    (taken at the end of the run, so the 1-minute figure covers the last of the timings). Keys in
    `extra` (a bench's own figures, for itself to read back) are kept beside them, not rendered."""
    if command is None:
        script, root = Path(sys.argv[0]).resolve(), PAGES.parent.parent
        name = str(script.relative_to(root)) if script.is_relative_to(root) else script.name
        command = " ".join([name, *sys.argv[1:]])
    result = {"command": command, "date": datetime.date.today().isoformat(),
              "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()), "columns": list(columns),
              "rows": [list(r) for r in rows]}
    if notes:
        result["notes"] = list(notes)
    result.update(extra)
    render(result, str(path))  # a malformed result fails here, in the bench, not later in --check
    Path(path).write_text(json.dumps(result, indent=1) + "\n")
    return result


def record_from_test(name: str, columns: list, rows: list, notes: list[str] | None = None) -> None:
    """A page whose measurement is a slow test: the test hands its table here, written to
    $SLOPILOT_RESULTS/NAME when that is set (`SLOPILOT_RESULTS=docs/benchmarks/results pytest -m slow
    tests/...`), and nowhere otherwise, so an ordinary test run leaves the recorded results alone.
    Several tests of one pytest run may record into one file: their rows are appended in run order."""
    where = os.environ.get("SLOPILOT_RESULTS")
    if not where:
        return
    path, session = Path(where) / name, f"pytest pid {os.getpid()}"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    if old.get("session") == session and old.get("columns") == list(columns):
        rows = old["rows"] + [list(r) for r in rows]
        notes = old.get("notes", []) + [n for n in notes or [] if n not in old.get("notes", [])]
    args = shlex.join(a for a in sys.argv[1:] if not a.startswith("--basetemp"))  # copy-pasteable
    write_result(path, columns, rows, notes, command=f"SLOPILOT_RESULTS={where} pytest {args}",
                 session=session)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e3 else f"{value:.0f}"  # .3g writes 1131.0 as 1.13e+03
    return str(value).replace("|", "\\|")


def render(result: dict, where: str = "result") -> str:
    """The markdown a result file gives: when, how, the table, its notes."""
    missing = [k for k in KEYS if k not in result]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    cols = result["columns"]
    for i, row in enumerate(result["rows"]):
        if len(row) != len(cols):
            raise ValueError(f"{where}: rows[{i}] has {len(row)} cells for {len(cols)} columns")
    lines = [f"Measured {result['date']} (load average {result['load']}) with `{result['command']}`:", "",
             "| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in result["rows"]]
    lines += [""] + [f"{n}" for n in result.get("notes", [])] + ([""] if result.get("notes") else [])
    return "\n".join(lines) + "\n"


def rendered(page: Path, results: Path = RESULTS) -> tuple[str, list[str]]:
    """The page's text with each results block regenerated, and the problems found doing it."""
    text, problems = page.read_text(), []

    def block(m: re.Match) -> str:
        path = results / m["file"]
        try:
            body = render(json.loads(path.read_text()), str(path))
        except (OSError, ValueError) as exc:
            problems.append(f"{page.name}: {exc}")
            return m[0]
        return f"<!-- results: {m['file']} -->\n{body}<!-- /results -->"

    return BLOCK.sub(block, text), problems


def stale(pages: Path = PAGES, results: Path = RESULTS) -> list[str]:
    """Pages whose tables differ from what their result files give (or whose files are unreadable)."""
    out = []
    for page in sorted(pages.glob("*.md")):
        text, problems = rendered(page, results)
        out += problems
        if text != page.read_text():
            out.append(f"{page.name}: its results table is stale (run bench/pages.py --write)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when a page's table is stale")
    ap.add_argument("--write", action="store_true", help="rewrite the tables from the result files")
    args = ap.parse_args(argv)
    if args.write:
        for page in sorted(PAGES.glob("*.md")):
            text, problems = rendered(page)
            if problems:
                print("\n".join(problems), file=sys.stderr)
                return 1
            page.write_text(text)
    bad = stale()
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"{len(list(PAGES.glob('*.md')))} benchmark pages, every results table current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
