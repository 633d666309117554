"""Warnings, never errors, for what parses but is probably not what was meant: a TPOT target of
`seconds: 100` (meant as ms), a week-long polling interval, `metricType: Value` written under a trigger's
`metadata` (KEDA reads it beside `metadata`; there it is ignored), a misspelled `activationTreshold`
(ignored too). Each warning is `file:line: field: what`, as errors are.

    for w in spec_warnings(parse(text, "so.yaml")): print("warning:", w)

`slopilot lint FILE` prints them; replay, simulate and control print them when they load a file.
"""

from __future__ import annotations

import difflib

from autoscaler.keda_schema import PROMETHEUS_METADATA, TRIGGER
from autoscaler.yamlfile import Document, dotted

SLO_MAX_SECONDS = {"ttft": 600.0, "tpot": 10.0, "itl": 10.0, "e2e": 3600.0}  # above: likely milliseconds
LONG = 7 * 86400.0  # seconds: a duration above a week is probably in the wrong unit
# KEDA prometheus metadata keys we accept but do not list in the schema (deprecated or passed through)
EXTRA_METADATA = ("cortexOrgID", "metricName")
TIME_KEYS = ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "stabilizationWindowSeconds",
             "periodSeconds", "startupDelaySeconds", "scaleDownDelaySeconds", "forecastWindowSeconds")


def slo_warnings(doc: Document, path: tuple) -> list[str]:
    """SLO targets (a mapping of metric -> {percentile, seconds}) whose seconds look like milliseconds."""
    out = []
    slos = doc.at(*path).data if _has(doc.data, path) else {}
    for metric, target in (slos or {}).items():
        limit = SLO_MAX_SECONDS.get(metric)
        secs = target.get("seconds") if isinstance(target, dict) else None
        if limit is not None and isinstance(secs, (int, float)) and secs > limit:
            out.append(doc.message(path + (metric, "seconds"),
                                   f"{secs:g} s for a {metric.upper()} target is above {limit:g} s: "
                                   f"milliseconds meant? (the unit is seconds: {secs / 1000:g} for "
                                   f"{secs:g} ms)"))
    return out


def long_warning(doc: Document, path: tuple, value, what: str = "") -> list[str]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > LONG:
        return [doc.message(path, f"{seconds_text(value)} s is over 7 days{what}: milliseconds meant? "
                                  "(the unit is seconds)")]
    return []


def trigger_warnings(doc: Document, path: tuple) -> list[str]:
    """A trigger list's metadata keys that KEDA does not read there."""
    out = []
    triggers = doc.at(*path).data if _has(doc.data, path) else []
    known = list(PROMETHEUS_METADATA["properties"]) + list(EXTRA_METADATA)
    outer = [k for k in TRIGGER["properties"] if k != "metadata"]
    for i, trig in enumerate(triggers or []):
        md = trig.get("metadata") if isinstance(trig, dict) else None
        for key in md or {}:
            where = path + (i, "metadata", key)
            if key in known:
                continue
            if key in outer:
                beside = f"{dotted(path + (i,))}.{key}"
                out.append(doc.message(where, f"{key} belongs beside metadata (at {beside}), not under it: "
                                              "it is ignored here"))
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(doc.message(where, f"not a prometheus trigger setting{hint}: it is ignored"))
    return out


def spec_warnings(doc: Document) -> list[str]:
    """Every warning for a ScaledObject or InferenceAutoscaler document."""
    d = doc.data if isinstance(doc.data, dict) else {}
    s = d.get("spec") if isinstance(d.get("spec"), dict) else {}
    out = []
    if d.get("kind") == "ScaledObject":
        out += trigger_warnings(doc, ("spec", "triggers"))
    else:
        out += slo_warnings(doc, ("spec", "slo"))
        policy = s.get("policy") if isinstance(s.get("policy"), dict) else {}
        block = policy.get(policy.get("type")) if isinstance(policy.get("type"), str) else None
        if isinstance(block, dict) and "triggers" in block:
            out += trigger_warnings(doc, ("spec", "policy", policy["type"], "triggers"))
    for path, value in _walk(s, ("spec",)):
        if path[-1] in TIME_KEYS:
            out += long_warning(doc, path, value)
    return out


def _has(data, path: tuple) -> bool:
    for k in path:
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and isinstance(k, int) and k < len(data):
            data = data[k]
        else:
            return False
    return True


def _walk(data, path: tuple):
    """(path, value) of every leaf under data."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, path + (i,))
    else:
        yield path, data


def seconds_text(v: float) -> str:
    """Seconds as people read them: 1,800,000 rather than 1.8e+06."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"
