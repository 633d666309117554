"""Where the P/D day's "ours" row spends GPU-hours above the oracle bound's plan, per pool and per phase
of the day, and policy variants that move them (bench/pd_day.py's day and rows; docs/benchmarks/pd_day.md,
"Where ours spends above the oracle"). Each pool's replicas (starting + ready, the simulator's 30-s
timeline) against the oracle's per-minute billed plan (bench/pd_bounds.py), in GPU-hours.

    .venv/bin/python bench/pd_excess.py --json docs/benchmarks/results/pd_excess.json

The capacities the oracle uses are read from pd_day.json (bench/pd_day.py measures them; 3 minutes).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages
import numpy as np  # noqa: E402
import pd_day  # noqa: E402
import pd_setup as setup  # noqa: E402
from pages import RESULTS, write_result  # noqa: E402
from pd_bounds import oracle_pd  # noqa: E402

from simulator.run import simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

KV = 451_543  # KV tokens one replica holds: (74.5 GiB x 4 x 0.9 - 130.4 GiB weights) / 327,680 B a token
# name -> the decode pool's options on top of ours (the prefill pool is ours throughout)
VARIANTS = {
    "ours": {},
    "measured context (kvTokensPerReplica)": {"kvTokensPerReplica": KV},
    "cut: measured context, no hysteresis, 60-s window": {
        "kvTokensPerReplica": KV, "scaleDownHeadroom": 0, "scaleDownDelaySeconds": 60},
    "cut + rateHeadroom 0.2": {"kvTokensPerReplica": KV, "scaleDownHeadroom": 0, "scaleDownDelaySeconds": 60,
                               "rateHeadroom": 0.2},
    "cut + rateHeadroom 0.25": {"kvTokensPerReplica": KV, "scaleDownHeadroom": 0,
                                "scaleDownDelaySeconds": 60, "rateHeadroom": 0.25},
}
# the day's phases (hours), the bursts' 10 minutes taken out of the phase they fall in
PHASES = [("trough 0-1.5 h", 0.0, 1.5), ("summarisation 1.67-2.4 h", 1.5, 2.4),
          ("mix shift 2.4-3.6 h", 2.4, 3.6), ("chat 3.6-6 h", 3.6, 6.0)]
COLUMNS = ["seed", "decode pool variant", "TTFT", "TPOT", "GPU-hours", "x oracle",
           "prefill GPU-h (oracle)", "decode GPU-h (oracle)"] + [
    f"decode over, {p[0]}" for p in PHASES] + ["decode over, bursts' 10 min",
                                               "prefill over (same phases, then the bursts)"]


def phase(t: np.ndarray, day: float) -> np.ndarray:
    """Index of each instant's phase; len(PHASES) for the bursts' 10 minutes."""
    out = np.searchsorted([p[2] * 3600 for p in PHASES[:-1]], t, side="right")
    for f in setup.BURSTS:
        out[(t >= f * day) & (t < f * day + setup.BURST_WINDOW)] = len(PHASES)
    return out


def gpu_hours(t: np.ndarray, counts: np.ndarray, step: float, day: float) -> np.ndarray:
    """GPU-hours per phase (and the bursts) of a count sampled every `step` seconds."""
    keep = t < day
    return np.bincount(phase(t[keep], day), counts[keep] * step / 3600 * setup.GPUS, len(PHASES) + 1)


def run(seed: int, decode: dict, caps: dict) -> list:
    day = 6 * 3600
    wl, long = setup.day_workload(6, 3.0, seed)
    bound = oracle_pd(wl, long, day, caps)
    pre = pd_day.pd_model("prefill", pd_day.PREFILL_OURS)
    dec = pd_day.pd_model("decode", {**pd_day.DECODE_OURS, **decode})
    t0 = time.perf_counter()
    res = simulate(load_scenario(setup.scenario(day, pre, dec, seed=seed)), None, workload=wl, plots=False)
    r = setup.row("", res, time.perf_counter() - t0)
    by: dict[float, list[int]] = {}
    for x in res.fleet.timeline:
        by.setdefault(x["time"], [0, 0])[0 if x["pool"] == "prefill" else 1] += x["ready"] + x["provisioning"]
    ts = np.array(sorted(by))
    step = float(np.median(np.diff(ts)))
    ours = {role: gpu_hours(ts, np.array([by[t][i] for t in ts]), step, day)
            for i, role in enumerate(("prefill", "decode"))}
    minutes = np.arange(len(bound["billed"]["decode"])) * 60.0
    orc = {role: gpu_hours(minutes, np.array(bound["billed"][role]), 60.0, day) for role in ours}
    over = ours["decode"] - orc["decode"]
    return [r["ttft_attainment"], r["tpot_attainment"], r["gpu_hours"], r["gpu_hours"] / bound["gpu_hours"],
            f"{ours['prefill'].sum():.1f} ({orc['prefill'].sum():.1f})",
            f"{ours['decode'].sum():.1f} ({orc['decode'].sum():.1f})"] + [f"{v:+.1f}" for v in over] \
        + [" / ".join(f"{v:+.1f}" for v in ours["prefill"] - orc["prefill"])]


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[7, 8, 9])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    caps = {k: tuple(v) for k, v in json.loads((RESULTS / "pd_day.json").read_text())["capacities"].items()}
    rows, loads = [], [os.getloadavg()[0]]
    for seed in args.seeds:
        for name, decode in VARIANTS.items():
            ttft, tpot, gh, x, *rest = run(seed, decode, caps)
            rows.append([str(seed), name, f"{100 * ttft:.2f}%", f"{100 * tpot:.2f}%", f"{gh:.1f}", f"{x:.3f}",
                         *rest])
            loads.append(os.getloadavg()[0])
            print(" | ".join(rows[-1]), f"(load {loads[-1]:.1f})", flush=True)
    if args.json:
        write_result(args.json, COLUMNS, rows, notes=[
            "The simulator is deterministic. 'over': the decode pool's GPU-hours (starting + ready replicas) "
            "minus the oracle plan's in that phase of the day (the bursts' 10 minutes counted apart). "
            "The prefill pool is ours throughout."], load=f"{min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
