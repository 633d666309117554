"""The simulator's P/D service (simulator.pd): hand arithmetic, decode admission, fast path identity."""

import numpy as np
import pytest

from simulator.fleet import Fleet
from simulator.report import summarize
from simulator.run import build_workload
from simulator.scenario import load_scenario
from simulator.steptime import PS, AffineStepModel, to_ps
from simulator.workload import Workload

STUB = AffineStepModel(8.0, 0.03, 0.3, 0.002)
KVB = 327680.0  # Llama-70B's K and V per token in bf16: 80 layers x 2 x 8 heads x 128 x 2 bytes


def _scenario(prefill=1, decode=1, decode_blocks=4000, threshold=256, duration=None, **extra):
    pool = {"latency_model": "stub", "max_num_batched_tokens": 4096, "prefix_caching": False}
    sc = {
        "seed": 3,
        "workload": {"arrivals": {"process": "gamma", "cv": 2.0, "rate": 4},
                     "prompt_tokens": {"dist": "lognormal", "mean": 1500, "median": 1000, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "mean": 150, "median": 80, "max": 600}},
        "duration": duration or 60,
        "pools": [{**pool, "name": "prefill", "replicas": prefill, "kv_blocks": 4000},
                  {**pool, "name": "decode", "replicas": decode, "kv_blocks": decode_blocks}],
        "router": {"policy": "round_robin"},
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": threshold,
               "link": {"bandwidth_gbs": 25, "latency_ms": 2}, "kv_bytes_per_token": KVB},
        **extra,
    }
    return load_scenario(sc)


def _run(sc, wl, fast=True):
    f = Fleet(sc, wl, fast=fast, models={"stub": STUB})
    f.run()
    return f


@pytest.fixture
def stretches(monkeypatch):
    """The decode steps of each closed-form stretch a run planned (Replica._stretch; an arrival may
    cut one short): proof that a fast run took the fast path rather than stepping throughout."""
    from simulator.replica import Replica

    steps: list[int] = []
    orig = Replica._stretch

    def counted(self, n, finishes):
        steps.append(n)
        return (yield from orig(self, n, finishes))

    monkeypatch.setattr(Replica, "_stretch", counted)
    return steps


def test_one_request_ttft_is_prefill_plus_transfer_plus_first_decode_step():
    sc = _scenario()
    p, out = 2000, 10
    f = _run(sc, Workload(np.array([1.0]), np.array([p]), np.array([out])))
    timer = f.pools[0].timer
    a, b = timer.coeffs(p, p, 0, 1)  # the whole prompt in one prefill step
    prefill = a
    transfer = to_ps(0.002 + p * KVB / 25e9)
    a1, b1 = timer.coeffs(1, p, 0, 1)  # the decode side recomputes the last prompt token
    first = a1
    ttft = (f.requests.first_token[0] - f.arrival_ps[0]) / PS
    assert ttft == pytest.approx((prefill + transfer + first) / PS, abs=1e-9)
    assert ttft > 0.002 + p * KVB / 25e9  # the 26 ms transfer is in it
    t = f.pd.table()
    assert t["disaggregated"][0]
    assert t["transfer"][0] == pytest.approx(0.002 + p * KVB / 25e9, abs=1e-9)
    assert t["admission_wait"][0] == 0.0
    assert t["prefill_queue"][0] == 0.0
    assert f.requests.pool[0] == 1 and f.requests.generated[0] == out  # decoded on the decode pool
    # the rest decode on the decode replica: out - 1 plain decode steps of one sequence
    a2, b2 = timer.coeffs(0, 0, 1, 0)
    rest = sum(a2 + b2 * (p + k) for k in range(1, out))  # step k attends over p + k tokens
    assert (f.requests.finish[0] - f.requests.first_token[0]) == rest
    # the prefill replica saw one max_tokens=1 request; the decode replica the decode hop
    pre, dec = f.pools[0].replicas[0], f.pools[1].replicas[0]
    assert pre.metrics.v[0] == 1 and dec.metrics.v[0] == 1
    s = summarize(f)
    assert s["pd"]["disaggregated"] == 1 and s["pd"]["kv_transfer_bytes"] == p * KVB


