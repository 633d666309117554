"""Scraped targets stored as Prometheus would hold them, in columns: one row of values per scrape of
a target, one column per series, so a scrape of hundreds of series is one array append.

A target that a scrape round no longer reaches (a replica gone) gets a staleness marker at that
round's time, as Prometheus writes one when a target disappears: instant queries stop seeing its
series at once, range queries keep its samples. Each series carries its family and type, so the
history can be written out as OpenMetrics.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from promql.storage import Labels, Matrix, Vector, get, latest_index, matches, name_of


@dataclass(frozen=True, slots=True)
class Column:
    family: str  # the metric family (a counter's name without _total, a histogram's base name)
    type: str  # counter, gauge, histogram, unknown
    labels: Labels  # the sample's full labels, __name__ included
    index: int  # where its value sits in a row


@dataclass(slots=True)
class Target:
    columns: list[Column]
    ts: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)  # times of staleness markers

    def row_at(self, t: int, lookback: int) -> np.ndarray | None:
        i = latest_index(self.ts, self.stale, t, lookback)
        return None if i is None else self.rows[i]


class TargetStorage:
    def __init__(self, retention: float = math.inf):
        self.retention = retention  # ms of history kept
        self.targets: dict[object, Target] = {}
        self._up: set = set()  # targets in the last scrape round
        self._selected: dict[tuple, list[tuple[Target, list[Column]]]] = {}

    def scrape(self, key, t: int, row: np.ndarray, columns) -> None:
        """One target's values at t (ms); `columns()` gives its series the first time it is seen."""
        target = self.targets.get(key)
        if target is None:
            target = self.targets[key] = Target(columns())
            self._selected.clear()
        target.ts.append(t)
        target.rows.append(row)

    def end_round(self, t: int, scraped: set) -> None:
        """After a scrape round at t: staleness markers for targets it missed; old samples dropped."""
        for key in self._up - scraped:
            self.targets[key].stale.append(t)
        self._up = set(scraped)
        if math.isinf(self.retention):
            return
        before = t - self.retention
        for key, target in list(self.targets.items()):
            k = bisect.bisect_left(target.ts, before)
            if k:
                del target.ts[:k], target.rows[:k]
                target.stale = [x for x in target.stale if x >= before]
            if not target.ts:
                del self.targets[key]
                self._up.discard(key)
                self._selected.clear()

    def select(self, matchers) -> list[tuple[Target, list[Column]]]:
        key = tuple(matchers)
        found = self._selected.get(key)
        if found is None:
            name = name_of(matchers)
            found = []
            for target in self.targets.values():
                cols = [c for c in target.columns if (name is None or get(c.labels, "__name__") == name)
                        and matches(matchers, c.labels)]
                if cols:
                    found.append((target, cols))
            self._selected[key] = found
        return found

    def instant(self, matchers, t: int, lookback: int) -> Vector:
        out = []
        for target, cols in self.select(matchers):
            row = target.row_at(t, lookback)
            if row is not None:
                out += [(c.labels, float(row[c.index])) for c in cols]
        return out

    def instant_times(self, matchers, t: int, lookback: int) -> list:
        """instant() with each sample's own (scrape) time, for timestamp()."""
        out = []
        for target, cols in self.select(matchers):
            row = target.row_at(t, lookback)
            if row is not None:
                at = target.ts[bisect.bisect_right(target.ts, t) - 1]
                out += [(c.labels, at, float(row[c.index])) for c in cols]
        return out

    def window(self, matchers, mint: int, maxt: int) -> Matrix:
        out = []
        for target, cols in self.select(matchers):
            lo, hi = bisect.bisect_left(target.ts, mint), bisect.bisect_right(target.ts, maxt)
            if lo >= hi:
                continue
            ts = target.ts[lo:hi]
            block = np.vstack(target.rows[lo:hi])[:, [c.index for c in cols]].T.tolist()
            out += [(c.labels, ts, vs) for c, vs in zip(cols, block)]
        return out

    def history(self):
        """(column, ts, vs) of every series kept, for writing them out."""
        for target in self.targets.values():
            if not target.ts:
                continue
            block = np.vstack(target.rows).T
            for c in target.columns:
                yield c, target.ts, block[c.index].tolist()
