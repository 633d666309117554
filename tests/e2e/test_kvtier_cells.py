"""Issue 32's first must-show, the simulator's side: the first 4,000 Mooncake conversation requests on
three tiny engines under KV pressure (the router's prefix test, tests/e2e/test_router_prefix_live.py:
4,500 blocks an engine, the trace 32x smaller in tokens, 12x faster), for {no offload, offload tier}
x {approximate, precise routing}: prefix hit rate (device, offload tier, both) and prompt tokens
computed, per cell. The same token ids and arrival times feed the live engines, so each simulated cell
is what a live one is checked against (within 3 points).

The offload tier is what `serve tiny --kv-offloading-size 0.125` keeps: 0.125 GiB of 8 KiB blocks
(tiny: 2 layers x 2 KV heads x 16 dims x K,V x 4 bytes = 512 bytes a token, 16-token blocks) =
16,384 blocks, 3.6x the device's 4,500.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.report import summarize
from simulator.scenario import load_scenario
from simulator.workload import Workload
from tests.e2e.test_router_prefix_live import (
    BLOCK,
    MAX_LEN,
    TRACE,
    TokenFleet,
    arrivals,
    outputs,
    prompts,
    read_trace,
)

N, SPEEDUP, KV_BLOCKS = 4000, 12, 4500
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 16 * 2 * 4
OFFLOAD_GIB = 0.125
APPROXIMATE = {"queue": 1.0, "kv": 1.0, "prefix": 4.0}  # the prefix test's weights under KV pressure

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE}")


def router(precise: bool) -> dict:
    if not precise:
        return {"policy": "weighted", "weights": APPROXIMATE}
    # the precise scorer (routing.precise, fed from each simulated replica's own cache by tier) in the
    # approximate one's place, same weight
    return {"policy": "weighted", "weights": {"queue": 1.0, "kv": 1.0, "precise_prefix": 4.0}}


def sim_cell(offload: bool, precise: bool, ids, max_tokens, times, kv_blocks: int = KV_BLOCKS) -> dict:
    pool = {"name": "tiny", "latency_model": "cpu-tiny", "replicas": 3, "autoscaler": {"fixed": 3},
            "kv_blocks": kv_blocks, "block_size": BLOCK, "max_model_len": MAX_LEN, "prefix_caching": True}
    if offload:
        pool["kv_offload"] = {"capacity_gib": OFFLOAD_GIB, "bandwidth_gbs": 64,
                              "kv_bytes_per_token": TINY_KV_BYTES_PER_TOKEN}
    sc = load_scenario({
        "name": "kvtier-cells", "seed": 0, "duration": float(times[-1]) + 1,
        "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 1, "output_tokens": 1},  # replaced below
        "pools": [pool], "router": router(precise), "drain": {"enabled": True, "max": 600},
    })
    wl = Workload(times, np.array([len(x) for x in ids]), np.array(max_tokens))
    fleet = type("Fleet", (TokenFleet,), {"token_ids": ids})(sc, wl, seed=0)
    fleet.run()
    t = summarize(fleet)["pools"]["tiny"]["kv_tiers"]
    return {k: t[k] for k in ("hit_rate", "device_hit_rate", "offload_hit_rate", "prefill_tokens_computed",
                              "queried_tokens")}


def cells(n: int = N, precise: tuple = (False, True)) -> dict:
    rows = read_trace(n)
    ids, max_tokens, times = prompts(rows, salt=2), outputs(rows), arrivals(rows, SPEEDUP)
    out = {}
    for p in precise:
        for off in (False, True):
            out[("offload" if off else "no offload", "precise" if p else "approximate")] = sim_cell(
                off, p, ids, max_tokens, times)
    for (off, route), c in out.items():
        print(f"{off:>10} / {route:<11}: hit {c['hit_rate']:.1%} (device {c['device_hit_rate']:.1%}, "
              f"offload {c['offload_hit_rate']:.1%}), prompt tokens computed "
              f"{c['prefill_tokens_computed']:,} of {c['queried_tokens']:,}")
    return out


def precise_available() -> bool:
    try:
        import routing.precise  # noqa: F401
    except ImportError:
        return False
    return True


def test_small_cells_offload_raises_the_hit_rate():
    # the first 600 requests on engines of 400 blocks: the offload tier holds what the device evicts
    rows = read_trace(600)
    ids, max_tokens, times = prompts(rows, salt=2), outputs(rows), arrivals(rows, SPEEDUP)
    no = sim_cell(False, False, ids, max_tokens, times, kv_blocks=400)
    off = sim_cell(True, False, ids, max_tokens, times, kv_blocks=400)
    assert off["hit_rate"] > no["hit_rate"] + 0.02 and off["offload_hit_rate"] > 0
    assert off["prefill_tokens_computed"] < no["prefill_tokens_computed"]


@pytest.mark.slow  # four 4,000-request runs
def test_four_cells_simulated():
    res = cells(precise=(False, True) if precise_available() else (False,))
    for route in {r for _, r in res}:
        no, off = res[("no offload", route)], res[("offload", route)]
        assert off["hit_rate"] > no["hit_rate"]
        assert off["prefill_tokens_computed"] < no["prefill_tokens_computed"]
