"""The two-role P/D autoscaler (pdModel): each role sized on its own needs, both pools scaling in the
simulator under a ramp, and its decision log replayed by `slopilot replay` to the same decisions."""

from __future__ import annotations

import csv
import io
import math

import pytest

from autoscaler import load_spec, make_policy
from autoscaler.observation import Observation
from autoscaler.pd_model import PdModelPolicy, erlang_c, prefill_wait
from autoscaler.slo import SloTarget
from controlplane.controller import AutoscalerLoop
from controlplane.decision_log import DecisionLog
from controlplane.targets import MemoryTarget
from simulator.fleet import Fleet
from simulator.latency import load_latency_model
from simulator.run import build_workload
from simulator.scenario import load_scenario
from slopilot.cli import main

MODEL = "h100-llama2-70b-tp4"
SLOS = [SloTarget("ttft", 90, 3.0), SloTarget("tpot", 90, 0.1)]


def spec_text(role: str, name: str | None = None, **opts) -> str:
    extra = "".join(f", {k}: {v}" for k, v in opts.items())
    return f"""
apiVersion: slopilot.dev/v1alpha1
kind: InferenceAutoscaler
metadata: {{name: {name or role}}}
spec:
  scaleTargetRef: {{name: {name or role}}}
  minReplicas: 1
  maxReplicas: 12
  pollingInterval: 15
  startupDelaySeconds: 60
  slo:
    ttft: {{percentile: 90, seconds: 3.0}}
    tpot: {{percentile: 90, seconds: 0.1}}
  policy:
    type: pdModel
    pdModel: {{role: {role}, scaleDownDelaySeconds: 120{extra}}}
"""


def steady(policy: PdModelPolicy, rate: float, prompt: float, output: float, **fields) -> int:
    """The count after ten polls of a steady load."""
    d = None
    for k in range(10):
        obs = Observation(15.0 * k, 1, arrival_rate=rate, mean_prompt_tokens=prompt,
                          mean_output_tokens=output, num_waiting=0, **fields)
        d = policy.decide(obs)
    return d.desired_replicas


def test_each_role_is_sized_on_its_own_work():
    m = load_latency_model(MODEL)

    def pol(role, **kw):
        return PdModelPolicy(role, SLOS, m, max_replicas=50, **kw)

    # prefill follows the prompt tokens per second, not the output length
    p1 = steady(pol("prefill"), 2.0, 4000, 300)
    assert p1 >= 2
    assert steady(pol("prefill"), 4.0, 4000, 300) > p1
    assert steady(pol("prefill"), 2.0, 8000, 300) > p1
    assert steady(pol("prefill"), 2.0, 4000, 3000) == p1
    # decode follows running sequences (rate x output x TPOT) and their context, not prefill work
    d1 = steady(pol("decode"), 4.0, 2000, 500)
    assert d1 >= 2
    assert steady(pol("decode"), 4.0, 2000, 1500) > d1
    assert steady(pol("decode"), 8.0, 2000, 500) > d1
    # a KV budget per replica: long contexts need more decode replicas than the TPOT alone
    assert steady(pol("decode", kv_tokens=50_000), 4.0, 8000, 500) > steady(pol("decode"), 4.0, 8000, 500)
    # short prompts the router sends whole to the decode pool are prefilled there: more decode replicas
    # for a chatty mix (800-token prompts, half of them under a 1024-token threshold), fewer without it
    chat = steady(pol("decode"), 12.0, 800, 450)
    assert steady(pol("decode", prefill_threshold=1024), 12.0, 800, 450) > chat
    assert steady(pol("decode", prefill_threshold=1024), 6.0, 20000, 450) == steady(pol("decode"), 6.0, 20000,
                                                                                     450)
    # the observed KV usage is a floor: 3 ready replicas at 95% with a 0.8 target -> 4
    assert steady(pol("decode"), 0.1, 2000, 100, ready_replicas=3, kv_usage=0.95) == 4
    # a TTFT-only or TPOT-only spec is refused for the role that needs the other
    with pytest.raises(ValueError, match="decode role needs a tpot SLO"):
        PdModelPolicy("decode", SLOS[:1], m)
    with pytest.raises(ValueError, match="prefill or decode"):
        PdModelPolicy("both", SLOS, m)


