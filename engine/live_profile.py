"""Profile rows from a serving run: every step the engine takes under a Poisson load, timed whole.

The grid profiler times each step shape in isolation, repeated and warm. A serving engine runs
other steps: shapes change every step, the first step after an idle gap finds cold caches, and
the loop schedules and does its bookkeeping between forward passes. Timing the steps of a real
`LLM.generate` run with real arrival times captures all of it, one CSV row a step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.core.sampling_params import SamplingParams
from engine.profiler import step_row


@dataclass
class LoadSpec:
    requests: int = 300
    rate: float = 10.0  # requests/s, Poisson
    prompt_tokens: tuple[int, int] = (32, 256)  # uniform, inclusive
    output_tokens: tuple[int, int] = (8, 64)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        for name in ("prompt_tokens", "output_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name}: need 1 <= low <= high, got {lo}-{hi}")


def poisson_load(spec: LoadSpec, vocab_size: int):
    """Arrival times (s from the start), prompts as token ids, and sampling params of a load."""
    rng = np.random.default_rng(spec.seed)
    arrivals = np.cumsum(rng.exponential(1 / spec.rate, spec.requests))
    arrivals -= arrivals[0]
    plen = rng.integers(spec.prompt_tokens[0], spec.prompt_tokens[1] + 1, spec.requests)
    olen = rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, spec.requests)
    vocab = max(4, min(vocab_size, 32000))
    prompts = [[int(t) for t in rng.integers(3, vocab, p)] for p in plen]
    params = [SamplingParams(temperature=0.0, max_tokens=int(o), ignore_eos=True) for o in olen]
    return list(arrivals), prompts, params


@dataclass
class LiveProfile:
    rows: list[dict]  # one profile CSV row per engine step
    wakeup_ms: float | None  # median delay from an arrival at an idle engine to its first step
    idle_arrivals: int  # requests that found the engine idle (what wakeup_ms is the median of)


def live_profile(llm, spec: LoadSpec, *, device_name: str, model_name: str, dtype: str,
                 warmup_requests: int = 120, progress: bool = False) -> LiveProfile:
    """Serve the load with llm (an engine.LLM) in wall time, recording every engine step.

    First the same load (other prompts, so that none is a prefix-cache hit; at most
    `warmup_requests` of them) is served unrecorded: a server that has run a while is what users
    size. A process's first serving run is slower, and it warms gradually, not in a few steps:
    measured on the tiny model, one thread, the median prefill-only step of a 120-request run took
    4.6-4.8 ms as the first run, 3.9 ms after 40 warm-up requests and 2.7-3.3 ms after 120, while
    warming every prompt length with back-to-back requests first changed nothing (4.8 ms). A
    simulator calibrated on a cold run over-predicted a warm engine's median TTFT by 35-65%.
    """
    vocab = llm.engine.runner.config.vocab_size
    arrivals, prompts, params = poisson_load(spec, vocab)
    warm = replace(spec, requests=min(spec.requests, warmup_requests), seed=spec.seed + 1)
    warm_arrivals, warm_prompts, warm_params = poisson_load(warm, vocab)
    llm.generate(warm_prompts, warm_params, arrival_times=warm_arrivals)
    engine = llm.engine
    engine.step_log = []
    try:
        outputs = llm.generate(prompts, params, arrival_times=arrivals, progress=progress)
        log = engine.step_log
    finally:
        engine.step_log = None
    rows = [step_row(shape, [seconds * 1000], device_name=device_name, model_name=model_name, dtype=dtype)
            for shape, seconds in log]
    waits = idle_arrival_waits([o.metrics for o in outputs])
    wakeup = float(np.median(waits)) * 1000 if waits else None
    return LiveProfile(rows, wakeup, len(waits))


def idle_arrival_waits(metrics: list) -> list[float]:
    """first_scheduled - arrival (s) of the requests that arrived while every earlier one was done."""
    done_by, waits = float("-inf"), []
    for m in sorted(metrics, key=lambda m: m.arrival_time):
        if m.first_scheduled_time is None or m.finish_time is None:
            continue
        if m.arrival_time >= done_by:
            waits.append(m.first_scheduled_time - m.arrival_time)
        done_by = max(done_by, m.finish_time)
    return waits
