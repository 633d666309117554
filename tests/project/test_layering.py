"""The import rules of docs/architecture.md, read from the source with ast (nothing is imported).

Every import counts, the lazy ones inside functions too: a lazy import still ties the two files
together, and still pulls torch in when the function runs. The one exception is a parent package's
__init__ that runs only because a submodule was imported: there only its module-level imports run
(engine/__init__ reaches the model code lazily, through a module __getattr__).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("autoscaler", "engine", "promql", "routing", "simulator", "controlplane", "slopilot")
# must start without torch
LIGHT = ("autoscaler", "promql", "routing", "simulator", "controlplane", "engine.core")
HEAVY = ("torch", "triton")

# package -> our modules it may import (a prefix match on dotted names); its own are always allowed
ALLOWED = {
    "autoscaler": (),
    "engine.core": ("engine._page_allocator",),  # the C++ extension built from csrc/
    "engine": (),
    "promql": (),
    "routing": ("autoscaler", "engine.core"),
    "simulator": ("autoscaler", "promql", "routing", "engine.core"),
    "controlplane": ("autoscaler", "promql", "routing", "simulator", "engine.core"),
    "slopilot": ("autoscaler", "engine", "promql", "routing", "simulator", "controlplane"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _import_nodes(tree: ast.AST, top_level: bool) -> list[ast.AST]:
    """Import statements anywhere, or only those that run at import time (not inside functions)."""
    if not top_level:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found, todo = [], list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _imports(name: str, path: Path, known: dict[str, Path], top_level: bool = False) -> set[str]:
    """Dotted names this module imports: ours resolved to modules, others as written."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(tree, top_level):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for alias in node.names:  # `from pkg import submodule`
                if f"{mod}.{alias.name}" in known:
                    out.add(f"{mod}.{alias.name}")
    return out


def _graph(top_level: bool = False) -> dict[str, set[str]]:
    try:
        return _graph_here(top_level)
    except SystemError:
        # CPython 3.11.7's ast can be left in a bad state by an earlier failure in the same process
        # ("AST constructor recursion depth mismatch", gh-106905): read the source in a fresh one
        code = ("import json, sys; from tests.project.test_layering import _graph_here; "
                "print(json.dumps({k: sorted(v) for k, v in _graph_here(sys.argv[1] == '1').items()}))")
        out = subprocess.run([sys.executable, "-c", code, "1" if top_level else "0"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return {k: set(v) for k, v in json.loads(out).items()}


def _graph_here(top_level: bool = False) -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known, top_level) for name, path in known.items()}


def _ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def _package_of(module: str) -> str:
    return "engine.core" if _within(module, "engine.core") else module.split(".")[0]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        pkg = _package_of(src)
        for t in sorted(targets):
            if not _ours(t) or _within(t, pkg):
                continue
            if pkg == "engine" and _within(t, "engine"):
                continue  # engine may use its own core
            if not any(_within(t, allowed) for allowed in ALLOWED[pkg]):
                bad.append(f"{src} imports {t}")
    return bad


