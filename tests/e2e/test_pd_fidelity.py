"""Simulator fidelity against a live P/D fleet: one emulated prefill replica and one emulated decode
replica (`serve --emulate llama-3.1-70b@h100-sxm-tp4-bf16`, kv_producer / kv_consumer, the emulated
`rdma` link) behind `slopilot route` in P/D mode, started and driven by bench/pd_live.py's own
functions (Mooncake lengths, gamma arrivals CV 1.5, streamed, timed by the client); then the
simulator's `pd:` service with the same latency model, engine settings, KV pool, threshold and link,
on the same arrival times and lengths.

Two fleets: 1P + 1D leaves the router no choice of replica on either hop, so that comparison is of the
P/D path itself (prefill queue and chunked prefill, the transfer, decode batching); 1P + 3D at
bench/pd_live.py's rate (0.4 req/s) adds the router's pick among three decode replicas (live: its
default weighted policy over scraped prefix, KV and queue scores; simulated: the same policy).
The simulator adds no HTTP time (router latency_ms 0): the live fleet's few milliseconds of hops are
inside the tolerance at these TTFTs (seconds) and show up, if anywhere, in TPOT.

The bar is the issue's: medians of TTFT, TPOT and E2E within 5%, p90 within 10%. The emulator runs in
real time on a shared machine, so the test prints the load average beside the numbers; it asserts
the bar as stated (no loosening for load).
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
import pytest

from engine.args import EngineArgs
from tests.e2e.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import pd_live  # noqa: E402

pytestmark = pytest.mark.slow

RATE, DURATION, DRAIN, SEED = 0.3, 60.0, 90.0, 7
THRESHOLD = 1024
P50_TOL, P90_TOL = 0.05, 0.10
# the emulated engines' flags in bench/pd_live.py (ENGINE) and the KV pool they give
SEQS, BATCHED, MODEL_LEN = 256, 8192, 65536
KV_BLOCKS = EngineArgs(max_num_seqs=SEQS, max_num_batched_tokens=BATCHED).kv_blocks(MODEL_LEN)


def _live(reqs, monkeypatch, n_p: int, n_d: int) -> dict[str, np.ndarray]:
    assert pd_live.ENGINE == ["--max-model-len", str(MODEL_LEN), "--max-num-seqs", str(SEQS),
                              "--max-num-batched-tokens", str(BATCHED)], "the bench's engine flags moved"
    monkeypatch.setattr(pd_live, "CONFIGS", {"pd": (n_p, n_d)})
    procs = []
    try:
        procs, routers, _ = pd_live.start(pd_live.MODEL, THRESHOLD)
        res = asyncio.run(pd_live.drive(routers, reqs, DRAIN))["pd"]
    finally:
        for p in procs:
            p.stop()
    assert all(r.status == 200 and r.tpot is not None for r in res), "every request answered in full"
    assert [r.tokens for r in res] == [q.output for q in reqs], "every request streamed all its tokens"
    ttft = np.array([r.ttft for r in res])
    e2e = np.array([r.waited for r in res])
    return {"ttft": ttft, "tpot": np.array([r.tpot for r in res]), "e2e": e2e}


def simulate_pair(reqs, fast: bool = True, n_p: int = 1, n_d: int = 1):
    """The simulator's nP + nD service on the live run's arrivals and lengths (tests/simulator/test_sim_pd.py
    also checks the 1P + 1D scenario's fast path against stepping)."""
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    pool = {"latency_model": pd_live.MODEL, "max_num_seqs": SEQS,
            "max_num_batched_tokens": BATCHED, "max_model_len": MODEL_LEN, "kv_blocks": KV_BLOCKS,
            "prefix_caching": False}  # the live prompts are random ids: no prefix is ever shared
    sc = load_scenario({
        "seed": SEED,
        "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
        "pools": [{**pool, "name": "prefill", "replicas": n_p}, {**pool, "name": "decode", "replicas": n_d}],
        # `slopilot route`'s default: the weighted policy over prefix, KV and queue scorers
        "router": {"policy": "weighted"},
        "pd": {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": THRESHOLD,
               "link": {"bandwidth_gbs": 50, "latency_ms": 0.5}},  # the emulated "rdma" link class
    })
    wl = Workload(np.array([q.at for q in reqs]), np.array([q.prompt for q in reqs]),
                  np.array([q.output for q in reqs]))
    return simulate(sc, workload=wl, plots=False, fast=fast)


def _simulated(reqs, n_p: int, n_d: int) -> tuple[dict[str, np.ndarray], dict]:
    run = simulate_pair(reqs, n_p=n_p, n_d=n_d)
    f = run.fleet
    assert (f.requests.status == 1).all()
    ttft = (f.requests.first_token - f.arrival_ps) / 1e12
    e2e = (f.requests.finish - f.arrival_ps) / 1e12
    return ({"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / (f.requests.generated - 1)},
            run.summary.get("pd") or {})


@pytest.mark.parametrize("n_p, n_d, rate", [(1, 1, RATE), (1, 3, 0.4)], ids=["1P+1D", "1P+3D"])
def test_simulated_pd_fleet_matches_the_live_one(monkeypatch, n_p, n_d, rate):
    reqs = pd_live.workload(rate, DURATION, SEED, 32000, 1024)
    load_start = os.getloadavg()
    live = _live(reqs, monkeypatch, n_p, n_d)
    load_end = os.getloadavg()
    sim, pd = _simulated(reqs, n_p, n_d)
    prompts = np.array([q.prompt for q in reqs])
    assert pd["disaggregated"] == int((prompts > THRESHOLD).sum())  # the same P/D decisions
    print(f"\n{n_p}P + {n_d}D: {len(reqs)} requests in {DURATION:g} s at {rate} req/s, "
          f"{pd['disaggregated']} disaggregated; "
          f"prompts mean {prompts.mean():.0f}, median {np.median(prompts):.0f} tokens; load average "
          f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} / {load_end[1]:.1f} (1 / 5 min) at the end")
    errors = {}
    for k in ("ttft", "tpot", "e2e"):
        for q in (50, 90):
            r, s = np.percentile(live[k], q), np.percentile(sim[k], q)
            errors[f"{k} p{q}"] = (r, s, s / r - 1)
            print(f"{k} p{q}: live {r * 1e3:.1f} ms, simulated {s * 1e3:.1f} ms ({100 * (s / r - 1):+.1f}%)")
    missed = {k: f"{100 * e:+.1f}%" for k, (_, _, e) in errors.items()
              if abs(e) > (P50_TOL if k.endswith("p50") else P90_TOL)}
    load = f"load average {load_start[0]:.1f}-{load_end[0]:.1f}"
    assert not missed, f"outside the bar (p50 5%, p90 10%): {missed}; {load}"
