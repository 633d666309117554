"""The model-based policy's opt-in inputs: the router's fast signals (its arrival counter and gateway
queue) and a deferrable batch band; in the simulator, the router's counters at their own scrape."""

import numpy as np
import pytest
import yaml

from autoscaler import load_spec, make_policy
from autoscaler.observation import Observation
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy
from simulator.run import simulate
from simulator.scenario import load_scenario
from simulator.scrape import ROUTER_SCRAPE_INTERVAL

SLOS = [SloTarget("ttft", 2.0, 90), SloTarget("tpot", 0.1, 90)]


class Step:
    def step_ms(self, prefill_tokens, prefill_context, decode_seqs, decode_context):
        return 10.0 + 0.05 * prefill_tokens + 0.2 * decode_seqs + 1e-4 * decode_context


def obs(t, rate60, count=None, queue=None, batch=None, batch_queue=None, waiting=0.0):
    metrics = {k: v for k, v in (("arrivals", count), ("queue", queue), ("batch_arrivals", batch),
                                 ("batch_queue", batch_queue)) if v is not None}
    return Observation(time=t, current_replicas=3, arrival_rate=rate60, mean_prompt_tokens=1000,
                       mean_output_tokens=200, num_waiting=waiting, metrics=metrics)


def fast(**kw) -> SloModelPolicy:
    return SloModelPolicy(SLOS, Step(), polling_interval=5, arrivals_query="sum(x)", queue_query="sum(q)",
                          **kw)


def test_rate_now_is_the_counters_rise_over_the_fast_window():
    p = fast(fast_window=15)
    count = 0.0
    for t in range(0, 300, 5):
        count += 8.0 * 5
        p.demand(obs(t, 8.0, count))
    assert p.forecast.rates[-1][1] == pytest.approx(8.0)
    # the rate doubles: seen within one fast window, while the 60-s rate still says 8
    for t in range(300, 320, 5):
        count += 16.0 * 5
        p.demand(obs(t, 8.0, count))
    assert p.forecast.rates[-1][1] == pytest.approx(16.0)


def test_a_burst_is_ordered_on_the_fast_counter_before_the_60s_rate_moves():
    slow = SloModelPolicy(SLOS, Step(), polling_interval=5, burst_slope="last")
    quick = fast(burst_slope="last")
    rng = np.random.default_rng(1)
    count = 0.0
    for t in range(0, 600, 5):  # a steady, noisy 8 req/s
        arrivals = float(rng.poisson(8.0 * 5))
        count += arrivals
        for p in (slow, quick):
            p.decide(obs(t, 8.0, count))
    base = quick.decide(obs(600, 8.0, count)).desired_replicas
    for t in range(605, 640, 5):  # the load ramps up to 3x in a minute; the 60-s rate has not moved yet
        count += 8.0 * (1 + 2 * min((t - 600) / 60, 1)) * 5
        d_quick, d_slow = quick.decide(obs(t, 8.0, count)), slow.decide(obs(t, 8.0, count))
    assert d_quick.desired_replicas > base
    assert d_slow.desired_replicas == base


def test_without_the_counter_the_60s_path_decides():
    plain = SloModelPolicy(SLOS, Step(), polling_interval=5)
    p = fast()
    for t in range(0, 300, 5):
        rate = 4.0 + 0.02 * t
        assert p.decide(obs(t, rate)) == plain.decide(obs(t, rate))


def test_the_gateway_queue_joins_the_backlog():
    p = fast(drain_seconds=60)
    p.demand(obs(0, 2.0, 0.0))
    assert p.demand(obs(15, 2.0, 30.0, queue=60.0, waiting=60.0)) == pytest.approx(2.0 + 120 / 60)


def test_batch_is_sized_at_its_mean_rate_and_its_queue_within_half_the_deadline():
    p = fast(batch_arrivals_query="sum(b)", batch_queue_query="sum(bq)", batch_deadline=3600,
             drain_seconds=60)
    total = batch = 0.0
    for t in range(0, 300, 5):
        total, batch = total + 10 * 5, batch + 3 * 5
        d = p.demand(obs(t, 10.0, total, queue=0.0, batch=batch, batch_queue=0.0))
    assert d == pytest.approx(10.0)  # interactive 7 + batch 3
    # a burst of batch alone: its mean over the window barely moves; its queue is given half an hour
    for t in range(300, 330, 5):
        total, batch = total + 40 * 5, batch + 33 * 5
        d = p.demand(obs(t, 10.0, total, queue=900.0, batch=batch, batch_queue=900.0))
    assert p.forecast.rates[-1][1] == pytest.approx(7.0)
    mean_batch = (batch - p.forecast.counts[0][2]) / (325 - p.forecast.counts[0][0])
    assert d == pytest.approx(7.0 + mean_batch + 900 / 1800, rel=1e-6)


def test_spec_signals_are_triggers_the_live_controller_reads():
    ia = yaml.safe_load("""
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {name: fast}
spec:
  scaleTargetRef: {name: llama}
  maxReplicas: 10
  pollingInterval: 5
  slo: {ttft: {percentile: 90, seconds: 2}}
  policy:
    type: sloModel
    sloModel:
      arrivalsQuery: sum(llm_d_epp_request_total)
      queueQuery: sum(llm_d_epp_flow_control_queue_size)
      seasonPeriodSeconds: 86400
""")
    spec = load_spec(ia)
    assert [(t.name, t.query) for t in spec.triggers] == [
        ("arrivals", "sum(llm_d_epp_request_total)"), ("queue", "sum(llm_d_epp_flow_control_queue_size)")]
    p = make_policy(spec, latency_model=Step())
    assert p.forecast.fast and p.forecast.profile is not None and p.forecast.profile.period == 86400
    del ia["spec"]["policy"]["sloModel"]
    assert load_spec(ia).triggers == []  # off by default


