"""P/D correctness: greedy tokens through a prefill engine + a decode engine (blocks moved over the
KV channel) equal one aggregated engine's, token for token, with prefix-cache hits on either side."""

from __future__ import annotations

import random

import pytest

from tests.engine.engine_helpers import save_random_llama
from tests.engine.kv_transfer_helpers import connector, decode, engine, greedy, prefill, run

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # the tiny test Llama's shape, with room for 2,000-token prompts
    return str(save_random_llama(tmp_path_factory.mktemp("llama_pd"), max_position_embeddings=4096))


def prompts(full: bool, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(3, 384) for _ in range(2000)]
    if not full:  # the fast suite's cut: 1 to 2,000 tokens, a prefix hit on both sides
        return [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 17)] + [base[:1000], base[:2000]]
    fresh = [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 2, 15, 16, 17, 33, 64, 257)]
    # base[:700] then base[:1400] then all of it: prefix-cache hits on both sides; the 1-token
    # extension of an exact block multiple checks the recomputed tail
    return fresh + [base[:700], base[:1400], base[:2000], base[:1024], base[:1025]]


@pytest.mark.parametrize("block_size,full", [(16, False), (32, False),
                                             pytest.param(16, True, marks=pytest.mark.slow),
                                             pytest.param(32, True, marks=pytest.mark.slow)])
def test_pd_pair_matches_aggregated(model_dir, block_size, full):
    agg = engine(model_dir, block_size)
    p, d = engine(model_dir, block_size), engine(model_dir, block_size)
    pc, dc = connector(p, "kv_producer"), connector(d, "kv_consumer")
    try:
        moved, full = 0, 0
        for i, ids in enumerate(prompts(full)):
            want = run(agg, ids, greedy(MAX_TOKENS), f"a{i}").output_token_ids
            params = prefill(p, pc, ids, f"r{i}")
            before = dc.consumer.blocks_received
            seq, error = decode(d, dc, ids, params, f"r{i}", MAX_TOKENS)
            assert error is None
            assert seq.output_token_ids == want, (len(ids), seq.output_token_ids, want)
            full_blocks = (len(ids) - 1) // block_size
            assert len(params["remote_block_ids"]) == full_blocks
            # D computed only the tail past what it pulled or had cached
            assert seq.num_cached_tokens == full_blocks * block_size
            moved += dc.consumer.blocks_received - before
            full += full_blocks
            pc.tick()
            assert not pc.producer.leases  # the consumer's confirmation ended the lease
            assert p.block_manager.check_no_leak() == []
            assert d.block_manager.check_no_leak() == []
        assert dc.consumer.num_failed == 0
        assert 0 < moved < full  # D's own prefix-cache hits were not moved again
    finally:
        pc.close()
