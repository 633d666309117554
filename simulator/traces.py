"""Trace readers: Azure LLM CSV, Mooncake JSONL, BurstGPT CSV and a generic CSV.

Every reader returns a Trace (arrival seconds from the trace's first request, prompt and output
lengths, and for Mooncake the 512-token prefix block ids). A bad line raises ValueError naming the
file and the line number. Rate scaling (thinning or replicating requests, keeping the trace's shape)
and time compression (dividing timestamps) apply to any trace.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

FORMATS = ("azure", "mooncake", "burstgpt", "csv")


@dataclass
class Trace:
    times: np.ndarray  # seconds, sorted, starting at 0
    prompt: np.ndarray  # tokens (int)
    output: np.ndarray  # tokens (int)
    hash_ids: list[list[int]] | None = None  # Mooncake: 512-token prefix blocks per request
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.times)

    def subset(self, idx: np.ndarray) -> "Trace":
        hashes = [self.hash_ids[i] for i in idx] if self.hash_ids is not None else None
        return Trace(self.times[idx], self.prompt[idx], self.output[idx], hashes, self.source, self.meta)


def _int(value: str, path, line: int, column: str) -> int:
    try:
        v = int(float(value))
    except (TypeError, ValueError):
        raise ValueError(f"{path}:{line}: column {column!r}: not a number: {value!r}") from None
    if v < 0:
        raise ValueError(f"{path}:{line}: column {column!r}: negative value {v}")
    return v


def _float(value: str, path, line: int, column: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}:{line}: column {column!r}: not a number: {value!r}") from None


def _azure_time(value: str, path, line: int) -> float:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, more than datetime parses
    try:
        base, _, frac = value.strip().partition(".")
        t = datetime.fromisoformat(base).timestamp()
        return t + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise ValueError(f"{path}:{line}: column 'TIMESTAMP': bad timestamp {value!r}") from None


def _read_csv(path: Path, columns: dict[str, str], time_parser) -> tuple[list, list, list]:
    times, prompt, output = [], [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns.values() if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; found {reader.fieldnames}")
        for row in reader:
            line = reader.line_num
            if None in row or any(row[c] is None for c in columns.values()):
                raise ValueError(f"{path}:{line}: wrong number of fields")
            times.append(time_parser(row[columns["time"]], path, line))
            prompt.append(_int(row[columns["prompt"]], path, line, columns["prompt"]))
            output.append(_int(row[columns["output"]], path, line, columns["output"]))
    return times, prompt, output


def read_azure(path) -> Trace:
    cols = {"time": "TIMESTAMP", "prompt": "ContextTokens", "output": "GeneratedTokens"}
    return _finish(*_read_csv(Path(path), cols, _azure_time), None, str(path))


def read_burstgpt(path) -> Trace:
    cols = {"time": "Timestamp", "prompt": "Request tokens", "output": "Response tokens"}
    return _finish(
        *_read_csv(Path(path), cols, lambda v, p, n: _float(v, p, n, "Timestamp")), None, str(path)
    )


def read_generic_csv(
    path,
    time_column: str = "time",
    prompt_column: str = "prompt_tokens",
    output_column: str = "output_tokens",
    time_unit: float = 1.0,
) -> Trace:
    """Any CSV with an arrival-time column (seconds x time_unit) and the two length columns."""
    cols = {"time": time_column, "prompt": prompt_column, "output": output_column}
    t, p, o = _read_csv(Path(path), cols, lambda v, f, n: _float(v, f, n, time_column) * time_unit)
    return _finish(t, p, o, None, str(path))


def read_mooncake(path) -> Trace:
    times, prompt, output, hashes = [], [], [], []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: invalid JSON: {exc.msg}") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in rec:
                    raise ValueError(f"{path}:{line_no}: missing field {key!r}")
            times.append(_float(rec["timestamp"], path, line_no, "timestamp") / 1000.0)  # ms
            prompt.append(_int(rec["input_length"], path, line_no, "input_length"))
            output.append(_int(rec["output_length"], path, line_no, "output_length"))
            ids = rec.get("hash_ids", [])
            if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in ids
            ):
                raise ValueError(f"{path}:{line_no}: field 'hash_ids' must be a list of integers")
            hashes.append(ids)
    return _finish(times, prompt, output, hashes, str(path))


def _finish(times, prompt, output, hashes, source: str) -> Trace:
    if not times:
        raise ValueError(f"{source}: trace has no requests")
    t = np.asarray(times, dtype=float)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    trace = Trace(
        t,
        np.asarray(prompt, dtype=np.int64)[order],
        np.asarray(output, dtype=np.int64)[order],
        [hashes[i] for i in order] if hashes is not None else None,
        source,
    )
    return trace


def read_trace(fmt: str, path, **kwargs) -> Trace:
    if fmt == "azure":
        return read_azure(path)
    if fmt == "mooncake":
        return read_mooncake(path)
    if fmt == "burstgpt":
        return read_burstgpt(path)
    if fmt == "csv":
        return read_generic_csv(path, **kwargs)
    raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")


def compress_time(trace: Trace, factor: float) -> Trace:
    """Plays the trace `factor` times faster: same requests, timestamps divided."""
    if factor <= 0:
        raise ValueError(f"time compression factor must be > 0, got {factor}")
    return Trace(trace.times / factor, trace.prompt, trace.output, trace.hash_ids, trace.source, trace.meta)


def scale_rate(trace: Trace, factor: float, rng: np.random.Generator) -> Trace:
    """Multiplies the arrival rate by `factor` over the same span: keeps each request with probability
    factor (< 1), or adds copies shifted to random points within the neighbouring gap (> 1)."""
    if factor <= 0:
        raise ValueError(f"rate scale must be > 0, got {factor}")
    n = len(trace)
    whole, frac = int(factor), factor - int(factor)
    parts, is_copy = [], []
    for k in range(whole):
        parts.append(np.arange(n))
        is_copy.append(np.full(n, k > 0))
    if frac > 0:
        extra = np.flatnonzero(rng.random(n) < frac)
        parts.append(extra)
        is_copy.append(np.full(len(extra), whole > 0))  # thinning keeps originals in place
    picked, copies = np.concatenate(parts), np.concatenate(is_copy)
    times = trace.times[picked].copy()
    # copies land uniformly within the gap after their original, so the burst shape is kept
    gaps = np.diff(np.append(trace.times, trace.times[-1]))[picked]
    times[copies] += rng.random(int(copies.sum())) * gaps[copies]
    order = np.argsort(times, kind="stable")
    out = trace.subset(picked[order])
    out.times = times[order]
    return out