def test_full_blocks_connector_loads_whole_blocks_and_the_decode_hop_passes_its_front_end():
    """`loads: full_blocks` (vLLM's ExampleConnector): the decode side loads (prompt - 2) // block whole
    blocks and computes the rest in its first step; a decode pool with a front end adds its delay."""
    sc = _scenario(pd={"prefill_pool": "prefill", "decode_pool": "decode", "threshold": 256,
                       "loads": "full_blocks", "link": {"bandwidth_gbs": 25, "latency_ms": 2},
                       "kv_bytes_per_token": KVB})
    sc.pools[1].frontend = {"quantiles_ms": (5.0,), "per_prompt_token_ms": 0.001}
    p, out, bs = 2000, 10, sc.pools[1].block_size
    loaded = (p - 2) // bs * bs
    assert bs == 16 and loaded == 1984
    f = _run(sc, Workload(np.array([1.0]), np.array([p]), np.array([out])))
    timer = f.pools[1].timer
    t = f.pd.table()
    move = 0.002 + loaded * KVB / 25e9
    assert t["transfer"][0] == pytest.approx(move + (5.0 + 0.001 * p) / 1000, abs=1e-9)
    assert t["first_decode_step"][0] == pytest.approx(timer.coeffs(p - loaded, p, 0, 1)[0] / PS, abs=1e-9)
    assert summarize(f)["pd"]["kv_transfer_bytes"] == loaded * KVB
    assert f.requests.generated[0] == out


def test_short_prompt_goes_whole_to_decode():
    sc = _scenario(threshold=256)
    f = _run(sc, Workload(np.array([1.0]), np.array([200]), np.array([5])))
    assert not f.pd.disaggregated[0]
    assert f.requests.pool[0] == 1
    assert f.pools[0].replicas[0].metrics.v[0] == 0  # the prefill pool never saw it
    ttft = (f.requests.first_token[0] - f.arrival_ps[0])
    assert ttft == f.pools[1].timer.coeffs(200, 200, 0, 1)[0]


def test_full_decode_pool_makes_prefilled_requests_wait():
    # the decode replica's KV holds ~2 of these requests: the third prefilled one must wait
    sc = _scenario(decode_blocks=300, threshold=0)
    n = 4
    wl = Workload(np.arange(n) * 0.01, np.full(n, 2000), np.full(n, 200))
    f = Fleet(sc, wl, models={"stub": STUB})
    usage = []  # the producer's KV usage, sampled every 0.1 s

    def probe():
        while True:
            yield f.env.timeout(to_ps(0.1))
            usage.append(f.pools[0].replicas[0].bm.usage)

    f.env.process(probe())
    f.run()
    t = f.pd.table()
    assert (f.requests.status == 1).all()
    wait = t["admission_wait"]
    assert wait[0] == 0.0 and wait.max() > 1.0  # it waited for a decode request to finish and free blocks
    # it was admitted when the first decode finished (its blocks freed), not before
    waited = int(np.argmax(wait))
    assert f.pd.reserved[waited] >= f.requests.finish.min()
    assert summarize(f)["pd"]["admission_wait"]["max"] == pytest.approx(wait.max())
    assert max(r.max_usage for r in f.pools[1].replicas) <= 1.0
    # the producer held the waiting requests' KV (125 blocks each of its 4000) until they were read
    assert max(usage) == 3 * 125 / 4000 and usage[-1] == 0.0
    for pool in f.pools:  # every block given back at the end, both sides
        assert all(r.bm.check_no_leak() == [] for r in pool.replicas)


@pytest.mark.parametrize("caching, loads", [(False, "all_but_last"), (True, "all_but_last"),
                                            (False, "full_blocks")])
