"""Replay recorded metric series through a policy: "what would this spec have done?"

SERIES.csv (UTF-8, no byte-order mark): a `time` column (seconds, or RFC 3339), one column per trigger
(the trigger's name, else s0, s1, ... in trigger order) holding the query's value at that time --
empty = an empty result, `error` = the query failed, NaN/Inf allowed -- and optionally
current_replicas and ready_replicas (when absent each decision is taken as applied at once). Optional
LLM columns fill the Observation for the SLO and KPA policies: arrival_rate, mean_prompt_tokens,
mean_output_tokens, num_waiting, num_running, kv_usage, starting_replicas, ttft_pNN, tpot_pNN and
itl_pNN (seconds, e.g. ttft_p90).

The policy is evaluated every polling interval from the first row's time to the last one's, each time
on the latest row at or before the tick. A decision log written by `slopilot control` (its extra
columns desired_replicas, active, reason and scale_error are ignored as inputs) is replayed at its
own rows' times instead, so the replay sees exactly what the live controller saw.

The series is streamed: `Series` checks and yields one row at a time and `replay_iter` yields each
decision as soon as the rows it needs are read, so a series of any length replays in constant memory.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import math
from collections.abc import Iterable, Iterator
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
PERCENTILE_KINDS = ("ttft", "tpot", "itl")
LOGGED_PERCENTILES = (50.0, 90.0, 99.0)  # the percentile columns a decision log writes
# columns of a series or decision log that are not triggers: a trigger may not take one of these names,
# or its column would be read twice (controlplane.decision_log writes exactly these)
RESERVED_NAMES = ("time", *INT_FIELDS, *FLOAT_FIELDS,
                  *(f"{k}_p{p:g}" for k in PERCENTILE_KINDS for p in LOGGED_PERCENTILES), *DECISION_FIELDS)

MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the last RFC 3339 second
MIN_INTERVAL = 0.001  # seconds; no controller polls faster than a millisecond
MAX_TICKS = 10_000_000  # evaluations in one replay (about a year at a 3-second interval)
MAX_REPLICAS = 1_000_000  # replica counts in the series
MAX_LINE_BYTES = 1 << 20  # one CSV line


@dataclass(slots=True)
class Row:
    line: int
    time: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    errors: set[str] = field(default_factory=set)
    extra: dict[str, float] = field(default_factory=dict)
    pct: dict[str, dict[float, float]] = field(default_factory=dict)


def parse_time(text: str, where: str) -> tuple[float, bool]:
    """Seconds (a finite float within +-MAX_TIME) or RFC 3339; returns (seconds, was_rfc3339)."""
    t = text.strip()
    try:
        seconds, rfc = float(t), False
    except ValueError:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"{where}: time {text!r} is neither seconds nor RFC 3339") from None
        if dt.tzinfo is None:
            raise ValueError(f"{where}: time {text!r} has no time zone (RFC 3339 needs Z or an offset)")
        seconds, rfc = dt.timestamp(), True
    if not math.isfinite(seconds):
        raise ValueError(f"{where}: time {text!r} is not a finite number of seconds")
    if abs(seconds) > MAX_TIME:
        raise ValueError(f"{where}: time {text!r} is out of range (at most {MAX_TIME:.0f} s, the year 9999; "
                         "seconds, not milliseconds)")
    return seconds, rfc


def format_time(t: float, rfc3339: bool) -> str:
    if rfc3339:
        return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return f"{t:.6f}".rstrip("0").rstrip(".")  # 30 -> "30", 1764763200.125 -> "1764763200.125"


def check_interval(seconds: float, what: str = "polling interval") -> float:
    """The polling interval, or a ValueError: finite and at least MIN_INTERVAL."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= MIN_INTERVAL):
        raise ValueError(f"{what} {seconds!r}: must be a finite number of seconds >= {MIN_INTERVAL}")
    return float(seconds)


def _number(text: str, where: str) -> float:
    try:
        return float(text)  # accepts NaN, inf, +Inf, -Inf
    except ValueError:
        raise ValueError(
            f"{where}: {text!r} is not a number (empty = empty result, 'error' = failed)"
        ) from None


def _text_lines(source, name: str) -> Iterator[str]:
    """Lines as text. Bytes (a binary file) are decoded here, so invalid UTF-8 names its line; a line
    longer than MAX_LINE_BYTES and a byte-order mark are refused."""
    if isinstance(source, str):
        source = io.StringIO(source)
    if isinstance(source, (io.RawIOBase, io.BufferedIOBase)):
        source = iter(functools.partial(source.readline, MAX_LINE_BYTES + 1), b"")
    source = iter(source)
    first = next(source, None)
    if first is None:
        return
    if first.startswith("\ufeff" if isinstance(first, str) else b"\xef\xbb\xbf"):
        raise ValueError(f"{name} line 1: starts with a byte-order mark; save the file as UTF-8 without BOM")
    if isinstance(first, str):
        yield first
        yield from source
        return
    for lineno, line in enumerate(itertools.chain([first], source), start=1):
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"{name} line {lineno}: longer than {MAX_LINE_BYTES} bytes")
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} line {lineno}: not UTF-8 text (byte {exc.start + 1} of the line is "
                             f"{exc.object[exc.start:exc.start + 1]!r})") from None


