"""tests/ mirrors the packages: a test file sits in the folder of the package it mainly tests
(tests/autoscaler/, tests/simulator/, ...; tests/README.md), never flat in tests/. A flat one fails
here, named with the folder its imports point to."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# a package's unit tests; then multi-process runs (e2e), the Kubernetes tests, repository-wide checks
PACKAGE_FOLDERS = ("autoscaler", "controlplane", "engine", "promql", "routing", "simulator", "slopilot")
FOLDERS = {*PACKAGE_FOLDERS, "e2e", "kube", "project", "data"}


def folder_for(path: Path) -> str:
    """The package a test file imports most (ties go to the first import), else `project`. Most tests
    drive the CLI (`slopilot.cli.main`), so `slopilot` counts only when nothing else is imported."""
    counts: Counter[str] = Counter()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGE_FOLDERS:
                counts[top] += 1
    cli = counts.pop("slopilot", 0)
    return counts.most_common(1)[0][0] if counts else "slopilot" if cli else "project"


def flat_test_files(tests: Path) -> list[str]:
    return [f"{p.name} sits flat in tests/: move it to tests/{folder_for(p)}/ (git mv; the folder of the "
            f"package it mainly tests, see tests/README.md)" for p in sorted(tests.glob("test_*.py"))]


def test_no_test_file_sits_flat_in_tests():
    flat = flat_test_files(TESTS)
    assert not flat, "\n".join(flat)


def test_a_flat_file_is_named_with_the_folder_its_imports_point_to(tmp_path):
    (tmp_path / "test_new.py").write_text("from autoscaler import load_spec\n"
                                          "from simulator.run import simulate\n"
                                          "from simulator.scenario import load_scenario\n")
    (tmp_path / "test_docs.py").write_text("import json\n")
    (tmp_path / "test_pipe.py").write_text("from slopilot.cli import main\n")
    (tmp_path / "helpers.py").write_text("from engine import LLM\n")
    assert flat_test_files(tmp_path) == [
        "test_docs.py sits flat in tests/: move it to tests/project/ (git mv; the folder of the package it "
        "mainly tests, see tests/README.md)",
        "test_new.py sits flat in tests/: move it to tests/simulator/ (git mv; the folder of the package it "
        "mainly tests, see tests/README.md)",
        "test_pipe.py sits flat in tests/: move it to tests/slopilot/ (git mv; the folder of the package it "
        "mainly tests, see tests/README.md)"]


def test_every_test_folder_is_a_known_one():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - FOLDERS == set(), "add the folder to tests/README.md and FOLDERS here"


def test_test_file_names_are_unique_across_folders():
    # without __init__.py files pytest imports a test file by its bare name: two of one name collide
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
