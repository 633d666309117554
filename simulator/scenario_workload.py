"""The scenario's workload section, once validated by the schema: the dict simulator.workload reads.

    {"trace": {...}}                                   a recorded trace (paths resolved)
    {"arrivals": {"cv", "curve", "spikes"}, "prompt_tokens": Dist, "output_tokens": Dist}
                                                       or "lengths_from": a trace of lengths
plus "max_prompt_tokens" / "max_output_tokens" (None: no cap).
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.yamlfile import Document
from simulator.scenario_schema import dist_at, resolve


def workload_config(doc: Document, base: Path) -> dict:
    w = doc.data
    out: dict = {}
    if "trace" in w:
        out["trace"] = dict(w["trace"], path=resolve(w["trace"]["path"], base))
    else:
        out["arrivals"] = arrivals_config(doc.at("arrivals"))
        if "lengths_from" in w:
            out["lengths_from"] = dict(w["lengths_from"], path=resolve(w["lengths_from"]["path"], base))
        else:
            for k in ("prompt_tokens", "output_tokens"):
                if k not in w:
                    raise doc.error((k,), "is required (or give lengths_from a trace)")
                out[k] = dist_at(doc, k, integer=True)
    for k in ("max_prompt_tokens", "max_output_tokens"):
        out[k] = int(w[k]) if k in w else None
    return out


def arrivals_config(doc: Document) -> dict:
    """The arrival process: inter-arrival CV, a rate curve, and spikes on top of it."""
    a = doc.data
    process = a.get("process", "poisson")
    cv = float(a.get("cv", 1.0))
    if process == "poisson" and cv != 1.0:
        raise doc.error(("cv",), "a poisson process has cv 1; use process: gamma")
    if process == "gamma" and "cv" not in a:
        raise doc.error(("cv",), "is required for process: gamma")
    out: dict = {"cv": cv, "spikes": []}
    if "rate" in a:
        out["curve"] = {"kind": "constant", "rate": float(a["rate"])}
    elif "diurnal" in a:
        d = a["diurnal"]
        out["curve"] = {
            "kind": "diurnal",
            "mean": float(d["mean"]),
            "amplitude": float(d.get("amplitude", 0.5)),
            "period": float(d.get("period", 86400.0)),
            "phase": float(d.get("phase", 0.0)),
        }
    else:
        points: list[tuple[float, float]] = []
        for i, p in enumerate(a["piecewise"]):
            t, r = (p["at"], p["rate"]) if isinstance(p, dict) else p
            if points and t < points[-1][0]:
                raise doc.error(("piecewise", i), "times must be non-decreasing")
            points.append((float(t), float(r)))
        out["curve"] = {"kind": "piecewise", "points": points}
    for s in a.get("spikes", []):
        out["spikes"].append(
            {
                "at": float(s["at"]),
                "duration": float(s["duration"]),
                "factor": float(s["factor"]),
                "ramp": float(s.get("ramp", 0.0)),
            }
        )
    return out
