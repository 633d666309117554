"""Series with timestamps as OpenMetrics text, the format `promtool tsdb create-blocks-from
openmetrics` backfills into a Prometheus TSDB, and reading it back into a MemoryStorage.

Written family by family (TYPE line, then every series of the family in time order; a histogram's
buckets, count and sum together at each timestamp), ending with `# EOF`. Timestamps are seconds with
the milliseconds Prometheus keeps; the reader turns them into milliseconds as Prometheus does
(seconds * 1000, truncated), so both hold the very same samples. OpenMetrics has no staleness
markers: a series that ended is seen by instant queries for five more minutes after a backfill.
"""

from __future__ import annotations

import math
from typing import IO, Iterable

from promql.storage import Labels, MemoryStorage, labels_of

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum")}


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series_text(labels: Labels) -> str:
    name = ""
    parts = []
    for k, v in labels:
        if k == "__name__":
            name = v
        else:
            parts.append(f'{k}="{_escape(v)}"')
    return f"{name}{{{','.join(parts)}}}" if parts else name


class _Stamps:
    """Timestamp text that Prometheus' reader (float seconds * 1000, truncated) turns back into t."""

    def __init__(self):
        self.cache: dict[int, str] = {}

    def __call__(self, t: int) -> str:
        s = self.cache.get(t)
        if s is None:
            s = repr(t / 1000) if t % 1000 else str(t // 1000)
            if int(float(s) * 1000) != t:
                s = repr((t + 0.5) / 1000)
            self.cache[t] = s
        return s


def write_openmetrics(f: IO[str], families: Iterable[tuple[str, str, list]]) -> int:
    """families: (family name, type, [(labels, ts, vs)]); returns the number of samples written."""
    from prometheus_client.utils import floatToGoString  # here: readers need not load the client

    stamp = _Stamps()
    n = 0
    for family, kind, series in families:
        f.write(f"# TYPE {family} {kind}\n")
        groups: dict[Labels, list] = {}
        for lb, ts, vs in series:  # a histogram's series of one label set go out together
            key = tuple(kv for kv in lb if kv[0] not in ("__name__", "le")) if kind == "histogram" else lb
            groups.setdefault(key, []).append((lb, ts, vs))
        for members in groups.values():
            members.sort(key=_member_order)
            aligned = len({tuple(ts) for _, ts, _ in members}) == 1
            if aligned:
                texts = [_series_text(lb) for lb, _, _ in members]
                for i, t in enumerate(members[0][1]):
                    ts_text = stamp(t)
                    for text, (_, _, vs) in zip(texts, members):
                        f.write(f"{text} {floatToGoString(vs[i])} {ts_text}\n")
                    n += len(members)
            else:
                for lb, ts, vs in members:
                    text = _series_text(lb)
                    for t, v in zip(ts, vs):
                        f.write(f"{text} {floatToGoString(v)} {stamp(t)}\n")
                    n += len(ts)
    f.write("# EOF\n")
    return n


def _member_order(member) -> tuple:
    lb = dict(member[0])
    name = lb.get("__name__", "")
    le = lb.get("le")
    bound = math.inf if le is None else float(le)
    return (0 if name.endswith("_bucket") else 1 if name.endswith("_count") else 2, bound, name)


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    out, i = [], 0
    while i < len(v):
        c = v[i]
        if c == "\\" and i + 1 < len(v):
            nxt = v[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _labels(text: str, where: str) -> dict[str, str]:
    """The inside of {...}: name="value" pairs separated by commas."""
    out: dict[str, str] = {}
    i = 0
    while i < len(text):
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ValueError(f"{where}: bad label list {{{text}}}")
        name = text[i:eq].strip()
        j = eq + 2
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        if j >= len(text):
            raise ValueError(f"{where}: unterminated label value")
        out[name] = _unescape(text[eq + 2:j])
        i = j + 1
        if i < len(text) and text[i] == ",":
            i += 1
    return out


def _split_sample(line: str, where: str) -> tuple[str, dict, list[str]]:
    brace = line.find("{")
    space = line.find(" ")
    if brace >= 0 and (space < 0 or brace < space):
        j = brace + 1
        while j < len(line) and line[j] != "}":  # the closing brace outside any quoted value
            if line[j] == '"':
                j += 1
                while j < len(line) and line[j] != '"':
                    j += 2 if line[j] == "\\" else 1
            j += 1
        if j >= len(line):
            raise ValueError(f"{where}: no closing brace")
        return line[:brace], _labels(line[brace + 1:j], where), line[j + 1:].split()
    name, _, rest = line.partition(" ")
    return name, {}, rest.split()


def read_openmetrics(lines: Iterable[str], name: str = "series.om") -> MemoryStorage:
    """Every sample with a timestamp, into a MemoryStorage (samples of a series in time order).

    A series' text (name and labels) is parsed the first time it is met; later lines of the same
    series, the bulk of a recording, only split off their value and timestamp."""
    store = MemoryStorage()
    known: dict[str, object] = {}  # series text -> its labels
    for lineno, line in enumerate(lines, start=1):
        line = line.rstrip("\n")
        if not line or line[0] == "#":
            continue
        head, _, tail = line.rpartition(" ")
        head, _, value_text = head.rpartition(" ")
        labels = known.get(head)
        if labels is None:
            where = f"{name} line {lineno}"
            metric, parsed, fields = _split_sample(line, where)
            if len(fields) < 2:
                raise ValueError(f"{where}: a sample needs a value and a timestamp")
            labels = labels_of({**parsed, "__name__": metric})
            if fields == [value_text, tail]:  # the fast split agrees (no exemplar, single spaces)
                known[head] = labels
            value_text, tail = fields[0], fields[1]
        try:
            value = float(value_text)
            t = int(float(tail) * 1000)
        except ValueError:
            pair = f"{value_text} {tail}"
            raise ValueError(f"{name} line {lineno}: bad value or timestamp {pair!r}") from None
        try:
            store.append(labels, t, value)
        except ValueError as exc:
            raise ValueError(f"{name} line {lineno}: {exc}") from None
    return store
