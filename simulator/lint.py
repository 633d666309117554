"""Warnings for scenario, plan and fleet files (autoscaler.lint has the spec's): SLO seconds that look
like milliseconds, durations over 7 days, a scrape or polling interval longer than the run (it never
fires), and every warning of the autoscaler specs they hold inline or name. Never errors.

    for w in lint_file("scenario.yaml"): print("warning:", w)
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.lint import long_warning, seconds_text, slo_warnings, spec_warnings
from autoscaler.yamlfile import Document, parse

SPEC_KINDS = ("ScaledObject", "InferenceAutoscaler")


def kind_of(data) -> str:
    """spec, plan, scenario or fleet, from the document's keys ('' when none fits)."""
    if not isinstance(data, dict):
        return ""
    if data.get("kind") in SPEC_KINDS:
        return "spec"
    keys = (("deployments", "plan"), ("pools", "scenario"), ("emulate", "fleet"), ("model", "fleet"))
    for key, kind in keys:
        if key in data:
            return kind
    return ""


def lint_document(doc: Document, base: Path = Path(".")) -> list[str]:
    kind = kind_of(doc.data)
    if kind == "spec":
        return spec_warnings(doc)
    if not kind:
        return []
    d = doc.data
    out = slo_warnings(doc, ("slo",)) + long_warning(doc, ("duration",), d.get("duration"))
    run = d.get("duration") if isinstance(d.get("duration"), (int, float)) else None
    if kind == "plan":
        run = run / d.get("compress", 1) if run else None  # the simulated length
        for i, p in enumerate(d.get("policies") or []):
            out += _spec(doc, ("policies", i, "spec"), p.get("spec") if isinstance(p, dict) else None, base)
        return out
    where = ("metrics", "scrape_interval") if kind == "scenario" else ("scrape_interval",)
    interval = (d.get("metrics") or {}).get("scrape_interval") if kind == "scenario" else d.get(where[0])
    if run and isinstance(interval, (int, float)) and interval > run:
        out.append(doc.message(where, f"{seconds_text(interval)} s is longer than the run "
                                      f"({seconds_text(run)} s): never scraped"))
    entries = [(("autoscaler",), d.get("autoscaler"))]
    entries += [(("pools", i, "autoscaler"), p.get("autoscaler")) for i, p in enumerate(d.get("pools") or [])
                if isinstance(p, dict)]
    for path, entry in entries:
        if kind == "scenario" and isinstance(entry, dict):
            path, entry = path + ("spec",), entry.get("spec")
        out += _spec(doc, path, entry, base, run)
    return out


def _spec(doc: Document, path: tuple, entry, base: Path, run: float | None = None) -> list[str]:
    """The warnings of a spec given inline or as a file path, and a polling interval above the run."""
    if isinstance(entry, dict):
        sdoc = doc.at(*path)
    elif isinstance(entry, str) and (base / entry).is_file():
        sdoc = parse((base / entry).read_text(), str(base / entry))
    else:
        return []
    out = spec_warnings(sdoc)
    polling = (sdoc.data.get("spec") or {}).get("pollingInterval") if isinstance(sdoc.data, dict) else None
    if run and isinstance(polling, (int, float)) and polling > run:
        out.append(sdoc.message(("spec", "pollingInterval"),
                                f"{seconds_text(polling)} s is longer than the run ({seconds_text(run)} s): "
                                "the policy never acts"))
    return out


def lint_file(path: str | Path) -> list[str]:
    """Every warning of a spec, scenario, plan or fleet file (which one: from its keys)."""
    p = Path(path)
    return lint_document(parse(p.read_text(), str(path)), p.resolve().parent)
