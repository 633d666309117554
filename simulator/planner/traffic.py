"""The plan's traffic: its workload section grown and compressed, its peak rate, and the constant-rate
workload with the same arrival process and length mix that capacity and peak runs use.

Compression plays the curve `compress` times faster at the same rates (a day in an hour at 24):
the simulated runs carry 1/compress of the requests, and costs over the curve are scaled back up.
"""

from __future__ import annotations

import copy

import numpy as np

from autoscaler.yamlfile import document
from simulator.scenario_workload import arrivals_config
from simulator.workload import RateCurve

RATE_STEP = 0.25  # seconds between samples of the rate curve (simulator.workload.arrival_times's grid)
PEAK_WINDOW = 60.0  # a trace's peak: the busiest window of this length


def scaled_workload(workload: dict, growth: float, compress: float) -> dict:
    """The workload section (as in a scenario file) with every rate times `growth` and every time
    divided by `compress`."""
    w = copy.deepcopy(workload)
    if "trace" in w:
        t = w["trace"]
        # faster playback raises the rate by `compress`; thinning takes it back
        t["time_scale"] = t.get("time_scale", 1.0) * compress
        t["rate_scale"] = t.get("rate_scale", 1.0) * growth / compress
        for k in ("start", "duration"):
            if k in t:
                t[k] = t[k] / compress
        return w
    a = w["arrivals"]
    if "rate" in a:
        a["rate"] = a["rate"] * growth
    elif "diurnal" in a:
        d = a["diurnal"]
        d["mean"] = d["mean"] * growth
        for k in ("period", "phase"):
            if k in d:
                d[k] = d[k] / compress
        if "period" not in d:
            d["period"] = 86400.0 / compress
    else:
        a["piecewise"] = [_point(p, growth, compress) for p in a["piecewise"]]
    for s in a.get("spikes", []):
        for k in ("at", "duration", "ramp"):
            if k in s:
                s[k] = s[k] / compress
    return w


def _point(p, growth: float, compress: float):
    if isinstance(p, dict):
        return {"at": p["at"] / compress, "rate": p["rate"] * growth}
    return [p[0] / compress, p[1] * growth]


def curve_peak(workload: dict, duration: float) -> float:
    """The highest rate of a generated workload's curve over [0, duration] (spikes included)."""
    a = arrivals_config(document(workload["arrivals"]))
    curve = RateCurve(**a["curve"], spikes=a["spikes"])
    step = max(RATE_STEP, duration / 2e6)
    return float(curve(np.arange(0.0, duration + step, step)).max())


def trace_peak(times: np.ndarray, window: float = PEAK_WINDOW) -> float:
    """The rate of the busiest `window` seconds of recorded arrivals."""
    if len(times) == 0:
        return 0.0
    counts = np.bincount((times // window).astype(np.int64))
    return float(counts.max()) / window


def constant_workload(workload: dict, rate: float) -> dict:
    """The same arrival process (its CV) and length mix at a constant rate, without spikes."""
    w = {k: v for k, v in workload.items() if k not in ("trace", "arrivals")}
    if "trace" in workload:  # a trace's lengths, resampled; Poisson arrivals
        t = workload["trace"]
        w["lengths_from"] = {k: v for k, v in t.items() if k in ("format", "path", "time_column",
                                                                  "prompt_column", "output_column",
                                                                  "time_unit")}
        w["arrivals"] = {"rate": rate}
        return w
    a = workload["arrivals"]
    w["arrivals"] = {k: a[k] for k in ("process", "cv") if k in a} | {"rate": rate}
    return w
