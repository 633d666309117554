"""One replica's metrics as vLLM keeps them: cumulative counters and histograms (vLLM's buckets) in
one numpy vector, laid out once (LAYOUT), so a scrape is one copy (simulator.metrics stores them)."""

from __future__ import annotations

import bisect
import math

import numpy as np

from engine.core.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

E2E_BUCKETS = REQUEST_LATENCY_BUCKETS  # e2e, queue, prefill and decode times share them

COUNTERS = (
    "arrivals",
    "prompt_tokens",
    "generation_tokens",
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "request_success",
    "request_prompt_tokens_sum",
    "request_output_tokens_sum",
)
HISTOGRAMS = {
    "time_to_first_token_seconds": TTFT_BUCKETS,
    "inter_token_latency_seconds": ITL_BUCKETS,
    "request_time_per_output_token_seconds": ITL_BUCKETS,
    "e2e_request_latency_seconds": E2E_BUCKETS,
    "request_queue_time_seconds": E2E_BUCKETS,
}


def _layout() -> dict[str, slice | int]:
    """Where each counter, histogram bucket vector (+Inf last), _sum and _count sits in a vector."""
    out: dict[str, slice | int] = {}
    i = 0
    for c in COUNTERS:
        out[c] = i
        i += 1
    for h, buckets in HISTOGRAMS.items():
        out[h + "_bucket"] = slice(i, i + len(buckets) + 1)
        i += len(buckets) + 1
        out[h + "_sum"] = i
        out[h + "_count"] = i + 1
        i += 2
    out["_size"] = i
    return out


LAYOUT = _layout()
SIZE = LAYOUT["_size"]


class ReplicaMetrics:
    """Cumulative counters and (non-cumulative per-bucket) histogram counts of one replica."""

    def __init__(self):
        self.v = np.zeros(SIZE)
        self._hist = {
            h: (LAYOUT[h + "_bucket"].start, LAYOUT[h + "_sum"], buckets) for h, buckets in HISTOGRAMS.items()
        }

    def inc(self, counter: str, by: float = 1.0) -> None:
        self.v[LAYOUT[counter]] += by

    def observe(self, hist: str, value: float, count: int = 1) -> None:
        start, s, buckets = self._hist[hist]
        self.v[start + bisect.bisect_left(buckets, value)] += count  # le: value <= bound
        self.v[s] += value * count
        self.v[s + 1] += count

    def observe_arithmetic(self, hist: str, first: float, step: float, n: int, weight: int = 1) -> None:
        """Observes first + step*j for j in [0, n), each `weight` times, in O(buckets)."""
        if n <= 0:
            return
        if step <= 0:
            self.observe(hist, first, n * weight)
            return
        start, s, buckets = self._hist[hist]
        v = self.v
        # only the buckets between the first and the last value get counts
        k = bisect.bisect_left(buckets, first)
        last_k = bisect.bisect_left(buckets, first + step * (n - 1))
        done = 0
        while k < last_k:
            upto = min(n, max(0, math.floor((buckets[k] - first) / step) + 1))  # j: first + step*j <= le
            if upto > done:
                v[start + k] += (upto - done) * weight
                done = upto
            k += 1
        v[start + last_k] += (n - done) * weight
        self.v[s] += weight * (n * first + step * n * (n - 1) / 2)
        self.v[s + 1] += n * weight

    def cumulative(self) -> np.ndarray:
        """The vector as Prometheus stores it: histogram buckets cumulative in le."""
        out = self.v.copy()
        for h in HISTOGRAMS:
            sl = LAYOUT[h + "_bucket"]
            out[sl] = np.cumsum(out[sl])
        return out
