"""Replay of a million-row series: peak memory and wall time of `slopilot replay` in a child process.

    .venv/bin/python bench/replay_million.py [--rows 1000000] [--step 5] [--baseline] [--json PATH]

Writes a series of ROWS rows (a random walk of the waiting queue, one row every STEP seconds) and
replays it through examples/replay/keda_queue.yaml (pollingInterval 30 s) with the CLI, in a child
process whose peak RSS comes from the kernel (wait4's ru_maxrss). With --baseline it also runs the
approach the CLI used before it streamed: every row parsed into a list, every decision kept in a list,
the output built as one string (`read_series` + `replay` + `to_csv`), and checks that both write the
same decisions. The target: under 200 MB and under 10 s for a million rows.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "replay" / "keda_queue.yaml"

BASELINE = """
import sys
from pathlib import Path
from autoscaler.replay import replay, to_csv
from autoscaler.series import read_series
from autoscaler.spec import load_spec, make_policy
spec = load_spec(Path(sys.argv[1]).read_text())
with open(sys.argv[2], newline="") as f:
    rows, rfc = read_series(f, [t.name for t in spec.triggers], sys.argv[2])
out = replay(make_policy(spec), rows, spec.polling_interval, spec.min_replicas)
Path(sys.argv[3]).write_text(to_csv(out, rfc))
"""


def write_series(path: Path, rows: int, step: float, seed: int = 0) -> None:
    rng = random.Random(seed)
    q = 0.0
    with path.open("w") as f:
        f.write("time,queue\n")
        for i in range(rows):
            q = max(0.0, q + rng.gauss(0.0, 1.0))
            f.write(f"{i * step:g},{q:.2f}\n")


def measure(argv: list[str]) -> dict:
    """Wall seconds, CPU seconds and peak RSS (MB) of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed: {child.stderr.read().decode()}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--step", type=float, default=5.0, help="seconds between rows (default 5)")
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--baseline", action="store_true", help="also run the non-streaming approach")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        series, out = Path(tmp) / "series.csv", Path(tmp) / "decisions.csv"
        write_series(series, args.rows, args.step)
        size = series.stat().st_size / 2**20
        print(f"series: {args.rows} rows, one every {args.step:g} s, {size:.1f} MiB; spec {args.spec.name}")
        cli = [sys.executable, "-m", "slopilot.cli", "replay", "--spec", str(args.spec),
               "--metrics", str(series), "-o", str(out)]
        runs = {"streaming (slopilot replay)": (measure(cli), out)}
        if args.baseline:
            base_out = Path(tmp) / "baseline.csv"
            argv_b = [sys.executable, "-c", BASELINE, str(args.spec), str(series), str(base_out)]
            runs["baseline (all rows in a list)"] = (measure(argv_b), base_out)
        decisions = sum(1 for _ in out.open()) - 1
        print(f"decisions: {decisions}")
        print(f"{'run':<32}{'wall s':>8}{'cpu s':>8}{'peak RSS MB':>13}")
        for label, (m, _) in runs.items():
            print(f"{label:<32}{m['wall_s']:8.2f}{m['cpu_s']:8.2f}{m['peak_rss_mb']:13.1f}")
        if args.baseline:
            same = out.read_bytes() == base_out.read_bytes()
            print(f"same decisions: {same}")
            if not same:
                return 1
        m = runs["streaming (slopilot replay)"][0]
        ok = m["peak_rss_mb"] < 200 and m["wall_s"] < 10
        print(f"target (< 200 MB, < 10 s): {'met' if ok else 'MISSED'}")
        if args.json:
            sys.path.insert(0, str(ROOT))
            from bench.pages import write_result

            notes = [f"{args.rows} rows, one every {args.step:g} s ({size:.1f} MiB), {decisions} decisions, "
                     f"spec {args.spec.name}; target (< 200 MB, < 10 s for the streaming run): "
                     f"{'met' if ok else 'MISSED'}."]
            if args.baseline:
                notes.append(f"Both runs wrote the same decisions: {same}.")
            write_result(args.json, ["run", "wall s", "CPU s", "peak RSS MB"],
                         [[label, round(m["wall_s"], 2), round(m["cpu_s"], 2), round(m["peak_rss_mb"], 1)]
                          for label, (m, _) in runs.items()], notes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
