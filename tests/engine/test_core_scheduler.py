"""Scheduler and block manager semantics, without a model: tokens are sampled by a stub."""

import random

import pytest

from engine.core.batch_shape import BatchShape, batch_shape
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import RequestRejected, Scheduler
from engine.core.sequence import Sequence, SequenceStatus


def make(num_blocks=32, block_size=4, **kw):
    bm = BlockManager(num_blocks, block_size)
    return bm, Scheduler(bm, **kw)


def seq(n, max_tokens=4, rid=None, start=10, **kw):
    return Sequence(list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    request_id=rid, **kw)


def run_step(sched, token=7):
    out = sched.schedule()
    sampled = [token if s.num_computed_tokens + n == len(s) else None
               for s, n in zip(out.seqs, out.num_new_tokens)]
    return out, sched.update(out, sampled)


def drain(sched, limit=10_000):
    finished = []
    for _ in range(limit):
        if not sched.has_unfinished():
            return finished
        finished += run_step(sched)[1]
    raise AssertionError("scheduler did not drain")


def test_decodes_first_then_prefills_fill_budget_and_chunk():
    bm, sched = make(max_num_batched_tokens=10)
    a, b = seq(4, rid="a"), seq(20, rid="b", start=100)
    sched.add(a)
    run_step(sched)  # a prefilled, now decoding
    sched.add(b)
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["a", "b"]
    assert out.num_new_tokens == [1, 9]  # the decode, then b chunked into the remaining budget
    assert batch_shape(out.seqs, out.num_new_tokens) == BatchShape(9, 9, 1, 0, 1, 5)
    sched.update(out, [7 if s.num_computed_tokens + n == len(s) else None
                       for s, n in zip(out.seqs, out.num_new_tokens)])
    out, _ = run_step(sched)
    assert out.num_new_tokens == [1, 9]


def test_max_num_seqs_caps_running():
    _, sched = make(max_num_seqs=2)
    for i in range(4):
        sched.add(seq(3, rid=str(i)))
    out, _ = run_step(sched)
    assert len(out.seqs) == 2 and len(sched.waiting) == 2


def test_newest_running_request_is_preempted_and_recomputed():
    bm, sched = make(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a, b = seq(8, max_tokens=8, rid="a"), seq(8, max_tokens=8, rid="b")
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both admitted: 4 blocks used
    finished = drain(sched)
    assert sched.num_preemptions > 0 and b.num_preemptions > 0 and a.num_preemptions == 0
    assert {s.request_id for s in finished} == {"a", "b"}
    assert all(len(s.output_token_ids) == 8 for s in (a, b))
    assert bm.check_no_leak() == []


def test_priority_policy_preempts_lowest_priority():
    _, sched = make(num_blocks=6, block_size=4, policy="priority")
    low, high = seq(8, max_tokens=8, rid="low", priority=5), seq(8, max_tokens=8, rid="high", priority=0)
    sched.add(low)
    sched.add(high)
    assert sched.waiting[0] is high  # lower value is served first
    drain(sched)
    assert low.num_preemptions > 0 and high.num_preemptions == 0


def test_prefix_cache_hits_and_lru_eviction():
    bm, sched = make(num_blocks=8, block_size=4)
    first = seq(13, max_tokens=1, rid="first")
    sched.add(first)
    drain(sched)
    assert bm.num_free_blocks == 8 and len(bm.cached) == 3  # 3 full blocks stay cached, evictable
    again = seq(13, max_tokens=1, rid="again")
    sched.add(again)
    run_step(sched)
    assert again.num_cached_tokens == 12 and bm.prefix_cache_hits == 12
    assert bm.prefix_cache_queries == 26
    # a full-block prompt recomputes its last block: at least one token is always computed
    exact = seq(12, max_tokens=1, rid="exact")
    sched.add(exact)
    run_step(sched)
    assert exact.num_cached_tokens == 8
    drain(sched)
    # filling the pool with other content evicts the cached blocks, least recent first
    other = seq(31, max_tokens=1, rid="other", start=500)
    sched.add(other)
    drain(sched)
    assert not any(h in bm.cached for h in first.block_hashes)
    assert bm.check_no_leak() == []


def test_requests_that_can_never_fit_are_rejected_clearly():
    _, sched = make(num_blocks=4, block_size=4, max_model_len=100)
    with pytest.raises(RequestRejected, match="KV cache holds 16 tokens"):
        sched.add(seq(20))
    _, sched = make(num_blocks=64, block_size=4, max_model_len=10)
    with pytest.raises(RequestRejected, match="max_model_len is 10"):
        sched.add(seq(10))
    with pytest.raises(RequestRejected, match="empty"):
        sched.add(Sequence([]))
    ok = seq(5, max_tokens=100)
    sched.add(ok)
    drain(sched)
    assert ok.finish_reason == "length" and len(ok) == 10  # capped at max_model_len


def test_abort_at_every_stage_frees_blocks():
    rng = random.Random(0)
    bm, sched = make(num_blocks=20, block_size=4, max_num_batched_tokens=8, max_num_seqs=4)
    seqs = [seq(rng.randint(1, 30), max_tokens=rng.randint(1, 12), rid=str(i), start=rng.randint(0, 3))
            for i in range(40)]
    for s in seqs:
        sched.add(s)
    steps = 0
    while sched.has_unfinished():
        run_step(sched)
        steps += 1
        if steps % 3 == 0:  # abort a random live request, waiting or running, mid-prefill or not
            live = list(sched.waiting) + list(sched.running)
            victim = rng.choice(live)
            assert sched.abort(victim.request_id)
    assert all(s.status == SequenceStatus.FINISHED for s in seqs)
    assert {s.finish_reason for s in seqs} <= {"length", "abort"}
    assert any(s.finish_reason == "abort" for s in seqs)
    assert not sched.abort("no-such-request")
    assert bm.check_no_leak() == []
    assert bm.usage == 0.0
