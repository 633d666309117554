"""docs/benchmarks/: every page's results table is what its bench's --json output gives (bench/pages.py
--check), and the check itself catches a stale table and a broken result file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_pages", ROOT / "bench" / "pages.py")
pages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pages)

RESULT = {"command": "bench/x.py --json x.json", "date": "2026-12-04", "load": "1.0, 1.0, 1.0",
          "columns": ["measure", "value"], "rows": [["speed", 1.5]]}


def test_every_benchmark_page_table_is_current():
    assert pages.stale() == []
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [p.name for p in pages.PAGES.glob("*.md") if f"benchmarks/{p.name}" not in index]
    assert not missing, f"docs/benchmarks.md does not link {missing}"


# Pages with no results block yet, each with the reason; every other page must open with one.
WITHOUT_RESULTS = {
}


def test_every_page_opens_with_a_results_block_or_says_why_not():
    missing = [p.name for p in sorted(pages.PAGES.glob("*.md"))
               if not pages.BLOCK.search(p.read_text()) and p.name not in WITHOUT_RESULTS]
    assert not missing, f"pages without a results block (add one, or a reason to WITHOUT_RESULTS): {missing}"
    for page in pages.PAGES.glob("*.md"):
        text = page.read_text()
        if pages.BLOCK.search(text):  # the current result first, the dated history (if any) below it
            assert text.index("## Current result") < text.index("<!-- results: "), page.name
            history = text.find("## History")
            assert history == -1 or history > text.rindex("<!-- /results -->"), page.name


def test_the_check_catches_a_stale_table_and_a_bad_file(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(json.dumps(RESULT))
    page = tmp_path / "x.md"
    page.write_text("# x\n\n<!-- results: x.json -->\nold table\n<!-- /results -->\n\n## History\n")
    assert pages.stale(tmp_path, results) == ["x.md: its results table is stale (run bench/pages.py --write)"]
    text, problems = pages.rendered(page, results)
    assert problems == [] and "| speed | 1.5 |" in text and "Measured 2026-12-04" in text
    (results / "x.json").write_text(json.dumps({**RESULT, "rows": [["speed", 1131.0], ["slow", 0.01234]]}))
    assert "| speed | 1131 |\n| slow | 0.0123 |" in pages.rendered(page, results)[0]
    (results / "x.json").write_text(json.dumps(RESULT))
    page.write_text(text)
    assert pages.stale(tmp_path, results) == []
    (results / "x.json").write_text(json.dumps({**RESULT, "rows": [["speed"]]}))
    assert pages.stale(tmp_path, results)[0].startswith("x.md: ") and "1 cells for 2 columns" in \
        pages.stale(tmp_path, results)[0]


def test_write_result_records_command_date_and_load_and_refuses_a_bad_table(tmp_path, monkeypatch):
    monkeypatch.setattr(pages.sys, "argv", [str(ROOT / "bench" / "x.py"), "--json", "x.json"])
    out = tmp_path / "x.json"
    pages.write_result(out, ["measure", "value"], [("speed", 1.5)], notes=["a note"])
    got = json.loads(out.read_text())
    assert got["command"] == "bench/x.py --json x.json" and got["rows"] == [["speed", 1.5]]
    assert len(got["load"].split(", ")) == 3 and got["date"][:2] == "20" and got["notes"] == ["a note"]
    with pytest.raises(ValueError, match="1 cells for 2 columns"):
        pages.write_result(tmp_path / "bad.json", ["a", "b"], [["only one"]])
    assert not (tmp_path / "bad.json").exists()


def test_a_slow_test_records_only_when_asked_and_appends_within_one_run(tmp_path, monkeypatch):
    monkeypatch.setattr(pages.sys, "argv", ["pytest", "-m", "slow", "tests/x.py"])
    monkeypatch.delenv("SLOPILOT_RESULTS", raising=False)
    pages.record_from_test("x.json", ["model", "error"], [["a", "1%"]])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("SLOPILOT_RESULTS", str(tmp_path))
    pages.record_from_test("x.json", ["model", "error"], [["a", "1%"]], ["how"])
    pages.record_from_test("x.json", ["model", "error"], [["b", "2%"]], ["how"])
    got = json.loads((tmp_path / "x.json").read_text())
    assert got["rows"] == [["a", "1%"], ["b", "2%"]] and got["notes"] == ["how"]
    assert got["command"] == f"SLOPILOT_RESULTS={tmp_path} pytest -m slow tests/x.py"
    monkeypatch.setattr(pages.os, "getpid", lambda: -1)  # another pytest run starts the file afresh
    pages.record_from_test("x.json", ["model", "error"], [["c", "3%"]])
    assert json.loads((tmp_path / "x.json").read_text())["rows"] == [["c", "3%"]]
