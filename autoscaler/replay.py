"""Replay recorded metric series through a policy: "what would this spec have done?"

SERIES.csv: a `time` column (seconds, or RFC 3339), one column per trigger (the trigger's name, else s0,
s1, ... in trigger order) holding the query's value at that time -- empty = an empty result, `error` =
the query failed, NaN/Inf allowed -- and optionally current_replicas and ready_replicas (when absent
each decision is taken as applied at once). Optional LLM columns fill the Observation for the SLO and
KPA policies: arrival_rate, mean_prompt_tokens, mean_output_tokens, num_waiting, num_running, kv_usage,
starting_replicas, ttft_pNN and tpot_pNN (seconds, e.g. ttft_p90).

The policy is evaluated every polling interval from the first row's time to the last one's, each time
on the latest row at or before the tick. A decision log written by `slopilot control` (its extra
columns desired_replicas, active, reason and scale_error are ignored as inputs) is replayed at its
own rows' times instead, so the replay sees exactly what the live controller saw.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.reconcile import clamp, decide

FLOAT_FIELDS = (
    "arrival_rate",
    "mean_prompt_tokens",
    "mean_output_tokens",
    "num_waiting",
    "num_running",
    "kv_usage",
)
INT_FIELDS = ("current_replicas", "ready_replicas", "starting_replicas")
DECISION_FIELDS = ("desired_replicas", "active", "reason", "scale_error")  # outputs of a decision log


@dataclass
class Row:
    line: int
    time: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    errors: set[str] = field(default_factory=set)
    extra: dict[str, float] = field(default_factory=dict)
    pct: dict[str, dict[float, float]] = field(default_factory=dict)


def parse_time(text: str, where: str) -> tuple[float, bool]:
    """Seconds (float) or RFC 3339; returns (seconds, was_rfc3339)."""
    t = text.strip()
    try:
        return float(t), False
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{where}: time {text!r} is neither seconds nor RFC 3339") from None
    if dt.tzinfo is None:
        raise ValueError(f"{where}: time {text!r} has no time zone (RFC 3339 needs Z or an offset)")
    return dt.timestamp(), True


def format_time(t: float, rfc3339: bool) -> str:
    if rfc3339:
        return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return f"{t:.6f}".rstrip("0").rstrip(".")  # 30 -> "30", 1764763200.125 -> "1764763200.125"


def _number(text: str, where: str) -> float:
    try:
        return float(text)  # accepts NaN, inf, +Inf, -Inf
    except ValueError:
        raise ValueError(
            f"{where}: {text!r} is not a number (empty = empty result, 'error' = failed)"
        ) from None


def read_series(lines: Iterable[str], trigger_names: list[str], name: str = "SERIES.csv"
                ) -> tuple[list[Row], bool]:
    """Parse and check the series, line by line (an open file, or any iterable of CSV lines; a str is
    taken as the whole text); errors name the file, line and column."""
    reader = csv.reader(io.StringIO(lines) if isinstance(lines, str) else lines)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ValueError(f"{name}: empty file (a header with a time column is required)") from None
    if "time" not in header:
        raise ValueError(f"{name} line 1: no 'time' column (columns: {', '.join(header)})")
    missing = [t for t in trigger_names if t not in header]
    if missing:
        raise ValueError(
            f"{name} line 1: no column for trigger(s) {', '.join(missing)} "
            f"(triggers are named by their name, else s0, s1, ... in order)"
        )
    known = set(trigger_names) | {"time", *FLOAT_FIELDS, *INT_FIELDS, *DECISION_FIELDS}
    for h in header:
        if h not in known and not (h.startswith(("ttft_p", "tpot_p", "itl_p"))):
            raise ValueError(f"{name} line 1: unknown column {h!r}")
    rows, rfc, last = [], None, -math.inf
    for lineno, cells in enumerate(reader, start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise ValueError(f"{name} line {lineno}: {len(cells)} fields, the header has {len(header)}")
        rec = dict(zip(header, (c.strip() for c in cells)))
        t, is_rfc = parse_time(rec["time"], f"{name} line {lineno}, column time")
        if rfc is not None and is_rfc != rfc:
            raise ValueError(f"{name} line {lineno}, column time: mixes seconds and RFC 3339 times")
        rfc = is_rfc
        if t < last:
            raise ValueError(f"{name} line {lineno}, column time: goes backwards ({rec['time']})")
        last = t
        row = Row(lineno, t)
        for col, val in rec.items():
            where = f"{name} line {lineno}, column {col}"
            if col == "time" or col in DECISION_FIELDS:
                continue
            if col in trigger_names:
                if val == "":
                    row.metrics[col] = None
                elif val.lower() == "error":
                    row.errors.add(col)
                else:
                    row.metrics[col] = _number(val, where)
            elif val == "":
                continue
            elif val.lower() == "error":  # a failed aggregate query (ttft_p90 -> ttft_p)
                row.errors.add(col if col in FLOAT_FIELDS else col.partition("_p")[0] + "_p")
            elif col in INT_FIELDS:
                v = _number(val, where)
                if v < 0 or not float(v).is_integer():
                    raise ValueError(f"{where}: {val!r} must be a whole number >= 0")
                row.extra[col] = int(v)
            elif col in FLOAT_FIELDS:
                row.extra[col] = _number(val, where)
            else:
                kind, _, p = col.partition("_p")
                try:
                    pct = float(p)
                except ValueError:
                    raise ValueError(f"{name} line 1: column {col!r} must look like {kind}_p90") from None
                row.pct.setdefault(kind, {})[pct] = _number(val, where)
        rows.append(row)
    if not rows:
        raise ValueError(f"{name}: no data rows")
    return rows, bool(rfc)


def observation(row: Row, tick: float, current: int) -> Observation:
    ex = row.extra
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


def replay(
    policy: Policy, rows: list[Row], interval: float, initial_replicas: int, at_rows: bool = False
) -> list[tuple[float, Decision]]:
    """Evaluate the policy at every tick (or, with at_rows, at every row's own time); without a
    current_replicas column a decision applies at once."""
    if interval <= 0:
        raise ValueError("polling interval must be > 0")
    out, current, i = [], initial_replicas, 0
    if at_rows:
        for row in rows:
            decision = decide(policy, observation(row, row.time, current))
            out.append((row.time, decision))
            current = clamp(decision.desired_replicas, policy.min_replicas, policy.max_replicas)
        return out
    start, end = rows[0].time, rows[-1].time
    k = 0
    while (tick := start + k * interval) <= end + 1e-9:
        while i + 1 < len(rows) and rows[i + 1].time <= tick + 1e-9:
            i += 1
        decision = decide(policy, observation(rows[i], tick, current))
        out.append((tick, decision))
        current = decision.desired_replicas
        k += 1
    return out


def to_csv(results: list[tuple[float, Decision]], rfc3339: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["time", "desired_replicas", "active", "reason"])
    for t, d in results:
        w.writerow([format_time(t, rfc3339), d.desired_replicas, "true" if d.active else "false", d.reason])
    return buf.getvalue()


class LinearStepModel:
    """A step-time model from four coefficients (JSON), for replaying sloModel specs without the
    simulator: ms = base + prefill_token * prefill_tokens + decode_seq * decode_seqs + decode_ctx * ctx."""

    KEYS = ("base_ms", "prefill_token_ms", "decode_seq_ms", "decode_context_token_ms")

    def __init__(self, coeffs: dict, where: str = "model"):
        for k in self.KEYS:
            if not isinstance(coeffs.get(k), (int, float)):
                raise ValueError(f"{where}: {k} must be a number (keys: {', '.join(self.KEYS)})")
        self.c = coeffs

    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context) -> float:
        c = self.c
        return (
            c["base_ms"]
            + c["prefill_token_ms"] * prefill_tokens
            + c["decode_seq_ms"] * decode_seqs
            + c["decode_context_token_ms"] * decode_context
        )
