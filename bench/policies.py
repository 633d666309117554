"""Autoscaling policies on the fleet simulator, on three workloads (--workload):

* bursty: the day below;
* seasonal: three days of the same diurnal curve (a "day" is --hours long), each day's amplitude and
  phase drawn at random (+-10%, +-15 minutes, seeded), no bursts; scored on days 2 and 3;
* pd-day: a disaggregated prefill/decode service through a day whose length mix shifts under the
  bursty rate (bench/pd_day.py: its rows, its oracle bound);
* priority: the bursty day behind a gateway queue with two priority bands, 30% of requests in a batch
  band whose deadline is an hour and which the gateway holds at a lower saturation level
  (--batch-saturation); scored on the interactive band's attainment and on batch requests done within
  the deadline.

The bursty day: a 6-hour diurnal workload with two bursts (3x within 2 minutes) of Azure-like
conversation requests on H100 Llama-2-70B TP4 replicas that take 2 minutes to start. For each
policy -- static peak provisioning, HPA on running requests, KEDA on the waiting queue, the llm-d
ratio law and the model-based SLO-headroom policy -- the SLO attainment (TTFT p90 <= 2 s, TPOT p90 <= 100 ms),
GPU-hours and scale events, beside an oracle lower bound: per minute, the fewest replicas that meet
the SLO with perfect foresight (from a measured per-replica capacity), started 2 minutes ahead and
billed while starting.

All policies see the same workload (same seed). Attainment is reported two ways: the fraction of
requests within both thresholds, and the fraction of 1-minute windows whose p90s meet both.

With --bounds, reference rows that no policy can beat without seeing a burst coming: the reactive
bound (the oracle's plan, blind to each burst until it is seen, then ordering the burst's peak at
once, ready a startup delay later), when the burst is seen at its start and 30 s after it (the first
15-s scrape, read at the next 15-s poll), and the 30-s bound on top of standing headroom x h.

    .venv/bin/python bench/policies.py [--workload bursty|seasonal|priority] [--seed 7] [--hours 6]
        [--out out/bench_policies] [--plot docs/img/policies.png] [--json OUT] [--bounds]
        [--headroom 1.25 1.5 1.75 2]

"Ours" is the model-based policy with the router's fast signals (its arrival counter and gateway
queue, scraped every 2 s, read every 5 s), with the learned seasonal profile on the seasonal days,
a burst's first order sized from its rise since the onset (burstSlope: onset) on the bursty and
priority days, and the batch band's deadline on the priority day; the 60-s row is the same policy on
the engines' 60-s rates (today's default).
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
from simulator.report import request_table, slo_meets, window_attainment  # noqa: E402
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
WORKLOADS = ("bursty", "seasonal", "priority", "pd-day")
DAYS = 3  # seasonal: days simulated; scored from day 2
INTERACTIVE, BATCH = 10, 0  # band priorities (the router's priority label)
BATCH_SHARE, BATCH_DEADLINE = 0.3, 3600.0
# the batch band goes only to engines under 10% of the saturation thresholds (no request waiting, KV
# under 9%): at the SLO's load an engine holds about 10% KV, so in a burst batch waits at the gateway
# while the interactive band has the engines up to the thresholds
BATCH_SATURATION = 0.1
FLOW = {  # the priority workload's gateway: interactive first, batch held up to its deadline
    "queue_threshold": 4,
    "kv_threshold": 0.9,
    "bands": [
        {"priority": INTERACTIVE, "name": "interactive", "capacity": 100000, "ttl": 3600,
         "share": 1 - BATCH_SHARE},
        {"priority": BATCH, "name": "batch", "capacity": 100000, "ttl": BATCH_DEADLINE, "share": BATCH_SHARE,
         "saturation": BATCH_SATURATION},
    ],
}
GATEWAY = {  # --gateway KV: one band, the priority day's queue threshold and the given KV threshold;
    # requests wait in the router, not in the engines
    "queue_threshold": FLOW["queue_threshold"],
    "bands": [{"priority": 0, "name": "default", "capacity": 100000, "ttl": 3600}],
}
ROUTER_ARRIVALS = "sum(llm_d_epp_request_total)"
ROUTER_QUEUE = "sum(llm_d_epp_flow_control_queue_size)"


def seasonal_points(day: float, seed: int) -> list[list[float]]:
    """Three days of the diurnal curve (mean 8 req/s, amplitude 0.7, trough at each day's start), each
    day's amplitude scaled by 1 +- 10% and its phase moved by +-15 minutes, as [time, rate] each minute."""
    rng = np.random.default_rng([seed, 20])
    amp = 0.7 * (1 + rng.uniform(-0.1, 0.1, DAYS))
    phase = rng.uniform(-900, 900, DAYS)
    t = np.arange(0, DAYS * day + 1, 60.0)
    d = np.minimum((t // day).astype(int), DAYS - 1)
    rate = 8.0 * (1 - amp[d] * np.cos(2 * np.pi * (t - phase[d]) / day))
    return [[float(a), round(float(b), 4)] for a, b in zip(t, rate)]


def spikes_of(workload: str, dur: float) -> list[dict]:
    """Bursts at 1/4 and 2/3 of the day (none on the seasonal days)."""
    if workload == "seasonal":
        return []
    return [
        {"at": dur * 0.25, "duration": 300, "factor": 3.0, "ramp": 120},
        {"at": dur * 0.66, "duration": 300, "factor": 3.0, "ramp": 120},
    ]


def scenario(
    hours: float, autoscaler: dict, replicas: int = 4, workload: str = "bursty", seed: int = 7,
    batch_saturation: float = BATCH_SATURATION, gateway: float | None = None,
) -> dict:
    dur = hours * 3600
    if workload == "seasonal":
        arrivals = {"piecewise": seasonal_points(dur, seed)}
        dur *= DAYS
    else:  # trough at the start, peak half-way
        arrivals = {"diurnal": {"mean": 8.0, "amplitude": 0.7, "period": dur}}
    router = {"policy": "least_outstanding"}
    if workload == "priority":
        router["flow_control"] = copy.deepcopy(FLOW)
        router["flow_control"]["bands"][1]["saturation"] = batch_saturation
    elif gateway is not None:
        router["flow_control"] = {**copy.deepcopy(GATEWAY), "kv_threshold": gateway}
    return {
        "name": "policies",
        "seed": seed,
        "duration": dur,
        "workload": {
            "arrivals": {"process": "gamma", "cv": 1.09, **arrivals, "spikes": spikes_of(workload, dur)},
            **LENGTHS,
        },
        "pools": [dict(POOL, replicas=replicas, autoscaler=autoscaler)],
        "router": router,
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


def ours(workload: str, day: float, gateway: float | None = None) -> dict:
    """The model-based policy on the router's fast signals (+ what the workload lets it use)."""
    opts = {"burstSlope": "last", "dropOnFall": True, "margin": 0.1, "arrivalsQuery": ROUTER_ARRIVALS}
    if gateway is not None:
        opts["queueQuery"] = ROUTER_QUEUE
    if workload == "seasonal":
        opts["seasonPeriodSeconds"] = day
    else:  # a burst's first order: a line through its rise since the onset, not one noisy interval;
        # a low rate's burst test no tighter than its counting noise
        opts.update(burstSlope="onset", burstNoiseFloor=True)
    if workload == "priority":
        opts.update(
            queueQuery=ROUTER_QUEUE,
            batchArrivalsQuery=f'sum(llm_d_epp_request_total{{priority="{BATCH}"}})',
            batchQueueQuery='sum(llm_d_epp_flow_control_queue_size{priority="batch"})',
            batchDeadlineSeconds=BATCH_DEADLINE,
        )
    return ia("slo-model-fast", {"type": "sloModel", "sloModel": opts}, polling=5)


def policies(peak: int, workload: str = "bursty", day: float = 21600.0, gateway: float | None = None
             ) -> dict[str, dict]:
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
        "model-based SLO headroom (60-s rates)": ia(
            "slo-model",
            {"type": "sloModel", "sloModel": {"burstSlope": "last", "dropOnFall": True}},
            polling=30,
        ),
        "ours (model-based, router signals)": ours(workload, day, gateway),
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


def gpu_hours_between(res, since: float, until: float) -> float:
    """GPU-hours billed in [since, until): replicas provisioning or ready, from the timeline's steps."""
    tl = res.fleet.timeline
    total = 0.0
    for i, r in enumerate(tl):
        t0 = r["time"]
        t1 = tl[i + 1]["time"] if i + 1 < len(tl) else until
        lo, hi = max(t0, since), min(t1, until)
        if hi > lo:
            total += (r["ready"] + r["provisioning"]) * (hi - lo)
    return total / 3600 * GPUS_PER_REPLICA


def summarize(name: str, res, wall: float, bursts=(), since: float = 0.0, until: float | None = None) -> dict:
    """One row: attainment of the requests arriving in [since, until) (by band on a flow-controlled
    run: interactive only, batch scored on its deadline), their p90s, the GPU-hours of that span."""
    fleet = res.fleet
    req = request_table(fleet)
    until = fleet.sc.duration if until is None else until
    t = req["arrival"]
    arrived = (np.arange(len(t)) < fleet.arrived) & (t >= since) & (t < until)
    gate = fleet.gate
    band = gate.band if gate is not None else None
    row = {"policy": name}
    if gate is not None and len(gate.bands) > 1:
        batch = arrived & (band == BATCH)
        e2e = np.where(req["status"] == 1, req["finish"] - t, np.inf)
        done = int((batch & (e2e <= BATCH_DEADLINE)).sum())
        row.update(batch_requests=int(batch.sum()), batch_done_by_deadline=done,
                   batch_e2e_max=float(np.max(e2e[batch])) if batch.any() else 0.0)
        arrived &= band == INTERACTIVE
    ok = np.ones(int(arrived.sum()), dtype=bool)
    for slo in fleet.sc.slos:
        ok &= slo_meets(req, slo, arrived)
    inside = np.zeros(len(ok), dtype=bool)
    for a, b in bursts:
        inside |= (t[arrived] >= a) & (t[arrived] < b)

    def p90(metric: str) -> float:
        v = np.where(req["status"][arrived] == 1, req[metric][arrived], np.inf)
        if not len(v):
            return float("nan")
        q = float(np.percentile(np.nan_to_num(v, nan=0.0, posinf=np.inf), 90))
        return math.inf if math.isnan(q) else q  # between two unfinished ones: inf - inf

    full = until >= fleet.sc.duration and since <= 0
    row.update(
        requests=int(arrived.sum()),
        late=int((~ok).sum()),
        late_in_bursts=int((~ok & inside).sum()),
        attainment=float(ok.mean()) if len(ok) else 1.0,
        window_attainment=window_attainment(req, fleet.sc.slos, arrived),
        ttft_p90=p90("ttft"),
        tpot_p90=p90("tpot"),
        # the summary's over the whole run (replica-hours x the pool's GPUs), else the timeline's span
        gpu_hours=res.summary["costs"]["gpu_hours"] if full else gpu_hours_between(res, since, until),
        scale_events=sum(1 for e in fleet.pools[0].scale_events if since <= e[0] < until),
        wall_s=wall,
        timeline=[(r["time"], r["ready"] + r["provisioning"], r["arrival_rate"]) for r in fleet.timeline],
    )
    return row


def seconds(v: float, scale: float = 1.0, fmt: str = ".2f") -> str:
    """A p90 for the table; unfinished requests count as infinitely late (a saved JSON holds 1.8e308)."""
    return "inf (unfinished)" if v >= 1e300 else format(v * scale, fmt)


def cells(rows: list[dict], oracle_gpu_h: float, priority: bool) -> tuple[list[str], list[list[str]]]:
    """The table's columns and cells (the printed table and the --json result's)."""
    cols = ["policy", "attainment (requests)", "attainment (1-min windows)", "TTFT p90 (s)", "TPOT p90 (ms)",
            "GPU-hours", "x oracle bound", "scale events", "late requests (in the bursts)"]
    cols += ["batch done by deadline", "batch e2e max (min)"] if priority else []
    out = [["oracle lower bound", "-", "-", "-", "-", f"{oracle_gpu_h:.1f}", "1.00", "-", "-"]
           + (["-", "-"] if priority else [])]
    for r in rows:
        wa = r["window_attainment"]
        line = [r["policy"], f"{100 * r['attainment']:.2f}%", "-" if wa is None else f"{100 * wa:.1f}%",
                seconds(r["ttft_p90"]), seconds(r["tpot_p90"], 1000, ".0f"), f"{r['gpu_hours']:.1f}",
                f"{r['gpu_hours'] / oracle_gpu_h:.2f}", str(r["scale_events"]),
                f"{r['late']:,} ({r['late_in_bursts']:,})"]
        if priority:
            n = max(r["batch_requests"], 1)
            line += [f"{100 * r['batch_done_by_deadline'] / n:.2f}%", f"{r['batch_e2e_max'] / 60:.1f}"]
        out.append(line)
    return cols, out


def table(rows: list[dict], oracle_gpu_h: float, priority: bool) -> str:
    cols, body = cells(rows, oracle_gpu_h, priority)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in body])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=WORKLOADS, default="bursty")
    ap.add_argument("--seed", type=int, default=7, help="the scenario's seed (arrivals, lengths, bands)")
    ap.add_argument("--hours", type=float, default=6.0, help="the day's length (seasonal: three of them)")
    ap.add_argument("--out", default="out/bench_policies")
    ap.add_argument("--json", default=None, help="also write the table here as bench/pages.py renders it "
                    "(the rows' figures under 'result', as --merge reads them)")
    ap.add_argument("--plot", default=None, help="also save the plot here (e.g. docs/img/policies.png)")
    ap.add_argument(
        "--bounds",
        action="store_true",
        help="also simulate the reactive bound and standing-headroom rows (about 3 more minutes)",
    )
    ap.add_argument("--headroom", type=float, nargs="*", default=[1.25, 1.5, 1.75, 2.0])
    ap.add_argument("--batch-saturation", type=float, default=BATCH_SATURATION,
                    help="priority: the batch band's saturation level in the gateway (1: the detector's)")
    ap.add_argument("--gateway", type=float, nargs="?", const=FLOW["kv_threshold"], default=None,
                    metavar="KV", help="bursty, seasonal: every row behind the router's gateway queue (one "
                    "band), engines held under KV usage KV (default %(const)s) and "
                    f"{GATEWAY['queue_threshold']} waiting")
    ap.add_argument("--only", nargs="*", default=None, help="run only the policy rows whose name starts so")
    ap.add_argument("--merge", nargs="*", default=[],
                    help="with --only: the other rows of these earlier --json outputs or results_WK.json "
                    "files (same workload, seed)")
    ap.add_argument("--rate", type=float, default=3.0, help="pd-day: the mean request rate")
    args = ap.parse_args()
    if args.workload == "pd-day":  # a P/D service: its own rows and bound (bench/pd_day.py)
        from pd_day import run_day

        run_day(args)
        return
    wk, day = args.workload, args.hours * 3600
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cap = capacity_per_replica()
    print(
        f"measured capacity: {cap:.3f} req/s per replica meets TTFT p90 <= {TTFT_SLO} s and TPOT p90 <= "
        f"{TPOT_SLO * 1000:.0f} ms (4 replicas, 15 min, same length mix)"
    )

    def sc(autoscaler: dict, replicas: int = 4) -> dict:
        return scenario(args.hours, autoscaler, replicas, wk, args.seed, args.batch_saturation, args.gateway)

    base = load_scenario(sc({"fixed": 1}))
    wl = build_workload(base, base.seed)
    duration = base.duration
    since = day if wk == "seasonal" else 0.0  # seasonal: days 2 and 3 are scored
    need, billed = oracle(wl.times, duration, cap, STARTUP)
    peak = int(need.max())
    oracle_gpu_h = billed[int(since // 60):].sum() / 60 * GPUS_PER_REPLICA
    print(
        f"workload {wk} (seed {args.seed}): {len(wl)} requests over {duration / 3600:g} h; oracle needs "
        f"1..{peak} replicas; oracle lower bound {oracle_gpu_h:.1f} GPU-hours"
        + (f" on days 2-{DAYS}" if since else "")
    )

    spikes = spikes_of(wk, day)
    bursts = [(sp["at"], sp["at"] + sp["duration"]) for sp in spikes]

    def row(name: str, autoscaler: dict, replicas: int = 4, **extra) -> dict:
        res, wall = run(sc(copy.deepcopy(autoscaler), replicas), wl)
        print(f"  {name}: done in {wall:.0f} s")
        return dict(summarize(name, res, wall, bursts, since), **extra)

    def schedule_row(name: str, steps: list[dict], bound: bool = False) -> dict:
        return row(name, {"schedule": steps, "polling_interval": 5}, steps[0]["replicas"], bound=bound)

    # the oracle's plan, simulated: desired(m - 2) = need(m), so replicas are ready when needed
    def wanted(name: str) -> bool:
        return not args.only or any(name.startswith(o) for o in args.only)

    rows = [schedule_row("oracle plan (simulated)", plan_steps(billed))] if wanted("oracle plan") else []
    if args.bounds and spikes and wanted("reactive bound"):
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
    for name, autoscaler in policies(peak, wk, day, args.gateway).items():
        if not wanted(name):
            continue
        rows.append(row(name, autoscaler, 4 if name != "static peak" else peak))

    for path in args.merge:
        old = json.loads(Path(path).read_text())
        old = old.get("result", old)  # a --json result, or an --out directory's results_WK.json
        if (old["workload"], old["seed"], old["hours"], old.get("gateway")) != (
                wk, args.seed, args.hours, args.gateway) or (
                wk == "priority" and old.get("batch_saturation", 1.0) != args.batch_saturation):
            raise SystemExit(f"--merge {path}: another workload, seed, day length, gateway or band level")
        ran = {r["policy"] for r in rows}
        rows = [dict(r, timeline=[]) for r in old["rows"] if r["policy"] not in ran] + rows
    print()
    text = table(rows, oracle_gpu_h, wk == "priority")
    print(text)
    (out / f"table_{wk}.md").write_text(text + "\n")
    result = {
        "workload": wk,
        "seed": args.seed,
        "gateway": args.gateway,
        "hours": args.hours,
        "scored_from_s": since,
        **({"batch_saturation": args.batch_saturation} if wk == "priority" else {}),
        "capacity_per_replica": cap,
        "oracle_gpu_hours": oracle_gpu_h,
        "rows": [{k: v for k, v in r.items() if k != "timeline"} for r in rows],
    }
    (out / f"results_{wk}.json").write_text(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, rows, result)
    shown = [r for r in rows if not r.get("bound") and r["timeline"]]
    if shown:
        plot(shown, need, billed, out / f"policies_{wk}.png", wk)
        if args.plot:
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            plot(shown, need, billed, Path(args.plot), wk)
    print(f"\nwrote {out}/table_{wk}.md, results_{wk}.json, policies_{wk}.png")


def write_json(path: str, rows: list[dict], result: dict) -> None:
    """The table for docs/benchmarks/ (bench/pages.py), the rows' own figures beside it for --merge."""
    from bench.pages import write_result

    wk = result["workload"]
    cols, body = cells(rows, result["oracle_gpu_hours"], wk == "priority")
    walls = sum(r["wall_s"] for r in rows)
    note = (f"Workload {wk}, seed {result['seed']}, {result['hours']:g}-hour day"
            + (f", scored from {result['scored_from_s'] / 3600:g} h" if result["scored_from_s"] else "")
            + (f", gateway at KV {result['gateway']}" if result["gateway"] is not None else "")
            + f"; measured capacity {result['capacity_per_replica']:.3f} req/s per replica; "
            f"{walls / 60:.1f} minutes of simulation for the {len(rows)} rows.")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_result(path, cols, body, [note], result=result)


def plot(rows, need, billed, path: Path, workload: str = "bursty") -> None:
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
        {
            "bursty": "Replicas over a diurnal day with two 3x bursts",
            "seasonal": f"Replicas over {DAYS} noisy diurnal days (scored on days 2-{DAYS})",
            "priority": "Replicas over the bursty day, 30% batch behind a gateway queue",
        }[workload]
        + " (H100 Llama-2-70B TP4, 2-min startup)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    main()
