"""Every example in the user guide runs as written: its files are written, its shell blocks run in order
in a scratch folder (with examples/ and profiles/ from the repository), and a block marked as output
must be what the command before it printed. The reference pages are what the generator makes now."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(file|output)\s*:?\s*(\S*)\s*-->\s*$")


def blocks(text: str) -> list[dict]:
    """Fenced blocks in order: {lang, body, mark, arg, line}; mark comes from an HTML comment on the
    line just before the fence (file: NAME, or output)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        mark = MARK.match(lines[i - 1]) if i > 0 else None
        start, i = i, i + 1
        while not lines[i].startswith("```"):
            i += 1
        out.append({"lang": m.group(1), "body": "\n".join(lines[start + 1:i]) + "\n", "line": start + 1,
                    "mark": mark.group(1) if mark else None, "arg": mark.group(2) if mark else None})
        i += 1
    return out


def test_every_block_is_runnable_or_a_file_or_an_output():
    for b in blocks(GUIDE.read_text()):
        runnable = b["lang"] == "sh" and b["mark"] is None
        assert runnable or b["mark"] in ("file", "output"), f"docs/guide.md:{b['line']}: {b['lang']} block " \
            "is neither a command (```sh), a file (<!-- file: NAME -->) nor an output (<!-- output -->)"


def test_the_guide_runs_as_written(tmp_path):
    for name in ("examples", "profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    last = None
    ran = 0
    for b in blocks(GUIDE.read_text()):
        where = f"docs/guide.md:{b['line']}"
        if b["mark"] == "file":
            (tmp_path / b["arg"]).write_text(b["body"])
        elif b["mark"] == "output":
            assert last is not None, f"{where}: an output block needs a command before it"
            assert last.stdout == b["body"], f"{where}: the command printed\n{last.stdout}"
        else:
            last = subprocess.run(["bash", "-e", "-c", b["body"]], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert last.returncode == 0, f"{where}: exit {last.returncode}\n{last.stdout}\n{last.stderr}"
            ran += 1
    assert ran >= 8
    # what the guide says the runs show
    assert (tmp_path / "out" / "plan-2.txt").read_text().startswith("all SLOs met")
    assert (tmp_path / "out" / "plan-1.txt").read_text().startswith("SLOs MISSED")
    assert "same decisions" in subprocess.run(
        ["bash", "-c", "diff decisions.csv examples/replay/keda_queue.expected.csv && echo same decisions"],
        cwd=tmp_path, capture_output=True, text=True).stdout
    summaries = {p: (tmp_path / "out" / f"compare-{p}" / "summary.json").read_text() for p in ("keda", "kpa")}
    assert '"met": false' in summaries["keda"] and '"met": false' not in summaries["kpa"]


def test_reference_pages_are_generated_from_the_schemas():
    rc = subprocess.run([sys.executable, str(ROOT / "docs" / "guide" / "generate.py"), "--check"],
                        capture_output=True, text=True)
    assert rc.returncode == 0, rc.stdout + rc.stderr + " (run: .venv/bin/python docs/guide/generate.py)"


def test_plan_reference_lists_every_plan_field_with_a_meaning():
    # a field added to the plan schema shows on the page (the check above) and needs a meaning written
    page = (ROOT / "docs" / "guide" / "plan-reference.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in page.splitlines()
            if line.startswith("| `")]
    fields = {r[0].strip("`"): r for r in rows}  # field, type, limits, default, meaning
    for name in ("seeds", "compress", "deployments[].price_per_gpu_hour", "engine.max_num_seqs",
                 "policies[].spec", "autoscale", "search.step", "search.check_duration"):
        assert name in fields, name
    assert all(r[4] for r in rows), [r[0] for r in rows if not r[4]]
    assert fields["search.max_duration"][3] == "`1800.0`" and fields["deployments"][3] == "required"
    assert "[scenario-reference.md](scenario-reference.md)" in fields["workload"][4]


@pytest.mark.parametrize("page", ["guide.md", "guide/scenario-reference.md", "guide/spec-reference.md",
                                  "guide/plan-reference.md", "inputs.md"])
def test_links_resolve(page):
    path = ROOT / "docs" / page
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if not target.startswith("http"):
            assert (path.parent / target).exists(), f"{page}: broken link {target}"


@pytest.mark.parametrize("command", ["replay", "simulate", "calibrate", "predict", "profile", "demo"])
def test_help_points_to_the_guide(command):
    out = subprocess.run([sys.executable, "-m", "slopilot.cli", command, "--help"], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "docs/guide.md" in out


def test_the_mistakes_section_shows_each_message():
    # each common mistake with the very message a user sees (the runnable test above checks each output)
    text = GUIDE.read_text()
    section = text[text.index("## Common mistakes and what you see"):text.index("## Where next")]
    outputs = [b["body"] for b in blocks(section) if b["mark"] == "output"]
    for message in ("matched nothing over the whole run", "did you mean model_name=",
                    "'ttft_p90' is reserved",
                    "metric source prometheus http://127.0.0.1:9 failed", "exit status 1",
                    "is not a `slopilot serve` flag (did you mean max_num_seqs?)", "shipped model",
                    "metricType belongs beside metadata", "did you mean activationThreshold?"):
        assert any(message in o for o in outputs), message
