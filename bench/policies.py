"""Autoscaling policies on the fleet simulator.

A 6-hour diurnal workload with two bursts (3x within 2 minutes) of Azure-like conversation requests
on H100 Llama-2-70B TP4 replicas that take 2 minutes to start. For each policy -- static peak
provisioning, HPA on running requests, KEDA on the waiting queue, the llm-d ratio law and the
model-based SLO-headroom policy -- the SLO attainment (TTFT p90 <= 2 s, TPOT p90 <= 100 ms),
GPU-hours and scale events, beside an oracle lower bound: per minute, the fewest replicas that meet
the SLO with perfect foresight (from a measured per-replica capacity), started 2 minutes ahead and
billed while starting.

All policies see the same workload (same seed). Attainment is reported two ways: the fraction of
requests within both thresholds, and the fraction of 1-minute windows whose p90s meet both.

With --bounds, reference rows that no policy can beat without seeing a burst coming: the reactive
bound (the oracle's plan, blind to each burst until it is seen, then ordering the burst's peak at
once, ready a startup delay later), when the burst is seen at its start and 30 s after it (the first
15-s scrape, read at the next 15-s poll), and the 30-s bound on top of standing headroom x h.

    .venv/bin/python bench/policies.py [--hours 6] [--out out/bench_policies] [--plot docs/img/policies.png]
        [--bounds] [--headroom 1.25 1.5 1.75 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.planner.oracle import oracle, plan_steps  # noqa: E402
from simulator.report import request_table, slo_meets  # noqa: E402
from simulator.run import build_workload, simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

STARTUP = 120.0
TTFT_SLO, TPOT_SLO = 2.0, 0.1
POOL = {
    "name": "h100",
    "latency_model": "h100-llama2-70b-tp4",
    "replicas": 4,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 16384,
    "prefix_caching": False,
    "kv_memory": {"gpu_memory_gib": 74.5, "num_gpus": 4, "weights_gib": 130.4, "kv_bytes_per_token": 327680},
    "provisioning_delay": STARTUP,
    "cost_per_hour": 39.2,
}
GPUS_PER_REPLICA = POOL["kv_memory"]["num_gpus"]  # the oracle's; runs read theirs from the summary
LENGTHS = {
    "prompt_tokens": {"dist": "lognormal", "mean": 1155, "median": 1020, "max": 8000},
    "output_tokens": {"dist": "lognormal", "mean": 211, "median": 129, "max": 2048},
}
SLO = {"ttft": {"seconds": TTFT_SLO, "percentile": 90}, "tpot": {"seconds": TPOT_SLO, "percentile": 90}}


def scenario(hours: float, autoscaler: dict, replicas: int = 4) -> dict:
    dur = hours * 3600
    return {
        "name": "policies",
        "seed": 7,
        "duration": dur,
        "workload": {
            "arrivals": {
                "process": "gamma",
                "cv": 1.09,
                # trough at the start, peak half-way; bursts at 1/4 and 2/3 of the run
                "diurnal": {"mean": 8.0, "amplitude": 0.7, "period": dur},
                "spikes": [
                    {"at": dur * 0.25, "duration": 300, "factor": 3.0, "ramp": 120},
                    {"at": dur * 0.66, "duration": 300, "factor": 3.0, "ramp": 120},
                ],
            },
            **LENGTHS,
        },
        "pools": [dict(POOL, replicas=replicas, autoscaler=autoscaler)],
        "router": {"policy": "least_outstanding"},
        "slo": SLO,
        "metrics": {"scrape_interval": 15, "rate_window": 60},
        "output": {"timeline_interval": 30},
        "drain": {"max": 900},
    }


def ia(name: str, policy: dict, polling: int = 15) -> dict:
    return {
        "spec": {
            "apiVersion": "slopilot.dev/v1alpha1",
            "kind": "InferenceAutoscaler",
            "metadata": {"name": name},
            "spec": {
                "scaleTargetRef": {"name": "llama-70b"},
                "minReplicas": 1,
                "maxReplicas": 60,
                "pollingInterval": polling,
                "startupDelaySeconds": int(STARTUP),
                "slo": {
                    "ttft": {"percentile": 90, "seconds": TTFT_SLO},
                    "tpot": {"percentile": 90, "seconds": TPOT_SLO},
                },
                "policy": policy,
            },
        }
    }


def policies(peak: int) -> dict[str, dict]:
    return {
        "static peak": {"fixed": peak},
        "HPA (running requests)": ia(
            "hpa-running",
            {
                "type": "hpa",
                "hpa": {
                    "triggers": [
                        {
                            "type": "prometheus",
                            "name": "running",
                            "metadata": {"query": "sum(vllm:num_requests_running)", "threshold": "20"},
                        }
                    ]
                },
            },
        ),
        "KEDA (waiting queue)": {
            "spec": {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "keda-queue"},
                "spec": {
                    "scaleTargetRef": {"name": "llama-70b"},
                    "pollingInterval": 30,
                    "cooldownPeriod": 300,
                    "minReplicaCount": 1,
                    "maxReplicaCount": 60,
                    "triggers": [
                        {
                            "type": "prometheus",
                            "name": "queue",
                            "metadata": {"query": "sum(vllm:num_requests_waiting)", "threshold": "5"},
                        }
                    ],
                },
            }
        },
        "llm-d ratio law": ia("ratio", {"type": "ratio", "ratio": {}}),
        "model-based SLO headroom": ia(
            "slo-model",
            {"type": "sloModel", "sloModel": {"burstSlope": "last", "dropOnFall": True}},
            polling=30,
        ),
        # the same with a wider margin (SLO targets x 0.45): standing headroom, against HPA's
        "model-based SLO headroom, margin 0.55": ia(
            "slo-model-wide",
            {"type": "sloModel", "sloModel": {"burstSlope": "last", "dropOnFall": True, "margin": 0.55}},
            polling=30,
        ),
    }


def run(sc_dict: dict, workload=None):
    sc = load_scenario(sc_dict)
    wl = workload if workload is not None else build_workload(sc, sc.seed)
    t = time.perf_counter()
    res = simulate(sc, None, workload=wl, plots=False)
    return res, time.perf_counter() - t


def capacity_per_replica(replicas: int = 4, minutes: float = 15) -> float:
    """The highest per-replica arrival rate at which a fixed pool meets both p90 SLOs (bisection)."""
    lo, hi = 0.2, 6.0
    for _ in range(8):
        mid = (lo + hi) / 2
        d = {
            "seed": 3,
            "duration": minutes * 60,
            "workload": {"arrivals": {"process": "gamma", "cv": 1.09, "rate": mid * replicas}, **LENGTHS},
            "pools": [dict(POOL, replicas=replicas, provisioning_delay=0)],
            "router": {"policy": "least_outstanding"},
            "slo": SLO,
            "drain": {"max": 600},
        }
        res, _ = run(d)
        ok = all(v["met"] for v in res.summary["slo"].values())
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def reactive_plan(need: np.ndarray, spikes: list[dict], detect: float, headroom: float = 1.0) -> list[dict]:
    """The reactive bound: the oracle's per-minute plan (diurnal foresight, started 2 minutes ahead),
    except that a burst is unknown until `detect` seconds after it starts. Until then the plan provisions
    the level of the minute before the burst; at detection it orders the burst's peak need at once
    (perfect sizing), ready a startup delay later, held until the burst ends. Any reactive policy that
    sees the burst no earlier has at most this capacity when the burst arrives. With headroom h > 1 the
    burst-blind plan is ceil(h x need): standing headroom that absorbs the start of a burst."""
    blind = need.copy()
    extra = []
    for s in spikes:
        m0, m1 = int(s["at"] // 60), int(math.ceil((s["at"] + s["duration"]) / 60))
        blind[m0:m1] = need[m0 - 1]
        extra.append((s["at"] + detect, s["at"] + s["duration"], int(need[m0:m1].max())))
    lead = int(math.ceil(STARTUP / 60))
    billed = np.array([blind[m : m + lead + 1].max() for m in range(len(blind))])
    return plan_steps(np.ceil(billed * headroom - 1e-9), extra)


def late_requests(res, bursts: list[tuple[float, float]]) -> tuple[int, int]:
    """Requests that missed either threshold: all of them, and those arriving inside a burst window."""
    fleet = res.fleet
    req = request_table(fleet)
    arrived = np.arange(len(req["id"])) < fleet.arrived
    ok = np.ones(int(arrived.sum()), dtype=bool)
    for slo in fleet.sc.slos:
        ok &= slo_meets(req, slo, arrived)
    t = req["arrival"][arrived]
    inside = np.zeros(len(t), dtype=bool)
    for a, b in bursts:
        inside |= (t >= a) & (t < b)
    return int((~ok).sum()), int((~ok & inside).sum())


def summarize(name: str, res, wall: float, bursts: list[tuple[float, float]] = ()) -> dict:
    s = res.summary
    late, late_in_bursts = late_requests(res, list(bursts))
    return {
        "late": late,
        "late_in_bursts": late_in_bursts,
        "policy": name,
        "attainment": s["slo_attainment_joint"],
        "window_attainment": s["slo_window_attainment"],
        "ttft_p90": s["slo"]["ttft"]["value_at_percentile"],
        "tpot_p90": s["slo"]["tpot"]["value_at_percentile"],
        "gpu_hours": s["costs"]["gpu_hours"],  # replica-hours x the pool's GPUs a replica
        "scale_events": s["scale_events"],
        "wall_s": wall,
        "timeline": [
            (r["time"], r["ready"] + r["provisioning"], r["arrival_rate"]) for r in res.fleet.timeline
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--out", default="out/bench_policies")
    ap.add_argument("--plot", default=None, help="also save the plot here (e.g. docs/img/policies.png)")
    ap.add_argument(
        "--bounds",
        action="store_true",
        help="also simulate the reactive bound and standing-headroom rows (about 3 more minutes)",
    )
    ap.add_argument("--headroom", type=float, nargs="*", default=[1.25, 1.5, 1.75, 2.0])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cap = capacity_per_replica()
    print(
        f"measured capacity: {cap:.3f} req/s per replica meets TTFT p90 <= {TTFT_SLO} s and TPOT p90 <= "
        f"{TPOT_SLO * 1000:.0f} ms (4 replicas, 15 min, same length mix)"
    )
    base = load_scenario(scenario(args.hours, {"fixed": 1}))
    wl = build_workload(base, base.seed)
    need, billed = oracle(wl.times, args.hours * 3600, cap, STARTUP)
    peak = int(need.max())
    oracle_gpu_h = billed.sum() / 60 * GPUS_PER_REPLICA
    print(
        f"workload: {len(wl)} requests over {args.hours:g} h; oracle needs 1..{peak} replicas; "
        f"oracle lower bound {oracle_gpu_h:.1f} GPU-hours"
    )

    spikes = scenario(args.hours, {"fixed": 1})["workload"]["arrivals"]["spikes"]
    bursts = [(sp["at"], sp["at"] + sp["duration"]) for sp in spikes]

    def schedule_row(name: str, steps: list[dict], bound: bool = False) -> dict:
        sc = scenario(args.hours, {"schedule": steps, "polling_interval": 5}, replicas=steps[0]["replicas"])
        res, wall = run(sc, wl)
        print(f"  {name}: done in {wall:.0f} s")
        return dict(summarize(name, res, wall, bursts), bound=bound)

    # the oracle's plan, simulated: desired(m - 2) = need(m), so replicas are ready when needed
    rows = [schedule_row("oracle plan (simulated)", plan_steps(billed))]
    if args.bounds:
        # 30 s = the first 15-s scrape after the burst starts, read at the next 15-s poll
        for label, detect in (("at its start", 0.0), ("30 s after its start", 30.0)):
            rows.append(
                schedule_row(
                    f"reactive bound (burst seen {label})", reactive_plan(need, spikes, detect), True
                )
            )
        for h in args.headroom:
            steps = reactive_plan(need, spikes, 30.0, h)
            rows.append(schedule_row(f"reactive bound (30 s) + standing headroom x{h:g}", steps, True))
    for name, autoscaler in policies(peak).items():
        res, wall = run(
            scenario(args.hours, copy.deepcopy(autoscaler), replicas=4 if name != "static peak" else peak), wl
        )
        rows.append(summarize(name, res, wall, bursts))
        print(f"  {name}: done in {wall:.0f} s")

    print()
    header = (
        "| policy | attainment (requests) | attainment (1-min windows) | TTFT p90 (s) | TPOT p90 (ms) | "
        "GPU-hours | x oracle bound | scale events | late requests (in the bursts) |"
    )
    lines = [
        header,
        "|---|---|---|---|---|---|---|---|---|",
        f"| oracle lower bound | - | - | - | - | {oracle_gpu_h:.1f} | 1.00 | - | - |",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {100 * r['attainment']:.2f}% | {100 * r['window_attainment']:.1f}% | "
            f"{r['ttft_p90']:.2f} | {1000 * r['tpot_p90']:.0f} | {r['gpu_hours']:.1f} | "
            f"{r['gpu_hours'] / oracle_gpu_h:.2f} | {r['scale_events']} | "
            f"{r['late']:,} ({r['late_in_bursts']:,}) |"
        )
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(
        json.dumps(
            {
                "capacity_per_replica": cap,
                "oracle_gpu_hours": oracle_gpu_h,
                "rows": [{k: v for k, v in r.items() if k != "timeline"} for r in rows],
            },
            indent=2,
        )
    )
    shown = [r for r in rows if not r.get("bound")]
    plot(shown, need, billed, out / "policies.png")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(shown, need, billed, Path(args.plot))
    print(f"\nwrote {out}/table.md, results.json, policies.png")


def plot(rows, need, billed, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.step(np.arange(len(billed)) / 60, billed, where="post", color="black", lw=1.5, label="oracle (billed)")
    for r in rows:
        t, n, _ = zip(*r["timeline"])
        ax.step(np.array(t) / 3600, n, where="post", lw=1, label=r["policy"])
    ax2 = ax.twinx()
    t, _, rate = zip(*rows[0]["timeline"])
    ax2.plot(np.array(t) / 3600, rate, color="grey", alpha=0.35, lw=0.8)
    ax2.set_ylabel("arrivals / s (grey)")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("replicas (provisioning + ready)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(
        "Replicas over a 6-hour diurnal day with two 3x bursts (H100 Llama-2-70B TP4, 2-min startup)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    main()