def test_simulated_router_exports_its_counters_at_its_own_interval(tmp_path):
    ia = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": "f"},
          "spec": {"scaleTargetRef": {"name": "p"}, "maxReplicas": 4, "pollingInterval": 5,
                   "slo": {"ttft": {"percentile": 90, "seconds": 2}},
                   "policy": {"type": "sloModel", "sloModel": {
                       "arrivalsQuery": "sum(llm_d_epp_request_total)",
                       "queueQuery": "sum(llm_d_epp_flow_control_queue_size)"}}}}
    sc = {"name": "fast", "seed": 1, "duration": 60,
          "workload": {"arrivals": {"rate": 6}, "prompt_tokens": 256, "output_tokens": 32},
          "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4", "replicas": 1,
                     "autoscaler": {"spec": ia}}],
          "router": {"policy": "least_outstanding", "flow_control": {"bands": [
              {"priority": 10, "name": "interactive", "share": 0.7},
              {"priority": 0, "name": "batch", "share": 0.3}]}},
          "drain": {"enabled": False}}
    fleet = simulate(load_scenario(sc), tmp_path, plots=False).fleet
    target = fleet.store.targets.targets["router"]
    assert np.diff(target.ts).min() == ROUTER_SCRAPE_INTERVAL * 1000
    names = {(dict(c.labels)["__name__"], dict(c.labels)["priority"]) for c in target.columns}
    assert names == {("llm_d_epp_request_total", "10"), ("llm_d_epp_request_total", "0"),
                     ("llm_d_epp_flow_control_queue_size", "interactive"),
                     ("llm_d_epp_flow_control_queue_size", "batch")}
    last = target.rows[-1]
    assert last[0] + last[1] == pytest.approx(np.count_nonzero(fleet.gate.band[: fleet.arrived] >= 0), abs=20)
    assert last[0] == pytest.approx(np.count_nonzero(fleet.gate.band == 10), abs=15)
    # the policy read the counter: its rate samples are the counter's, not the 60-s rate's
    policy = fleet.pools[0].policy.policy
    assert policy.forecast.counts and policy.forecast.rates[-1][1] == pytest.approx(6.0 * 0.7, rel=0.5)


def test_onset_ramp_is_the_samples_since_the_rate_left_the_trend():
    from autoscaler.forecast import onset_ramp

    flat = [[float(t), 8.0] for t in range(0, 300, 5)]
    ramp = [[float(t), 8.0 + 0.2 * (t - 295)] for t in range(300, 340, 5)]
    rates = flat + ramp
    got = onset_ramp(rates, flat)
    assert got[0] == flat[-1] and got[1:] == ramp  # from the last sample at or below the trend
    noisy = [[float(t), 8.0 + (0.5 if t % 10 else -0.5)] for t in range(0, 300, 5)]
    assert len(onset_ramp(noisy, noisy[:-1])) <= 2  # no burst: at most the last sample is above it


def test_onset_slope_sizes_a_noisy_burst_nearer_its_ramp_than_the_last_interval():
    """The same noisy ramps, read by burstSlope last and onset: the onset line's first orders scatter
    less around what the ramp itself extrapolates to, and never exceed last's by much on average."""
    errors = {"last": [], "onset": []}
    for seed in range(12):
        rng = np.random.default_rng(seed)
        pols = {k: fast(burst_slope=k) for k in errors}
        count = 0.0
        orders = {k: None for k in errors}
        for t in range(0, 700, 5):
            true = 8.0 if t < 600 else 8.0 * (1 + 2 * min((t - 600) / 120, 1))
            count += float(rng.poisson(true * 5))
            for k, p in pols.items():
                d = p.demand(obs(t, 8.0, count))
                if orders[k] is None and t >= 600 and d > 1.3 * 8.0:
                    orders[k] = (t, d)
        for k, (t, d) in ((k, v) for k, v in orders.items() if v is not None):
            # the ramp's own rate a startup delay and a poll ahead (24 at most: the plateau)
            truth = 8.0 * (1 + 2 * min((t + 125 - 600) / 120, 1))
            errors[k].append(d - truth)
    assert len(errors["onset"]) >= 10 and len(errors["last"]) >= 10
    assert np.std(errors["onset"]) < np.std(errors["last"])



def test_noise_floor_keeps_a_low_rates_burst_test_at_its_counting_noise():
    """At 1.5 req/s a 15-s rate varies by about sqrt(1.5 / 15) = 0.32 req/s; a calm stretch of
    residuals can say less, and a 4-spread test then calls a noise excursion a burst. With
    burstNoiseFloor the same samples order no burst, and a real 3x ramp is still ordered for."""
    def run(floor: bool, ramp: bool) -> list[int]:
        p = fast(burst_slope="onset", burst_noise_floor=floor)
        count, out = 0.0, []
        for t in range(0, 420, 5):
            rate = 1.5
            if t >= 300:  # a blip of 1.0 req/s over one fast window, or a ramp to 3x in 60 s
                rate = 1.5 * (1 + 2 * min((t - 295) / 60, 1)) if ramp else (2.5 if t < 315 else 1.5)
            count += rate * 5  # exact counts: the trend's residual spread is near zero
            out.append(p.decide(obs(t, 1.5, count)).desired_replicas)
        return out

    base = run(True, False)[55]
    assert max(run(False, False)) > base  # without the floor the blip is called a burst
    assert max(run(True, False)) == base
    assert max(run(True, True)) > base  # a real burst still is
