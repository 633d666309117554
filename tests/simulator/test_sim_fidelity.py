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
"""


import numpy as np
import pytest

RATE = 12.0  # requests/s
ENGINE = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "block_size": 16}


def _workload(n: int, rate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals -= arrivals[0]
    prompt = rng.integers(64, 193, n)
    output = rng.integers(16, 49, n)
    return arrivals, prompt, output


def _prompts(lengths, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 256, p)] for p in lengths]


def _engine_run(arrivals, prompt, output):
    from engine.core.sampling_params import SamplingParams
    from engine.llm import LLM

    llm = LLM("tiny", **ENGINE)
    params = [SamplingParams(temperature=0.0, max_tokens=int(o), ignore_eos=True) for o in output]
    llm.generate(_prompts(prompt[:8], seed=2), params[:8])  # warm up on other prompts (no cache hits)
    outs = llm.generate(_prompts(prompt, seed=1), params, arrival_times=list(arrivals))
    ttft = np.array([o.metrics.ttft for o in outs])
    e2e = np.array([o.metrics.e2e for o in outs])
    gen = np.array([len(o.token_ids) for o in outs])
    assert (gen == output).all()
    tpot = (e2e - ttft) / np.maximum(gen - 1, 1)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def _calibrate(tmp_path, requests: int):
    """A serving profile of a calibration run (seed 11, prompts 32-256, outputs 8-64), fitted."""
    from simulator.latency.fit import fit
    from simulator.latency.profile import read_metadata, read_profile
    from slopilot.cli import main

    csv_path = tmp_path / "tiny-serving.csv"
    argv = ["profile", "--from-run", "--model", "tiny", "--out", str(csv_path), "--threads", "1",
            "--requests", str(requests), "--rate", str(RATE), "--prompt-tokens", "32-256",
            "--output-tokens", "8-64", "--seed", "11", "--max-num-seqs", str(ENGINE["max_num_seqs"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--block-size", str(ENGINE["block_size"])]
    assert main(argv) == 0
    wakeup_ms = read_metadata(csv_path)["from_run"]["wakeup_ms"]
    return fit(read_profile(csv_path), match_mean=True), wakeup_ms or 0.0


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


def _compare(tmp_path, n: int, p50_tol: float, p90_tol: float, pairs: int = 1,
             record: str | None = None) -> dict:
    """`pairs` times: calibrate, then run the engine and the simulator on the test workload; each
    percentile's error is the median over the pairs (a shared machine's speed drifts between runs)."""
    arrivals, prompt, output = _workload(n, RATE)
    errors: dict[str, list[float]] = {}
    for pair in range(pairs):
        model, wakeup_ms = _calibrate(tmp_path / f"pair{pair}", requests=n)
        real = _engine_run(arrivals, prompt, output)
        sim = _sim_run(arrivals, prompt, output, model, wakeup_ms)
        print(f"pair {pair}: idle wake-up {wakeup_ms:.3f} ms")
        for k in ("ttft", "tpot", "e2e"):
            for q in (50, 90):
                r, s = np.percentile(real[k], q), np.percentile(sim[k], q)
                e = s / r - 1
                print(f"  {k} p{q}: engine {r * 1000:.2f} ms, sim {s * 1000:.2f} ms ({100 * e:+.1f}%)")
                errors.setdefault(f"{k} p{q}", []).append(e)
    report = {k: float(np.median(v)) for k, v in errors.items()}
    print("median error over the pairs: " + ", ".join(f"{k} {100 * e:+.1f}%" for k, e in report.items()))
    if record:  # docs/benchmarks/sim_fidelity.md's table, when asked for (bench/pages.py)
        from bench.pages import record_from_test

        bar = {k: p50_tol if k.endswith("p50") else p90_tol for k in report}
        record_from_test(record, ["measure", "sim / engine - 1, each pair", "median", "bar"],
                         [[k.upper(), ", ".join(f"{100 * e:+.1f}%" for e in errors[k]), f"{100 * e:+.1f}%",
                           f"{100 * bar[k]:.0f}%"] for k, e in report.items()],
                         [f"The real engine (`tiny`, CPU, one torch thread), {n} Poisson requests at "
                          f"{RATE:g}/s, against the simulator calibrated on a separate serving run; {pairs} "
                          "calibrate-serve-simulate pairs."])
    for k, e in report.items():
        assert abs(e) <= (p50_tol if k.endswith("p50") else p90_tol), (k, report)
    return report


@pytest.mark.slow
def test_fidelity_tiny_cpu_300_requests(tmp_path, one_thread):
    _compare(tmp_path, 300, p50_tol=0.10, p90_tol=0.15, pairs=3, record="sim_fidelity_engine.json")


def test_fidelity_tiny_cpu_short(tmp_path, one_thread):
    _compare(tmp_path, 120, p50_tol=0.50, p90_tol=float("inf"))
