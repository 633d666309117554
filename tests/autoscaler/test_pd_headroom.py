"""pdModel's rateHeadroom: standing capacity for (1 + h) x the rate at every count (not only on the way
down, as scaleDownHeadroom)."""

from __future__ import annotations

import pytest

from autoscaler import load_spec, make_policy
from autoscaler.observation import Observation
from autoscaler.pd_model import PdModelPolicy
from autoscaler.slo import SloTarget
from simulator.latency import load_latency_model

MODEL = "h100-llama2-70b-tp4"
SLOS = [SloTarget("ttft", 90, 3.0), SloTarget("tpot", 90, 0.1)]


def spec(extra: str = "") -> str:
    return f"""
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {{name: decode}}
spec:
  scaleTargetRef: {{name: decode}}
  minReplicas: 1
  maxReplicas: 40
  slo:
    tpot: {{percentile: 90, seconds: 0.1}}
  policy:
    type: pdModel
    pdModel: {{role: decode{extra}}}
"""


def steady(policy: PdModelPolicy, rate: float, prompt: float = 2000, output: float = 400) -> int:
    d = None
    for k in range(10):
        d = policy.decide(Observation(15.0 * k, d.desired_replicas if d else 1, arrival_rate=rate,
                                      mean_prompt_tokens=prompt, mean_output_tokens=output,
                                      num_waiting=0))
    return d.desired_replicas


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_pool_is_sized_for_the_rate_raised_by_its_headroom(role):
    m = load_latency_model(MODEL)
    plain = PdModelPolicy(role, SLOS, m, max_replicas=40)
    counts = [steady(PdModelPolicy(role, SLOS, m, max_replicas=40, rate_headroom=0.25), r)
              for r in (2.0, 6.0, 12.0)]
    # the same count the plain policy gives 1.25x the rate, and more than it gives the rate itself
    assert counts == [steady(PdModelPolicy(role, SLOS, m, max_replicas=40), 1.25 * r)
                      for r in (2.0, 6.0, 12.0)]
    assert counts[-1] > steady(plain, 12.0)


def test_the_option_defaults_to_none_and_is_checked():
    m = load_latency_model(MODEL)
    assert make_policy(load_spec(spec()), m).rate_headroom == 0.0
    assert make_policy(load_spec(spec(", rateHeadroom: 0.2")), m).rate_headroom == 0.2
    with pytest.raises(ValueError, match="rateHeadroom"):
        load_spec(spec(", rateHeadroom: -0.1"), "d.yaml")
