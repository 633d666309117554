"""Background requests (priority >= background_priority) yield whole steps to the others, or with a
step-time model join them within a bound."""

import pytest

from engine.args import EngineArgs
from engine.core.background import BackgroundFill
from engine.core.batch_shape import BatchShape, batch_shape
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.llm_engine import background_fill


def make(num_blocks=64, block_size=4, **kw):
    kw.setdefault("policy", "priority")
    kw.setdefault("background_priority", 1)
    return Scheduler(BlockManager(num_blocks, block_size), **kw)


def seq(n, rid, priority=0, max_tokens=4, start=10, arrival=0.0):
    return Sequence(list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    request_id=rid, arrival_time=arrival, priority=priority)


def step(sched):
    out = sched.schedule()
    sampled = [7 if s.num_computed_tokens + n == len(s) else None
               for s, n in zip(out.seqs, out.num_new_tokens)]
    sched.update(out, sampled)
    return out


def ids(out):
    return [s.request_id for s in out.seqs]


def test_background_runs_only_in_steps_without_foreground_and_resumes_with_its_blocks():
    sched = make()
    b = seq(8, "b", priority=1)
    sched.add(b)
    assert ids(step(sched)) == ["b"]  # alone: background work runs
    blocks = list(b.block_table)
    a = seq(8, "a", start=100)
    sched.add(a)
    for _ in range(4):  # a's prefill and decodes: b sits every step out, keeping its seat and blocks
        out = step(sched)
        assert ids(out) == ["a"]
        assert b.status == SequenceStatus.RUNNING and b.block_table == blocks
    assert a.is_finished and sched.num_foreground == 0
    assert ids(step(sched)) == ["b"]  # resumes where it was, not recomputed
    assert b.num_preemptions == 0


def test_waiting_background_is_not_admitted_beside_foreground():
    sched = make(max_num_batched_tokens=64)
    a = seq(8, "a")
    sched.add(a)
    sched.add(seq(8, "b", priority=1, start=200))
    assert ids(step(sched)) == ["a"]  # the budget has room for b's prefill, but b waits
    while not a.is_finished:
        assert ids(step(sched)) == ["a"]
    assert ids(step(sched)) == ["b"]


def test_foreground_preempts_paused_background_for_a_seat():
    sched = make(max_num_seqs=2)
    for i in range(2):
        sched.add(seq(8, f"b{i}", priority=1, start=100 * i, arrival=i))
    step(sched)
    sched.add(seq(8, "a", start=500, arrival=5))
    out = step(sched)
    assert ids(out) == ["a"]
    assert [s.request_id for s in out.preempted] == ["b1"]  # the later of the two background ones
    assert [s.request_id for s in sched.waiting] == ["b1"]


def test_foreground_preempts_paused_background_for_blocks():
    sched = make(num_blocks=6, block_size=4)  # 24 token slots
    b = seq(16, "b", priority=1)
    sched.add(b)
    step(sched)  # b holds 4 blocks (16 tokens, + room for its next token)
    a = seq(12, "a", start=100)
    sched.add(a)
    out = step(sched)
    assert ids(out) == ["a"] and out.preempted == [b]
    assert b.status == SequenceStatus.WAITING and not b.block_table


def test_without_background_priority_lower_priority_shares_steps():
    sched = make(background_priority=None, max_num_batched_tokens=64)
    sched.add(seq(8, "a"))
    sched.add(seq(8, "b", priority=1, start=200))
    assert ids(step(sched)) == ["a", "b"]  # vLLM's priority policy: order, not exclusion


def test_priority_preemption_reinserts_by_priority():
    sched = make(background_priority=None, num_blocks=5, block_size=4, max_num_batched_tokens=64)
    sched.add(seq(4, "lo", priority=5, max_tokens=8))
    sched.add(seq(4, "hi", priority=0, max_tokens=8, start=100))
    sched.add(seq(12, "mid", priority=2, max_tokens=8, start=200, arrival=1))
    for _ in range(6):
        out = step(sched)
        if out.preempted:
            break
    assert out.preempted and out.preempted[0].request_id == "lo"
    prios = [s.priority for s in sched.waiting]
    assert prios == sorted(prios)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_all_finish_and_the_foreground_count_returns_to_zero(policy):
    sched = make(policy=policy, num_blocks=24, max_num_seqs=4)
    seqs = [seq(6 + i % 5, f"r{i}", priority=i % 3, start=13 * i, arrival=i) for i in range(20)]
    for s in seqs:
        sched.add(s)
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        step(sched)
    assert all(s.is_finished for s in seqs) and sched.num_foreground == 0
    sched.add(seq(4, "x"))
    assert sched.abort("x") and sched.num_foreground == 0


