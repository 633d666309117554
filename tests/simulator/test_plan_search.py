"""The planner's searches and oracle on made-up verdicts (no simulation): table-tested arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.planner.oracle import oracle, plan_steps
from simulator.planner.search import capacity_search, fleet_search, grid_rate, lockstep


def drive(search, meets):
    """Runs a search against a verdict function; returns (answer, points tried)."""
    tried = []
    point = next(search)
    while True:
        tried.append(point)
        try:
            point = search.send(meets(point))
        except StopIteration as stop:
            return stop.value, tried


@pytest.mark.parametrize("true_capacity", [0.013, 0.3, 1.0, 2.7, 55.0, 900.0])
@pytest.mark.parametrize("start", [0.5, 1.0, 20.0])
def test_capacity_search_finds_neighbouring_grid_rates(true_capacity, start):
    (met, missed), tried = drive(capacity_search(start, 0.05, 0.01, 1e5), lambda r: r <= true_capacity)
    assert met <= true_capacity < missed
    assert missed == pytest.approx(met * 1.05)  # tight to one grid step
    assert met in tried and missed in tried
    assert len(tried) <= 20  # about log2 of the range plus a few jumps


def test_capacity_search_limits():
    assert drive(capacity_search(1.0, 0.05, 0.01, 1e5), lambda r: False)[0][0] == 0.0
    (met, missed), _ = drive(capacity_search(1.0, 0.05, 0.01, 1e3), lambda r: True)
    assert missed == math.inf and met <= 1e3
    assert grid_rate(2.0, 0.05, 3) == pytest.approx(2.0 * 1.05**3)


@pytest.mark.parametrize("need", [1, 2, 3, 7, 8, 9, 40, 200])
@pytest.mark.parametrize("start", [1, 5, 8, 30])
def test_fleet_search_equals_the_smallest_count_that_meets(need, start):
    answer, tried = drive(fleet_search(start, 256), lambda n: n >= need)
    assert answer == need
    assert need in tried and (need == 1 or need - 1 in tried)  # both sides of the answer were run
    brute = min(n for n in range(1, 257) if n >= need)
    assert answer == brute
    assert len(tried) <= 2 * math.ceil(math.log2(max(abs(need - start), 1) + 1)) + 2


def test_fleet_search_gives_up_at_the_maximum():
    assert drive(fleet_search(3, 10), lambda n: False)[0] is None
    assert drive(fleet_search(50, 10), lambda n: n >= 10)[0] == 10


def test_lockstep_runs_searches_side_by_side():
    caps = [1.0, 3.0, 0.4]
    lock = lockstep([capacity_search(1.0, 0.05, 0.01, 1e5) for _ in caps])
    points, rounds = next(lock), 0
    while True:
        rounds += 1
        try:
            points = lock.send([None if p is None else p <= c for p, c in zip(points, caps)])
        except StopIteration as stop:
            answers = stop.value
            break
    assert [a[0] <= c < a[1] for a, c in zip(answers, caps)] == [True, True, True]
    assert rounds == max(len(drive(capacity_search(1.0, 0.05, 0.01, 1e5), lambda r, c=c: r <= c)[1])
                         for c in caps)


def test_oracle_needs_and_bills_ahead():
    # 30 arrivals in minute 0, 300 in minute 2, none else; 2.5 req/s a replica, 2-minute startup
    times = np.concatenate([np.linspace(0, 59, 30), np.linspace(120, 179, 300)])
    need, billed = oracle(times, 300, 2.5, 120)
    assert need.tolist() == [1, 1, 2, 1, 1]
    assert billed.tolist() == [2, 2, 2, 1, 1]  # minute 2's replicas are paid from minute 0
    assert plan_steps(billed) == [{"at": 0.0, "replicas": 2}, {"at": 180.0, "replicas": 1}]
    with pytest.raises(ValueError):
        oracle(times, 300, 0.0, 120)
