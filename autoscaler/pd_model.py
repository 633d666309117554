"""Two-role model-based sizing for a disaggregated (prefill/decode) service: one policy per pool, each
sized on what its own role needs, from its own pool's signals and a step-time model.

* prefill (role "prefill"): its pool sees prompts only. Each replica is an M/G/1 prefill server: with
  the per-replica rate lam and S the prefill of a mean prompt, rho = lam S, the wait at the TTFT
  percentile is W0/rho ln(rho/tail) (W0 = lam E[S^2] / 2(1 - rho)); plus the prefill of a
  percentile-long prompt and `decodeTtftSeconds` (the transfer, the decode admission and the first
  decode step, which the prefill pool cannot shorten) must stay within the TTFT SLO less the margin.
  A queue backlog is drained within drainSeconds (the forecast adds it to the rate). When a
  percentile-long prompt's prefill alone exceeds that budget (no count shortens it), the queue wait is
  held to a tenth of the SLO instead.
* decode (role "decode"): its pool holds the running sequences. By Little's law a replica runs
  B = lam O tpot sequences; tpot = d(B), one decode step of B sequences of context P + O/2 (no prefill
  chunks interfere: that is what disaggregation buys); B must fit maxBatchSeqs and, when
  kvTokensPerReplica is given, B (P + O/2) must fit kvTarget of its KV; tpot must meet the TPOT SLO
  less the margin. The observed KV usage and running count are floors (a full decode pool makes
  prefilled requests wait where no rate shows it): ready x usage / kvTarget replicas.

Neither role reads the other pool: each is its own InferenceAutoscaler on its own scale target, with
its own startup delay and forecast (autoscaler.forecast.Demand on its own arrival rate). Scale-up is
immediate; scale-down waits scaleDownDelaySeconds (the highest recommendation of the window wins).
"""

from __future__ import annotations

import math

from autoscaler.forecast import Demand, DemandOptions
from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.slo import SloTarget
from autoscaler.slo_model import StepTimeModel, quantile_factor

ROLES = ("prefill", "decode")


def prefill_wait(model: StepTimeModel, lam: float, prompt: float, q: float, prompt_cv: float) -> float:
    """Queue wait at quantile q in one prefill replica serving lam prompts/s (inf when saturated)."""
    s = model.step_ms(prompt, prompt, 0, 0) / 1000.0
    rho = lam * s
    if rho >= 1.0:
        return math.inf
    w0 = lam * s * s * (1.0 + prompt_cv**2) / (2.0 * (1.0 - rho))
    tail = 1.0 - q
    return 0.0 if rho <= tail or w0 <= 0 else (w0 / rho) * math.log(rho / tail)


def decode_batch(model: StepTimeModel, lam: float, prompt: float, output: float, max_batch: int):
    """(tpot seconds, running sequences) of one decode replica at lam requests/s; None when the batch
    has no fixed point within max_batch (overloaded)."""
    ctx = prompt + output / 2.0

    def step(b: float) -> float:
        b = max(b, 1.0)
        return model.step_ms(0, 0, b, b * ctx) / 1000.0

    tpot = step(1.0)
    batch = lam * output * tpot
    for _ in range(60):
        tpot_new = step(batch)
        batch_new = lam * output * tpot_new
        if batch_new > max_batch:
            return None
        done = abs(batch_new - batch) <= 1e-4 * max(1.0, batch)
        tpot, batch = tpot_new, batch_new
        if done:
            return tpot, batch
    return None


def smallest(ok, lo: int, hi: int) -> int:
    """Smallest n in [lo, hi] with ok(n) (hi when none); ok is monotone in n."""
    if ok(lo):
        return lo
    if not ok(hi):
        return hi
    a, b = lo, hi
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (a, mid) if ok(mid) else (mid, b)
    return b


