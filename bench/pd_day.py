"""The P/D day (`bench/pd_day.py`, or `bench/policies.py --workload pd-day`): a disaggregated
Llama-2-70B service on H100 TP4 replicas (a prefill pool and a decode pool, 2-minute startup each)
through a 6-hour day whose length mix shifts under the bursty rate, so the right P:D ratio moves:

* the rate: the bursty day's shape (diurnal, trough at the start, peak half-way, two 3x bursts at 1/4
  and 2/3 of the day), at --rate req/s on average;
* the mix: each request is a summarisation (long prompt, short answer) with a probability of 0.85 for
  the first 40% of the day, falling linearly to 0.1 by 60% and staying there (the chatty phase: short
  prompts, longer answers).

Rows: HPA per pool on its own utilisation (prefill: requests in the pool per replica; decode: running
sequences per replica), a fixed 1:1 P:D unit scaled as one on the whole fleet's requests, a Dynamo-style
throughput planner (bench/pd_baselines.py), ours (pdModel on each pool; the previous configuration
kept beside it, and the same policy under a budget to compare with the planner at its cost), and the
oracle bound (the day's setting and the bounds in bench/pd_setup.py and bench/pd_bounds.py): per
minute, the fewest prefill and decode replicas for that minute's arrivals of each kind at the capacities
a replica of each role sustains on each pure mix (measured by steady runs, simulator.planner.pd_plan),
each started and billed a startup delay ahead. With --bounds, that plan simulated (each pool on a
schedule) and the reactive bounds (the same plan blind to each burst until it is seen, at its start or
30 s after, then its peak ordered at once; and the 30-s one with standing headroom), as
bench/policies.py does for the aggregated bursty day (bench/pd_bounds.py).

    .venv/bin/python bench/pd_day.py --bounds --json docs/benchmarks/results/pd_day.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages
import pd_baselines  # noqa: E402, F401  (registers throughputPlanner)
from pd_bounds import bound_rows, capacities, late_plans, oracle_pd  # noqa: E402
from pd_setup import PD, SLO, day_workload, hpa, ia, run_row, scenario  # noqa: E402  (the day's setting)

# both pools read the router's arrival counter as their fast signal (the prefill pool its share of it)
# a burst sized from the line through its whole rise so far (onset) past a counted rate's noise, not from
# one 15-s interval's slope; 2-minute scale-down window (the decode role's batch percentile and the
# prefill role's whole-TTFT tail keep the count off the edge, so it need not be held 3 minutes)
OURS = {"burstSlope": "onset", "burstNoiseFloor": True, "dropOnFall": True, "margin": 0.05,
        "scaleDownDelaySeconds": 120, "decodeTtftSeconds": 0.3,
        "arrivalsQuery": "sum(llm_d_epp_request_total)"}
# the prompts under the router's threshold are prefilled on the decode pool
DECODE = {"role": "decode", "prefillThreshold": PD["threshold"]}
# each pool's headroom where its misses last: a decode batch pushed past its fold runs away and stays slow
# after help arrives, so the decode pool keeps a replica on the way down (it shrinks only to a count that
# would hold 1.15x the rate) in place of its 5% margin; a prefill queue drains once a replica is ready,
# so the prefill pool lets replicas go after a 90-s window instead of 120 s (chosen on seed 7: see the page)
PREFILL_OURS = {"scaleDownDelaySeconds": 90}
DECODE_OURS = {"margin": 0.0, "scaleDownHeadroom": 0.15}
LEAN_SLO = {"ttft": {"percentile": 50, "seconds": 2 * SLO["ttft"]["seconds"]},
            "tpot": {"percentile": 50, "seconds": 2 * SLO["tpot"]["seconds"]}}


def pd_model(role: str, extra: dict, **kw) -> dict:
    """Our policy (pdModel) on one pool, OURS with `extra` on top; kw: ia's (max_replicas, slo)."""
    base = {**OURS, "role": "prefill"} if role == "prefill" else {**OURS, **DECODE}
    return ia(role, {"type": "pdModel", "pdModel": {**base, **extra}}, polling=5, **kw)


