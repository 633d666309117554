"""The replicas' metrics as Prometheus sees them: scraped every few seconds, read through rate
windows and histogram quantiles, so an autoscaler in the simulator reacts with the same lag as a
real one.

Each replica keeps vLLM's counters and histograms (same buckets) cumulatively
(simulator.replica_metrics); a scrape copies them into a per-replica series; `rate` and
`histogram_quantile` follow PromQL's semantics (extrapolation to the window edges, counter resets,
linear interpolation inside a bucket).

The same scrapes are also kept as labelled series under vLLM's names (`replica_columns`), for the
PromQL evaluator: trigger queries and recording rules read them as they would read Prometheus.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import math

import numpy as np
from prometheus_client.utils import floatToGoString

from promql.storage import MemoryStorage, labels_of
from promql.targets import Column, TargetStorage
from simulator.replica_metrics import HISTOGRAMS, LAYOUT, SIZE


def extrapolated_increase(
    ts: list[float], vs: list[np.ndarray], start: float, end: float
) -> np.ndarray | None:
    """PromQL's increase() over the window (start, end] for one series; None with < 2 samples."""
    if len(ts) < 2:
        return None
    delta = vs[-1] - vs[0]
    # counter resets: add back what was there before each drop
    for a, b in zip(vs[:-1], vs[1:]):
        drop = b < a
        if drop.any():
            delta = delta + np.where(drop, a, 0.0)
    sampled = ts[-1] - ts[0]
    if sampled <= 0:
        return None
    avg = sampled / (len(ts) - 1)
    to_start, to_end = ts[0] - start, end - ts[-1]
    # a counter cannot be extrapolated below zero
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = np.where(delta > 0, sampled * vs[0] / np.where(delta > 0, delta, 1), np.inf)
    to_start = np.minimum(to_start, to_zero)
    threshold = avg * 1.1
    ext_start = np.where(to_start < threshold, to_start, avg / 2)
    ext_end = to_end if to_end < threshold else avg / 2
    return delta * (sampled + ext_start + ext_end) / sampled


def histogram_quantile(q: float, le: tuple[float, ...], counts: np.ndarray) -> float:
    """PromQL histogram_quantile over cumulative bucket counts (last = +Inf). NaN when empty."""
    total = counts[-1]
    if not total > 0 or math.isnan(total):
        return math.nan
    rank = q * total
    i = int(np.searchsorted(counts, rank, side="left"))
    if i >= len(le):  # in the +Inf bucket: the highest finite bound
        return le[-1]
    lower = 0.0 if i == 0 else le[i - 1]
    below = 0.0 if i == 0 else counts[i - 1]
    inside = counts[i] - below
    if inside <= 0:
        return le[i]
    return lower + (le[i] - lower) * (rank - below) / inside


# a replica's scraped row: its cumulative vector, then these gauges
GAUGES = {"waiting": "vllm:num_requests_waiting", "running": "vllm:num_requests_running",
          "kv_usage": "vllm:kv_cache_usage_perc"}
# counters of the vector under vLLM's names: family, extra labels
VLLM_COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens", {}),
    "generation_tokens": ("vllm:generation_tokens", {}),
    "num_preemptions": ("vllm:num_preemptions", {}),
    "prefix_cache_queries": ("vllm:prefix_cache_queries", {}),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", {}),
    "request_success": ("vllm:request_success", {"finished_reason": "length"}),  # outputs run to max_tokens
}
# per-request token totals: vLLM exports histograms; the simulator keeps their sum and count
TOKEN_SUMS = {"request_prompt_tokens_sum": "vllm:request_prompt_tokens",
              "request_output_tokens_sum": "vllm:request_generation_tokens"}


def histogram_columns(family: str, base: dict, buckets, start: int, total: int) -> list[Column]:
    """A histogram's _bucket (cumulative, +Inf last), _sum and _count columns from `start`, and
    _sum, _count at `total`, `total + 1`."""
    cols = [Column(family, "histogram", labels_of({**base, "__name__": family + "_bucket",
                                                   "le": floatToGoString(b)}), start + i)
            for i, b in enumerate((*buckets, math.inf))]
    cols.append(Column(family, "histogram", labels_of({**base, "__name__": family + "_sum"}), total))
    cols.append(Column(family, "histogram", labels_of({**base, "__name__": family + "_count"}), total + 1))
    return cols


def replica_columns(target: dict[str, str]) -> list[Column]:
    """Every series a replica exports, as a scrape of vLLM's /metrics shows them."""
    cols = []
    for key, (family, extra) in VLLM_COUNTERS.items():
        cols.append(Column(family, "counter", labels_of({**target, **extra, "__name__": family + "_total"}),
                           LAYOUT[key]))
    for key, family in TOKEN_SUMS.items():
        for suffix, index in (("_sum", LAYOUT[key]), ("_count", LAYOUT["request_success"])):
            cols.append(Column(family + suffix, "unknown", labels_of({**target, "__name__": family + suffix}),
                               index))
    for h, buckets in HISTOGRAMS.items():
        start, total = LAYOUT[h + "_bucket"].start, LAYOUT[h + "_sum"]
        cols += histogram_columns("vllm:" + h, target, buckets, start, total)
    for i, name in enumerate(GAUGES.values()):
        cols.append(Column(name, "gauge", labels_of({**target, "__name__": name}), SIZE + i))
    return cols


