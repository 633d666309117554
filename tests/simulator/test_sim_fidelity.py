"""Fidelity against the real engine: the `tiny` model on CPU serves a Poisson workload through
LLM.generate with real arrival times; the simulator, calibrated on the same model's profile and
given the same arrivals and lengths, must match the median TTFT, TPOT and E2E within 10% and the
p90 within 15%.

The profile is taken here, on this machine, just before the engine run: a profile from another
machine or another moment of a shared machine's load would be a different engine. It is a serving
profile (`slopilot profile --from-run`): every step of a separate calibration run (another seed,
a wider length mix) timed whole, fitted with the mean matched (`calibrate --match-mean`), plus the
idle engine's measured wake-up. Steps timed in isolation miss what a serving loop pays (shapes that
change every step, cold caches after an idle gap, the loop's bookkeeping); see docs/benchmarks.md.

Both runs use one torch thread (steadiest on a shared machine). The full check (300 requests) is
marked slow (three calibrate-then-serve pairs, the median error of each percentile over them,
about three minutes): wall-clock timing of 1-ms steps is at the mercy of other jobs on the same cores (with
two other busy processes the engine's steps ran 1.5-3x slower during the test run than during the
calibration run a minute before). The short variant (120 requests) in `make test` is a smoke check
of the whole pipeline: medians within 50%.

The same check on the ~80M-parameter model of the engine benchmarks (slow, about 15 minutes): 40
requests at 0.5/s (prompts 32-128, outputs 8-32), calibrated on 40-request serving runs (prompts
16-192, outputs 4-48). Its steps are 30-1,000 ms, so a run spans minutes, over which a shared CPU's
share moves; each test run is bracketed by a calibration run before and one after, and simulated
with the model fitted on both. Every pair prints the test run's measured step time over the model's
prediction per phase, the drift the simulator cannot see.
"""


import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "block_size": 16}


@dataclass(frozen=True)
class Setup:
    """A model and the loads it is calibrated on and tested with (sized to keep it about 60% busy)."""

    model: str  # preset name or checkpoint directory
    rate: float  # requests/s of both loads
    prompt: tuple[int, int]  # test load's uniform prompt lengths, inclusive
    output: tuple[int, int]
    calib_prompt: str  # the calibration run's wider mix (profile --from-run flags)
    calib_output: str
    calib_requests: int | None = None  # default: as many as the test load


TINY = Setup("tiny", 12.0, (64, 192), (16, 48), "32-256", "8-64")


def _workload(n: int, setup: Setup, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / setup.rate, n))
    arrivals -= arrivals[0]
    prompt = rng.integers(setup.prompt[0], setup.prompt[1] + 1, n)
    output = rng.integers(setup.output[0], setup.output[1] + 1, n)
    return arrivals, prompt, output


def _prompts(lengths, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 256, p)] for p in lengths]


def _engine_run(setup: Setup, arrivals, prompt, output):
    from engine.core.sampling_params import SamplingParams
    from engine.llm import LLM

    llm = LLM(setup.model, **ENGINE)
    params = [SamplingParams(temperature=0.0, max_tokens=int(o), ignore_eos=True) for o in output]
    llm.generate(_prompts(prompt[:8], seed=2), params[:8])  # warm up on other prompts (no cache hits)
    llm.engine.step_log = []  # the test run's steps, to check the model against (_step_ratios)
    outs = llm.generate(_prompts(prompt, seed=1), params, arrival_times=list(arrivals))
    steps, llm.engine.step_log = llm.engine.step_log, None
    ttft = np.array([o.metrics.ttft for o in outs])
    e2e = np.array([o.metrics.e2e for o in outs])
    gen = np.array([len(o.token_ids) for o in outs])
    assert (gen == output).all()
    tpot = (e2e - ttft) / np.maximum(gen - 1, 1)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "steps": steps}


def _step_ratios(model, steps) -> dict[str, float]:
    """Per phase, the test run's measured total step time over the calibrated model's prediction for
    the same step shapes: 1.0 when the engine ran as fast as in its calibration run."""
    from engine.profiler import step_row
    from simulator.latency.profile import parse_rows

    rows = [{k: str(v) for k, v in step_row(shape, [sec * 1000], device_name=model.device,
                                             model_name=model.model, dtype=model.dtype).items()}
            for shape, sec in steps]
    prof = parse_rows(rows, list(rows[0]))
    pred, meas = model.predict_profile(prof), prof.num["latency_ms"]
    return {ph: float(meas[prof.phase == ph].sum() / pred[prof.phase == ph].sum())
            for ph in sorted(set(prof.phase.tolist()))}


