"""A recording loaded once: the samples of an OpenMetrics file kept in a cache file beside it.

    store = load_cached(Path("run/series.om"))   # parses and writes run/series.om.cache.npz once;
                                                 # later calls read the cache (tens of ms)

The cache holds every series' labels (JSON) and its samples as two flat arrays (int64 ms, float64)
with offsets, plus the source's size and modification time: a file that changed is parsed again and
the cache rewritten. A series reads the arrays directly (a binary search per lookup), so a query
over a few families of a large recording touches only their samples near the times it asks about.
Where the cache cannot be written (a read-only folder) the file is simply parsed each time.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from promql.openmetrics import read_openmetrics
from promql.storage import MemoryStorage, Series, get

VERSION = 1


def cache_path(source: Path) -> Path:
    return source.with_name(source.name + ".cache.npz")


def _stamp(source: Path) -> list[int]:
    st = source.stat()
    return [VERSION, st.st_size, st.st_mtime_ns]


class ArraySeries(Series):
    """A series over slices of the cache's arrays: a lookup reads one sample, a window copies only
    its own samples into the lists the evaluator works on."""

    __slots__ = ()

    def latest(self, t: int, lookback: int) -> float | None:
        i = int(self.ts.searchsorted(t, "right")) - 1
        if i < 0 or self.ts[i] < t - lookback:
            return None
        return float(self.vs[i])

    def latest_at(self, t: int, lookback: int) -> int | None:
        i = int(self.ts.searchsorted(t, "right")) - 1
        return int(self.ts[i]) if i >= 0 and self.ts[i] >= t - lookback else None

    def between(self, mint: int, maxt: int) -> tuple[list[int], list[float]]:
        lo = int(self.ts.searchsorted(mint, "left"))  # the method: np.searchsorted's wrapper costs more
        hi = int(self.ts.searchsorted(maxt, "right"))
        return self.ts[lo:hi].tolist(), self.vs[lo:hi].tolist()


class CachedStorage(MemoryStorage):
    """The series of a cache file (read only: no samples are appended)."""


def _write(store: MemoryStorage, source: Path, stamp: list[int]) -> None:
    series = list(store.series.values())
    lengths = np.array([len(s.ts) for s in series], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ts = np.fromiter((t for s in series for t in s.ts), dtype=np.int64, count=int(offsets[-1]))
    vs = np.fromiter((v for s in series for v in s.vs), dtype=np.float64, count=int(offsets[-1]))
    labels = json.dumps([list(map(list, s.labels)) for s in series])
    target = cache_path(source)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, stamp=np.array(stamp, dtype=np.int64), offsets=offsets, ts=ts, vs=vs,
                     labels=np.frombuffer(labels.encode(), dtype=np.uint8))
        os.chmod(tmp, source.stat().st_mode & 0o666)  # readable by whoever reads the recording
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(source: Path, stamp: list[int]) -> CachedStorage | None:
    try:
        with np.load(cache_path(source)) as z:
            if z["stamp"].tolist() != stamp:
                return None
            offsets, ts, vs = z["offsets"], z["ts"], z["vs"]
            labels = json.loads(z["labels"].tobytes())
    except (OSError, ValueError, KeyError, EOFError):  # absent, partial or foreign: parse again
        return None
    store = CachedStorage()
    for i, lb in enumerate(labels):
        key = tuple(tuple(kv) for kv in lb)
        s = ArraySeries(key)
        s.ts, s.vs = ts[offsets[i]:offsets[i + 1]], vs[offsets[i]:offsets[i + 1]]
        store.series[key] = s
        store.by_name.setdefault(get(key, "__name__"), []).append(s)
    return store


def load_cached(source: Path) -> MemoryStorage:
    """The samples of an OpenMetrics file, from its cache when that is current."""
    stamp = _stamp(source)
    store = _read(source, stamp)
    if store is not None:
        return store
    with source.open(encoding="utf-8") as f:
        store = read_openmetrics(f, str(source))
    if _stamp(source) == stamp:  # not rewritten while it was read
        try:
            _write(store, source, stamp)
        except OSError:
            pass  # a read-only folder: no cache, the answer is the same
    return store
