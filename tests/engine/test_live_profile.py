"""The serving-run profile: step shapes read from a scheduled batch, the engine's step log, the
idle wake-up, the mean-matched fit, and the simulator's wake-up delay."""

import csv
import json

import numpy as np
import pytest

from engine.core.batch_shape import BatchShape, batch_shape
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.live_profile import LoadSpec, idle_arrival_waits
from engine.outputs import RequestMetrics


def _seq(prompt: int, output: int, computed: int) -> Sequence:
    seq = Sequence(list(range(3, 3 + prompt)), SamplingParams(max_tokens=64))
    seq.token_ids.extend([7] * output)
    seq.num_computed_tokens = computed
    return seq


@pytest.mark.parametrize(
    "batch, expected",
    [
        # a fresh prompt of 100 tokens in one chunk
        ([(100, 0, 0, 100)], BatchShape(100, 100, 1, 0, 0, 0)),
        # a 64-token chunk on 128 computed tokens of a 300-token prompt
        ([(300, 0, 128, 64)], BatchShape(64, 192, 1, 128, 0, 0)),
        # two decodes: 50-token prompt + 3 outputs (52 computed), 10 + 1 (10 computed)
        ([(50, 3, 52, 1), (10, 1, 10, 1)], BatchShape(0, 0, 0, 0, 2, 53 + 11)),
        # the last prompt token alone (a one-token chunk) is prefill, not a decode
        ([(40, 0, 39, 1)], BatchShape(1, 40, 1, 39, 0, 0)),
        # a preempted sequence recomputing its prompt and outputs is prefill
        ([(30, 5, 0, 34), (20, 2, 21, 1)], BatchShape(34, 34, 1, 0, 1, 22)),
    ],
)
def test_batch_shape(batch, expected):
    seqs = [_seq(p, o, c) for p, o, c, _ in batch]
    assert batch_shape(seqs, [n for *_, n in batch]) == expected


def test_phase_names():
    assert BatchShape(10, 10, 1, 0, 0, 0).phase == "prefill"
    assert BatchShape(0, 0, 0, 0, 3, 30).phase == "decode"
    assert BatchShape(10, 10, 1, 0, 3, 30).phase == "mixed"


@pytest.mark.parametrize(
    "requests, waits",
    [
        # (arrival, first scheduled, finish): the second arrives while the first runs
        ([(0.0, 0.001, 0.5), (0.2, 0.3, 0.9), (1.0, 1.0004, 1.2)], [0.001, 0.0004]),
        # out of order in the list; one that never finished is ignored
        ([(2.0, 2.002, 2.5), (0.0, 0.003, 1.0), (1.5, None, None)], [0.003, 0.002]),
        ([], []),
    ],
)
def test_idle_arrival_waits(requests, waits):
    metrics = [RequestMetrics(a, s, None if f is None else s, f) for a, s, f in requests]
    assert idle_arrival_waits(metrics) == pytest.approx(waits)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"requests": 0}, "requests"),
        ({"rate": 0.0}, "rate"),
        ({"prompt_tokens": (10, 5)}, "prompt_tokens"),
        ({"output_tokens": (0, 5)}, "output_tokens"),
    ],
)
def test_load_spec_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoadSpec(**kwargs)