class PdModelPolicy(Policy):
    def __init__(
        self,
        role: str,
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
        decode_ttft: float = 0.25,
        kv_tokens: float = 0.0,
        kv_target: float = 0.8,
        demand: DemandOptions | None = None,
    ):
        if role not in ROLES:
            raise ValueError(f"spec.policy.pdModel.role: must be prefill or decode, not {role!r}")
        if latency_model is None:
            raise ValueError("spec.policy.pdModel: needs a latency model (pass latency_model=...)")
        metric = "ttft" if role == "prefill" else "tpot"
        if not any(s.metric == metric for s in slos):
            raise ValueError(f"spec.slo: the pdModel policy's {role} role needs a {metric} SLO")
        self.role, self.slos, self.model = role, slos, latency_model
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.polling_interval, self.margin = polling_interval, margin
        self.scale_down_delay, self.max_batch, self.prompt_cv = scale_down_delay, max_batch_seqs, prompt_cv
        self.decode_ttft, self.kv_tokens, self.kv_target = decode_ttft, kv_tokens, kv_target
        self.forecast = Demand(demand or DemandOptions(), startup_delay, polling_interval)
        self.recs: list[list[float]] = []  # [time, recommendation]

    def state_dict(self) -> dict:
        state = self.forecast.state_dict()
        return {"rates": state.pop("rates"), "recs": self.recs, **state}

    def load_state_dict(self, state: dict) -> None:
        self.forecast.load_state_dict(state)
        self.recs = [list(x) for x in state.get("recs", [])]

    def _slo(self, metric: str) -> SloTarget | None:
        return next((s for s in self.slos if s.metric == metric), None)

    def prefill_need(self, rate: float, prompt: float, lo: int, hi: int) -> int:
        slo = self._slo("ttft")
        budget = slo.seconds * (1.0 - self.margin) - self.decode_ttft
        q = slo.percentile / 100.0
        long_prompt = prompt * quantile_factor(q, self.prompt_cv)
        # a percentile-long prompt's own prefill no replica count shortens: when it alone takes the
        # budget, keep the queue to a tenth of the SLO rather than order every replica allowed
        wait = max(budget - self.model.step_ms(long_prompt, long_prompt, 0, 0) / 1000.0,
                   0.1 * slo.seconds)
        return smallest(lambda n: prefill_wait(self.model, rate / n, prompt, q, self.prompt_cv) <= wait,
                        lo, hi)

    def decode_need(self, rate: float, prompt: float, output: float, lo: int, hi: int, max_batch: int) -> int:
        slo = self._slo("tpot")
        ctx = prompt + output / 2.0

        def ok(n: int) -> bool:
            got = decode_batch(self.model, rate / n, prompt, output, max_batch)
            if got is None:
                return False
            tpot, batch = got
            if self.kv_tokens > 0 and batch * ctx > self.kv_target * self.kv_tokens:
                return False
            return tpot <= slo.seconds * (1.0 - self.margin)

        return smallest(ok, lo, hi)

    def floors(self, obs: Observation, max_batch: int) -> int:
        """Replicas the decode pool's observed KV usage and running batch need now."""
        if self.role != "decode":
            return 0
        need = 0
        if obs.kv_usage is not None and obs.ready > 0:
            need = math.ceil(obs.ready * obs.kv_usage / self.kv_target - 1e-9)
        if obs.num_running:
            need = max(need, math.ceil(obs.num_running / (self.kv_target * max_batch) - 1e-9))
        return need

    def decide(self, obs: Observation) -> Decision:
        name = f"pdModel/{self.role}"
        prompt, output = obs.mean_prompt_tokens, obs.mean_output_tokens
        no_mix = prompt is None or (self.role == "decode" and output is None)
        idle = obs.arrival_rate == 0 and not obs.num_waiting and bool(self.recs)
        if obs.arrival_rate is None or (no_mix and not idle):
            return Decision(obs.current_replicas, False, f"{name}: no arrival rate / length mix, no change")
        rate = 0.0 if no_mix else self.forecast.rate(obs)
        lo, hi = max(self.min_replicas, 1), self.max_replicas
        max_batch = obs.max_batch_seqs or self.max_batch
        if rate <= 0:
            need = self.min_replicas
        elif self.role == "prefill":
            need = self.prefill_need(rate, prompt, lo, hi)
        else:
            need = self.decode_need(rate, prompt, output, lo, hi, max_batch)
        floor = self.floors(obs, max_batch)
        need = max(need, min(floor, hi))
        now = obs.time
        self.recs.append([now, need])
        self.recs = [r for r in self.recs if r[0] > now - self.scale_down_delay] or self.recs[-1:]
        desired = min(max(int(max(r[1] for r in self.recs)), self.min_replicas), self.max_replicas)
        tokens = rate * (prompt or 0.0)
        what = f"{tokens:.0f} prompt tok/s" if self.role == "prefill" else f"{rate:.2f} req/s"
        extra = f", KV/running floor {floor}" if floor else ""
        return Decision(desired, rate > 0, f"{name}: provision for {what} -> {need} replicas{extra}")
