"""Replay recorded metric series through a policy: "what would this spec have done?"

The policy is evaluated every polling interval from the first row's time to the last one's, each time
on the latest row at or before the tick. A decision log written by `slopilot control` is replayed at
its own rows' times instead, so the replay sees exactly what the live controller saw. The series
format and its reader are autoscaler.series.

`replay_iter` yields each decision as soon as the rows it needs are read, so a series of any length
replays in constant memory.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.reconcile import clamp, decide
from autoscaler.series import Row, format_time

MIN_INTERVAL = 0.001  # seconds; no controller polls faster than a millisecond
MAX_TICKS = 10_000_000  # evaluations in one replay (about a year at a 3-second interval)


def check_interval(seconds: float, what: str = "polling interval") -> float:
    """The polling interval, or a ValueError: finite and at least MIN_INTERVAL."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= MIN_INTERVAL):
        raise ValueError(f"{what} {seconds!r}: must be a finite number of seconds >= {MIN_INTERVAL}")
    return float(seconds)


def observation(row: Row, tick: float, current: int) -> Observation:
    ex = row.extra
    if not ex and not row.pct:  # trigger values only (a KEDA series): the short way
        return Observation(time=tick, current_replicas=current, ready_replicas=current,
                           metrics=dict(row.metrics), errors=set(row.errors))
    current = ex.get("current_replicas", current)
    return Observation(
        time=tick,
        current_replicas=current,
        ready_replicas=ex.get("ready_replicas", current),
        metrics=dict(row.metrics),
        errors=set(row.errors),
        arrival_rate=ex.get("arrival_rate"),
        mean_prompt_tokens=ex.get("mean_prompt_tokens"),
        mean_output_tokens=ex.get("mean_output_tokens"),
        num_waiting=ex.get("num_waiting"),
        num_running=ex.get("num_running"),
        kv_usage=ex.get("kv_usage"),
        starting_replicas=ex.get("starting_replicas", 0),
        ttft_p=row.pct.get("ttft", {}),
        tpot_p=row.pct.get("tpot", {}),
        itl_p=row.pct.get("itl", {}),
    )


def replay_iter(
    policy: Policy, rows: Iterable[Row], interval: float, initial_replicas: int, at_rows: bool = False,
    name: str = "SERIES.csv",
) -> Iterator[tuple[float, Decision]]:
    """(time, decision) at every tick (or, with at_rows, at every row's own time), each yielded as
    soon as the rows it needs are read; without a current_replicas column a decision applies at once.
    Raises ValueError when a row would need more than MAX_TICKS evaluations."""
    interval = check_interval(interval)
    current = initial_replicas
    if at_rows:
        for row in rows:
            decision = decide(policy, observation(row, row.time, current))
            yield row.time, decision
            current = clamp(decision.desired_replicas, policy.min_replicas, policy.max_replicas)
        return
    rows = iter(rows)
    seen = next(rows, None)  # the latest row at or before the next tick
    if seen is None:
        return
    start, k, tick = seen.time, 0, seen.time
    limit = start + MAX_TICKS * interval
    for row in rows:
        if row.time > limit:
            raise ValueError(f"{name} line {row.line}: time {row.time:g} is more than {MAX_TICKS} polling "
                             f"intervals of {interval:g} s after the first row (at {start:g}); "
                             "give a longer --interval or a shorter series")
        while tick + 1e-9 < row.time:  # ticks before this row's time see the row before it
            decision = decide(policy, observation(seen, tick, current))
            yield tick, decision
            current = decision.desired_replicas
            k += 1
            tick = start + k * interval
        seen = row
    while tick <= seen.time + 1e-9:  # ticks up to the last row's time
        decision = decide(policy, observation(seen, tick, current))
        yield tick, decision
        current = decision.desired_replicas
        k += 1
        tick = start + k * interval


def replay(
    policy: Policy, rows: Iterable[Row], interval: float, initial_replicas: int, at_rows: bool = False
) -> list[tuple[float, Decision]]:
    """Every decision of replay_iter, as a list."""
    return list(replay_iter(policy, rows, interval, initial_replicas, at_rows))


DECISION_COLUMNS = ["time", "desired_replicas", "active", "reason"]


def decision_row(t: float, d: Decision, rfc3339: bool) -> list:
    return [format_time(t, rfc3339), d.desired_replicas, "true" if d.active else "false", d.reason]


def to_csv(results: Iterable[tuple[float, Decision]], rfc3339: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(DECISION_COLUMNS)
    w.writerows(decision_row(t, d, rfc3339) for t, d in results)
    return buf.getvalue()


class LinearStepModel:
    """A step-time model from four coefficients (JSON), for replaying sloModel specs without the
    simulator: ms = base + prefill_token * prefill_tokens + decode_seq * decode_seqs + decode_ctx * ctx."""

    KEYS = ("base_ms", "prefill_token_ms", "decode_seq_ms", "decode_context_token_ms")

    def __init__(self, coeffs: dict, where: str = "model"):
        if not isinstance(coeffs, dict):
            raise ValueError(f"{where}: must be a JSON object with {', '.join(self.KEYS)}")
        for k in self.KEYS:
            v = coeffs.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: {k} must be a number >= 0 (keys: {', '.join(self.KEYS)})")
        self.c = coeffs

    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context) -> float:
        c = self.c
        return (
            c["base_ms"]
            + c["prefill_token_ms"] * prefill_tokens
            + c["decode_seq_ms"] * decode_seqs
            + c["decode_context_token_ms"] * decode_context
        )
