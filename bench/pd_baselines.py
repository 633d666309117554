"""A baseline policy type for the P/D day (bench/pd_day.py), registered when imported: a throughput
planner in the style of Dynamo's. Each adjustment interval it predicts the next interval's request
rate and lengths as the last interval's (a constant predictor) and sizes each pool from its profile:

* prefill: prompt tokens per second over the throughput of one replica running one mean prompt at a
  time (the profiled prefill throughput whose isolated TTFT meets the target): no queueing term, which
  is what dynamo#10528 reports undersizing under bursts;
* decode: output tokens per second over one replica's decode throughput at the largest batch whose
  step (at the mean context) meets the TPOT target.

No scale-down delay: the count follows the prediction each interval, clamped to min/max.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.observation import Observation
from autoscaler.policy import Decision, Policy
from autoscaler.registry import PolicyType, option, register


@dataclass(frozen=True)
class ThroughputOptions:
    role: str = option("role", "decode", {"enum": ["prefill", "decode"]}, "which pool this sizes")


class ThroughputPlanner(Policy):
    def __init__(self, role, slos, model, min_replicas, max_replicas, polling_interval):
        self.role, self.model = role, model
        self.ttft = next((s.seconds for s in slos if s.metric == "ttft"), math.inf)
        self.tpot = next((s.seconds for s in slos if s.metric == "tpot"), math.inf)
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.polling_interval = polling_interval

    def decode_throughput(self, ctx: float) -> float:
        """Output tokens/s of one replica at the largest batch whose step meets the TPOT target."""
        best, b = 0.0, 1
        while b <= 512:
            step = self.model.step_ms(0, 0, b, b * ctx) / 1000.0
            if step > self.tpot:
                break
            best, b = b / step, b * 2 if b < 8 else b + 8
        return max(best, 1.0 / (self.model.step_ms(0, 0, 1, ctx) / 1000.0))

    def decide(self, obs: Observation) -> Decision:
        if obs.arrival_rate is None or obs.mean_prompt_tokens is None or obs.mean_output_tokens is None:
            return Decision(obs.current_replicas, False, f"throughput/{self.role}: no rate or lengths")
        rate, isl, osl = obs.arrival_rate, obs.mean_prompt_tokens, obs.mean_output_tokens
        if self.role == "prefill":
            per = isl / (self.model.step_ms(isl, isl, 0, 0) / 1000.0)
            need = math.ceil(rate * isl / per - 1e-9)
        else:
            per = self.decode_throughput(isl + osl / 2.0)
            need = math.ceil(rate * osl / per - 1e-9)
        desired = min(max(need, self.min_replicas), self.max_replicas)
        return Decision(desired, rate > 0, f"throughput/{self.role}: {rate:.2f} req/s -> {need}")


def build(spec, options: ThroughputOptions, latency_model) -> ThroughputPlanner:
    return ThroughputPlanner(options.role, spec.slos, latency_model, spec.min_replicas, spec.max_replicas,
                             spec.polling_interval)


THROUGHPUT = register(PolicyType(
    "throughputPlanner", build, reads=("arrival_rate", "mean_tokens"), options=ThroughputOptions,
    needs_latency_model=True, needs_slo=True, meaning="bench baseline: a Dynamo-style throughput planner"))
