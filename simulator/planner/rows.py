"""A compared run as a table row: SLO attainment (requests and 1-minute windows), each SLO's value at
its percentile, the verdict (simulator.planner.verdict), GPU-hours, cost and scale events, with the
run's summary and its replicas over time kept for the report."""

from __future__ import annotations

import numpy as np

from simulator.planner.oracle import MINUTE
from simulator.planner.verdict import meets


def run_row(name: str, kind: str, summary: dict, timeline: list, spec: str | None = None) -> dict:
    c = summary["costs"]
    return {
        "name": name,
        "kind": kind,
        "spec": spec,
        "attainment": summary["slo_attainment_joint"],
        "window_attainment": summary["slo_window_attainment"],
        "slo": {k: v["value_at_percentile"] for k, v in summary["slo"].items()},
        "met": meets(summary),
        "gpu_hours": c["gpu_hours"],
        "cost": c["total"],
        "cost_per_hour_at_peak": c["per_hour_at_peak"],
        "peak_replicas": max(p["peak_replicas"] for p in summary["pools"].values()),
        "scale_events": summary["scale_events"],
        "summary": summary,
        "timeline": timeline,
        "unmatched_triggers": summary.get("unmatched_triggers", []),
    }


def oracle_row(name: str, billed: np.ndarray, gpus_per_replica: int, cost_per_hour: float) -> dict:
    """The oracle's billed replicas per minute as a row (nothing simulated: no attainment)."""
    hours = float(billed.sum()) * MINUTE / 3600
    return {
        "name": name,
        "kind": "oracle",
        "spec": None,
        "attainment": None,
        "window_attainment": None,
        "slo": {},
        "met": None,
        "gpu_hours": hours * gpus_per_replica,
        "cost": hours * cost_per_hour,
        "cost_per_hour_at_peak": int(billed.max()) * cost_per_hour,
        "peak_replicas": int(billed.max()),
        "scale_events": None,
        "timeline": [[MINUTE * m, int(n), None] for m, n in enumerate(billed)],
    }
