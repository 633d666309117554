"""Limits on scenario values, far beyond any real fleet or model, so that a value that would need
unbounded memory or time (a duration in milliseconds, a scrape every microsecond, a billion replicas,
a mean prompt of 10^12 tokens) is refused when the file loads, naming the field, the value and the
limit, instead of ending in a MemoryError or a run that never finishes.

Single fields carry their limit in the schema (simulator.scenario_schema); `check_limits` checks what
depends on several fields: the expected number of requests, and how many times each periodic process
(scrape, timeline, autoscaler) runs over the simulated span.
"""

from __future__ import annotations

import math

from autoscaler.yamlfile import Document
from simulator.dists import Dist, lognormal_params

DAY = 86400.0
MAX_DURATION = 30 * DAY  # simulated seconds (workload, drain, trace windows)
MAX_RATE = 100_000.0  # requests per second into one fleet
MAX_SPIKE_FACTOR = 1000.0
MAX_CV = 100.0  # inter-arrival coefficient of variation
MAX_RATE_SCALE = 1000.0  # a trace replayed at most this many times faster
MAX_REQUESTS = 10_000_000  # expected requests in one run (~40 min of simulation at 4,000 requests/s)
MAX_REPLICAS = 10_000  # replicas of one pool
MAX_TOKENS = 10_000_000  # a prompt, an output, a context window (the longest windows offered today)
MAX_NUM_SEQS = 65_536
MAX_BLOCK_SIZE = 1024
MAX_KV_BLOCKS = 1 << 22  # per replica: 67M tokens at block size 16, beyond any GPU's KV cache
MAX_LRU_BLOCKS = 10_000_000  # the router's prefix index
MAX_LOGNORMAL_SIGMA = 4.0  # mean / median = e^8; measured traces have sigma 0.5-1.5
MIN_SCRAPE_INTERVAL = 0.1
MAX_WINDOW = 3600.0  # the rate window
MIN_INTERVAL = 0.001  # timeline rows, autoscaler polls
MIN_MTBF = 1.0
MAX_TICKS = 10_000_000  # runs of one periodic process over the simulated span
MAX_SAMPLES = 20_000  # scraped samples the metric store keeps per replica


def expected_requests(arrivals: dict, duration: float) -> float:
    """About how many requests a generated workload makes (the rate curve's integral over the run, the
    spikes counted at the curve's peak rate)."""
    curve = arrivals["curve"]
    if curve["kind"] == "constant":
        base, peak = curve["rate"] * duration, curve["rate"]
    elif curve["kind"] == "diurnal":
        peak = curve["mean"] * (1 + curve["amplitude"])
        base = curve["mean"] * (duration + curve["amplitude"] * curve["period"] / math.pi)
    else:
        points = curve["points"]
        peak = max(r for _, r in points)
        xs = sorted({0.0, duration, *(t for t, _ in points if 0 < t < duration)})
        ts, rs = [t for t, _ in points], [r for _, r in points]
        ys = [_interp(x, ts, rs) for x in xs]
        base = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))
    extra = sum(max(s["factor"] - 1, 0.0) * peak * (s["duration"] + s["ramp"]) for s in arrivals["spikes"])
    return base + extra


def _interp(x: float, ts: list[float], rs: list[float]) -> float:
    """np.interp for one point (flat beyond the ends), without numpy."""
    if x <= ts[0]:
        return rs[0]
    for t0, t1, r0, r1 in zip(ts, ts[1:], rs, rs[1:]):
        if x <= t1:
            return r0 if t1 == t0 else r0 + (r1 - r0) * (x - t0) / (t1 - t0)
    return rs[-1]


def dist_problem(d: Dist, limit: float) -> str | None:
    """Why the lengths a distribution draws are beyond `limit` (None: they are not)."""
    p = d.params
    if d.kind == "lognormal":
        mu, sigma = lognormal_params(p)
        if sigma > MAX_LOGNORMAL_SIGMA:
            return f"sigma {sigma:.3g} is more than the limit of {MAX_LOGNORMAL_SIGMA:g}"
        log_mean = mu + sigma**2 / 2
        mean = math.inf if log_mean > 700 else math.exp(log_mean)
    elif d.kind == "empirical":
        mean = max(p["values"])
    elif d.kind == "uniform":
        mean = p["high"]
    else:
        mean = d.mean()
    if d.kind == "gamma" and p["cv"] > MAX_CV:
        return f"cv {p['cv']:g} is more than the limit of {MAX_CV:g}"
    if d.kind == "normal" and p["std"] > limit:
        return f"std {p['std']:g} is more than the limit of {limit:g}"
    if mean > limit:
        return f"a mean (or largest value) of {mean:.4g} is more than the limit of {limit:g}"
    if d.hi is not None and d.hi > limit:
        return f"max {d.hi:g} is more than the limit of {limit:g}"
    return None


def check_limits(doc: Document, workload: dict, duration: float | None, horizon: float, pools: list,
                 scrape_interval: float, rate_window: float, timeline_interval: float,
                 router: dict | None = None) -> None:
    """The limits that depend on several fields; raises doc.error naming the field."""
    if "arrivals" in workload and duration is not None:
        n = expected_requests(workload["arrivals"], duration)
        if n > MAX_REQUESTS:
            raise doc.error(("workload", "arrivals"), f"about {n:,.0f} requests over the duration of "
                            f"{duration:g} s, more than the limit of {MAX_REQUESTS:,}")
    for key in ("prompt_tokens", "output_tokens"):
        if isinstance(workload.get(key), Dist):
            problem = dist_problem(workload[key], MAX_TOKENS)
            if problem:
                raise doc.error(("workload", key), f"{problem} tokens")
    periodic = [(("metrics", "scrape_interval"), scrape_interval, "scrapes"),
                (("output", "timeline_interval"), timeline_interval, "timeline rows")]
    for i, pool in enumerate(pools):
        a = pool.autoscaler or {}
        interval = a["spec"].polling_interval if a.get("kind") == "spec" else a.get("polling_interval")
        if interval is not None:
            where = ("pools", i, "autoscaler") if "autoscaler" in doc.data["pools"][i] else ("autoscaler",)
            periodic.append((where, interval, "autoscaler polls"))
    if router is not None and router.config.flow_control:
        periodic.append((("router", "flow_control", "interval"), router.interval,
                         "gateway dispatch rounds"))
    for path, interval, what in periodic:
        ticks = horizon / interval
        if ticks > MAX_TICKS:
            raise doc.error(path, f"an interval of {interval:g} s over the {horizon:g} s simulated (duration "
                            f"and drain) is {ticks:,.0f} {what}, more than the limit of {MAX_TICKS:,}")
    retention = max(4 * rate_window, 600.0)  # what simulator.fleet keeps in its metric store
    if retention / scrape_interval > MAX_SAMPLES:
        kept = retention / scrape_interval
        raise doc.error(("metrics", "scrape_interval"), f"{scrape_interval:g} s keeps {kept:,.0f} samples "
                        f"per replica over the {retention:g} s the metric store retains (4 x rate_window, at "
                        f"least 600 s), more than the limit of {MAX_SAMPLES:,}")
