"""The decision log: one CSV row per reconcile, in `slopilot replay`'s series format plus the decision.

Columns: time (seconds since the epoch, to the millisecond: the very value the policy saw), each
trigger's value (empty = an empty result, `error` = the query failed), the replica counts, the LLM
aggregates (`error` where their query failed), then desired_replicas, active, reason and scale_error.
`slopilot replay --spec SPEC --metrics LOG.csv` evaluates the policy at each row and gives the same
decisions, row for row.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from autoscaler.observation import Observation
from autoscaler.reconcile import Step
from autoscaler.series import DECISION_FIELDS as DECISION
from autoscaler.series import FLOAT_FIELDS as AGGREGATES
from autoscaler.series import LOGGED_PERCENTILES as PERCENTILES
from autoscaler.series import PERCENTILE_KINDS as HISTOGRAMS
from autoscaler.series import format_time


def columns(trigger_names: list[str]) -> list[str]:
    pct = [f"{h}_p{p:g}" for h in HISTOGRAMS for p in PERCENTILES]
    counts = ["current_replicas", "ready_replicas", "starting_replicas"]
    return ["time", *trigger_names, *counts, *AGGREGATES, *pct, *DECISION]


def number(v: float | None) -> str:
    """A value that parses back to the same float (repr round-trips); empty for None."""
    if v is None:
        return ""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def row(obs: Observation, step: Step, trigger_names: list[str]) -> list[str]:
    out = [format_time(round(obs.time, 3), rfc3339=False)]
    for name in trigger_names:
        out.append("error" if name in obs.errors else number(obs.metrics.get(name)))
    ready = obs.ready_replicas if obs.ready_replicas is not None else obs.current_replicas
    out += [str(obs.current_replicas), str(ready), str(obs.starting_replicas)]
    for name in AGGREGATES:
        out.append("error" if name in obs.errors else number(getattr(obs, name)))
    for h in HISTOGRAMS:
        table = getattr(obs, f"{h}_p")
        for p in PERCENTILES:
            out.append("error" if f"{h}_p" in obs.errors else number(table.get(p)))
    d = step.decision
    out += [str(d.desired_replicas), "true" if d.active else "false", d.reason, step.error or ""]
    return out


class DecisionLog:
    """Appends rows to one CSV file (the header is written when the file is new or empty)."""

    def __init__(self, path: str | Path, trigger_names: list[str]):
        self.path = Path(path)
        self.triggers = list(trigger_names)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = self.path.open("a", newline="")
        self._csv = csv.writer(self._file, lineterminator="\n")
        if new:
            self._csv.writerow(columns(self.triggers))
            self._file.flush()

    def write(self, obs: Observation, step: Step) -> None:
        self._csv.writerow(row(obs, step, self.triggers))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