def test_the_prefill_pool_is_one_queue():
    m = load_latency_model(MODEL)
    s = m.step_ms(4000, 4000, 0, 0) / 1000.0
    lam, cv, q = 1.5, 0.8, 0.9
    rho = lam * s  # one replica: sloModel's M/G/1 tail, W0 / rho ln(rho / tail)
    w0 = lam * s * s * (1 + cv**2) / (2 * (1 - rho))
    assert prefill_wait(m, lam, 1, 4000, q, cv) == pytest.approx(w0 / rho * math.log(rho / (1 - q)))
    # four replicas sharing one queue wait less than one replica at a quarter of the rate
    assert prefill_wait(m, 4 * lam, 4, 4000, q, cv) < prefill_wait(m, lam, 1, 4000, q, cv)
    assert prefill_wait(m, 10.0, 4, 4000, q, cv) == math.inf  # 4.3 erlangs on 4 replicas
    assert erlang_c(1, 0.5) == pytest.approx(0.5) and erlang_c(2, 1.0) == pytest.approx(1 / 3)


def test_a_prompt_too_long_for_the_slo_does_not_order_every_replica():
    m = load_latency_model(MODEL)
    pol = PdModelPolicy("prefill", SLOS, m, max_replicas=50)
    # a 16k-token mean prompt: its 90th percentile alone takes longer than the 3-s SLO
    assert steady(pol, 0.2, 16000, 100) < 10


def test_the_spec_loads_and_a_bad_role_names_the_field():
    spec = load_spec(spec_text("prefill"), "p.yaml")
    assert spec.policy_type == "pdModel" and spec.config.role == "prefill" and spec.triggers == []
    fast = load_spec(spec_text("decode", arrivalsQuery='"sum(llm_d_epp_request_total)"'))
    assert [(t.name, t.query) for t in fast.triggers] == [("arrivals", "sum(llm_d_epp_request_total)")]
    assert isinstance(make_policy(spec, load_latency_model(MODEL)), PdModelPolicy)
    with pytest.raises(ValueError, match=r"spec\.policy\.pdModel\.role"):
        load_spec(spec_text("middle"), "p.yaml")
    # the burst test's baseline: window (the default, written once in DemandOptions) or beforeTrend
    default = make_policy(spec, load_latency_model(MODEL))
    assert default.forecast.options.burst_baseline == "window"
    before = load_spec(spec_text("decode", burstBaseline="beforeTrend"))
    assert make_policy(before, load_latency_model(MODEL)).forecast.options.burst_baseline == "beforeTrend"
    with pytest.raises(ValueError, match=r"burstBaseline"):
        load_spec(spec_text("decode", burstBaseline="older"), "p.yaml")


def pool(name: str, role: str) -> dict:
    return {"name": name, "latency_model": MODEL, "replicas": 1, "max_num_seqs": 256,
            "max_num_batched_tokens": 8192, "max_model_len": 32768, "prefix_caching": False,
            "provisioning_delay": 60, "cost_per_hour": 39.2, "labels": {"engine": role},
            "kv_memory": {"gpu_memory_gib": 74.5, "num_gpus": 4, "utilization": 0.9, "weights_gib": 130.4,
                          "kv_bytes_per_token": 327680},
            "autoscaler": {"spec": load_spec(spec_text(role)).doc}}


def test_both_pools_scale_in_the_simulator_under_a_ramp():
    sc = load_scenario({
        "seed": 5, "duration": 1500,
        "workload": {"arrivals": {"process": "gamma", "cv": 1.0,
                                  "piecewise": [[0, 0.2], [300, 0.2], [900, 3.0], [1500, 3.0]]},
                     "prompt_tokens": {"dist": "lognormal", "mean": 4000, "median": 3000, "max": 16000},
                     "output_tokens": {"dist": "lognormal", "mean": 600, "median": 400, "max": 2000}},
        "pools": [pool("prefill", "prefill"), pool("decode", "decode")],
        "router": {"policy": "least_outstanding"},
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": 512,
               "link": {"bandwidth_gbs": 50, "latency_ms": 0.5}, "kv_bytes_per_token": 327680},
        "slo": {"ttft": {"percentile": 90, "seconds": 3.0}, "tpot": {"percentile": 90, "seconds": 0.1}},
        "metrics": {"scrape_interval": 15, "rate_window": 60},
    })
    f = Fleet(sc, build_workload(sc, sc.seed))
    f.run()
    prefill, decode = f.pools
    # at 0.2 req/s one or two; at 3 req/s of 4k-token prompts (1.3 erlangs of prefill) and 600-token
    # outputs both grew
    assert [d for t, d, _ in prefill.decisions if t < 300][-1] <= 2
    assert [d for t, d, _ in decode.decisions if t < 300][-1] == 1
    assert max(d for _, d, _ in prefill.decisions) >= 3
    assert max(d for _, d, _ in decode.decisions) >= 4
    assert all(r.startswith("pdModel/prefill") for _, _, r in prefill.decisions[1:])
    assert any("prompt tok/s" in r for _, _, r in prefill.decisions)
    assert all(r.startswith("pdModel/decode") for _, _, r in decode.decisions[1:])