def test_profile_from_run_cli(tmp_path, capsys):
    pytest.importorskip("torch")
    from slopilot.cli import main

    out = tmp_path / "serving.csv"
    argv = ["profile", "--from-run", "--model", "tiny", "--threads", "1", "--requests", "12", "--rate", "40",
            "--prompt-tokens", "20-60", "--output-tokens", "4-9", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    meta = json.loads(out.with_suffix(".meta.json").read_text())  # not serving.json: calibrate's name
    assert meta["from_run"]["load"]["requests"] == 12
    assert meta["from_run"]["wakeup_ms"] is None or meta["from_run"]["wakeup_ms"] >= 0
    assert all(float(r["latency_ms"]) > 0 for r in rows)
    # every token of the load is computed exactly once (random prompts: no prefix-cache hit, no
    # preemption with this KV cache): prompts in prefill steps, outputs but the first in decodes
    rng = np.random.default_rng(3)
    np.cumsum(rng.exponential(1 / 40, 12))
    prompts = rng.integers(20, 61, 12)
    outputs = rng.integers(4, 10, 12)
    assert sum(int(r["prefill_tokens"]) for r in rows) == prompts.sum()
    assert sum(int(r["decode_seqs"]) for r in rows) == (outputs - 1).sum()
    assert {r["phase"] for r in rows} <= {"prefill", "decode", "mixed"}


@pytest.mark.parametrize("flag, value", [("--prompt-tokens", "9-3"), ("--output-tokens", "x"),
                                         ("--requests", "0")])
def test_profile_from_run_rejects_bad_flags(tmp_path, capsys, flag, value):
    pytest.importorskip("torch")
    from slopilot.cli import main

    argv = ["profile", "--from-run", "--model", "tiny", "--out", str(tmp_path / "p.csv"), flag, value]
    assert main(argv) == 2
    assert flag.lstrip("-").replace("-", "_") in capsys.readouterr().err.replace("-", "_")


def test_match_mean_equals_the_measured_total():
    from simulator.latency.fit import fit, mean_scale, scale_params
    from simulator.latency.profile import parse_rows

    rng = np.random.default_rng(0)
    rows = []
    for _ in range(300):  # decode steps with noise skewed upward, like a busy machine's
        b, ctx = int(rng.integers(1, 33)), int(rng.integers(50, 400))
        ms = (1.0 + 0.05 * b + 0.0004 * b * ctx) * (1 + rng.exponential(0.15))
        rows.append({"device": "cpu", "model": "m", "dtype": "float32", "tp": "1", "phase": "decode",
                     "batch_size": str(b), "num_tokens": str(b), "context_tokens": str(b * ctx),
                     "latency_ms": f"{ms:.5f}"})
    prof = parse_rows(rows, list(rows[0]))
    robust, matched = fit(prof), fit(prof, match_mean=True)
    measured = prof.num["latency_ms"].sum()
    assert robust.predict_profile(prof).sum() < measured  # the typical step is below the mean one
    assert matched.predict_profile(prof).sum() == pytest.approx(measured, rel=1e-9)
    assert mean_scale(matched, prof) == pytest.approx(1.0, rel=1e-9)
    doubled = scale_params({"overhead_ms": 1.0, "decode_hinge_ms": [0.5, 1.0], "roof_p": 8.0}, 2.0)
    assert doubled == {"overhead_ms": 2.0, "decode_hinge_ms": [1.0, 2.0], "roof_p": 8.0}


def test_simulator_wakeup_delays_the_first_step_after_idle():
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.steptime import AffineStepModel
    from simulator.workload import Workload

    model = AffineStepModel(base_ms=2.0, prefill_token_ms=0.01, decode_seq_ms=0.0, decode_kv_ms=0.0)

    def run(wakeup_ms: float):
        sc = load_scenario({"seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                            "pools": [{"name": "p", "latency_model": "m", "wakeup_ms": wakeup_ms,
                                       "kv_blocks": 100}]})
        # a request to an idle replica, one 0.5 ms later (inside the wake-up), one after both finish
        wl = Workload(np.array([0.1, 0.1005, 1.0]), np.array([100, 100, 100]), np.array([1, 1, 1]))
        f = simulate(sc, workload=wl, plots=False, models={"m": model}).fleet
        return (f.requests.first_token - f.arrival_ps) / 1e9  # ms

    assert run(0.0) == pytest.approx([3.0, 3.0 + 2.5, 3.0])  # the second waits for the first step
    # with a 1 ms wake-up both early requests join the first step, 1 ms after the first arrival
    assert run(1.0) == pytest.approx([1.0 + 4.0, 0.5 + 4.0, 1.0 + 3.0])


def test_wakeup_ms_is_checked():
    from simulator.scenario import load_scenario

    with pytest.raises(ValueError, match=r"wakeup_ms"):
        load_scenario({"workload": {"trace": {"format": "csv", "path": "x.csv"}},
                       "pools": [{"name": "p", "latency_model": "m", "wakeup_ms": -1}]})
