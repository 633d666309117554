"""Where the evaluator reads samples: labelled series of (ms timestamp, value), with staleness.

A store answers two questions, as Prometheus' TSDB does for its query engine:

    instant(matchers, t, lookback) -> [(labels, value)]   latest sample in [t - lookback, t], unless
                                                          a staleness marker came after it
    window(matchers, mint, maxt)  -> [(labels, ts, vs)]   samples in [mint, maxt] (both ends closed)

Labels are a sorted tuple of (name, value) pairs (hashable, ordered as Prometheus orders them);
an empty value means the label is absent, so none is ever stored.
"""

from __future__ import annotations

import bisect
import functools
from typing import Iterable, Protocol

Labels = tuple[tuple[str, str], ...]
Vector = list[tuple[Labels, float]]
Matrix = list[tuple[Labels, list[int], list[float]]]


def labels_of(d: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in d.items() if v != ""))


def get(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


@functools.lru_cache(maxsize=1 << 16)
def drop_name(labels: Labels) -> Labels:
    """labels without __name__ (cached: every function calls this for every series at every step)."""
    return tuple(kv for kv in labels if kv[0] != "__name__")


def matches(matchers, labels: Labels) -> bool:
    d = dict(labels)
    return all(m.matches(d.get(m.name, "")) for m in matchers)


def name_of(matchers) -> str | None:
    return next((m.value for m in matchers if m.name == "__name__" and m.op == "="), None)


class Storage(Protocol):
    def instant(self, matchers, t: int, lookback: int) -> Vector: ...

    def window(self, matchers, mint: int, maxt: int) -> Matrix: ...


def latest_index(ts: list[int], stale: list[int], t: int, lookback: int) -> int | None:
    """Index of the newest sample at or before t within lookback, unless a staleness marker came
    after it (then None, as Prometheus reads a series gone stale)."""
    i = bisect.bisect_right(ts, t) - 1
    if i < 0 or ts[i] < t - lookback:
        return None
    if stale:
        j = bisect.bisect_right(stale, t) - 1
        if j >= 0 and stale[j] > ts[i]:
            return None
    return i



class Series:
    __slots__ = ("labels", "ts", "vs", "stale")

    def __init__(self, labels: Labels):
        self.labels = labels
        self.ts: list[int] = []
        self.vs: list[float] = []
        self.stale: list[int] = []  # times of staleness markers

    def latest(self, t: int, lookback: int) -> float | None:
        i = latest_index(self.ts, self.stale, t, lookback)
        return None if i is None else self.vs[i]

    def latest_at(self, t: int, lookback: int) -> int | None:
        """The time of the sample latest() answers with, or None."""
        i = bisect.bisect_right(self.ts, t) - 1
        return self.ts[i] if i >= 0 and self.latest(t, lookback) is not None else None

    def between(self, mint: int, maxt: int) -> tuple[list[int], list[float]]:
        lo, hi = bisect.bisect_left(self.ts, mint), bisect.bisect_right(self.ts, maxt)
        return self.ts[lo:hi], self.vs[lo:hi]


class MemoryStorage:
    """Series in memory, each appended in time order: a loaded series file, recording rules' output."""

    def __init__(self):
        self.series: dict[Labels, Series] = {}
        self.by_name: dict[str, list[Series]] = {}
        self._selected: dict[tuple, list[Series]] = {}

    def append(self, labels: Labels, t: int, v: float) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = Series(labels)
            self.by_name.setdefault(get(labels, "__name__"), []).append(s)
            self._selected.clear()
        if s.ts and t <= s.ts[-1]:
            raise ValueError(f"series {format_labels(labels)}: sample at {t} ms is not after {s.ts[-1]} ms")
        s.ts.append(t)
        s.vs.append(v)

    def mark_stale(self, labels: Labels, t: int) -> None:
        self.series[labels].stale.append(t)

    def prune(self, before: int) -> None:
        """Drops samples older than `before` (ms), and series left with none."""
        for labels, s in list(self.series.items()):
            k = bisect.bisect_left(s.ts, before)
            if k:
                del s.ts[:k], s.vs[:k]
            s.stale = [x for x in s.stale if x >= before]
            if not s.ts:
                del self.series[labels]
                self.by_name[get(labels, "__name__")].remove(s)
                self._selected.clear()

    def select(self, matchers) -> list[Series]:
        key = tuple(matchers)
        found = self._selected.get(key)
        if found is None:
            name = name_of(matchers)
            pool = self.by_name.get(name, []) if name is not None else list(self.series.values())
            found = self._selected[key] = [s for s in pool if matches(matchers, s.labels)]
        return found

    def instant(self, matchers, t: int, lookback: int) -> Vector:
        out = []
        for s in self.select(matchers):
            v = s.latest(t, lookback)
            if v is not None:
                out.append((s.labels, v))
        return out

    def instant_times(self, matchers, t: int, lookback: int) -> list[tuple[Labels, int, float]]:
        """instant() with each sample's own time (timestamp())."""
        out = []
        for s in self.select(matchers):
            at = s.latest_at(t, lookback)
            if at is not None:
                out.append((s.labels, at, s.latest(t, lookback)))
        return out

    def window(self, matchers, mint: int, maxt: int) -> Matrix:
        out = []
        for s in self.select(matchers):
            ts, vs = s.between(mint, maxt)
            if ts:
                out.append((s.labels, ts, vs))
        return out


class Storages:
    """Several stores read as one (the scraped series and the recording rules' output)."""

    def __init__(self, parts: Iterable[Storage]):
        self.parts = list(parts)

    def instant(self, matchers, t: int, lookback: int) -> Vector:
        return [x for p in self.parts for x in p.instant(matchers, t, lookback)]

    def instant_times(self, matchers, t: int, lookback: int) -> list[tuple[Labels, int, float]]:
        if not all(hasattr(p, "instant_times") for p in self.parts):
            from promql.parse import PromQLError

            raise PromQLError("timestamp() of a selector is not supported over this store")
        return [x for p in self.parts for x in p.instant_times(matchers, t, lookback)]

    def window(self, matchers, mint: int, maxt: int) -> Matrix:
        return [x for p in self.parts for x in p.window(matchers, mint, maxt)]


def format_labels(labels: Labels) -> str:
    name = get(labels, "__name__")
    inner = ", ".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return f"{name}{{{inner}}}"
