"""Steady-state runs of the planner (simulator.planner.steady, simulator.planner.peakruns) and a
scenario's `warmup`: the trend test, the doubling rule driven with made-up results, the re-check of a
static fleet raising it while it misses, and the warm-up's requests left out of the SLOs."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.planner.peakruns import merged
from simulator.planner.steady import rising, steady_runs, waiting_means, with_length
from simulator.report import request_table
from simulator.run import simulate
from simulator.scenario import load_scenario


def test_a_rising_queue_is_rising_and_a_flat_noisy_one_is_not():
    rng = np.random.default_rng(0)
    assert rising(list(np.linspace(0.1, 4.0, 10) + rng.normal(0, 0.2, 10)))["rising"]
    assert not rising(list(0.5 + rng.normal(0, 0.2, 10)))["rising"]
    assert not rising([0.0] * 10)["rising"]
    assert not rising(list(np.linspace(4.0, 0.1, 10)))["rising"]  # draining is not growing


def test_a_request_never_scheduled_waited_until_the_end():
    arrival = np.array([0.5, 1.5, 2.5, 3.5])
    queue = np.array([0.1, 0.2, np.nan, 0.4])
    assert waiting_means(arrival, queue, 0.0, 4.0, sim_end=10.0, slices=4) == pytest.approx(
        [0.1, 0.2, 7.5, 0.4])


def test_with_length_discards_the_first_third():
    assert with_length({"duration": 180, "x": 1}, 900) == {"duration": 900.0, "warmup": 300.0, "x": 1}


def _result(met: bool, stationary: bool) -> dict:
    slo = {"ttft": {"attainment": 0.95 if met else 0.5, "percentile": 90}}
    return {"summary": {"slo": slo}, "steady": {"stationary": stationary}}


def drive(task, verdicts):
    """Sends each yielded job the next made-up result; returns (jobs asked, the task's answer)."""
    asked = []
    try:
        jobs = next(task)
        while True:
            asked.append(jobs[0])
            jobs = task.send([verdicts(*jobs[0])])
    except StopIteration as stop:
        return asked, stop.value


def test_a_run_that_meets_while_its_queue_rises_is_run_twice_as_long_on_every_seed():
    # stationary only from 720 s on: 180 and 360 are redone; every seed runs at the final length
    asked, (duration, results, runs) = drive(
        steady_runs(lambda seed, d: (seed, d), [1, 2], 180, 1800),
        lambda seed, d: _result(True, d >= 720))
    assert asked == [(1, 180), (1, 360), (1, 720), (2, 720)]
    assert duration == 720 and len(results) == 2 and runs == 4


def test_a_miss_is_final_and_the_length_stops_at_the_maximum():
    asked, (duration, results, _) = drive(steady_runs(lambda s, d: (s, d), [1, 2], 180, 1800),
                                          lambda seed, d: _result(False, False))
    assert asked == [(1, 180)] and duration == 180 and len(results) == 1
    asked, (duration, _, _) = drive(steady_runs(lambda s, d: (s, d), [1], 180, 1000),
                                    lambda seed, d: _result(True, False))
    assert asked == [(1, 180), (1, 360), (1, 720)] and duration == 720  # 1440 > 1000


def test_the_recheck_keeps_the_count_below_that_missed_and_the_longest_runs():
    searched = {"replicas": 7, "duration": 180, "checked": [
        {"replicas": 6, "met": False, "duration": 180, "slo": {"ttft": 9.0}},
        {"replicas": 7, "met": True, "duration": 180, "slo": {"ttft": 1.0}}]}
    answer = {"replicas": 8, "duration": 900, "slo_at_peak": {"ttft": 0.3}, "entries": [
        {"replicas": 7, "met": False, "duration": 900, "slo": {"ttft": 3.4}, "recheck": True},
        {"replicas": 8, "met": True, "duration": 900, "slo": {"ttft": 0.3}, "recheck": True}]}
    out = merged(searched, answer)
    assert out["replicas"] == 8 and out["searched_replicas"] == 7 and out["duration"] == 900
    assert out["fewer_missed"]["replicas"] == 7 and out["fewer_missed"]["duration"] == 900
    assert [c["replicas"] for c in out["checked"]] == [6, 7, 7, 8]


SCENARIO = """
duration: 120
workload:
  arrivals: {rate: 2.0}
  prompt_tokens: {dist: constant, value: 500}
  output_tokens: {dist: constant, value: 50}
pools: [{name: a, latency_model: h100-llama2-70b-tp4, replicas: 1}]
slo: {ttft: {percentile: 90, seconds: 2.0}}
"""


def test_a_scenario_warmup_leaves_its_first_requests_out_of_the_slos():
    res = simulate(load_scenario(SCENARIO + "warmup: 60\n"), plots=False)
    req = request_table(res.fleet)
    later = (req["arrival"] >= 60) & (np.arange(len(req["arrival"])) < res.fleet.arrived)
    within = (req["status"] == 1) & (req["ttft"] <= 2.0)
    s = res.summary
    assert s["warmup"] == 60 and 0 < later.sum() < s["requests"]["arrived"]
    assert s["slo"]["ttft"]["attainment"] == pytest.approx(within[later].mean())
    assert s["slo"]["ttft"]["value_at_percentile"] == pytest.approx(np.percentile(req["ttft"][later], 90))


def test_a_warmup_as_long_as_the_run_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"warmup: must be below the duration \(120 s\), got 120"):
        load_scenario(SCENARIO + "warmup: 120\n")
