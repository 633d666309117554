"""Two-role model-based sizing for a disaggregated (prefill/decode) service: one policy per pool, each
sized on what its own role needs, from its own pool's signals and a step-time model.

* prefill (role "prefill"): its pool sees prompts only, and the router sends each to the least busy
  replica, so the pool is one M/G/c queue: with S the prefill of a mean prompt and C the Erlang C
  probability of waiting, the wait at the TTFT percentile is ln(C/tail) (1 + cv^2) / 2(n/S - rate)
  (Allen-Cunneen; for n = 1 sloModel's M/G/1 tail); plus the prefill of a
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
  prefilled requests wait where no rate shows it): ready x usage / kvTarget replicas. With
  prefillThreshold (the router's P/D threshold) the prompts at most that long, which the router sends
  whole to a decode replica, are prefilled there: their share and mean length are estimated from the
  mean prompt (an exponential mix), and decode steps stretch by 1 / (1 - rho_p) as in sloModel.
  With arrivalsQuery (the router's arrival counter) the rate now is the counter's rise, as sloModel's
  fast signals: the decode role's whole (every request reaches the decode pool), the prefill role's
  times its share (its pool's 60-s rate over the counter's 60-s rise).

Neither role reads the other pool: each is its own InferenceAutoscaler on its own scale target, with
its own startup delay and forecast (autoscaler.forecast.Demand on its own arrival rate). Scale-up is
immediate; scale-down waits scaleDownDelaySeconds (the highest recommendation of the window wins).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from autoscaler.forecast import Demand, DemandOptions
from autoscaler.observation import Observation
from autoscaler.pd_queue import decode_batch, erlang_c, prefill_miss, prefill_times, prefill_wait
from autoscaler.policy import Decision, Policy
from autoscaler.slo import SloTarget
from autoscaler.slo_model import StepTimeModel

__all__ = ["PdModelPolicy", "erlang_c", "prefill_wait", "decode_batch", "smallest"]

ROLES = ("prefill", "decode")
MEASURED_BATCH = 8  # running sequences (pool-wide) from which their measured context is used


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
        prefill_threshold: float = 0.0,
        scale_down_headroom: float = 0.0,
        burst_confirm: float = 0.0,
        rate_headroom: float = 0.0,
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
        self.threshold, self.down_headroom = prefill_threshold, scale_down_headroom
        self.forecast = Demand(demand or DemandOptions(), startup_delay, polling_interval)
        self.recs: list[list[float]] = []  # [time, recommendation(, start of its burst episode)]
        self.burst_confirm, self.rate_headroom = burst_confirm, rate_headroom
        self.episode: list[float] | None = None  # [first, last firing] of the current burst episode

    def state_dict(self) -> dict:
        state = self.forecast.state_dict()
        extra = {"episode": self.episode} if self.burst_confirm > 0 else {}
        return {"rates": state.pop("rates"), "recs": self.recs, **state, **extra}

    def load_state_dict(self, state: dict) -> None:
        self.forecast.load_state_dict(state)
        self.recs = [list(x) for x in state.get("recs", [])]
        self.episode = state.get("episode")

    def role_rate(self, obs: Observation) -> float:
        """The rate to provision this pool for (autoscaler.forecast.Demand). On the router's arrival
        counter the prefill role takes its pool's share of the arrivals (its own rate over the
        counter's rise in the same window: the requests the router disaggregates), the backlog whole."""
        rate = self.forecast.rate(obs)
        total = obs.metrics.get("arrivals")
        if self.role != "prefill" or total is None or not self.forecast.fast:
            return rate
        counts = [c for c in self.forecast.counts if c[0] <= obs.time - 60.0 + 1e-9]
        if not counts or obs.arrival_rate is None:
            return rate
        t0, c0, _ = counts[-1]
        seen = (total - c0) / (obs.time - t0) if obs.time > t0 else 0.0
        share = min(obs.arrival_rate / seen, 1.0) if seen > 0 else 1.0
        backlog = (obs.num_waiting or 0.0) / self.forecast.options.drain_seconds
        return max(rate - backlog, 0.0) * share + backlog

    def _slo(self, metric: str) -> SloTarget | None:
        return next((s for s in self.slos if s.metric == metric), None)

    def prefill_need(self, rate: float, prompt: float, lo: int, hi: int) -> int:
        slo = self._slo("ttft")
        budget = slo.seconds * (1.0 - self.margin) - self.decode_ttft
        q = slo.percentile / 100.0
        times = prefill_times(self.model, prompt, self.prompt_cv)
        if sum(t > budget for t in times) / len(times) < 1.0 - q:
            return smallest(lambda n: prefill_miss(times, rate, n, budget) <= 1.0 - q, lo, hi)
        # the long prompts' own prefills miss the budget whatever the count: keep the queue to a tenth
        # of the SLO rather than order every replica allowed
        return smallest(lambda n: prefill_wait(self.model, rate, n, prompt, q, self.prompt_cv)
                        <= 0.1 * slo.seconds, lo, hi)

    def decode_need(self, rate: float, prompt: float, output: float, lo: int, hi: int, max_batch: int,
                    ctx: float | None = None) -> int:
        slo = self._slo("tpot")
        ctx = ctx or prompt + output / 2.0
        z = NormalDist().inv_cdf(slo.percentile / 100.0)

        def ok(n: int) -> bool:
            got = decode_batch(self.model, rate / n, prompt, output, max_batch, self.threshold, z, n, ctx)
            if got is None:
                return False
            tpot, batch = got
            if self.kv_tokens > 0 and batch * ctx > self.kv_target * self.kv_tokens:
                return False
            return tpot <= slo.seconds * (1.0 - self.margin)

        return smallest(ok, lo, hi)

    def running_context(self, obs: Observation) -> float | None:
        """KV tokens per running sequence, measured (KV usage x capacity over the running count), when
        kvTokensPerReplica is given and the batch is large enough to say. A running sequence's context
        is weighted by how long it stays (its output length), which the mean prompt and output cannot
        show when long prompts come with short answers and short prompts with long ones."""
        if self.kv_tokens <= 0 or obs.kv_usage is None or not obs.num_running or obs.ready <= 0:
            return None
        if obs.num_running < MEASURED_BATCH:
            return None
        return obs.kv_usage * obs.ready * self.kv_tokens / obs.num_running

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

    def burst_episode(self, now: float) -> float | None:
        """burstConfirmSeconds: the start of the burst test's current episode while it fires (None when
        it does not). An episode is confirmed when the test still fires burstConfirmSeconds after its
        first firing (a noisy fast-window rate passes the test for at most one window's polls); one
        that is not has its recommendations taken out of the scale-down window once that time has passed,
        so the replicas it ordered are cancelled while still starting: a sensitive burst test then
        costs seconds of starting replicas per false alarm, not a scale-down window of them. A confirmed
        episode ends after burstConfirmSeconds without a firing."""
        c, firing = self.burst_confirm, self.forecast.bursting
        if c <= 0:
            return None
        if self.episode:
            start, last = self.episode
            confirmed = last - start >= c
            # an episode ends c s after its last firing; an unconfirmed one as soon as c s have passed since
            # its start without it firing now
            if now - last >= c or (not confirmed and not firing and now - start >= c):
                if not confirmed:  # a noisy poll's orders, withdrawn
                    self.recs = [r for r in self.recs if len(r) < 3 or r[2] != start]
                self.episode = None
        if firing:
            self.episode = [self.episode[0] if self.episode else now, now]
            return self.episode[0]
        return None

    def decide(self, obs: Observation) -> Decision:
        name = f"pdModel/{self.role}"
        prompt, output = obs.mean_prompt_tokens, obs.mean_output_tokens
        no_mix = prompt is None or (self.role == "decode" and output is None)
        idle = obs.arrival_rate == 0 and not obs.num_waiting and bool(self.recs)
        if obs.arrival_rate is None or (no_mix and not idle):
            return Decision(obs.current_replicas, False, f"{name}: no arrival rate / length mix, no change")
        # rateHeadroom: standing capacity for (1 + h) x the rate, held at every count (a burst's first
        # minutes meet it before any order is ready)
        rate = 0.0 if no_mix else self.role_rate(obs) * (1.0 + self.rate_headroom)
        lo, hi = max(self.min_replicas, 1), self.max_replicas
        max_batch = obs.max_batch_seqs or self.max_batch

        def need_at(r: float) -> int:
            if r <= 0:
                return self.min_replicas
            if self.role == "prefill":
                return self.prefill_need(r, prompt, lo, hi)
            return self.decode_need(r, prompt, output, lo, hi, max_batch, self.running_context(obs))

        need = need_at(rate)
        if self.down_headroom > 0 and need < obs.current_replicas:
            # hysteresis: shrink only to a count that would still hold (1 + h) x the rate
            need = max(need, min(obs.current_replicas, need_at(rate * (1.0 + self.down_headroom))))
        floor = self.floors(obs, max_batch)
        need = max(need, min(floor, hi))
        now = obs.time
        episode = self.burst_episode(now)
        self.recs.append([now, need] if episode is None else [now, need, episode])
        self.recs = [r for r in self.recs if r[0] > now - self.scale_down_delay] or self.recs[-1:]
        desired = min(max(int(max(r[1] for r in self.recs)), self.min_replicas), self.max_replicas)
        tokens = rate * (prompt or 0.0)
        what = f"{tokens:.0f} prompt tok/s" if self.role == "prefill" else f"{rate:.2f} req/s"
        extra = f", KV/running floor {floor}" if floor else ""
        return Decision(desired, rate > 0, f"{name}: provision for {what} -> {need} replicas{extra}")
