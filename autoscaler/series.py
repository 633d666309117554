"""A recorded metric series (SERIES.csv, or a decision log written by `slopilot control`), read and
checked one row at a time: the columns, the time formats, the rows.

SERIES.csv (UTF-8, no byte-order mark): a `time` column (seconds, or RFC 3339), one column per trigger
(the trigger's name, else s0, s1, ... in trigger order) holding the query's value at that time --
empty = an empty result, `error` = the query failed, NaN/Inf allowed -- and optionally
current_replicas and ready_replicas (when absent each decision is taken as applied at once). Optional
LLM columns fill the Observation for the SLO and KPA policies: arrival_rate, mean_prompt_tokens,
mean_output_tokens, num_waiting, num_running, kv_usage, starting_replicas, ttft_pNN, tpot_pNN and
itl_pNN (seconds, e.g. ttft_p90). A decision log's extra columns (desired_replicas, active, reason,
scale_error) are not inputs.

`Series` checks and yields one row at a time, so a series of any length is read in constant memory;
errors name the file, line and column. Replaying it through a policy is autoscaler.replay.
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
