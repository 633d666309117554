"""The queueing models behind the pdModel policy (autoscaler.pd_model): the prefill pool as one M/G/c
queue of prompts, the decode pool as a batch whose step time grows with what it holds.

* prefill: a request's TTFT on the prefill side is its queue wait W plus its own prefill S. The miss
  probability at a budget T is taken whole, P(W + S > T) = E_S[1{S > T} + 1{S <= T} P(W > T - S)],
  over a lognormal prompt-length mix of the observed mean and the configured cv (a quantile grid), with
  W the M/G/c wait under the Allen-Cunneen scaling, P(W > t) = C exp(-2 (n/s - rate) t / (1 + cv_s^2)),
  C the Erlang C probability, s and cv_s the grid's mean prefill and its cv. Summing the wait's and
  the prompt's percentiles instead (both cannot be at their 90th at once) orders two to three times
  the replicas a light long-prompt load needs.
* decode: by Little's law a replica runs B = lam O tpot sequences and tpot = d(B), one decode step of
  B sequences; d grows with B (every step reads every sequence's KV), so the batch feeds back on itself
  and beyond a fold no fixed point exists. The batch is taken at the TPOT percentile of its occupancy
  (M/G/inf: Poisson of mean B over the pool, spread over n replicas by the router's least-outstanding
  pick: B + z sqrt(B / n)), so that a replica is not sized at the edge of the fold, where one
  replica's random extra sequences slow every step and the batch runs away.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from autoscaler.slo_model import StepTimeModel

GRID = 48  # quantile points of the prompt-length mix


def erlang_c(servers: int, load: float) -> float:
    """The probability an arrival waits in an M/M/c queue with `load` erlangs (< servers)."""
    b = 1.0
    for k in range(1, servers + 1):  # Erlang B by its stable recursion
        b = load * b / (k + load * b)
    rho = load / servers
    return b / (1.0 - rho * (1.0 - b))


def prefill_wait(model: StepTimeModel, rate: float, n: int, prompt: float, q: float,
                 prompt_cv: float) -> float:
    """Queue wait at quantile q for prompts arriving at `rate` to n prefill replicas (inf when
    saturated): M/G/c with the Allen-Cunneen scaling, P(W > t) = C exp(-2 (n/S - rate) t / (1 + cv^2)),
    C the Erlang C probability of waiting. With n = 1 it is sloModel's M/G/1 tail."""
    s = model.step_ms(prompt, prompt, 0, 0) / 1000.0
    load = rate * s
    if load >= n:
        return math.inf
    if load <= 0:
        return 0.0
    c = erlang_c(n, load)
    tail = 1.0 - q
    if c <= tail:
        return 0.0
    return math.log(c / tail) * (1.0 + prompt_cv**2) / (2.0 * (n / s - rate))


def prefill_times(model: StepTimeModel, prompt: float, cv: float) -> list[float]:
    """Seconds of prefill at GRID equally likely quantiles of a lognormal prompt mix (mean `prompt`,
    coefficient of variation cv; cv 0: every prompt the mean)."""
    if cv <= 0:
        return [model.step_ms(prompt, prompt, 0, 0) / 1000.0]
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    mu, z = math.log(prompt) - sigma * sigma / 2.0, NormalDist()
    out = []
    for k in range(GRID):
        p = math.exp(mu + sigma * z.inv_cdf((k + 0.5) / GRID))
        out.append(model.step_ms(p, p, 0, 0) / 1000.0)
    return out


def prefill_miss(times: list[float], rate: float, n: int, budget: float) -> float:
    """P(wait + own prefill > budget) for prompts at `rate` on n replicas, the prefills `times` (a
    quantile grid): 1 when the pool is saturated."""
    s = sum(times) / len(times)
    load = rate * s
    if load >= n:
        return 1.0
    var = sum((t - s) ** 2 for t in times) / len(times)
    c = erlang_c(n, load) if load > 0 else 0.0
    theta = 2.0 * (n / s - rate) / (1.0 + var / (s * s))
    return sum(1.0 if t > budget else c * math.exp(-theta * (budget - t)) for t in times) / len(times)


def local_prompts(prompt: float, threshold: float) -> tuple[float, float]:
    """(share, mean length) of the prompts at most `threshold` tokens long, which the router sends whole
    to a decode replica, for an exponential length mix of mean `prompt` (promptCV 1)."""
    if threshold <= 0 or prompt <= 0:
        return 0.0, 0.0
    share = 1.0 - math.exp(-threshold / prompt)
    return share, max(prompt - threshold * (1.0 - share) / share, 1.0)


def decode_batch(model: StepTimeModel, lam: float, prompt: float, output: float, max_batch: int,
                 threshold: float = 0.0, z: float = 0.0, pool: int = 1, ctx: float | None = None):
    """(tpot seconds, running sequences) of one decode replica at lam requests/s, its batch taken z
    standard deviations above its mean occupancy (Poisson over a pool of `pool` replicas); None when
    the batch has no fixed point within max_batch (overloaded). Prompts of at most `threshold` tokens
    are prefilled here, in steps the decoding sequences wait through: tpot = d(B) / (1 - rho_p). `ctx`:
    the KV tokens a running sequence holds (default: the mean prompt and half the mean output)."""
    ctx = ctx or prompt + output / 2.0
    share, local = local_prompts(prompt, threshold)
    rho_p = lam * share * model.step_ms(local, local, 0, 0) / 1000.0 if share else 0.0
    if rho_p >= 1.0:
        return None

    def step(b: float) -> float:
        b = max(b, 1.0)
        return model.step_ms(0, 0, b, b * ctx) / 1000.0 / (1.0 - rho_p)

    def occupancy(tpot: float) -> float:
        mean = lam * output * tpot
        return mean + z * math.sqrt(mean / pool) if z > 0 else mean

    tpot = step(1.0)
    batch = occupancy(tpot)
    for _ in range(60):
        tpot_new = step(batch)
        batch_new = occupancy(tpot_new)
        if batch_new > max_batch:
            return None
        done = abs(batch_new - batch) <= 1e-4 * max(1.0, batch)
        tpot, batch = tpot_new, batch_new
        if done:
            return tpot, batch
    return None