# -- bounded background work in shared steps (engine.core.background) -------------------------------

def cost(b: BatchShape) -> float:
    """A toy step-time model: 10 ms, +20 ms for any prefill, +1 ms a decode, +0.1 ms a prefill token."""
    return 10 + (20 if b.prefill_tokens else 0) + b.decode_seqs + 0.1 * b.prefill_tokens


def filled(step_budget=None, solo_step=None, **kw):
    kw.setdefault("num_blocks", 256)
    return make(background_fill=BackgroundFill(cost, step_budget, solo_step), **kw)


def decoding(sched, seqs):
    for s in seqs:
        sched.add(s)
    for _ in range(100):
        if not any(s.num_computed_tokens < s.num_prompt_tokens for s in seqs):
            return
        step(sched)
    raise AssertionError("the background prefills never finished")


def test_background_decodes_join_a_foreground_step_within_the_budget():
    sched = filled(step_budget=2.0)
    bg = [seq(4, f"b{i}", priority=1, max_tokens=50, start=20 * i) for i in range(5)]
    decoding(sched, bg)
    a = seq(8, "a", start=500, max_tokens=50)
    sched.add(a)
    out = step(sched)  # a's prefill (30.8 ms): the bg prefills' fixed cost is already paid, decodes cost 1 ms
    assert ids(out)[0] == "a" and len(out) == 3
    assert cost(batch_shape(out.seqs, out.num_new_tokens)) <= 30.8 + 2
    out = step(sched)  # a decodes: 11 ms alone, two background decodes more
    assert ids(out)[0] == "a" and len(out) == 3
    assert all(s.status == SequenceStatus.RUNNING for s in bg)


def test_a_background_prefill_stays_out_of_a_decode_step_and_is_cut_to_fit_beside_a_prefill():
    sched = filled(step_budget=2.0, max_num_batched_tokens=256)
    a = seq(8, "a", max_tokens=20)
    sched.add(a)
    step(sched)
    b = seq(100, "b", priority=1, start=300)
    sched.add(b)
    assert ids(step(sched)) == ["a"]  # a prefill's fixed 20 ms would break a decode step's 2 ms
    c = seq(40, "c", start=700)
    sched.add(c)
    out = step(sched)  # c's prefill is in the step: b's prefill may add 2 ms = 20 tokens
    assert ids(out) == ["a", "c", "b"] and out.num_new_tokens[-1] == 20
    assert b.status == SequenceStatus.RUNNING and b.num_computed_tokens == 20


def test_without_a_step_budget_nothing_joins_and_the_solo_cap_keeps_background_steps_short():
    sched = filled(solo_step=14.0)
    bg = [seq(4, f"b{i}", priority=1, max_tokens=50, start=20 * i) for i in range(6)]
    for s in bg:
        sched.add(s)
    out = step(sched)  # alone: one prefill at least, though it exceeds 14 ms; then no other fits
    assert ids(out) == ["b0"] and ids(step(sched)) == ["b0"]
    sched.background_fill = BackgroundFill(cost, None, None)  # uncapped: the rest prefill at once
    assert len(step(sched)) == 6
    sched.background_fill = BackgroundFill(cost, None, 14.0)
    out = step(sched)  # decodes: 10 + 1 each, so 4 fit in 14 ms
    assert len(out) == 4 and cost(batch_shape(out.seqs, out.num_new_tokens)) <= 14
    sched.add(seq(8, "a", start=500))
    assert ids(step(sched)) == ["a"]  # no step budget: background sits foreground steps out


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_with_bounds_all_finish_and_no_blocks_leak(policy):
    sched = filled(step_budget=3.0, solo_step=20.0, policy=policy, num_blocks=24, max_num_seqs=4)
    seqs = [seq(6 + i % 5, f"r{i}", priority=i % 3, start=13 * i, arrival=i) for i in range(30)]
    for s in seqs:
        sched.add(s)
    for _ in range(3000):
        if not sched.has_unfinished():
            break
        step(sched)
    assert all(s.is_finished for s in seqs) and sched.num_foreground == 0
    assert sched.bm.num_free_blocks == 24


def test_the_bounds_need_a_background_priority_and_a_step_time_model():
    with pytest.raises(ValueError, match="background priority"):
        make(background_priority=None, background_fill=BackgroundFill(cost, 1.0, None))
    with pytest.raises(ValueError, match="--background-priority"):
        EngineArgs(background_step_budget=2.0)
    with pytest.raises(ValueError, match="milliseconds"):
        EngineArgs(background_priority=1, background_solo_step=-1.0)
    with pytest.raises(ValueError, match="step-time model"):
        background_fill(EngineArgs(background_priority=1, background_step_budget=2.0), object())
    assert background_fill(EngineArgs(background_priority=1), object()) is None
