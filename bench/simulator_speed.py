"""Simulator speed: the Azure conversation trace (19,366 requests, ~1 h) on 8 H100 Llama-2-70B replicas,
and a scale run of 200 replicas at 100 req/s for a simulated hour (~360k requests).

Baseline and ours in the same run: the step-by-step simulator (every decode iteration through the
engine's scheduler, `fast=False`) against the closed-form fast path, on the same workload; their
per-request timings must be identical. Prints medians of several runs and the ratio; the scale run
reports wall time and peak memory (tracemalloc is not used: it would slow the run; ru_maxrss of a
child process is).

    .venv/bin/python bench/simulator_speed.py [--repeats 3] [--skip-scale] [--baseline-limit 4000]
        [--against COMMIT] [--keda] [--json docs/benchmarks/results/simulator_speed.json]

`--against COMMIT` also times the Azure run on that commit's simulator (a temporary git worktree),
interleaved with this tree's, each in a fresh child process, and prints the ratio: a refactor must
not make the simulator slower. `--keda` gives the pool a KEDA ScaledObject with Prometheus triggers
(the waiting queue and the TTFT p90), so the triggers' queries are answered at every poll.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.fleet import Fleet  # noqa: E402
from simulator.run import build_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

POOL = {
    "name": "h100",
    "latency_model": "h100-llama2-70b-tp4",
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 16384,
    "kv_memory": {"gpu_memory_gib": 74.5, "num_gpus": 4, "weights_gib": 130.4, "kv_bytes_per_token": 327680},
    "prefix_caching": False,
}


def shared_data() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import find_shared_data

    p = find_shared_data()
    if p is None:
        sys.exit("public data not found: set SLOPILOT_SHARED_DATA or place it at ../shared/data")
    return p


# a KEDA ScaledObject polled every 15 s: the queue, and TTFT p90 from the bucket rates
KEDA_SPEC = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "azure"},
    "spec": {
        "scaleTargetRef": {"name": "h100"},
        "pollingInterval": 15,
        "minReplicaCount": 2,
        "maxReplicaCount": 16,
        "triggers": [
            {"type": "prometheus", "name": "queue",
             "metadata": {"query": "sum(vllm:num_requests_waiting)", "threshold": "5"}},
            {"type": "prometheus", "name": "ttft",
             "metadata": {"query": "histogram_quantile(0.9, sum(rate("
                          "vllm:time_to_first_token_seconds_bucket[1m])) by (le))", "threshold": "2"}},
        ],
    },
}


def azure_scenario(limit: int | None = None, keda: bool = False):
    d = azure_dict(keda)
    if limit:
        d["workload"]["trace"]["limit"] = limit
    return load_scenario(d)


def timed_run(sc, wl, fast: bool) -> tuple[float, float, Fleet]:
    """(wall s, CPU s of this process, fleet): the machine may be shared, so both are reported."""
    t, c = time.perf_counter(), time.process_time()
    f = Fleet(sc, wl, fast=fast)
    f.run()
    return time.perf_counter() - t, time.process_time() - c, f


def scale_child() -> None:
    """Runs the scale scenario in this process and prints wall seconds and peak RSS as JSON."""
    sc = load_scenario(
        {
            "seed": 0,
            "duration": 3600,
            "workload": {
                "arrivals": {"rate": 100},
                "prompt_tokens": {"dist": "lognormal", "mean": 1155, "median": 1020, "max": 8000},
                "output_tokens": {"dist": "lognormal", "mean": 211, "median": 129, "max": 2048},
            },
            "pools": [dict(POOL, replicas=200)],
            "router": {"policy": "least_outstanding"},
        }
    )
    t, c = time.perf_counter(), time.process_time()
    wl = build_workload(sc, 0)
    f = Fleet(sc, wl)
    f.run()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    ok = int((f.requests.status == 1).sum())
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "requests": len(wl),
                "ok": ok,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


# Times the Azure run on the simulator found first on sys.path (the tree under test); prints JSON.
AZURE_CHILD = """
import json, sys, time
from simulator.fleet import Fleet
from simulator.run import build_workload
from simulator.scenario import load_scenario
sc = load_scenario(json.loads(sys.argv[1]))
wl = build_workload(sc, 0)
t, c = time.perf_counter(), time.process_time()
f = Fleet(sc, wl)
f.run()
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c, "requests": len(wl)}))
"""


def azure_dict(keda: bool = False) -> dict:
    trace = {"format": "azure", "path": str(shared_data() / "traces" / "azure_llm_2023_conv.csv")}
    pool = dict(POOL, replicas=8, **({"autoscaler": {"spec": KEDA_SPEC}} if keda else {}))
    return {"seed": 0, "workload": {"trace": trace}, "pools": [pool],
            "router": {"policy": "least_outstanding"}, "slo": {"ttft": 2.0, "tpot": 0.1}}


def time_in_tree(tree: Path, keda: bool = False) -> dict:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", AZURE_CHILD, json.dumps(azure_dict(keda))], cwd=tree,
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def against(commit: str, repeats: int, keda: bool = False, rows: list | None = None) -> None:
    """This tree against `commit`, interleaved, in fresh processes; CPU seconds are the fairer figure."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), commit],
                       check=True, capture_output=True)
        try:
            ours, theirs = [], []
            for _ in range(repeats):
                theirs.append(time_in_tree(base, keda))
                ours.append(time_in_tree(ROOT, keda))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           capture_output=True)
    for key in ("wall_s", "cpu_s"):
        o = statistics.median(r[key] for r in ours)
        t = statistics.median(r[key] for r in theirs)
        what = "Azure conv fast path" + (" (KEDA triggers)" if keda else "")
        if rows is not None:
            rows.append([f"{what}, {key} vs {commit[:12]} (median of {repeats}, fresh processes)",
                         f"{o:.2f} s", f"{t:.2f} s then: ours/then {o / t:.3f}"])
        print(f"{what} vs {commit[:12]}: {key} median {o:.2f} (ours) vs {t:.2f} (then): "
              f"ours/then = {o / t:.3f}  (runs ours {', '.join(f'{r[key]:.2f}' for r in ours)}; "
              f"then {', '.join(f'{r[key]:.2f}' for r in theirs)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--baseline-limit",
        type=int,
        default=4000,
        help="requests of the trace for the step-by-step comparison (the full trace takes minutes)",
    )
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--against", metavar="COMMIT", help="also compare the Azure run with this commit's")
    ap.add_argument("--keda", action="store_true", help="the Azure runs with a KEDA Prometheus-trigger spec")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    ap.add_argument("--scale-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_child:
        scale_child()
        return

    rows: list = []
    if args.against:
        against(args.against, args.repeats, args.keda, rows)
    sc = azure_scenario(keda=args.keda)
    wl = build_workload(sc, 0)
    times, cpus = [], []
    for _ in range(args.repeats):
        wall, cpu, fleet = timed_run(sc, wl, True)
        times.append(wall)
        cpus.append(cpu)
    print(
        f"Azure conv trace, {len(wl)} requests, 8 x H100 Llama-2-70B TP4 (fast path"
        f"{', KEDA triggers' if args.keda else ''}): median "
        f"{statistics.median(times):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
        f"(wall runs {', '.join(f'{t:.2f}' for t in times)}); target < 5 s"
    )
    ok = int((fleet.requests.status == 1).sum())
    print(f"  {ok}/{len(wl)} requests ok")
    rows.append([f"Azure conv trace, {len(wl)} requests, 8 replicas, fast path"
                 f"{' (KEDA triggers)' if args.keda else ''}: median of {args.repeats}",
                 f"{statistics.median(times):.2f} s wall", f"{statistics.median(cpus):.2f} s CPU; {ok} ok"])

    sub = azure_scenario(args.baseline_limit)
    wl2 = build_workload(sub, 0)
    fast_t, slow_t = [], []
    for _ in range(args.repeats):
        t1, _, f1 = timed_run(sub, wl2, True)
        t2, _, f2 = timed_run(sub, wl2, False)
        fast_t.append(t1)
        slow_t.append(t2)
    same = all(
        (getattr(f1.requests, k) == getattr(f2.requests, k)).all()
        for k in ("first_token", "finish", "first_sched")
    )
    slow_m, fast_m = statistics.median(slow_t), statistics.median(fast_t)
    rows.append([f"first {len(wl2)} requests: step-by-step vs fast path", f"{slow_m:.2f} s vs {fast_m:.2f} s",
                 f"x{slow_m / fast_m:.1f}; per-request timings identical: {same}"])
    print(
        f"first {len(wl2)} requests: step-by-step (engine BlockManager, every step) median {slow_m:.2f} s, "
        f"fast path {fast_m:.2f} s, speed-up x{slow_m / fast_m:.1f}; per-request timings identical: {same}"
    )

    if not args.skip_scale:
        out = subprocess.run(
            [sys.executable, __file__, "--scale-child"], capture_output=True, text=True, check=True
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"scale: 200 replicas, 100 req/s, 1 simulated hour, {r['requests']} requests ({r['ok']} ok): "
            f"{r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), peak RSS {r['peak_rss_mib']:.0f} MiB; "
            "targets < 120 s, < 1024 MiB"
        )
        rows.append([f"scale: 200 replicas, 100 req/s, 1 simulated hour, {r['requests']} requests",
                     f"{r['wall_s']:.1f} s wall",
                     f"{r['cpu_s']:.1f} s CPU, peak RSS {r['peak_rss_mib']:.0f} MiB"])
    if args.json:
        write_json(args.json, rows)


def write_json(path: str, rows: list) -> None:
    """The results as bench/pages.py reads them (docs/benchmarks/simulator_speed.md's table)."""
    import datetime
    import os

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    Path(path).write_text(json.dumps({
        "command": "bench/simulator_speed.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(), "load": load,
        "columns": ["measure", "ours", "detail"], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
