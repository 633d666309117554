"""The chained block hash shared by the block manager's prefix cache and the router's prefix scores."""

from engine.core.block_hash import ROOT, block_hashes
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from routing.router import prefix_hashes


def test_common_prefix_shares_hashes_until_the_first_differing_block():
    a = list(range(64))
    b = a[:40] + [999] + a[41:]  # differs inside block 2 (tokens 32..47) of 16-token blocks
    ha, hb = list(block_hashes(a, 16, 0, 4)), list(block_hashes(b, 16, 0, 4))
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]  # the chain carries the difference
    assert len(set(ha)) == 4


def test_resuming_the_chain_gives_the_same_hashes():
    ids = list(range(100))
    whole = list(block_hashes(ids, 8, 0, 12))
    assert list(block_hashes(ids, 8, 5, 12, parent=whole[4])) == whole[5:]
    assert list(block_hashes(ids, 8, 0, 0)) == [] and whole[0] == hash((ROOT, tuple(ids[:8])))


def test_block_manager_and_router_hash_alike():
    ids = list(range(1000, 1100))
    seq = Sequence(ids, SamplingParams(max_tokens=1))
    bm = BlockManager(32, 16)
    bm.admit(seq, [], [])
    assert bm.append_slots(seq, len(ids))
    seq.num_computed_tokens = len(ids)
    bm.cache_full_blocks(seq)
    assert seq.block_hashes == prefix_hashes(ids, 16) == list(block_hashes(ids, 16, 0, 6))
    blocks, hashes = bm.lookup_prefix(Sequence(ids + [1], SamplingParams(max_tokens=1)))
    assert hashes == seq.block_hashes and blocks == seq.block_table[:6]
