"""The priority-aware policy live against serving batch at arrival (issue 31's must-show 4).

Runs `slopilot fleet up examples/fleet_batch_autoscaled.yaml` twice on the same arrivals and for the
same run length: once as written (sloModel `batchServe: deadline`: size for the interactive SLO, let
the batch fill the idle capacity, add capacity only when its answer rate would miss the deadline) and
once with `batchServe: arrival` (the same backlog drained in drainSeconds, like a queue). Each run is
its own process (emulated engines, the router with its Batch API, Prometheus, the controller); its
decision log is then replayed (`slopilot replay --step-model`) and compared row by row. Per policy it
reports the GPU-seconds (replica-seconds from each replica's spawn to its exit, x 4 GPUs of the TP4
model), the interactive TTFT and TPOT p90 measured by the load's client against the spec's SLO, the
batch's end against its deadline, the largest fleet and the replay check. Rounds alternate the order.

    .venv/bin/python bench/batch_fleet.py [--rounds 1] [--duration 240] [--json out/batch_fleet.json]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "fleet_batch_autoscaled.yaml"
POLICIES = ("deadline", "arrival")
KEY = ("time", "desired_replicas", "active", "reason")


def fleet_file(out: Path, serve: str) -> Path:
    """The example with sloModel's batchServe set to `serve`, written into `out`."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["autoscaler"]["spec"]["policy"]["sloModel"]["batchServe"] = serve
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def replayed_equal(run: Path, model: str) -> tuple[int, int]:
    """(rows of the decision log, rows the replay decided the same)."""
    spec = next(p for p in run.glob("*.yaml") if p.name != "fleet.yaml")
    again = run / "replayed.csv"
    subprocess.run([sys.executable, "-m", "slopilot.cli", "replay", "--spec", str(spec), "--metrics",
                    str(run / "decisions.csv"), "--step-model", model, "-o", str(again)],
                   cwd=ROOT, check=True, capture_output=True)
    rows = list(csv.DictReader(io.StringIO((run / "decisions.csv").read_text())))
    back = list(csv.DictReader(io.StringIO(again.read_text())))
    same = sum(1 for a, b in zip(rows, back) if all(a[k] == b[k] for k in KEY))
    return len(rows), same if len(rows) == len(back) else 0


def run_one(out: Path, serve: str, duration: float) -> dict:
    """One live run of the example under `serve`; its measured figures."""
    run = out / serve
    shutil.rmtree(run, ignore_errors=True)  # an older run's decision log and policy state would be reused
    cfg = fleet_file(out / f"{serve}-spec", serve)
    log = out / f"{serve}.log"
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "slopilot.cli", "fleet", "up", str(cfg), "--out", str(run),
                             "--duration", str(duration), "--no-dashboard"], cwd=ROOT, stdout=f,
                            stderr=subprocess.STDOUT, timeout=duration + 300).returncode
    if rc != 0:
        raise RuntimeError(f"fleet up ({serve}) exited {rc}: see {log}")
    doc = yaml.safe_load(cfg.read_text())
    s = json.loads((run / "summary.json").read_text())
    rows = list(csv.DictReader(io.StringIO((run / "decisions.csv").read_text())))
    slo = doc["autoscaler"]["spec"]["slo"]
    n, same = replayed_equal(run, doc["emulate"])
    b, req = s["batch"], s["requests"]
    return {"policy": serve, "gpu_seconds": s["gpu_seconds"]["gpu_seconds"],
            "replica_seconds": s["gpu_seconds"]["replica_seconds"], "run_s": s["gpu_seconds"]["run_s"],
            "ttft_p90": req["ttft_s"]["p90"], "tpot_p90": req["tpot_s"]["p90"],
            "ttft_slo": slo["ttft"]["seconds"], "tpot_slo": slo["tpot"]["seconds"],
            "requests": req["requests"], "ok": req["ok"], "batch_status": b["status"],
            "batch_completed": b.get("request_counts", {}).get("completed", 0), "batch_lines": b["lines"],
            "batch_ended_s": b.get("ended_s"), "batch_deadline_s": b.get("deadline_s"),
            "done_by_deadline": bool(b.get("done_by_deadline")),
            "max_replicas": max(int(r["desired_replicas"]) for r in rows), "decisions": n,
            "replayed_same": same,
            "load": round(os.getloadavg()[0], 1), "out": str(run)}


def run_pair(out: Path, duration: float, first: str = "deadline") -> dict[str, dict]:
    order = POLICIES if first == POLICIES[0] else POLICIES[::-1]
    return {serve: run_one(out, serve, duration) for serve in order}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--duration", type=float, default=240.0, help="seconds of each run (the same for both)")
    ap.add_argument("--out", default="out/batch_fleet", help="run folders")
    ap.add_argument("--json", help="write the results table here (docs/benchmarks/results/batch_fleet.json)")
    args = ap.parse_args()
    results = []
    for r in range(args.rounds):
        pair = run_pair(Path(args.out) / f"round{r}", args.duration, POLICIES[r % 2])
        for serve in POLICIES:
            x = pair[serve]
            results.append(x)
            print(f"round {r} {serve}: {x['gpu_seconds']:.0f} GPU-s ({x['replica_seconds']:.0f} replica-s, "
                  f"up to {x['max_replicas']}), TTFT p90 {x['ttft_p90'] * 1000:.0f} ms "
                  f"(SLO {x['ttft_slo'] * 1000:.0f}), "
                  f"TPOT p90 {x['tpot_p90'] * 1000:.1f} ms (SLO {x['tpot_slo'] * 1000:.0f}), batch "
                  f"{x['batch_status']} {x['batch_completed']}/{x['batch_lines']} at {x['batch_ended_s']} s "
                  f"(deadline {x['batch_deadline_s']} s), replay {x['replayed_same']}/{x['decisions']}; "
                  f"load {x['load']}", flush=True)
    ratio = [a["gpu_seconds"] / b["gpu_seconds"] for a, b in zip(results[::2], results[1::2])]
    print(f"deadline / arrival GPU-seconds: {', '.join(f'{x:.2f}' for x in ratio)} "
          f"(median {statistics.median(ratio):.2f})")
    if args.json:
        from bench.pages import write_result

        cols = ["round", "policy", "GPU-s", "max replicas", "TTFT p90 (ms)", "TPOT p90 (ms)",
                "batch ended (s)", "deadline (s)", "replayed", "load"]
        rows = [[i // 2, x["policy"], round(x["gpu_seconds"]), x["max_replicas"], round(x["ttft_p90"] * 1000),
                 round(x["tpot_p90"] * 1000, 1),
                 "-" if x["batch_ended_s"] is None else round(x["batch_ended_s"]),
                 round(x["batch_deadline_s"]), f"{x['replayed_same']}/{x['decisions']}", x["load"]]
                for i, x in enumerate(results)]
        x = results[0]
        write_result(args.json, cols, rows, [
            f"SLO: TTFT p90 <= {x['ttft_slo'] * 1000:.0f} ms, TPOT p90 <= {x['tpot_slo'] * 1000:.0f} ms; "
            f"{x['batch_lines']} batch lines; {x['run_s']:.0f}-s runs; GPU-seconds deadline / arrival: "
            f"{', '.join(f'{v:.2f}' for v in ratio)}."])


if __name__ == "__main__":
    main()