def test_fast_path_equals_stepping_for_pd(caching, loads, stretches):
    sc = _scenario(prefill=2, decode=2, decode_blocks=900, threshold=512,
                   pd={"prefill_pool": "prefill", "decode_pool": "decode", "threshold": 512, "loads": loads,
                       "link": {"bandwidth_gbs": 25, "latency_ms": 2}, "kv_bytes_per_token": KVB})
    for p in sc.pools:
        p.prefix_caching = caching
    wl = build_workload(sc, 3)
    fast = _run(sc, wl, True)
    ff = sum(stretches)
    slow = _run(sc, wl, False)
    assert ff > 1000 and sum(stretches) == ff  # the fast run skipped steps; the reference stepped all
    for name in ("first_sched", "first_token", "finish", "cached", "generated", "preemptions", "status",
                 "replica"):
        np.testing.assert_array_equal(getattr(fast.requests, name), getattr(slow.requests, name),
                                      err_msg=name)
    for k in ("prefill_sched", "prefilled", "reserved", "transferred"):
        np.testing.assert_array_equal(getattr(fast.pd, k), getattr(slow.pd, k), err_msg=k)
    assert fast.pd.disaggregated.sum() > 20 and (~fast.pd.disaggregated).sum() > 5
    assert np.nanmax(fast.pd.table()["admission_wait"]) > 0  # the hard case: reservations mid-stretch
    assert (fast.requests.status == 1).all()


def test_bad_pd_sections_name_the_field():
    with pytest.raises(ValueError, match="pd.decode_pool.*no pool named 'nope'"):
        _scenario(pd={"prefill_pool": "prefill", "decode_pool": "nope", "link": {"bandwidth_gbs": 1},
                      "kv_bytes_per_token": 1})
    with pytest.raises(ValueError, match="kv_bytes_per_token.*is required"):
        _scenario(pd={"prefill_pool": "prefill", "decode_pool": "decode", "link": {"bandwidth_gbs": 1}})
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        _scenario(pd={"prefill_pool": "prefill", "decode_pool": "decode", "link": {"bandwidth_gbs": 0},
                      "kv_bytes_per_token": 1})


def test_derived_model_gives_kv_bytes_per_token():
    from simulator.latency import load_latency_model
    from simulator.pd_spec import model_kv_bytes_per_token

    assert model_kv_bytes_per_token(load_latency_model("llama-3.1-70b@h100-sxm-tp4-bf16")) == KVB
    assert model_kv_bytes_per_token(STUB) is None


def test_fast_path_equals_stepping_for_pd_with_shared_prefixes(shared_data, stretches):
    """Mooncake's shared prefix blocks on both pools' caches, a decode pool small enough to preempt
    and to make prefilled requests wait: the hard case for the fast path (evictions, deferred
    reservations, re-admissions after preemption)."""
    pool = {"latency_model": "stub", "max_num_batched_tokens": 4096, "max_model_len": 32768}
    sc = load_scenario({
        "seed": 3, "duration": 100,
        "workload": {"trace": {"format": "mooncake", "limit": 300,
                               "path": str(shared_data / "traces" / "mooncake_conversation.jsonl")},
                     "max_prompt_tokens": 16000, "max_output_tokens": 300},
        "pools": [{**pool, "name": "prefill", "replicas": 2, "kv_blocks": 3000},
                  {**pool, "name": "decode", "replicas": 2, "kv_blocks": 1100}],
        "router": {"policy": "round_robin"},
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": 512,
               "link": {"bandwidth_gbs": 25, "latency_ms": 2}, "kv_bytes_per_token": KVB}})
    wl = build_workload(sc, 3)
    fast = _run(sc, wl, True)
    ff = sum(stretches)
    slow = _run(sc, wl, False)
    assert ff > 1000 and sum(stretches) == ff
    for name in ("first_sched", "first_token", "finish", "cached", "generated", "preemptions", "status",
                 "replica"):
        np.testing.assert_array_equal(getattr(fast.requests, name), getattr(slow.requests, name),
                                      err_msg=name)
    for k in ("prefill_sched", "prefilled", "reserved", "transferred"):
        np.testing.assert_array_equal(getattr(fast.pd, k), getattr(slow.pd, k), err_msg=k)
    assert fast.requests.cached.sum() > 0 and fast.requests.preemptions.sum() > 0
    assert np.nanmax(fast.pd.table()["admission_wait"]) > 1.0
    assert (fast.requests.status == 1).all()


