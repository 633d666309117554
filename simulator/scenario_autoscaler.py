"""A scenario's autoscaling: a pool's `autoscaler` entry (fixed, a schedule, or a policy spec inline or
in a file, its trigger queries checked against the evaluator) and the recording rules of `metrics`."""

from __future__ import annotations

import inspect
from pathlib import Path

from autoscaler.schedule import SchedulePolicy
from autoscaler.spec import load_spec
from autoscaler.yamlfile import Document, dotted, parse
from promql import PromQLError, compile_query
from promql.rules import RuleGroup, rule_groups
from simulator.latency.loader import model_ref
from simulator.scenario_limits import MAX_REPLICAS, MIN_INTERVAL, MIN_SCRAPE_INTERVAL
from simulator.scenario_schema import resolve

SCHEDULE_POLLING = inspect.signature(SchedulePolicy).parameters["polling_interval"].default


def autoscaler_entry(doc: Document, base: Path) -> dict:
    """The pool's autoscaler entry: fixed, a schedule, or a policy spec (a file or inline)."""
    entry = _entry(doc, base)
    if entry["kind"] == "spec":
        spec = entry["spec"]
        _check_queries(doc, spec)
        if spec.max_replicas > MAX_REPLICAS:
            raise doc.error((), f"the spec's maximum of {spec.max_replicas} replicas is more than the limit "
                            f"of {MAX_REPLICAS}")
        if spec.polling_interval < MIN_INTERVAL:
            raise doc.error((), f"the spec's polling interval of {spec.polling_interval:g} s is less than "
                            f"the limit of {MIN_INTERVAL} s")
    return entry


def _entry(doc: Document, base: Path) -> dict:
    a, where = doc.data, dotted(doc.prefix)
    if "apiVersion" in a or "kind" in a:  # a whole spec inline
        return {"kind": "spec", "spec": load_spec(doc), "latency_model": None, "where": where}
    if "fixed" in a:
        return {"kind": "fixed", "replicas": int(a["fixed"])}
    if "schedule" in a:
        steps: list[tuple[float, int]] = []
        for i, r in enumerate(a["schedule"]):
            if steps and r["at"] < steps[-1][0]:
                raise doc.error(("schedule", i, "at"), "times must be non-decreasing")
            steps.append((float(r["at"]), int(r["replicas"])))
        polling = a.get("polling_interval", SCHEDULE_POLLING)
        return {"kind": "schedule", "steps": steps, "polling_interval": float(polling)}
    lm = model_ref(a["latency_model"]) if a.get("latency_model") else None
    if lm and ("/" in lm or lm.endswith(".json")):
        lm = resolve(lm, base)
    if isinstance(a["spec"], dict):
        return {"kind": "spec", "spec": load_spec(doc.at("spec")), "latency_model": lm, "where": where}
    path = resolve(a["spec"], base)
    if not Path(path).is_file():
        raise doc.error(("spec",), f"file not found: {path}")
    try:
        spec = load_spec(Path(path).read_text(), path=path)
    except ValueError as exc:
        raise doc.error(("spec",), str(exc)) from None
    return {"kind": "spec", "spec": spec, "path": path, "latency_model": lm, "where": where}


def recording_rules(doc: Document, base: Path) -> list[RuleGroup]:
    """The recording rules of metrics.rule_files and metrics.rules, their errors naming the field."""
    groups: list[RuleGroup] = []
    for i, f in enumerate(doc.data.get("rule_files", [])):
        path = Path(resolve(f, base))
        try:
            groups += rule_groups(parse(path.read_text(), str(path)).data, str(path))
        except FileNotFoundError:
            raise doc.error(("rule_files", i), f"file not found: {path}") from None
        except ValueError as exc:
            raise doc.error(("rule_files", i), str(exc)) from None
    if "rules" in doc.data:
        try:
            groups += rule_groups(doc.data["rules"], "rules")
        except ValueError as exc:
            raise doc.error(("rules",), str(exc)) from None
    for g in groups:  # a group's evaluations over the run are bounded as the scrapes are
        if g.interval is not None and g.interval < MIN_SCRAPE_INTERVAL * 1000:
            raise doc.error((), f"rule group {g.name!r}: interval {g.interval} ms is less than the limit "
                            f"of {MIN_SCRAPE_INTERVAL} s")
    names = [g.name for g in groups]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise doc.error((), f"rule group(s) {', '.join(twice)} defined more than once")
    return groups


def _check_queries(doc: Document, spec) -> None:
    """Every trigger query of a spec parses and uses only what the simulator's evaluator answers."""
    for trig in spec.triggers:
        try:
            tree = compile_query(trig.query)
        except PromQLError as exc:
            raise doc.error((), f"trigger {trig.name!r}: {exc}") from None
        if tree.type == "matrix":
            raise doc.error((), f"trigger {trig.name!r}: query {trig.query!r} gives a range vector; a "
                            "trigger needs an instant vector or a scalar")
