"""Profile CSV rows (one measured engine step each), read and checked into numpy columns.

Columns: engine.core.profile_csv.PROFILE_COLUMNS (extra columns are kept). Mixed
(chunked-prefill) rows may carry the split columns MIXED_COLUMNS (our profiler writes them);
without them a mixed row is split as described in `step_shape`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.core.profile_csv import KEY_COLUMNS, MIXED_COLUMNS, PHASES, PROFILE_COLUMNS, SHAPE_COLUMNS
from simulator.latency.fileformat import FORMAT


@dataclass
class Profile:
    """Rows of one or more profile CSVs; numeric columns as float arrays, the rest as str lists."""

    columns: list[str]
    text: dict[str, list[str]]  # every column, as read
    num: dict[str, np.ndarray] = field(default_factory=dict)  # numeric columns (checked ones + extras)
    source: str = ""

    def __len__(self) -> int:
        return len(self.text["phase"])

    @property
    def phase(self) -> np.ndarray:
        return np.array(self.text["phase"])

    @property
    def has_latency(self) -> bool:
        return "latency_ms" in self.num

    def subset(self, mask: np.ndarray) -> Profile:
        idx = np.flatnonzero(mask)
        text = {c: [v[i] for i in idx] for c, v in self.text.items()}
        num = {c: v[idx] for c, v in self.num.items()}
        return Profile(list(self.columns), text, num, self.source)

    def groups(self) -> list[tuple[str, str, str, int]]:
        """The distinct (device, model, dtype, tp) keys, in order of first appearance."""
        seen = dict.fromkeys(zip(*(self.text[c] for c in KEY_COLUMNS)))
        return [(d, m, t, int(float(tp))) for d, m, t, tp in seen]

    def _column(self, name: str, default: np.ndarray) -> np.ndarray:
        col = self.num.get(name)
        return default if col is None else np.where(np.isnan(col), default, col)

    def step_shape(self) -> dict[str, np.ndarray]:
        """Per-row engine-step shape: prefill tokens/context/seqs and decode seqs/context.

        A mixed row without split columns is taken as one prefilling sequence plus
        batch_size - 1 decodes, the prior KV (context - tokens) shared equally by all sequences.
        """
        ph = self.phase
        b, n, c = (self.num[k] for k in SHAPE_COLUMNS)
        pre, dec, mix = ph == "prefill", ph == "decode", ph == "mixed"
        zeros = np.zeros(len(self))
        p_tok = np.where(pre, n, zeros)
        p_ctx = np.where(pre, c, zeros)
        p_seq = np.where(pre, b, zeros)
        d_seq = np.where(dec, b, zeros)
        d_ctx = np.where(dec, c, zeros)
        if mix.any():
            m_dseq = self._column("decode_seqs", np.maximum(b - 1, 0))
            m_ptok = self._column("prefill_tokens", n - m_dseq)
            m_pseq = self._column("prefill_seqs", np.maximum(b - m_dseq, 1))
            prior_per_seq = (c - n) / b
            m_pctx = self._column("prefill_context", m_ptok + prior_per_seq * m_pseq)
            p_tok = np.where(mix, m_ptok, p_tok)
            p_ctx = np.where(mix, m_pctx, p_ctx)
            p_seq = np.where(mix, m_pseq, p_seq)
            d_seq = np.where(mix, m_dseq, d_seq)
            d_ctx = np.where(mix, self._column("decode_context", c - m_pctx), d_ctx)
        return {"prefill_tokens": p_tok, "prefill_context": p_ctx, "prefill_seqs": p_seq,
                "decode_seqs": d_seq, "decode_context": d_ctx}


def _number(value: str, row: int, col: str, where: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{where}: row {row}, column {col!r}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{where}: row {row}, column {col!r}: {value!r} is not a finite number")
    if x < 0:
        raise ValueError(f"{where}: row {row}, column {col!r}: {value!r} is negative")
    return x


def parse_rows(rows: list[dict[str, str]], columns: list[str], where: str = "<rows>",
               require_latency: bool = True) -> Profile:
    """Check rows (row numbers count the header as line 1, as an editor shows them)."""
    need = [c for c in PROFILE_COLUMNS if require_latency or c != "latency_ms"]
    missing = [c for c in need if c not in columns]
    if missing:
        raise ValueError(f"{where}: missing column(s) {', '.join(missing)} (header has {', '.join(columns)})")
    if not rows:
        raise ValueError(f"{where}: no data rows")
    numeric = ["tp", *SHAPE_COLUMNS] + [c for c in ("latency_ms", *MIXED_COLUMNS) if c in columns]
    text = {c: [] for c in columns}
    values = {c: [] for c in numeric}
    for i, r in enumerate(rows, start=2):
        for c in columns:
            v = r.get(c)
            text[c].append("" if v is None else v.strip())
        for c in KEY_COLUMNS[:3]:
            if not text[c][-1]:
                raise ValueError(f"{where}: row {i}, column {c!r}: empty")
        phase = text["phase"][-1]
        if phase not in PHASES:
            raise ValueError(f"{where}: row {i}, column 'phase': unknown phase {phase!r} "
                             f"(expected one of {', '.join(PHASES)})")
        for c in numeric:
            raw = text[c][-1]
            if c in MIXED_COLUMNS and raw == "":
                values[c].append(math.nan)  # split unknown: step_shape falls back to its default
                continue
            x = _number(raw, i, c, where)
            if c != "latency_ms" and x != int(x):
                raise ValueError(f"{where}: row {i}, column {c!r}: {raw!r} is not a whole number")
            values[c].append(x)
        b, n, ctx = (values[c][-1] for c in SHAPE_COLUMNS)
        if values["tp"][-1] < 1:
            raise ValueError(f"{where}: row {i}, column 'tp': must be at least 1")
        if b < 1:
            raise ValueError(f"{where}: row {i}, column 'batch_size': must be at least 1")
        if n < 1:
            raise ValueError(f"{where}: row {i}, column 'num_tokens': must be at least 1")
        if ctx < n:
            raise ValueError(f"{where}: row {i}, column 'context_tokens': {ctx:g} is less than num_tokens "
                             f"{n:g} (the KV after the step includes the tokens computed)")
        if require_latency and values["latency_ms"][-1] <= 0:
            raise ValueError(f"{where}: row {i}, column 'latency_ms': must be positive")
    num = {c: np.asarray(v, dtype=float) for c, v in values.items()}
    for c in columns:  # extra columns that are all numbers become numeric (for --holdout-where)
        if c not in num and c not in KEY_COLUMNS + ("phase",):
            try:
                num[c] = np.array([float(v) if v != "" else np.nan for v in text[c]])
            except ValueError:
                pass
    return Profile(list(columns), text, num, where)


def read_profile(path: str | Path, require_latency: bool = True) -> Profile:
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty file (no header)")
        columns = [c.strip() for c in reader.fieldnames]
        reader.fieldnames = columns
        rows = list(reader)
    return parse_rows(rows, columns, str(path), require_latency)


def metadata_path(csv_path: str | Path) -> Path:
    """Where `slopilot profile` puts a profile's metadata: beside the CSV as PROFILE.meta.json, a name
    a latency model fitted to the profile (PROFILE.json, PROFILE.model.json) does not take."""
    return Path(csv_path).with_suffix(".meta.json")


def read_metadata(csv_path: str | Path) -> dict | None:
    """A profile's metadata, from PROFILE.meta.json or the older PROFILE.json (unless a latency model
    was written over it); None when there is none."""
    for path in (metadata_path(csv_path), Path(csv_path).with_suffix(".json")):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"{path}: not a JSON file ({exc})") from None
            if isinstance(data, dict) and data.get("format") != FORMAT:
                return data
    return None


def write_csv(path: str | Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
