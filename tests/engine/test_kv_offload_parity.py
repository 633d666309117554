"""Must-show 3 of the KV-tiers issue: greedy outputs with blocks restored from the offload tier equal
those computed fresh (no prefix cache at all), under randomized eviction pressure on both tiers."""

from __future__ import annotations

import random

import pytest

from engine.args import EngineArgs
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine

BLOCK = 16
TINY_BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * BLOCK  # K+V x 2 layers x 2 kv heads x head_dim 16 x fp32, per token


def conversations(n_requests: int, rng: random.Random) -> list[list[int]]:
    """Multi-turn traffic: each request extends one of a few conversations (shared system prompt,
    then the history so far plus a new turn), so prefixes recur after other traffic evicted them."""
    system = [rng.randrange(258, 512) for _ in range(rng.choice((16, 40, 64)))]
    convs: list[list[int]] = [[] for _ in range(rng.randrange(4, 10))]
    out = []
    for _ in range(n_requests):
        i = rng.randrange(len(convs))
        turn = [rng.randrange(258, 512) for _ in range(rng.randrange(8, 120))]
        if len(convs[i]) + len(turn) > 360:  # the conversation ends; a new one starts in its place
            convs[i] = []
        convs[i] += turn
        out.append(system + convs[i] if i % 3 else list(convs[i]))
    return out


def drive(engine: LLMEngine, prompts: list[list[int]], max_tokens: list[int], rng: random.Random
          ) -> dict[str, list[int]]:
    """Adds requests in random bursts between steps; the greedy output of each, by request id."""
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4)) if engine.has_unfinished() else 1):
            if pending:
                i, p = pending.pop(0)
                params = SamplingParams(max_tokens=max_tokens[i], temperature=0.0, ignore_eos=True)
                engine.add_request(p, params, request_id=str(i))
        engine.step()
    return {rid: engine.pop_output(rid).token_ids for rid in list(engine.seqs)}


def run_case(seed: int, n_requests: int) -> dict[str, float]:
    rng = random.Random(seed)
    prompts = conversations(n_requests, rng)
    # a few long answers: decodes that outgrow the pool preempt, and the recompute may hit the tier
    max_tokens = [rng.randrange(1, 9) if rng.random() < 0.85 else rng.randrange(30, 80) for _ in prompts]
    device_blocks = rng.randrange(28, 48)  # a few conversations' worth: constant eviction
    tier_slots = rng.choice((8, 40, 160, 600))  # from thrashing to holding nearly everything
    seqs = rng.randrange(1, 5)
    chunked = rng.random() < 0.75  # off: each prompt whole in one step, so the budget holds a whole one
    budget = rng.choice((64, 512)) if chunked else 1024
    common = dict(model="tiny", num_kv_blocks=device_blocks, max_num_seqs=seqs, block_size=BLOCK,
                  enable_chunked_prefill=chunked, max_num_batched_tokens=budget)
    fresh = LLMEngine(EngineArgs(**common, enable_prefix_caching=False))
    tiered = LLMEngine(EngineArgs(**common, kv_offloading_size=tier_slots * TINY_BLOCK_BYTES / 2**30))
    assert tiered.block_manager.offload.num_slots == tier_slots
    want = drive(fresh, prompts, max_tokens, random.Random(seed + 1))
    got = drive(tiered, prompts, max_tokens, random.Random(seed + 2))
    assert len(want) == len(got) == n_requests
    bad = [rid for rid in want if want[rid] != got[rid]]
    assert not bad, f"seed {seed}: {len(bad)} differ, first {bad[0]}: {want[bad[0]]} vs {got[bad[0]]}"
    bm = tiered.block_manager
    assert bm.check_no_leak() == []  # device pool and the tier's books both clean
    tier = bm.offload
    return {"loaded": tier.loaded_blocks, "stored": tier.stored_blocks, "evicted": tier.index.evictions,
            "preemptions": tiered.scheduler.num_preemptions, "chunked": chunked,
            "hit_tokens": bm.offload_hits, "device_hit_tokens": bm.prefix_cache_hits}


def check_exercised(stats: list[dict[str, float]], every_path: bool = False) -> None:
    assert all(s["loaded"] > 0 and s["stored"] > 0 for s in stats), stats  # the tier was really used
    assert any(s["evicted"] > 0 for s in stats), stats  # and its own LRU overflowed somewhere
    assert all(s["hit_tokens"] == s["loaded"] * BLOCK for s in stats), stats
    if every_path:  # preempted requests recomputed, and prompts whole (chunked prefill off) and chunked
        assert any(s["preemptions"] > 0 for s in stats), stats
        assert {s["chunked"] for s in stats} == {True, False}, stats


def test_restored_blocks_match_fresh_fast():
    check_exercised([run_case(seed, 25) for seed in range(4)])  # 100 requests


@pytest.mark.slow
def test_restored_blocks_match_fresh_1000():
    check_exercised([run_case(seed, 100) for seed in range(100, 110)], every_path=True)  # 1,000 requests