class Series:
    """The rows of a series, checked as they are read: iterate once for Row objects (the file is
    never held in memory). After the first row, `rfc3339` says how times are written;
    `decision_log` says the header is a `slopilot control` decision log's."""

    def __init__(self, lines: Iterable[str] | Iterable[bytes] | str, trigger_names: list[str],
                 name: str = "SERIES.csv"):
        self.name = name
        self.rfc3339 = False
        self._reader = csv.reader(_text_lines(lines, name))
        try:
            header = [h.strip() for h in self._next()]
        except StopIteration:
            raise ValueError(f"{name}: empty file (a header with a time column is required)") from None
        self.header = header
        if "time" not in header:
            raise ValueError(f"{name} line 1: no 'time' column (columns: {', '.join(header)})")
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise ValueError(f"{name} line 1: column(s) {', '.join(twice)} given twice")
        missing = [t for t in trigger_names if t not in header]
        if missing:
            raise ValueError(
                f"{name} line 1: no column for trigger(s) {', '.join(missing)} "
                f"(triggers are named by their name, else s0, s1, ... in order)"
            )
        self.decision_log = "desired_replicas" in header
        self._time = header.index("time")
        self._columns = [self._plan(h, set(trigger_names)) for h in header]

    def _plan(self, col: str, triggers: set[str]) -> tuple:
        """(column, kind, key): how one column's cells are read."""
        if col == "time" or col in DECISION_FIELDS:
            return (col, "skip", None)
        if col in triggers:
            return (col, "trigger", None)
        if col in INT_FIELDS:
            return (col, "int", None)
        if col in FLOAT_FIELDS:
            return (col, "float", None)
        kind, sep, p = col.partition("_p")
        if kind in PERCENTILE_KINDS and sep:
            try:
                pct = float(p)
            except ValueError:
                pct = math.nan
            if not 0 < pct <= 100:
                raise ValueError(f"{self.name} line 1: column {col!r} must look like {kind}_p90")
            return (col, "pct", (kind, pct))
        raise ValueError(f"{self.name} line 1: unknown column {col!r}")

    def _next(self) -> list[str]:
        try:
            return next(self._reader)
        except csv.Error as exc:
            raise ValueError(f"{self.name} line {self._reader.line_num}: {exc}") from None

    def __iter__(self) -> Iterator[Row]:
        try:
            yield from self._rows()
        except csv.Error as exc:
            raise ValueError(f"{self.name} line {self._reader.line_num}: {exc}") from None

    def _rows(self) -> Iterator[Row]:
        name, width, ti, reader = self.name, len(self.header), self._time, self._reader
        columns = [(i, *c) for i, c in enumerate(self._columns) if c[1] != "skip"]
        last, rfc = -math.inf, None
        for cells in reader:
            if len(cells) != width:
                if not cells or all(not c.strip() for c in cells):
                    continue
                raise ValueError(f"{name} line {reader.line_num}: {len(cells)} fields, "
                                 f"the header has {width}")
            text = cells[ti]
            try:  # seconds, the common case, inline
                t, is_rfc = float(text), False
                if not -MAX_TIME <= t <= MAX_TIME:  # also NaN
                    raise ValueError
            except ValueError:
                t, is_rfc = parse_time(text, f"{name} line {reader.line_num}, column time")
            if is_rfc is not rfc:
                if rfc is not None:
                    raise ValueError(f"{name} line {reader.line_num}, column time: mixes seconds and "
                                     "RFC 3339 times")
                rfc = self.rfc3339 = is_rfc
            if t < last:
                raise ValueError(f"{name} line {reader.line_num}, column time: goes backwards "
                                 f"({text.strip()})")
            last = t
            row = Row(reader.line_num, t)
            for i, col, kind, key in columns:
                val = cells[i]
                if kind == "trigger":
                    try:  # a number, the common case, first
                        row.metrics[col] = float(val)
                        continue
                    except ValueError:
                        pass
                    val = val.strip()
                    if val == "":
                        row.metrics[col] = None
                    elif val.lower() == "error":
                        row.errors.add(col)
                    else:
                        row.metrics[col] = _number(val, f"{name} line {row.line}, column {col}")
                    continue
                val = val.strip()
                if val == "":
                    continue
                elif val.lower() == "error":  # a failed aggregate query (ttft_p90 -> ttft_p)
                    row.errors.add(col if kind != "pct" else key[0] + "_p")
                elif kind == "float":
                    row.extra[col] = _number(val, f"{name} line {row.line}, column {col}")
                elif kind == "int":
                    v = _number(val, f"{name} line {row.line}, column {col}")
                    if not (0 <= v <= MAX_REPLICAS and v.is_integer()):
                        raise ValueError(f"{name} line {row.line}, column {col}: {val!r} must be a whole "
                                         f"number from 0 to {MAX_REPLICAS}")
                    row.extra[col] = int(v)
                else:
                    table = row.pct.setdefault(key[0], {})
                    table[key[1]] = _number(val, f"{name} line {row.line}, column {col}")
            yield row


def read_series(lines: Iterable[str] | Iterable[bytes] | str, trigger_names: list[str],
                name: str = "SERIES.csv") -> tuple[list[Row], bool]:
    """The whole series as a list (for short series; `Series` streams), and whether times are
    RFC 3339. Lines: an open file, any iterable of CSV lines, or a str holding the whole text;
    errors name the file, line and column."""
    series = Series(lines, trigger_names, name)
    rows = list(series)
    if not rows:
        raise ValueError(f"{name}: no data rows")
    return rows, series.rfc3339


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
