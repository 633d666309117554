"""Interactive latency beside batch lines in virtual time: one engine (LLMEngine, its scheduler and
block manager, the emulated runner on a VirtualClock), no HTTP and no machine noise.

Interactive requests arrive as a Poisson process (distinct prompts, no shared prefix); batch lines
are kept `batch_inflight` at a time at the engine (sent with priority 1, as the router's
--batch-engine-priority 1 sends them) while the interactive load runs. Used by
bench/batch_isolation.py (the engine's capacity) and tests/engine/test_batch_isolation_virtual.py.

    .venv/bin/python bench/batch_virtual.py [--load 0.8] [--seconds 120]
    .venv/bin/python bench/batch_virtual.py --fill [--step-budget 3] [--solo-step 70]

--fill compares, at each load, background priority alone (batch lines only in steps with no
interactive work) with the engine's --background-step-budget/--background-solo-step bounds, on the
same arrivals: the change in interactive p90 against the load alone, and the batch lines finished.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.args import EngineArgs  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.emulated import EmulatedRunner, VirtualClock  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from simulator.latency import load_latency_model  # noqa: E402
from slopilot.commands.serve import emulated_kv  # noqa: E402

EMULATED = "h100-llama2-70b-tp4"
PROMPT, OUTPUT = 1000, 32  # interactive tokens in and out
BATCH_PROMPT, BATCH_OUTPUT = 64, 16


@dataclass
class Result:
    ttft_p90: float  # seconds
    tpot_p90: float
    requests: int
    batch_done: int  # batch lines finished while the interactive load ran
    batch_total: int  # and when those still out have finished after it


def engine(policy: str = "fcfs", background: int | None = None, step_budget: float | None = None,
           solo_step: float | None = None) -> tuple[LLMEngine, VirtualClock]:
    lat, clock = load_latency_model(EMULATED), VirtualClock()
    args = emulated_kv(EngineArgs(scheduling_policy=policy, background_priority=background,
                                  background_step_budget=step_budget, background_solo_step=solo_step), lat)
    runner = EmulatedRunner(lat, num_kv_blocks=args.kv_blocks(4096), block_size=args.block_size,
                            sleep=clock.sleep, clock=clock)
    return LLMEngine(args, runner=runner, clock=clock), clock


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(300, 500) for _ in range(n)]


def capacity(seconds: float = 60.0) -> float:
    """Interactive requests a second one engine finishes with a queue that never empties."""
    eng, clock = engine()
    rng = random.Random(0)
    for i in range(int(seconds * 20)):
        eng.add_request(tokens(rng, PROMPT), SamplingParams(max_tokens=OUTPUT, ignore_eos=True), f"r{i}", 0.0)
    done = 0
    while clock.now < seconds:
        done += sum(s.is_finished for s in eng.step())
    return done / clock.now


def run(rate: float, seconds: float, batch_inflight: int = 0, policy: str = "fcfs",
        background: int | None = None, seed: int = 1, step_budget: float | None = None,
        solo_step: float | None = None) -> Result:
    """The interactive load for `seconds` (then drained), with batch_inflight lines kept at the engine;
    step_budget/solo_step: the engine's --background-step-budget/--background-solo-step (ms)."""
    eng, clock = engine(policy, background, step_budget, solo_step)
    arrivals, rng, words = [], random.Random(seed), random.Random(seed + 1)
    t = rng.expovariate(rate)
    while t < seconds:
        arrivals.append(t)
        t += rng.expovariate(rate)
    inter, batch, done, i = [], [], 0, 0
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    batch_params = SamplingParams(max_tokens=BATCH_OUTPUT, ignore_eos=True)
    while i < len(arrivals) or any(not s.is_finished for s in inter):
        while i < len(arrivals) and arrivals[i] <= clock.now:
            inter.append(eng.add_request(tokens(words, PROMPT), params, f"i{i}", arrivals[i]))
            i += 1
        finished = [s for s in batch if s.is_finished]
        done += len(finished)
        batch = [s for s in batch if not s.is_finished]
        while len(batch) < batch_inflight:
            batch.append(eng.add_request(tokens(words, BATCH_PROMPT), batch_params, None, clock.now, 1))
        if eng.has_unfinished():
            eng.step()
        else:  # idle: on to the next arrival
            clock.now = max(clock.now, arrivals[i])
            eng.runner.idle()
    left = [s for s in batch if not s.is_finished]
    while eng.has_unfinished():
        eng.step()
    ttft = [s.first_token_time - s.arrival_time for s in inter]
    tpot = [(s.finish_time - s.first_token_time) / (s.num_output_tokens - 1) for s in inter]
    return Result(float(np.percentile(ttft, 90)), float(np.percentile(tpot, 90)), len(inter), done,
                  done + sum(s.is_finished for s in left))