def test_requests_csv_carries_each_requests_hops(tmp_path):
    import csv

    from simulator.run import simulate

    sc = _scenario()
    wl = Workload(np.array([1.0, 2.0]), np.array([2000, 100]), np.array([10, 5]))
    simulate(sc, out_dir=tmp_path, workload=wl, plots=False, models={"stub": STUB})
    rows = list(csv.DictReader(open(tmp_path / "requests.csv")))
    assert rows[0]["pd_disaggregated"] == "1" and rows[1]["pd_disaggregated"] == "0"
    assert float(rows[0]["pd_transfer"]) == pytest.approx(0.002 + 2000 * KVB / 25e9, abs=1e-6)
    assert rows[1]["pd_transfer"] == ""  # served whole by a decode replica: no hop times
    hops = sum(float(rows[0][f"pd_{k}"]) for k in ("prefill_queue", "prefill", "admission_wait", "transfer",
                                                   "first_decode_step"))
    assert hops == pytest.approx(float(rows[0]["ttft"]), abs=1e-5)  # TTFT is the sum of the hops


def test_example_shows_the_pd_trade(shared_data):
    """docs/pd.md's reading of examples/pd_h100_70b.yaml, on 10 simulated minutes of it: decode
    replicas free of prompt chunks give a lower TPOT; disaggregated requests pay the transfer, and a
    single prefill replica queues."""
    import importlib.util
    from pathlib import Path

    from autoscaler.yamlfile import parse
    from simulator.run import simulate

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("pd_sim", root / "bench" / "pd_sim.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = root / "examples" / "pd_h100_70b.yaml"
    data = parse(path.read_text(), str(path)).data
    data["duration"] = 600
    data["workload"]["lengths_from"]["path"] = str(shared_data / "traces" / "mooncake_conversation.jsonl")
    wl = build_workload(load_scenario(data, base_dir=path.parent), data["seed"])
    s = {name: simulate(load_scenario(d, base_dir=path.parent), workload=wl, plots=False).summary
         for name, d in bench.variants(data).items()}
    agg, one, two = s["aggregated 4"], s["1P + 3D"], s["2P + 2D"]
    assert two["latency"]["tpot"]["p90"] < agg["latency"]["tpot"]["p90"]
    assert one["latency"]["tpot"]["p90"] < agg["latency"]["tpot"]["p90"]
    assert two["latency"]["ttft"]["p50"] > agg["latency"]["ttft"]["p50"]
    assert one["pd"]["prefill_queue"]["p90"] > two["pd"]["prefill_queue"]["p90"]
    # the median transfer: 1 ms + a median disaggregated prompt's 327,680 bytes a token at 50 GB/s
    assert 0.02 < two["pd"]["transfer"]["p50"] < 0.1
    assert agg["requests"]["ok"] == one["requests"]["ok"] == two["requests"]["ok"] == len(wl)


def test_each_pool_scales_on_its_own_series():
    """A KEDA ScaledObject on the prefill pool reads the prefill role's queue under vLLM's name and
    scales that pool alone; the decode pool keeps its count."""
    keda = {"spec": {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "prefill"},
        "spec": {"scaleTargetRef": {"name": "prefill"}, "pollingInterval": 15, "cooldownPeriod": 60,
                 "minReplicaCount": 1, "maxReplicaCount": 6,
                 "triggers": [{"type": "prometheus", "metadata": {
                     "serverAddress": "http://prometheus:9090", "threshold": "2",
                     "query": 'sum(vllm:num_requests_waiting{job="prefill"})'}}]}}}
    sc = load_scenario({
        "seed": 3, "duration": 150,
        "workload": {"arrivals": {"process": "gamma", "cv": 1.0, "rate": 8},
                     "prompt_tokens": {"dist": "lognormal", "mean": 6000, "median": 5000, "max": 12000},
                     "output_tokens": {"dist": "lognormal", "mean": 100, "median": 80, "max": 300}},
        "pools": [{"name": "prefill", "latency_model": "stub", "replicas": 1, "kv_blocks": 4000,
                   "max_num_batched_tokens": 4096, "provisioning_delay": 10, "autoscaler": keda},
                  {"name": "decode", "latency_model": "stub", "replicas": 2, "kv_blocks": 8000,
                   "autoscaler": {"fixed": 2}}],
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode",
               "link": {"bandwidth_gbs": 25, "latency_ms": 2}, "kv_bytes_per_token": KVB}})
    f = _run(sc, build_workload(sc, 3))
    pre, dec = f.pools
    assert pre.scale_events and max(to for _, _, to in pre.scale_events) > 1
    assert not dec.scale_events and len(dec.replicas) == 2
    assert (f.requests.status == 1).all() and f.pd.disaggregated.all()
    used = {int(r) for r in f.pd.prefill_replica}
    assert len(used) > 1  # the new prefill replicas took prompts


