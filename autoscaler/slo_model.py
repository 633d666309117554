"""Model-based SLO headroom: the fewest replicas whose predicted TTFT and TPOT percentiles meet the SLOs.

From a step-time model (the calibrated simulator.latency model, passed in by the caller: autoscaler
imports none of our packages), the arrival rate and the mean prompt/output lengths, each replica is a
continuous-batching server with the per-replica rate lam = rate / n:

* decode: B sequences in the running batch, B = lam * O * tpot (Little's law), tpot = d(B) / (1 - rho_p),
  d(B) = one decode step of B sequences, rho_p = lam * S the share of time spent in prefill steps;
  solved as a fixed point; no solution with B <= maxBatchSeqs and rho_p < 1 means "overloaded".
* TTFT: prefills queue FCFS and are scheduled ahead of decode steps: M/G/1 with vacations,
  mean wait W0 = lam E[S^2] / (2 (1 - rho_p)), tail P(W > t) ~ rho_p exp(-rho_p t / W0), plus one decode
  step of residual and the prefill of a percentile-long prompt.


The arrival rate to provision for comes from autoscaler.forecast (Demand: the look-ahead trend, the
burst test, fast signals, a seasonal profile, a batch band). Scale-up is immediate; scale-down waits
scaleDownDelay seconds (the highest recommendation of that window wins), like the HPA's stabilization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from autoscaler.batch_backlog import BacklogOptions, BatchBacklog, interactive, with_mix
from autoscaler.forecast import Demand, DemandOptions
from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.slo import SloTarget


class StepTimeModel(Protocol):
    """What the policy needs from simulator.latency.LatencyModel: one engine step in milliseconds."""

    def step_ms(
        self, prefill_tokens: float, prefill_context: float, decode_seqs: float, decode_context: float
    ) -> float: ...


@dataclass
class Prediction:
    ttft: float  # seconds at the SLO percentile (inf = overloaded)
    tpot: float  # seconds
    batch: float  # sequences in the running batch
    rho_prefill: float


OVERLOADED = Prediction(math.inf, math.inf, math.inf, math.inf)


def quantile_factor(q: float, cv: float) -> float:
    """Length at quantile q over the mean, for a length mix with coefficient of variation cv
    (cv = 1 is the exponential quantile -ln(1 - q); cv = 0 is a fixed length)."""
    return max(0.0, 1.0 + cv * (-math.log(1.0 - q) - 1.0))


def predict(
    model: StepTimeModel,
    rate_per_replica: float,
    prompt: float,
    output: float,
    ttft_q: float = 0.9,
    max_batch: int = 256,
    prompt_cv: float = 1.0,
) -> Prediction:
    """Predicted TTFT (at quantile ttft_q) and mean TPOT for one replica serving rate_per_replica req/s."""
    lam = max(rate_per_replica, 0.0)
    prefill_s = model.step_ms(prompt, prompt, 0, 0) / 1000.0
    rho_p = lam * prefill_s
    if rho_p >= 1.0:
        return OVERLOADED
    ctx = prompt + output / 2.0  # mean KV length of a decoding sequence

    def decode_s(b: float) -> float:
        b = max(b, 1.0)
        return model.step_ms(0, 0, b, b * ctx) / 1000.0

    tpot = decode_s(1.0) / (1.0 - rho_p)
    batch = lam * output * tpot
    for _ in range(60):  # the smallest fixed point, approached from below
        tpot_new = decode_s(batch) / (1.0 - rho_p)
        batch_new = lam * output * tpot_new
        if batch_new > max_batch:
            return OVERLOADED
        done = abs(batch_new - batch) <= 1e-4 * max(1.0, batch)
        tpot, batch = tpot_new, batch_new
        if done:
            break
    else:
        return OVERLOADED  # no fixed point: the batch keeps growing
    step = decode_s(batch) if lam > 0 else 0.0
    es2 = prefill_s**2 * (1.0 + prompt_cv**2)
    w0 = lam * es2 / (2.0 * (1.0 - rho_p))
    tail = 1.0 - ttft_q
    wait = 0.0 if rho_p <= tail or w0 <= 0 else (w0 / rho_p) * math.log(rho_p / tail)
    long_prompt = prompt * quantile_factor(ttft_q, prompt_cv)
    ttft = wait + step + model.step_ms(long_prompt, long_prompt, 0, 0) / 1000.0
    return Prediction(ttft, tpot, batch, rho_p)


def meets(p: Prediction, slos: list[SloTarget], margin: float) -> bool:
    for slo in slos:
        value = p.ttft if slo.metric == "ttft" else p.tpot
        if value > slo.seconds * (1.0 - margin):
            return False
    return True


def replicas_needed(
    model: StepTimeModel,
    rate: float,
    prompt: float,
    output: float,
    slos: list[SloTarget],
    margin: float = 0.15,
    lo: int = 1,
    hi: int = 1000,
    max_batch: int = 256,
    prompt_cv: float = 1.0,
) -> int:
    """Smallest n in [lo, hi] meeting every SLO (hi when none does); binary search, latency falls with n."""
    if rate <= 0:
        return lo
    q = max((s.percentile / 100.0 for s in slos if s.metric == "ttft"), default=0.9)
    lo = max(lo, 1)

    def ok(n: int) -> bool:
        return meets(predict(model, rate / n, prompt, output, q, max_batch, prompt_cv), slos, margin)

    if ok(lo):
        return lo
    if not ok(hi):
        return hi
    a, b = lo, hi  # ok(a) false, ok(b) true
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (a, mid) if ok(mid) else (mid, b)
    return b


class SloModelPolicy(Policy):
    """demand_options: DemandOptions' keywords (forecast_window, burst_slope, ...), or demand=..."""

    def __init__(
        self,
        slos: list[SloTarget],
        latency_model: StepTimeModel,
        min_replicas: int = 1,
        max_replicas: int = 100,
        polling_interval: float = 15.0,
        startup_delay: float = 120.0,
        margin: float = 0.15,
        scale_down_delay: float = 180.0,
        max_batch_seqs: int = 256,
        prompt_cv: float = 1.0,
        demand: DemandOptions | None = None,
        backlog: BacklogOptions | None = None,
        prompt_tokens_query: str = "",
        output_tokens_query: str = "",
        **demand_options,
    ):
        if not slos:
            raise ValueError("spec.slo: the sloModel policy needs at least one SLO (ttft or tpot)")
        if latency_model is None:
            raise ValueError("spec.policy.sloModel: needs a latency model (pass latency_model=...)")
        self.slos, self.model = slos, latency_model
        self.min_replicas, self.max_replicas, self.polling_interval = (
            min_replicas,
            max_replicas,
            polling_interval,
        )
        self.startup_delay, self.margin = startup_delay, margin
        self.scale_down_delay, self.max_batch, self.prompt_cv = scale_down_delay, max_batch_seqs, prompt_cv
        if demand is not None and demand_options:
            raise ValueError("give demand=DemandOptions(...) or its keywords, not both")
        self.forecast = Demand(demand or DemandOptions(**demand_options), startup_delay, polling_interval)
        self.recs: list[list[float]] = []  # [time, recommendation]
        self.mix_queries = bool(prompt_tokens_query or output_tokens_query)
        self.backlog = None  # a live batch backlog (autoscaler.batch_backlog), when its query is given
        if backlog is not None and backlog.backlog_query:
            self.backlog = BatchBacklog(backlog, startup_delay, polling_interval,
                                        self.forecast.options.drain_seconds)

    def state_dict(self) -> dict:
        state = self.forecast.state_dict()
        extra = self.backlog.state_dict() if self.backlog is not None else {}
        return {"rates": state.pop("rates"), "recs": self.recs, **state, **extra}

    def load_state_dict(self, state: dict) -> None:
        self.forecast.load_state_dict(state)
        self.recs = [list(x) for x in state.get("recs", [])]
        if self.backlog is not None:
            self.backlog.load_state_dict(state)

    def demand(self, obs: Observation) -> float:
        """The arrival rate to provision for (autoscaler.forecast.Demand.rate)."""
        return self.forecast.rate(obs)

    def decide(self, obs: Observation) -> Decision:
        if self.backlog is not None:  # size the interactive part alone; the batch has its own term
            obs = interactive(obs)
        if self.mix_queries:  # the length mix from the router, in place of the engines'
            obs = with_mix(obs)
        no_mix = obs.mean_prompt_tokens is None or obs.mean_output_tokens is None
        # a fleet that served and is now idle finishes no request, so it has no length mix; it needs
        # none to size for nothing (before any decision the count given at start is kept instead)
        idle = obs.arrival_rate == 0 and not obs.num_waiting and bool(self.recs)
        if obs.arrival_rate is None or (no_mix and not idle):
            return Decision(obs.current_replicas, False, "sloModel: no arrival rate / length mix, no change")
        rate = 0.0 if no_mix else self.demand(obs)

        def sizing(r: float, prompt: float, output: float) -> int:
            return self.min_replicas if r <= 0 else replicas_needed(
                self.model, r, prompt, output, self.slos, self.margin, max(self.min_replicas, 1),
                self.max_replicas, obs.max_batch_seqs or self.max_batch, self.prompt_cv)

        need = sizing(rate, obs.mean_prompt_tokens, obs.mean_output_tokens)
        note = ""
        if self.backlog is not None and not no_mix:
            need, batch, why = self.backlog.size(obs, need, rate, obs.mean_prompt_tokens,
                                                 obs.mean_output_tokens, sizing)
            note = f"; {why}" if why else ""
            rate += batch
        now = obs.time
        self.recs.append([now, need])
        self.recs = [r for r in self.recs if r[0] > now - self.scale_down_delay] or self.recs[-1:]
        desired = int(max(r[1] for r in self.recs))  # scale down only after the delay window
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        return Decision(desired, rate > 0,
                        f"sloModel: provision for {rate:.2f} req/s -> {need} replicas{note}")
