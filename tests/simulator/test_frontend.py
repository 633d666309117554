"""A pool's HTTP front end (simulator.frontend): the probe's measured delays kept as quantiles, read from
the latency model by `frontend_from_model`, and drawn per request before the engine takes it."""

import numpy as np
import pytest

from simulator.frontend import QUANTILES, delay_quantiles, draw_ms, frontend_from_provenance
from simulator.latency import load_latency_model
from simulator.run import simulate
from simulator.scenario import load_scenario
from simulator.workload import Workload


def test_delay_quantiles_are_ascending_and_never_below_zero():
    q = delay_quantiles(np.array([-1.0, 2.0, 3.0, 4.0, 40.0]))
    assert len(q) == QUANTILES and q == sorted(q)
    assert q[0] == 0.0 and q[50] == 3.0 and q[100] == 40.0


@pytest.mark.parametrize("prov, quantiles, per_token", [
    ({"frontend_ms_quantiles": [1.0, 2.0, 4.0], "frontend_ms_per_prompt_token": 0.01}, (1.0, 2.0, 4.0), 0.01),
    ({"frontend_ms": 5.0}, (5.0,), 0.0),  # a model calibrated before the quantiles were kept: its median
])
def test_frontend_read_from_provenance(prov, quantiles, per_token):
    assert frontend_from_provenance(prov) == {"quantiles_ms": quantiles, "per_prompt_token_ms": per_token}


@pytest.mark.parametrize("prov, message", [
    ({}, "records no front end"),
    ({"frontend_ms_quantiles": [3.0, 2.0]}, "not non-negative and ascending"),
    ({"frontend_ms_quantiles": [-1.0, 2.0]}, "not non-negative and ascending"),
    ({"frontend_ms": 2.0, "frontend_ms_per_prompt_token": -1.0}, "frontend_ms_per_prompt_token = -1.0"),
])
def test_frontend_errors_say_what_is_wrong(prov, message):
    with pytest.raises(ValueError, match=message):
        frontend_from_provenance(prov)


def test_draws_follow_the_quantiles():
    fe = {"quantiles_ms": tuple(delay_quantiles(np.linspace(2.0, 6.0, 1000))), "per_prompt_token_ms": 0.0}
    rng = np.random.default_rng(0)
    draws = np.array([draw_ms(fe, rng, 100) for _ in range(20000)])
    assert draws.min() >= 2.0 and draws.max() <= 6.0
    assert np.percentile(draws, [10, 50, 90]) == pytest.approx([2.4, 4.0, 5.6], abs=0.05)
    plain = draw_ms(fe, np.random.default_rng(1), 100)
    fe["per_prompt_token_ms"] = 0.01  # plus 1 ms for a 100-token prompt
    assert draw_ms(fe, np.random.default_rng(1), 100) == pytest.approx(plain + 1.0)


def _model(tmp_path, prov: dict):
    m = load_latency_model("h100-llama2-70b-tp4")
    m.provenance = {**m.provenance, **prov}
    path = tmp_path / "server.model.json"
    m.save(path)
    return path


def _ttft(path, frontend: bool, seed: int = 0) -> np.ndarray:
    sc = load_scenario({"seed": seed, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                        "pools": [{"name": "p", "latency_model": str(path),
                                   "frontend_from_model": frontend}]})
    n = 400  # 2 s apart: every arrival finds the replica idle
    wl = Workload(np.arange(n) * 2.0, np.full(n, 128), np.full(n, 4))
    f = simulate(sc, workload=wl, plots=False).fleet
    return (f.requests.first_token - f.arrival_ps) / 1e9  # ms


def test_a_pool_with_a_front_end_adds_each_requests_drawn_delay(tmp_path):
    path = _model(tmp_path, {"frontend_ms_quantiles": list(np.linspace(2.0, 10.0, QUANTILES))})
    base, drawn = _ttft(path, False), _ttft(path, True)
    extra = drawn - base
    assert np.ptp(base) < 1e-6  # alike requests at an idle replica: one TTFT
    assert extra.min() >= 2.0 - 1e-6 and extra.max() <= 10.0 + 1e-6
    assert np.percentile(extra, [10, 50, 90]) == pytest.approx([2.8, 6.0, 9.2], abs=0.4)
    assert np.array_equal(drawn, _ttft(path, True))  # the scenario's seed fixes the draws


def test_a_constant_front_end_is_one_delay(tmp_path):
    path = _model(tmp_path, {"frontend_ms": 4.5})
    assert np.allclose(_ttft(path, True) - _ttft(path, False), 4.5, atol=1e-6)


def test_frontend_from_a_model_without_one_names_the_field(tmp_path):
    path = _model(tmp_path, {})
    with pytest.raises(ValueError, match="frontend_from_model.*records no front end"):
        _ttft(path, True)


@pytest.mark.parametrize("key", ["settings_from_model", "frontend_from_model"])
def test_an_unreadable_model_is_named_at_the_option_that_reads_it(tmp_path, key):
    path = tmp_path / "broken.model.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"{key}.*cannot read the latency model"):
        load_scenario({"seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                       "pools": [{"name": "p", "latency_model": str(path), key: True}]})
