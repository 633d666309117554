"""Background requests (priority >= background_priority) yield whole steps to the others."""

import pytest

from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus


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