def file_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between files of the same top-level package (Tarjan's strongly connected sets)."""
    edges = {
        m: {t for t in ts if t in graph and t != m and t.split(".")[0] == m.split(".")[0]}
        for m, ts in graph.items()
    }
    # a package's __init__ importing its own modules is how packages re-export, not a cycle
    for m in edges:
        edges[m] = {t for t in edges[m] if not _within(t, m)}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def heavy_paths(graph: dict[str, set[str]], top_level: dict[str, set[str]] | None = None) -> list[str]:
    """For each light module that reaches torch or triton through any chain of imports, that chain.

    `top_level` holds each module's import-time imports, used for parent packages that run only
    because one of their submodules was imported."""
    top_level = graph if top_level is None else top_level
    bad = []
    for start in sorted(m for m in graph if any(_within(m, light) for light in LIGHT)):
        seen, queue = {start: None}, [(start, graph)]
        while queue:
            m, edges = queue.pop(0)
            hit = next((t for t in sorted(edges.get(m, ())) if t.split(".")[0] in HEAVY), None)
            if hit:
                chain = [hit, m]
                while seen[chain[-1]] is not None:
                    chain.append(seen[chain[-1]])
                bad.append(" -> ".join(reversed(chain)))
                break
            for t in sorted(edges.get(m, ())):
                for parent in _parents(t):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                    if parent in graph and parent not in seen:
                        seen[parent] = m
                        queue.append((parent, graph if parent == t else top_level))
    return bad


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def unresolved(graph: dict[str, set[str]]) -> list[str]:
    """Imports of our packages that name no module of ours (a module that moved, a typo)."""
    known = set(graph) | {"engine._page_allocator"}  # the C++ extension, built, not in the source
    return [f"{src} imports {t}" for src, targets in sorted(graph.items()) for t in sorted(targets)
            if _ours(t) and t not in known]


def test_every_import_of_ours_names_a_module():
    assert unresolved(_graph()) == []
    assert unresolved({"controlplane.a": {"simulator.promql.parse", "numpy"}, "simulator.b": set()}) == [
        "controlplane.a imports simulator.promql.parse"]  # a module that moved away


def test_packages_import_only_what_the_layers_allow():
    assert layer_violations(_graph()) == []


def test_no_import_cycle_between_files():
    assert file_cycles(_graph()) == []


def test_light_packages_never_reach_torch():
    assert heavy_paths(_graph(), _graph(top_level=True)) == []


# the checks themselves, on small made-up graphs
@pytest.mark.parametrize(
    "graph,expected",
    [
        ({"autoscaler.keda": {"simulator.metrics"}}, ["autoscaler.keda imports simulator.metrics"]),
        ({"engine.emulated": {"simulator.latency"}}, ["engine.emulated imports simulator.latency"]),
        ({"engine.core.scheduler": {"engine.model"}}, ["engine.core.scheduler imports engine.model"]),
        ({"simulator.replica": {"engine.llm"}}, ["simulator.replica imports engine.llm"]),
        ({"simulator.replica": {"engine.core.scheduler", "autoscaler.policy", "numpy"}}, []),
        ({"controlplane.x": {"slopilot.cli"}}, ["controlplane.x imports slopilot.cli"]),
        ({"slopilot.commands.serve": {"engine.server", "simulator.latency"}}, []),
        ({"routing.router": {"simulator.fleet"}}, ["routing.router imports simulator.fleet"]),
        ({"controlplane.router.gate": {"routing.flow", "simulator.scenario"}}, []),
        ({"promql.engine": {"simulator.metrics"}}, ["promql.engine imports simulator.metrics"]),
        ({"controlplane.sources.scrape": {"promql.engine"}}, []),
    ],
)
def test_layer_rule_examples(graph, expected):
    assert layer_violations(graph) == expected


def test_cycle_and_torch_examples():
    graph = {"simulator.a": {"simulator.b"}, "simulator.b": {"simulator.a"}, "simulator.c": set()}
    assert file_cycles(graph) == [["simulator.a", "simulator.b"]]
    graph = {"simulator.a": {"engine.core.x"}, "engine.core.x": set(), "engine": {"torch"}}
    assert heavy_paths(graph) == ["simulator.a -> engine -> torch"]  # engine/__init__ runs first
    assert heavy_paths(graph, {**graph, "engine": set()}) == []  # ... and imports torch only lazily
    graph = {"simulator.a": {"engine.core.x"}, "engine.core.x": {"engine.llm"}, "engine.llm": {"torch"}}
    assert heavy_paths(graph)[0] == "engine.core.x -> engine.llm -> torch"


FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink"}


def file_io_calls(package: str) -> list[str]:
    """Calls that touch files (open(), Path.read_text(), ...) in a package's code."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in FILE_CALLS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}()")
    return found


def test_autoscaler_does_no_file_io():
    """Policies and their parsers take text; the CLI (slopilot/commands) reads and writes the files."""
    assert file_io_calls("autoscaler") == []