class PdScript:
    """One pool's aggregates as its own scrape would give them (decode: running and KV as well)."""

    def __init__(self, rates, prompt, output, kv=None):
        self.rates, self.prompt, self.output, self.kv, self.i = rates, prompt, output, kv, 0

    def observe(self, spec, now, current, ready=None):
        r = self.rates[min(self.i, len(self.rates) - 1)]
        self.i += 1
        obs = Observation(now, current, ready, arrival_rate=r, mean_prompt_tokens=self.prompt,
                          mean_output_tokens=self.output, num_waiting=r * 2)
        if self.kv is not None:
            obs.kv_usage, obs.num_running = self.kv, r * 10
        return obs


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_decision_log_replays_to_the_same_decisions(role, tmp_path):
    text = spec_text(role)
    spec = load_spec(text)
    rates = [0.2, 0.2, 0.5, 1.0, 2.0, 3.0, 3.5, 3.5, 3.0, 1.0, 0.5, 0.3] + [0.2] * 12
    source = PdScript(rates, 4000.0, 600.0, kv=0.5 if role == "decode" else None)
    log = DecisionLog(tmp_path / "decisions.csv", [])
    loop = AutoscalerLoop(spec, make_policy(spec, load_latency_model(MODEL)), source, MemoryTarget(1),
                          log_file=log)
    desired = [loop.tick(1000.0 + 15 * k).desired for k in range(len(rates))]
    log.close()
    assert max(desired) > 1 and desired[-1] < max(desired)  # up with the load, down after the delay
    (tmp_path / "spec.yaml").write_text(text)
    out = tmp_path / "replayed.csv"
    assert main(["replay", "--spec", str(tmp_path / "spec.yaml"), "--metrics",
                 str(tmp_path / "decisions.csv"), "--step-model", MODEL, "-o", str(out)]) == 0
    logged = list(csv.DictReader(io.StringIO((tmp_path / "decisions.csv").read_text())))
    replayed = list(csv.DictReader(io.StringIO(out.read_text())))
    key = ("time", "desired_replicas", "active", "reason")
    assert [tuple(r[k] for k in key) for r in logged] == [tuple(r[k] for k in key) for r in replayed]


def test_the_prefill_tail_is_the_whole_ttft_not_two_percentiles_summed():
    from autoscaler.pd_queue import prefill_miss, prefill_times

    m = load_latency_model(MODEL)
    times = prefill_times(m, 6000, 1.0)
    assert len(times) > 10 and sorted(times) == times  # a quantile grid of the lognormal mix
    mean_prompt = m.step_ms(6000, 6000, 0, 0) / 1000.0
    assert sum(times) / len(times) > mean_prompt  # prefill grows faster than linearly with the prompt
    # the miss probability falls with the count, rises with the rate; saturated is a sure miss
    fewer, base, busier = (prefill_miss(times, r, c, 2.4) for r, c in ((1.0, 3), (1.0, 2), (2.0, 2)))
    assert fewer < base < busier
    assert prefill_miss(times, 10.0, 2, 2.4) == 1.0
    # an idle pool misses only the prompts whose own prefill exceeds the budget
    assert prefill_miss(times, 1e-9, 1, 2.4) == pytest.approx(sum(t > 2.4 for t in times) / len(times))
    # 2 req/s of 6k-token prompts: the old rule (wait at p90 + a p90 prompt within the budget) asked
    # for more replicas than the whole-TTFT tail does
    pol = PdModelPolicy("prefill", SLOS, m, max_replicas=50, margin=0.1, decode_ttft=0.3)
    new = pol.prefill_need(4.0, 6000, 1, 50)
    budget = 3.0 * 0.9 - 0.3 - m.step_ms(6000 * 2.3026, 6000 * 2.3026, 0, 0) / 1000.0
    old = next(n for n in range(1, 50) if prefill_wait(m, 4.0, n, 6000, 0.9, 1.0) <= budget)
    assert new < old