def _profile_run(tmp_path, setup: Setup, requests: int):
    """A serving profile of a calibration run (seed 11, the setup's wider mix): its CSV, the wake-up."""
    from simulator.latency.profile import read_metadata
    from slopilot.cli import main

    csv_path = tmp_path / "serving.csv"
    argv = ["profile", "--from-run", "--model", setup.model, "--out", str(csv_path), "--threads", "1",
            "--requests", str(requests), "--rate", str(setup.rate), "--prompt-tokens", setup.calib_prompt,
            "--output-tokens", setup.calib_output, "--seed", "11",
            "--max-num-seqs", str(ENGINE["max_num_seqs"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--block-size", str(ENGINE["block_size"])]
    assert main(argv) == 0
    return csv_path, read_metadata(csv_path)["from_run"]["wakeup_ms"] or 0.0


def _fit(runs: list) -> tuple:
    """`calibrate --match-mean` on the steps of the calibration runs together; their mean wake-up."""
    import csv

    from simulator.latency.fit import fit
    from simulator.latency.profile import read_profile

    rows = [r for path, _ in runs for r in csv.DictReader(path.open())]
    both = runs[-1][0].with_name("calibration.csv")
    with both.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return fit(read_profile(both), match_mean=True), float(np.mean([w for _, w in runs]))


def _sim_run(arrivals, prompt, output, model, wakeup_ms: float):
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    from simulator.workload import Workload

    sc = load_scenario(
        {
            "seed": 0,
            "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
            "pools": [
                {
                    "name": "cpu",
                    "latency_model": "calibrated",
                    "wakeup_ms": wakeup_ms,
                    "replicas": 1,
                    "max_num_seqs": ENGINE["max_num_seqs"],
                    "max_num_batched_tokens": ENGINE["max_num_batched_tokens"],
                    "kv_blocks": ENGINE["max_num_seqs"] * 2048 // 16,
                    "max_model_len": 2048,
                }
            ],
        }
    )
    res = simulate(
        sc,
        workload=Workload(arrivals, prompt.copy(), output.copy()),
        plots=False,
        models={"calibrated": model},
    )
    f = res.fleet
    t = lambda a: a / 1e12  # noqa: E731
    ttft = t(f.requests.first_token - f.arrival_ps)
    e2e = t(f.requests.finish - f.arrival_ps)
    tpot = (e2e - ttft) / np.maximum(f.requests.generated - 1, 1)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


@pytest.fixture
def one_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _compare(tmp_path, n: int, p50_tol: float, p90_tol: float, pairs: int = 1, setup: Setup = TINY,
             bracket: bool = False, record: str | None = None) -> dict:
    """`pairs` times: calibrate, then run the engine and the simulator on the test workload; each
    percentile's error is the median over the pairs (a shared machine's speed drifts between runs).

    bracket: every test run sits between two calibration runs (the next pair's is the one after) and
    is simulated with a model fitted on both: the engine's share of a shared CPU drifts over minutes,
    and a model from before alone carries the drift of a long run (80M model: the test run's steps
    ran 0.73-1.00x the time the calibration run before it predicted, at load 8-10)."""
    arrivals, prompt, output = _workload(n, setup)
    requests = setup.calib_requests or n
    errors: dict[str, list[float]] = {}
    before = _profile_run(tmp_path / "cal0", setup, requests)
    for pair in range(pairs):
        real = _engine_run(setup, arrivals, prompt, output)
        runs = [before]
        if bracket:
            before = _profile_run(tmp_path / f"cal{pair + 1}", setup, requests)
            runs.append(before)
        model, wakeup_ms = _fit(runs)
        sim = _sim_run(arrivals, prompt, output, model, wakeup_ms)
        ratios = ", ".join(f"{ph} {r:.2f}" for ph, r in _step_ratios(model, real["steps"]).items())
        print(f"pair {pair}: idle wake-up {wakeup_ms:.3f} ms; test-run steps / model: {ratios}; "
              f"load average {os.getloadavg()}")
        for k in ("ttft", "tpot", "e2e"):
            for q in (50, 90):
                r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
                e = s / r - 1
                print(f"  {k} p{q}: engine {r * 1000:.2f} ms, sim {s * 1000:.2f} ms ({100 * e:+.1f}%)")
                errors.setdefault(f"{k} p{q}", []).append(e)
        if not bracket and pair + 1 < pairs:
            before = _profile_run(tmp_path / f"cal{pair + 1}", setup, requests)
    report = {k: float(np.median(v)) for k, v in errors.items()}
    print("median error over the pairs: " + ", ".join(f"{k} {100 * e:+.1f}%" for k, e in report.items()))
    if record:  # docs/benchmarks/sim_fidelity.md's table, when asked for (bench/pages.py)
        from bench.pages import record_from_test

        bar = {k: p50_tol if k.endswith("p50") else p90_tol for k in report}
        record_from_test(record, ["measure", "sim / engine - 1, each pair", "median", "bar"],
                         [[k.upper(), ", ".join(f"{100 * e:+.1f}%" for e in errors[k]), f"{100 * e:+.1f}%",
                           f"{100 * bar[k]:.0f}%"] for k, e in report.items()],
                         [f"The real engine (`{Path(setup.model).name}`, CPU, one torch thread), {n} Poisson "
                          f"requests at {setup.rate:g}/s, against the simulator calibrated on a separate "
                          f"serving run{' before and one after' if bracket else ''}; {pairs} "
                          "calibrate-serve-simulate pairs."])
    for k, e in report.items():
        assert abs(e) <= (p50_tol if k.endswith("p50") else p90_tol), (k, report)
    return report


@pytest.mark.slow
def test_fidelity_tiny_cpu_300_requests(tmp_path, one_thread):
    _compare(tmp_path, 300, p50_tol=0.10, p90_tol=0.15, pairs=3, record="sim_fidelity_engine.json")


def test_fidelity_tiny_cpu_short(tmp_path, one_thread):
    _compare(tmp_path, 120, p50_tol=0.50, p90_tol=float("inf"))


M80_RATE, M80_REQUESTS = 0.5, 40  # 80M float32, one thread: ~0.3 s CPU a 100-token prefill, 30 ms a decode


def m80_setup() -> Setup:
    """The ~80M-parameter random Llama of the engine benchmarks (written once under build/)."""
    pytest.importorskip("transformers")
    from bench.bench_models import model_dir

    return Setup(str(model_dir("80m")), M80_RATE, (32, 128), (8, 32), "16-192", "4-48")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fidelity_80m_cpu(tmp_path, one_thread):
    _compare(tmp_path, M80_REQUESTS, p50_tol=0.10, p90_tol=0.15, pairs=3, setup=m80_setup(), bracket=True,
             record="sim_fidelity_engine_80m.json")

