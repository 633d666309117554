"""Chunked prefill off (vLLM's --no-enable-chunked-prefill): a prompt is computed whole in one step.

The engine's scheduler, the simulator built on it (fast path and step by step), the scenario and plan
files, and the engine's flag all follow the one rule in engine.core.scheduler.
"""

import numpy as np
import pytest

from engine.args import EngineArgs, add_cli_args, from_cli
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from simulator.scenario import load_scenario
from tests.engine.test_core_scheduler import run_step, seq
from tests.simulator.test_sim_fastpath import _assert_same, _run, _scenario


def make(num_blocks=64, block_size=4, **kw):
    bm = BlockManager(num_blocks, block_size)
    return bm, Scheduler(bm, max_model_len=40, **kw)


def test_prompt_that_does_not_fit_the_budget_left_is_passed_over_not_chunked():
    _, sched = make(max_num_batched_tokens=40, enable_chunked_prefill=False)
    sched.add(seq(4, rid="a"))
    sched.add(seq(4, rid="b", start=50))
    run_step(sched)  # a and b decode from now on: 2 tokens of the 40
    big, small = seq(39, rid="big", start=100), seq(20, rid="small", start=300)
    sched.add(big)
    sched.add(small)
    out = sched.schedule()
    # 39 > 40 - 2 left: big waits whole; small (20) fits and goes ahead of it
    assert [s.request_id for s in out.seqs] == ["a", "b", "small"]
    assert out.num_new_tokens == [1, 1, 20]
    assert [s.request_id for s in sched.waiting] == ["big"]


def test_same_batch_chunked_on_splits_the_long_prompt():
    _, sched = make(max_num_batched_tokens=40)
    sched.add(seq(4, rid="a"))
    sched.add(seq(4, rid="b", start=50))
    run_step(sched)
    sched.add(seq(39, rid="big", start=100))
    sched.add(seq(20, rid="small", start=300))
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["a", "b", "big"]
    assert out.num_new_tokens == [1, 1, 38]


@pytest.mark.parametrize("chunked", [True, False])
def test_every_prefill_is_whole_without_chunking_and_all_requests_finish(chunked):
    rng = np.random.default_rng(5)
    _, sched = make(num_blocks=40, max_num_batched_tokens=40, max_num_seqs=8, enable_chunked_prefill=chunked)
    reqs = [seq(int(rng.integers(1, 30)), max_tokens=int(rng.integers(1, 10)), rid=str(i), start=i * 50)
            for i in range(30)]
    for r in reqs:
        sched.add(r)
    partial = 0
    finished = []
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        left = [len(s) - s.num_computed_tokens - n for s, n in zip(out.seqs, out.num_new_tokens)]
        partial += sum(1 for x in left if x > 0)  # a prefill that leaves some of its prompt for later
        finished += sched.update(out, [7 if x == 0 else None for x in left])
    assert sorted(s.request_id for s in finished) == sorted(r.request_id for r in reqs)
    assert (partial == 0) if not chunked else (partial > 0)
    assert sched.bm.num_free_blocks == 40


def test_budget_below_model_length_is_refused_with_the_rule():
    bm = BlockManager(64, 4)
    rule = r"max_num_batched_tokens \(16\) must be at least max_model_len \(40\)"
    with pytest.raises(ValueError, match=rule):
        Scheduler(bm, max_num_batched_tokens=16, max_model_len=40, enable_chunked_prefill=False)
    Scheduler(bm, max_num_batched_tokens=16, max_model_len=40)  # chunking: any budget works


def test_simulator_fast_path_equals_stepping_without_chunking():
    sc = _scenario(chunked_prefill=False, max_model_len=3000, max_num_batched_tokens=3000)
    from simulator.run import build_workload
    wl = build_workload(sc, 3)
    fast, slow = _run(sc, wl, True), _run(sc, wl, False)
    _assert_same(fast, slow)
    served = fast.requests.status == 1
    assert served.sum() > 300 and set(fast.requests.status[~served]) <= {2}  # 2: too long for max_model_len
    on = _scenario(max_model_len=3000, max_num_batched_tokens=3000)
    chunked = _run(on, wl, True)
    # the same arrivals scheduled differently: some first tokens move
    assert not np.array_equal(chunked.requests.first_token, fast.requests.first_token)


def test_scenario_names_the_field_when_the_budget_is_too_small():
    rule = r"max_num_batched_tokens: without chunked prefill .*\(512\).*\(3000\)"
    with pytest.raises(ValueError, match=rule):
        _scenario(chunked_prefill=False, max_model_len=3000)


def test_engine_flag_in_both_spellings():
    import argparse
    for flag in ("--no-chunked-prefill", "--no-enable-chunked-prefill"):
        p = argparse.ArgumentParser()
        add_cli_args(p)
        args = from_cli(p.parse_args([flag, "--max-num-batched-tokens", "4096"]))
        assert args.enable_chunked_prefill is False
    assert EngineArgs().enable_chunked_prefill is True


def test_real_engine_runs_without_chunking():
    from engine.core.sampling_params import SamplingParams
    from engine.llm import LLM
    llm = LLM("tiny", max_num_batched_tokens=4096, max_model_len=4096, enable_chunked_prefill=False)
    prompts = [list(range(1, 1 + n)) for n in (5, 300, 40)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))
    assert [len(o.token_ids) for o in outs] == [4, 4, 4]


def test_scenario_loads_the_field():
    sc = load_scenario({"duration": 10, "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 10,
                                                     "output_tokens": 5},
                        "pools": [{"name": "p", "latency_model": "h100-llama2-70b-tp4",
                                   "chunked_prefill": False, "max_model_len": 4096,
                                   "max_num_batched_tokens": 4096}]})
    assert sc.pools[0].chunked_prefill is False


def test_without_chunking_the_budget_defaults_to_a_whole_prompt():
    base = {"duration": 10, "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 10, "output_tokens": 5}}
    pool = {"name": "p", "latency_model": "h100-llama2-70b-tp4", "max_model_len": 16384}
    off = load_scenario({**base, "pools": [{**pool, "chunked_prefill": False}]}).pools[0]
    on = load_scenario({**base, "pools": [pool]}).pools[0]
    assert (on.max_num_batched_tokens, off.max_num_batched_tokens) == (8192, 16384)
