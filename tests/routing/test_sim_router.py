"""Routing policies: pure scoring over plain replica state."""

from dataclasses import dataclass

import pytest

from routing.router import PrefixIndex, Router, prefix_hashes


@dataclass
class R:
    id: int
    num_waiting: int = 0
    num_running: int = 0
    outstanding: int = 0
    kv_usage: float = 0.0


def test_round_robin_cycles():
    reps = [R(0), R(1), R(2)]
    r = Router("round_robin")
    assert [r.pick(reps) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    "policy,reps,expected",
    [
        ("least_outstanding", [R(0, outstanding=5), R(1, outstanding=2), R(2, outstanding=3)], 1),
        (
            "least_waiting",
            [R(0, num_waiting=3, outstanding=1), R(1, num_waiting=0, outstanding=9), R(2, num_waiting=2)],
            1,
        ),
        ("kv_aware", [R(0, kv_usage=0.9), R(1, kv_usage=0.5), R(2, kv_usage=0.7)], 1),
    ],
)
def test_least_loaded_policies(policy, reps, expected):
    assert Router(policy).pick(reps) == expected


def test_ties_are_broken_in_turn():
    reps = [R(0, outstanding=1), R(1, outstanding=0), R(2, outstanding=0), R(3, outstanding=0)]
    r = Router("least_outstanding")
    picks = {r.pick(reps) for _ in range(6)}
    assert picks == {1, 2, 3}


def test_random_is_seeded():
    reps = [R(i) for i in range(5)]
    a = [Router("random", seed=7).pick(reps) for _ in range(1)]
    r1, r2 = Router("random", seed=7), Router("random", seed=7)
    assert [r1.pick(reps) for _ in range(20)] == [r2.pick(reps) for _ in range(20)]
    assert a[0] in range(5)


def test_prefix_affinity_follows_the_shared_prefix_within_a_load_bound():
    reps = [R(0), R(1), R(2)]
    r = Router("prefix_affinity", block_tokens=4)
    conv = list(range(100, 140))
    first = r.pick(reps, conv)
    reps[first].outstanding = 1
    # the follow-up turn extends the prompt: it goes back to the same replica although it is busier
    assert r.pick(reps, conv + [7, 8, 9, 10]) == first
    # but not when that replica is far busier than the others (bounded load)
    reps[first].outstanding = 50
    assert r.pick(reps, conv + [1, 2, 3, 4]) != first


def test_weighted_filter_score_pick():
    reps = [
        R(0, kv_usage=0.99, num_waiting=0),
        R(1, kv_usage=0.3, num_waiting=4),
        R(2, kv_usage=0.5, num_waiting=1),
    ]
    r = Router("weighted", weights={"kv": 1.0, "queue": 1.0}, kv_threshold=0.95)
    # replica 0 is filtered out as saturated; 2 wins on queue (1 vs 4) despite more KV use
    assert r.pick(reps) == 2
    # when every replica is saturated none is filtered
    sat = [R(0, kv_usage=0.99), R(1, kv_usage=0.97)]
    assert r.pick(sat) == 1


def test_session_affinity_keeps_a_session_on_its_replica_and_forgets_a_gone_one():
    reps = [R(0, num_waiting=0), R(1, num_waiting=1), R(2, num_waiting=3)]
    r = Router("weighted", weights={"queue": 1.0, "session": 2.0})
    assert r.pick(reps, session="a") == 0  # new session: the least waiting
    reps[0].num_waiting, reps[1].num_waiting = 3, 0
    assert r.pick(reps, session="a") == 0  # the session's weight outbids the queue
    assert r.pick(reps, session="b") == 1  # another session goes by load
    assert r.pick(reps) == 1  # no session header: by load
    assert r.pick([reps[1], reps[2]], session="a") == 0  # its replica is gone: by load among the rest


def test_prefix_index_lru_and_match():
    idx = PrefixIndex(capacity_blocks=3)
    idx.record(0, [1, 2, 3])
    assert idx.match(0, [1, 2, 9]) == 2
    idx.record(0, [4])  # evicts the least recent (1)
    assert idx.match(0, [1, 2]) == 0
    assert idx.match(5, [1]) == 0
    h = prefix_hashes(list(range(20)), 8)
    assert len(h) == 2 and h == prefix_hashes(list(range(20)) + [99], 8)