def test_decode_side_prefix_hit_shortens_the_transfer():
    """A second request sharing the first one's 1,024-token prefix finds it in the decode replica's
    cache: only its other tokens move (vLLM's consumer reads only the blocks it lacks)."""
    sc = _scenario(threshold=256)
    for p in sc.pools:
        p.prefix_caching = True
    wl = Workload(np.array([1.0, 5.0]), np.array([2000, 1500]), np.array([10, 10]), hash_ids=[[0, 1], [0, 1]])
    f = _run(sc, wl)
    t = f.pd.table()
    assert t["disaggregated"].all()
    assert t["decode_cached"][0] == 0 and t["decode_cached"][1] == 1024
    assert t["transfer"][0] == pytest.approx(0.002 + 2000 * KVB / 25e9, abs=1e-9)
    assert t["transfer"][1] == pytest.approx(0.002 + (1500 - 1024) * KVB / 25e9, abs=1e-9)
    assert f.pd.transfer_bytes == (2000 + 1500 - 1024) * KVB
    assert f.requests.cached[1] == 1024  # the prefill side's own cache hit too


def test_fast_path_equals_stepping_on_the_live_fidelity_scenario(shared_data, stretches):
    """The scenario the slow live check (tests/e2e/test_pd_fidelity.py) simulates: the derived
    Llama-3.1-70B H100 TP4 model, 1 prefill + 1 decode replica, Mooncake lengths, the same arrivals."""
    from tests.e2e.test_pd_fidelity import DURATION, RATE, SEED, pd_live, simulate_pair

    reqs = pd_live.workload(RATE, DURATION, SEED, 32000, 1024)
    fast = simulate_pair(reqs, fast=True).fleet
    ff = len(stretches)
    slow = simulate_pair(reqs, fast=False).fleet
    assert ff > 10 and len(stretches) == ff
    for name in ("first_sched", "first_token", "finish", "cached", "generated", "preemptions", "status",
                 "replica"):
        np.testing.assert_array_equal(getattr(fast.requests, name), getattr(slow.requests, name),
                                      err_msg=name)
    for k in ("prefill_sched", "prefilled", "reserved", "transferred"):
        np.testing.assert_array_equal(getattr(fast.pd, k), getattr(slow.pd, k), err_msg=k)
    assert fast.pd.disaggregated.sum() > 10 and (fast.requests.status == 1).all()