_KEEP_ALL = contextvars.ContextVar("keep_all_samples", default=False)


@contextlib.contextmanager
def keep_all_samples():
    """Stores made inside keep every sample of the run (for writing the series out afterwards)."""
    token = _KEEP_ALL.set(True)
    try:
        yield
    finally:
        _KEEP_ALL.reset(token)


class MetricStore:
    """Scraped samples per series (a replica, or a router), and PromQL-style reads over them.

    `series`/`gauges` feed the Observation's fleet aggregates; `targets` holds the same scrapes as
    labelled series and `recorded` the recording rules' output, both read by the PromQL evaluator
    through instant() and window()."""

    def __init__(self, retention: float = 3600.0):
        self.series: dict[tuple, tuple[list[float], list[np.ndarray]]] = {}
        self.gauges: dict[tuple, tuple[float, dict]] = {}
        self.keep_all = _KEEP_ALL.get()
        self.targets = TargetStorage()
        self.recorded = MemoryStorage()
        self.retention = math.inf if self.keep_all else retention

    @property
    def retention(self) -> float:
        return self._retention

    @retention.setter
    def retention(self, seconds: float) -> None:
        self._retention = math.inf if self.keep_all else seconds
        self.targets.retention = self._retention * 1000

    def instant(self, matchers, t: int, lookback: int):
        return self.targets.instant(matchers, t, lookback) + self.recorded.instant(matchers, t, lookback)

    def instant_times(self, matchers, t: int, lookback: int):
        return (self.targets.instant_times(matchers, t, lookback)
                + self.recorded.instant_times(matchers, t, lookback))

    def window(self, matchers, mint: int, maxt: int):
        return self.targets.window(matchers, mint, maxt) + self.recorded.window(matchers, mint, maxt)

    def families(self):
        """(family, type, [(labels, ts, vs)]) of every series kept, family by family (OpenMetrics order):
        the scraped ones, then the recording rules' output."""
        members: dict[str, tuple[str, list]] = {}
        for target in self.targets.targets.values():
            for c in target.columns:
                members.setdefault(c.family, (c.type, []))[1].append((target, c))
        stacked: dict[int, np.ndarray] = {}
        for family, (kind, cols) in members.items():
            series = []
            for target, c in cols:
                if not target.ts:
                    continue
                block = stacked.get(id(target))
                if block is None:
                    block = stacked[id(target)] = np.vstack(target.rows).T
                series.append((c.labels, target.ts, block[c.index].tolist()))
            if series:
                yield family, kind, series
        recorded: dict[str, list] = {}
        for s in self.recorded.series.values():
            recorded.setdefault(dict(s.labels)["__name__"], []).append((s.labels, s.ts, s.vs))
        for family, series in recorded.items():
            yield family, "unknown", series

    def scrape(self, key: tuple, t: float, vector: np.ndarray, gauges: dict | None = None) -> None:
        ts, vs = self.series.setdefault(key, ([], []))
        ts.append(t)
        vs.append(vector)
        while ts and ts[0] < t - self.retention:
            ts.pop(0)
            vs.pop(0)
        if gauges is not None:
            self.gauges[key] = (t, gauges)

    def forget(self, key: tuple) -> None:
        self.gauges.pop(key, None)

    def increase(self, keys, t: float, window: float) -> np.ndarray:
        """sum(increase(x[window])) over the given series, for every counter and bucket at once."""
        total = np.zeros(SIZE)
        for k in keys:
            if k not in self.series:
                continue
            ts, vs = self.series[k]
            lo = bisect.bisect_right(ts, t - window)
            hi = bisect.bisect_right(ts, t)
            inc = extrapolated_increase(ts[lo:hi], vs[lo:hi], t - window, t)
            if inc is not None:
                total += inc
        return total

    def rate(self, keys, t: float, window: float) -> np.ndarray:
        return self.increase(keys, t, window) / window

    def gauge(self, keys, name: str, t: float, stale: float = 300.0) -> list[float]:
        """Latest value of a gauge per series, skipping stale series (Prometheus' 5-minute lookback)."""
        out = []
        for k in keys:
            g = self.gauges.get(k)
            if g is not None and t - g[0] <= stale and name in g[1]:
                out.append(g[1][name])
        return out


def quantile_of(rates: np.ndarray, hist: str, q: float) -> float:
    return histogram_quantile(q, HISTOGRAMS[hist], rates[LAYOUT[hist + "_bucket"]])