def policies() -> dict[str, tuple[dict, dict]]:
    """name -> (prefill pool's autoscaler, decode pool's)."""
    fleet = "sum(vllm:num_requests_running) + sum(vllm:num_requests_waiting)"
    return {
        "HPA per pool (own utilisation)": (
            hpa("prefill", 'sum(vllm:num_requests_running{job="prefill"}) + '
                           'sum(vllm:num_requests_waiting{job="prefill"})', 2),
            hpa("decode", 'sum(vllm:num_requests_running{job="decode"})', 24)),
        "fixed 1:1 P:D unit": (hpa("prefill", fleet, 24), hpa("decode", fleet, 24)),
        "throughput planner (Dynamo-style)": tuple(
            ia(r, {"type": "throughputPlanner", "throughputPlanner": {"role": r}}, polling=60)
            for r in ("prefill", "decode")),
        "ours (pdModel per pool)": (pd_model("prefill", PREFILL_OURS), pd_model("decode", DECODE_OURS)),
        # the previous rows (kept for history): both pools at margin 0.05 and a 120-s window; and that
        # with the decode hysteresis on top of the margin (over the cost target, 1.22x)
        "ours before (margin 0.05 both pools, 120-s windows)": (
            pd_model("prefill", {}), pd_model("decode", {})),
        "ours before + decode hysteresis (scaleDownHeadroom 0.15)": (
            pd_model("prefill", {}), pd_model("decode", {"scaleDownHeadroom": 0.15})),
        # cost-matched with the throughput planner: the same policy under a budget (at most 2 prefill and
        # 3 decode replicas) sized for a lean target (the median within twice each SLO)
        "ours under a budget (max 2 prefill / 3 decode, sized for p50 at 2x the SLOs)": (
            pd_model("prefill", {}, max_replicas=2, slo=LEAN_SLO),
            pd_model("decode", {}, max_replicas=3, slo=LEAN_SLO)),
    }


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


COLUMNS = ["policy", "TTFT attainment", "TPOT attainment", "both", "GPU-hours", "x oracle", "P:D ratio range",
           "prefill replicas", "decode replicas", "scale events",
           "late TTFT / TPOT (of them in the bursts' 10 min)"]


def cells(rows: list[dict], bound: dict) -> list[list[str]]:
    """The table's rows: every policy and bound row, then the oracle bound's own plan (not simulated)."""
    out = []
    for r in rows:
        out.append([r["policy"], pct(r["ttft_attainment"]), pct(r["tpot_attainment"]), pct(r["attainment"]),
                    f"{r['gpu_hours']:.1f}", f"{r['gpu_hours'] / bound['gpu_hours']:.2f}",
                    f"{r['pd_ratio'][0]:.2f}-{r['pd_ratio'][1]:.2f}",
                    f"{r['prefill_range'][0]}-{r['prefill_range'][1]}",
                    f"{r['decode_range'][0]}-{r['decode_range'][1]}", str(r["scale_events"]),
                    "{:,} / {:,} ({:,} / {:,})".format(*r["late"]["ttft"][:1], *r["late"]["tpot"][:1],
                                                       r["late"]["ttft"][1], r["late"]["tpot"][1])])
    out.append(["oracle bound (P/D, per minute)", "-", "-", "-", f"{bound['gpu_hours']:.1f}", "1.00",
                f"{bound['pd_ratio'][0]:.2f}-{bound['pd_ratio'][1]:.2f}",
                f"{bound['prefill_range'][0]}-{bound['prefill_range'][1]}",
                f"{bound['decode_range'][0]}-{bound['decode_range'][1]}", "-", "-"])
    return out


def table(rows: list[dict], bound: dict) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(out + ["| " + " | ".join(c) + " |" for c in cells(rows, bound)])