@dataclass
class FillRow:
    load: float
    label: str
    ttft: float  # median over seeds of the change in TTFT p90 against no batch (a fraction)
    tpot: float
    lines: float  # median batch lines finished during the load


def fill_table(loads: tuple[float, ...], seconds: float, seeds: int, inflight: int = 64,
               step_budget: float = 3.0, solo_step: float | None = 70.0) -> list[FillRow]:
    """At each load: background priority alone ('before') and with the bounds ('after')."""
    cap, rows = capacity(), []
    for load in loads:
        alone = [run(load * cap, seconds, 0, "priority", 1, seed) for seed in range(1, seeds + 1)]
        for label, budget, solo in (("before", None, None), ("after", step_budget, solo_step)):
            runs = [run(load * cap, seconds, inflight, "priority", 1, seed, budget, solo)
                    for seed in range(1, seeds + 1)]
            rows.append(FillRow(load, label,
                                float(np.median([b.ttft_p90 / a.ttft_p90 - 1 for a, b in zip(alone, runs)])),
                                float(np.median([b.tpot_p90 / a.tpot_p90 - 1 for a, b in zip(alone, runs)])),
                                float(np.median([b.batch_done for b in runs]))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=float, default=0.8, help="interactive rate as a share of capacity")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--fill", action="store_true", help="before/after the background step bounds")
    ap.add_argument("--step-budget", type=float, default=3.0, metavar="MS")
    ap.add_argument("--solo-step", type=float, default=70.0, metavar="MS")
    ap.add_argument("--inflight", type=int, default=64, help="batch lines kept at the engine (--fill)")
    args = ap.parse_args()
    if args.fill:
        print(f"{args.inflight} batch lines at the engine, {args.seconds:g} s virtual, median of "
              f"{args.seeds} seeds; after: --background-step-budget {args.step_budget:g} "
              f"--background-solo-step {args.solo_step:g}")
        for r in fill_table((0.1, 0.25, 0.5, 0.8), args.seconds, args.seeds, args.inflight,
                            args.step_budget, args.solo_step):
            per_min = r.lines * 60 / args.seconds
            print(f"load {r.load:4.0%} {r.label:>6}: TTFT p90 {100 * r.ttft:+5.1f}%  TPOT p90 "
                  f"{100 * r.tpot:+5.1f}%  batch lines {r.lines:5.0f} ({per_min:.0f}/min)", flush=True)
        return
    cap = capacity()
    rate = args.load * cap
    print(f"capacity {cap:.2f} req/s; interactive {rate:.2f} req/s; {args.seconds:g} s virtual; "
          f"change in p90 beside the batch lines, per seed")
    for label, policy, background in (("fcfs", "fcfs", None), ("priority", "priority", None),
                                      ("background", "priority", 1)):
        for k in (2, 8, 64):
            cells = []
            for seed in range(1, args.seeds + 1):
                a = run(rate, args.seconds, 0, policy, background, seed)
                b = run(rate, args.seconds, k, policy, background, seed)
                ttft, tpot = 100 * (b.ttft_p90 / a.ttft_p90 - 1), 100 * (b.tpot_p90 / a.tpot_p90 - 1)
                cells.append(f"{ttft:+.0f}/{tpot:+.0f}% ({b.batch_done} lines)")
            print(f"{label:>10} {k:>2} lines out: TTFT/TPOT " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