def test_decode_is_not_sized_at_the_edge_of_its_fold():
    from autoscaler.pd_queue import decode_batch

    m = load_latency_model(MODEL)
    # one replica of 6k-token contexts: the mean batch has a fixed point at 2.2 req/s, the batch at its
    # 90th percentile does not (one replica's random extra sequences would run the batch away)
    assert decode_batch(m, 2.2, 6000, 150, 256) is not None
    assert decode_batch(m, 2.2, 6000, 150, 256, z=1.2816, pool=1) is None
    # pooled over more replicas the percentile's excess per replica shrinks
    assert decode_batch(m, 2.0, 6000, 150, 256, z=1.2816, pool=8)[1] < decode_batch(m, 2.0, 6000, 150, 256,
                                                                                     z=1.2816, pool=1)[1]
    pol = PdModelPolicy("decode", SLOS, m, max_replicas=50)
    assert steady(pol, 2.2, 6000, 150) == 2


def test_the_measured_running_context_replaces_the_mean_mix():
    m = load_latency_model(MODEL)
    pol = PdModelPolicy("decode", SLOS, m, max_replicas=50, kv_tokens=450_000)
    # 4 ready replicas at 20% KV with 60 running: 6,000 tokens a sequence
    obs = Observation(0.0, 4, arrival_rate=5.0, num_running=60, kv_usage=0.2)
    assert pol.running_context(obs) == pytest.approx(6000)
    obs.num_running = 4  # too few sequences to say
    assert pol.running_context(obs) is None
    # a mixed phase: the means say 3,000-token prompts, the batch holds 1,900-token sequences (the
    # chatty requests stay longest): fewer replicas than the means alone ask for
    means = steady(PdModelPolicy("decode", SLOS, m, max_replicas=50), 6.0, 3000, 330)
    measured = steady(pol, 6.0, 3000, 330, ready_replicas=4, num_running=80, kv_usage=80 * 1900 / 4 / 450_000)
    assert measured < means


def test_scale_down_headroom_holds_a_count_the_rate_nearly_needs():
    m = load_latency_model(MODEL)

    def run(h: float) -> int:
        pol = PdModelPolicy("decode", SLOS, m, max_replicas=50, scale_down_delay=0.0, scale_down_headroom=h)
        d = None
        for k, rate in enumerate([8.0] * 4 + [5.0] * 4):
            d = pol.decide(Observation(15.0 * k, d.desired_replicas if d else 1, arrival_rate=rate,
                                       mean_prompt_tokens=2000, mean_output_tokens=500, num_waiting=0))
        return d.desired_replicas

    assert run(0.0) < run(0.6)


def _episodes(confirm: float, firing: str) -> list[int]:
    """The recommendations left in the scale-down window after polls 5 s apart, `firing` one character a
    poll (x: the burst test fires, recommending 9; .: it does not, 2), with burstConfirmSeconds `confirm`."""
    p = PdModelPolicy("decode", SLOS, load_latency_model(MODEL), burst_confirm=confirm)
    for k, c in enumerate(firing):
        p.forecast.bursting = c == "x"
        episode = p.burst_episode(5.0 * k)
        p.recs.append([5.0 * k, 9 if c == "x" else 2] + ([] if episode is None else [episode]))
    return [int(r[1]) for r in p.recs]


@pytest.mark.parametrize("confirm,firing,left", [
    (0.0, ".xxx....", [2, 9, 9, 9, 2, 2, 2, 2]),  # off: every recommendation stays for the window
    # one fast window's noise (fires 5-15 s, under 20 s): withdrawn at 25 s, 20 s after its first firing
    (20.0, ".xxx....", [2, 2, 2, 2, 2]),
    (20.0, ".xxxxxx..", [2, 9, 9, 9, 9, 9, 9, 2, 2]),  # still firing at 25 s, 20 s in: a burst, kept
    (20.0, ".x.x.x..", [2, 9, 2, 9, 2, 9, 2, 2]),  # a flickering test still firing 20 s in: kept
    (20.0, ".x...x...", [2, 2, 2, 2, 9, 2, 2, 2]),  # two separate noisy polls: each withdrawn
])
def test_an_unconfirmed_burst_is_withdrawn(confirm, firing, left):
    assert _episodes(confirm, firing) == left


def test_the_burst_episode_survives_a_restart():
    p = PdModelPolicy("decode", SLOS, load_latency_model(MODEL), burst_confirm=20.0)
    p.forecast.bursting = True
    p.burst_episode(5.0)
    q = PdModelPolicy("decode", SLOS, load_latency_model(MODEL), burst_confirm=20.0)
    q.load_state_dict(p.state_dict())
    assert q.episode == [5.0, 5.0]
    assert "episode" not in PdModelPolicy("decode", SLOS, load_latency_model(MODEL)).state_dict()