def run_day(args) -> dict:
    """`bench/pd_day.py [--hours 6] [--rate 3] [--seed 7] [--only ...] [--bounds] [--json F]` (or
    `bench/policies.py --workload pd-day ...`): the rows, printed and (--json) written for bench/pages.py."""
    import datetime
    import json
    import os

    day = args.hours * 3600
    wl, long = day_workload(args.hours, args.rate, args.seed)
    loads = [os.getloadavg()[0]]
    print(f"pd-day: {len(wl)} requests over {args.hours:g} h ({100 * long.mean():.0f}% summarisations; "
          f"prompt mean {wl.prompt.mean():.0f}, output mean {wl.output.mean():.0f} tokens); load "
          f"{loads[0]:.1f}", flush=True)
    t = time.perf_counter()
    caps = capacities()
    print("capacity per replica (req/s): " + ", ".join(
        f"{k}: prefill {p:.2f}, decode {d:.2f}" for k, (p, d) in caps.items())
        + f" ({time.perf_counter() - t:.0f} s)", flush=True)
    bound = oracle_pd(wl, long, day, caps)

    def log(r: dict) -> None:
        loads.append(os.getloadavg()[0])
        print(f"  {r['policy']}: {pct(r['ttft_attainment'])} TTFT, {pct(r['tpot_attainment'])} TPOT, "
              f"{r['gpu_hours']:.1f} GPU-h, {r['wall_s']:.0f} s wall, load {loads[-1]:.1f}", flush=True)

    rows = []
    for name, (pre, dec) in policies().items():
        if args.only is not None and not any(name.startswith(o) for o in args.only):
            continue
        rows.append(run_row(name, scenario(day, pre, dec, seed=args.seed), wl))
        log(rows[-1])
    if getattr(args, "bounds", False):
        rows += bound_rows(wl, day, bound, list(getattr(args, "headroom", None) or []), log, args.seed)
    late, dh = list(getattr(args, "late", None) or []), list(getattr(args, "decode_headroom", None) or [])
    if late or dh:
        rows += bound_rows(wl, day, bound, [], log, args.seed, late_plans(bound, day, late, dh))
    print(table(rows, bound))
    result = {"command": f"bench/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:]),
              "date": datetime.date.today().isoformat(),
              "load": f"{min(loads):.1f}-{max(loads):.1f}", "columns": COLUMNS, "rows": cells(rows, bound),
              "notes": [f"{len(wl)} requests over {args.hours:g} h at {args.rate:g} req/s on average, seed "
                        f"{args.seed}; the simulator is deterministic (the numbers do not depend on the "
                        "load, the wall times do). Capacities per replica (req/s, prefill / decode): "
                        + "; ".join(f"{k} {p:.2f} / {d:.2f}" for k, (p, d) in caps.items()) + "."],
              "hours": args.hours, "rate": args.rate, "seed": args.seed, "capacities": caps,
              "bound": {k: v for k, v in bound.items() if k not in ("need", "billed")}, "raw": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=3.0, help="the mean request rate")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", nargs="*", default=None, help="run only the policy rows whose name starts so "
                    "(none: no policy row)")
    ap.add_argument("--bounds", action="store_true", help="also simulate the oracle plan and the reactive "
                    "bounds (bench/pd_bounds.py)")
    ap.add_argument("--headroom", type=float, nargs="*", default=[1.25, 1.5, 2.0],
                    help="with --bounds: the standing-headroom factors of the 30-s reactive bound")
    ap.add_argument("--late", type=float, nargs="*", default=[], metavar="D",
                    help="also the late bounds: each burst seen D s after its start, 40 a pool ordered "
                    "(bench/pd_bounds.py)")
    ap.add_argument("--decode-headroom", type=float, nargs="*", default=[], metavar="H",
                    help="also the late bounds seen at each D (45 s without --late), their peak ordered, "
                    "with ceil(H x the plan) decode replicas standing")
    ap.add_argument("--json", default=None, help="also write the results here (bench/pages.py renders them)")
    run_day(ap.parse_args(argv))


if __name__ == "__main__":
    main()
