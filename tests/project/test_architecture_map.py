"""docs/architecture.md names every package folder: a folder holding Python code that the map does not
name (as `folder/`) fails here, so a newcomer can always find where a package lives."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_PACKAGES = {"tests", "bench", "docs", "scripts", "examples", "build", "deploy", "out"}


def package_folders() -> list[str]:
    """Top-level packages (a folder with __init__.py) and every folder below them holding .py files."""
    tops = [p for p in ROOT.iterdir()
            if p.is_dir() and (p / "__init__.py").is_file() and p.name not in NOT_PACKAGES]
    found = set()
    for top in tops:
        for py in top.rglob("*.py"):
            rel = py.parent.relative_to(ROOT)
            if not any(part.startswith((".", "__pycache__")) for part in rel.parts):
                found.add(rel.as_posix())
    return sorted(found)


def test_every_package_folder_is_on_the_map():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    folders = package_folders()
    assert {"autoscaler", "routing", "promql", "controlplane/kube", "engine/core"} <= set(folders)
    missing = [f for f in folders if f"`{f}/`" not in doc]
    assert not missing, (f"docs/architecture.md does not name {', '.join(missing)}: add a row to its "
                         "folder table (and to the layering table for a new top-level package)")
