"""When does the burst test see the P/D day's bursts? (`bench/pd_onset.py`): the forecast of ours
(autoscaler.forecast.Demand with the bench's options) replayed on the router's arrival counter as the
policy reads it (scraped every 2 s, read by a 5-s poll: the last scrape before the poll), for each
burst-test setting and seed: the seconds after each burst's start at which the test first fires, and
its fires outside the bursts (false alarms: episodes, and polls in them).

It replays the test alone, without the simulator (the counter is the day's arrivals; the decode role's
rate is the counter's, and the prefill role's test reads the same counter), so it takes seconds.

    .venv/bin/python bench/pd_onset.py --json docs/benchmarks/results/pd_onset.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages
from autoscaler.forecast import Demand, DemandOptions  # noqa: E402
from autoscaler.observation import Observation  # noqa: E402
from bench.pages import write_result  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pd_setup import BURST_WINDOW, BURSTS, STARTUP, day_workload  # noqa: E402

POLL, SCRAPE = 5.0, 2.0  # the bench's polling interval; the router's scrape interval (simulator/scrape.py)
OURS = {"burst_slope": "onset", "burst_noise_floor": True, "drop_on_fall": True, "arrivals_query": "a"}
SETTINGS = {  # name -> DemandOptions on top of OURS
    "ours (baseline on the whole window, burstZ 4)": {},
    "burstZ 3": {"burst_z": 3.0},
    "burstBaseline beforeTrend (burstZ 4)": {"burst_baseline": "beforeTrend"},
    "burstBaseline beforeTrend, burstZ 3": {"burst_baseline": "beforeTrend", "burst_z": 3.0},
    "burstBaseline beforeTrend, burstZ 5": {"burst_baseline": "beforeTrend", "burst_z": 5.0},
}


def fires(times: np.ndarray, day: float, options: dict) -> np.ndarray:
    """The poll times at which the burst test fires."""
    demand = Demand(DemandOptions(**{**OURS, **options}), STARTUP, POLL)
    out = []
    for t in np.arange(0.0, day, POLL):
        scraped = (np.ceil(t / SCRAPE) - 1) * SCRAPE  # the poll reads the last scrape before it
        count = float(np.searchsorted(times, scraped, side="right"))
        demand.rate(Observation(time=float(t), current_replicas=1, arrival_rate=1.0,
                                metrics={"arrivals": count}, num_waiting=0.0))
        if demand.bursting:
            out.append(t)
    return np.array(out)


def summary(fired: np.ndarray, day: float) -> tuple[list[float | None], int, int]:
    """(first fire after each burst's start, within 5 minutes; false episodes; false polls). An episode:
    fires no more than 2 polls apart; false: outside a burst's 10 minutes (and the 30 s before)."""
    onsets = []
    near = np.zeros(len(fired), dtype=bool)
    for f in BURSTS:
        b = f * day
        x = fired[(fired >= b) & (fired < b + 300)]
        onsets.append(float(x[0] - b) if len(x) else None)
        near |= (fired >= b - 30) & (fired < b + BURST_WINDOW)
    false = fired[~near]
    episodes = int((np.diff(false) > 2 * POLL).sum() + 1) if len(false) else 0
    return onsets, episodes, len(false)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[7, 8, 9])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    day = 6 * 3600.0
    arrivals = {s: np.sort(day_workload(6, 3, s)[0].times) for s in args.seeds}
    columns = ["burst test"] + [f"seed {s}: seen at (s after burst 1 / 2); false alarms" for s in args.seeds]
    rows = []
    for name, options in SETTINGS.items():
        cells = [name]
        for s in args.seeds:
            onsets, episodes, polls = summary(fires(arrivals[s], day, options), day)
            seen = " / ".join("-" if o is None else f"{o:.0f}" for o in onsets)
            cells.append(f"{seen}; {episodes} ({polls} polls)")
        rows.append(cells)
        print(" | ".join(cells), flush=True)
    notes = ["The day's router counter (2-s scrape, 5-s polls) replayed through the burst test alone; "
             "'-': not seen in the burst's 5 minutes. False alarms: fires outside the bursts' 10 minutes, "
             "as episodes (fires at most 2 polls apart) and polls."]
    if args.json:
        write_result(args.json, columns, rows, notes)


if __name__ == "__main__":
    main()
