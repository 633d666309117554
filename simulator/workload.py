"""Workloads: when requests arrive and how long their prompts and outputs are.

Arrivals are a renewal process (Poisson, or Gamma with a chosen inter-arrival CV) run in
"operational time" and mapped through the cumulative rate curve, so a diurnal curve, a piecewise
schedule with ramps, or spikes shape a Gamma process just as they shape a Poisson one. A trace is
replayed as recorded (optionally rate-scaled and time-compressed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.dists import Dist
from simulator.traces import Trace, compress_time, read_trace, scale_rate


@dataclass
class Workload:
    times: np.ndarray  # arrival seconds, sorted
    prompt: np.ndarray  # prompt tokens
    output: np.ndarray  # output tokens
    hash_ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.times)


@dataclass
class RateCurve:
    """Requests per second over time: a base (constant, diurnal or piecewise-linear) times spikes."""

    kind: str  # constant | diurnal | piecewise
    rate: float = 0.0
    mean: float = 0.0
    amplitude: float = 0.0
    period: float = 86400.0
    phase: float = 0.0
    points: list[tuple[float, float]] | None = None
    spikes: list[dict] | None = None  # {at, duration, factor, ramp}

    def __call__(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        if self.kind == "constant":
            r = np.full_like(t, self.rate)
        elif self.kind == "diurnal":
            # lowest at t = phase, highest half a period later
            r = self.mean * (1 - self.amplitude * np.cos(2 * np.pi * (t - self.phase) / self.period))
        else:
            xs, ys = zip(*self.points)
            r = np.interp(t, xs, ys)
        for s in self.spikes or []:
            r = r * spike_factor(t, s["at"], s["duration"], s["factor"], s.get("ramp", 0.0))
        return np.maximum(r, 0.0)


def spike_factor(t: np.ndarray, at: float, duration: float, factor: float, ramp: float) -> np.ndarray:
    """1 outside [at, at+duration]; `factor` on the plateau; linear ramps of `ramp` s at both ends."""
    f = np.ones_like(t)
    if ramp > 0:
        up = np.clip((t - at) / ramp, 0, 1)
        down = np.clip((at + duration - t) / ramp, 0, 1)
        w = np.minimum(up, down)
    else:
        w = ((t >= at) & (t < at + duration)).astype(float)
    return f + (factor - 1) * w


def arrival_times(
    curve: RateCurve, duration: float, cv: float, rng: np.random.Generator, dt: float = 0.25
) -> np.ndarray:
    """Arrivals in [0, duration): a renewal process of mean gap 1 in operational time Λ(t) = ∫rate."""
    grid = np.arange(0.0, duration + dt, dt)
    rate = curve(grid)
    cum = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * dt)])  # trapezoid Λ(t)
    total = cum[-1]
    if total <= 0:
        return np.zeros(0)
    n = int(total + 10 * math.sqrt(total) * max(cv, 1.0) + 20)
    if cv == 1.0:
        gaps = rng.exponential(1.0, n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / shape, n)
    ops = np.cumsum(gaps)
    while ops[-1] < total:  # rare: the draw ran short
        more = rng.gamma(1.0 / cv**2, cv**2, n) if cv != 1.0 else rng.exponential(1.0, n)
        ops = np.concatenate([ops, ops[-1] + np.cumsum(more)])
    ops = ops[ops < total]
    # invert Λ; flat stretches (rate 0) are skipped because cum is non-decreasing
    times = np.interp(ops, cum, grid)
    return times[times < duration]


def synthetic(
    curve: RateCurve,
    duration: float,
    cv: float,
    prompt: Dist | None,
    output: Dist | None,
    rng: np.random.Generator,
    mix: Trace | None = None,
) -> Workload:
    """Generated arrivals; lengths from distributions or resampled (as pairs) from a trace's mix."""
    times = arrival_times(curve, duration, cv, rng)
    n = len(times)
    if mix is not None:
        pick = rng.integers(0, len(mix), n)
        p, o = mix.prompt[pick].copy(), mix.output[pick].copy()
        hashes = [mix.hash_ids[i] for i in pick] if mix.hash_ids is not None else None
    else:
        p = prompt.sample(rng, n).astype(np.int64)
        o = output.sample(rng, n).astype(np.int64)
        hashes = None
    return Workload(times, np.maximum(p, 1), np.maximum(o, 1), hashes)


def from_trace(
    trace: Trace,
    rng: np.random.Generator,
    rate_scale: float = 1.0,
    time_scale: float = 1.0,
    start: float = 0.0,
    duration: float | None = None,
    limit: int | None = None,
) -> Workload:
    """Replays a trace: window [start, start+duration) of the compressed, rate-scaled trace."""
    if time_scale != 1.0:
        trace = compress_time(trace, time_scale)
    if rate_scale != 1.0:
        trace = scale_rate(trace, rate_scale, rng)
    keep = trace.times >= start
    if duration is not None:
        keep &= trace.times < start + duration
    idx = np.flatnonzero(keep)
    if limit is not None:
        idx = idx[:limit]
    t = trace.subset(idx)
    return Workload(t.times - start, np.maximum(t.prompt, 1), np.maximum(t.output, 1), t.hash_ids)


def load_trace(cfg: dict) -> Trace:
    kwargs = {k: cfg[k] for k in ("time_column", "prompt_column", "output_column", "time_unit") if k in cfg}
    return read_trace(cfg["format"], cfg["path"], **kwargs)
