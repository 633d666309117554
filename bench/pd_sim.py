"""Aggregated vs disaggregated in the simulator, same GPUs, same arrivals (docs/pd.md).

    python bench/pd_sim.py [examples/pd_h100_70b.yaml] [--rate R] [--duration S] [--tpot-slo S] [--json PATH]

Runs the example's P/D service as 1 prefill + 3 decode and 2 + 2, and the same 4 replicas aggregated
(one pool, no P/D), on one workload drawn once, and prints TTFT/TPOT/E2E percentiles, goodput under
the scenario's SLOs and the P/D breakdown (prefill queue, transfer, decode admission wait).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscaler.yamlfile import parse  # noqa: E402
from simulator.run import build_workload, simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402


def variants(data: dict) -> dict[str, dict]:
    pre, dec = (copy.deepcopy(p) for p in data["pools"])
    total = pre["replicas"] + dec["replicas"]
    agg = {k: v for k, v in data.items() if k != "pd"}
    one = {k: v for k, v in dec.items() if k != "labels"}
    agg["pools"] = [{**one, "name": "aggregated", "replicas": total}]
    out = {f"aggregated {total}": agg}
    for p in range(1, total):
        if p in (1, 2):
            pools = [{**pre, "replicas": p}, {**dec, "replicas": total - p}]
            out[f"{p}P + {total - p}D"] = {**data, "pools": pools}
    return out


COLUMNS = ["config", "TTFT p50 ms", "TTFT p90 ms", "TPOT p50 ms", "TPOT p90 ms", "E2E p50 s", "goodput req/s",
           "SLO attainment", "prefill queue p90 ms", "transfer p50 ms", "decode admission wait max ms"]


def cells(name: str, s: dict) -> list[str]:
    lat, pd = s["latency"], s.get("pd") or {}

    def ms(d, k):
        return f"{d[k] * 1000:.0f}" if d and d.get(k) is not None else "-"

    wait = pd.get("admission_wait") or {}
    return [name, ms(lat["ttft"], "p50"), ms(lat["ttft"], "p90"), ms(lat["tpot"], "p50"),
            ms(lat["tpot"], "p90"), f"{lat['e2e']['p50']:.1f}", f"{s['goodput_rps']:.3f}",
            f"{s['slo_attainment_joint']:.3f}",
            ms(pd.get("prefill_queue"), "p90"), ms(pd.get("transfer"), "p50"), ms(wait, "max")]


def row(name: str, s: dict) -> str:
    return "| " + " | ".join(cells(name, s)) + " |"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "examples" / "pd_h100_70b.yaml"))
    ap.add_argument("--rate", type=float, help="requests per second (replaces the file's)")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--tpot-slo", type=float, help="TPOT p90 SLO in seconds (replaces the file's)")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    a = ap.parse_args(argv)
    path = Path(a.scenario)
    data = parse(path.read_text(), str(path)).data
    if a.rate:
        data["workload"]["arrivals"]["rate"] = a.rate
    if a.duration:
        data["duration"] = a.duration
    if a.tpot_slo:
        data["slo"]["tpot"] = {"percentile": 90, "seconds": a.tpot_slo}
    base = path.resolve().parent
    wl = build_workload(load_scenario(data, base_dir=base), data.get("seed", 0))
    slo = ", ".join(f"{k} p{v['percentile']:g} <= {v['seconds']:g} s" for k, v in data["slo"].items())
    print(f"{len(wl)} requests, prompt mean {wl.prompt.mean():.0f} / median {np.median(wl.prompt):.0f}, "
          f"output mean {wl.output.mean():.0f} tokens; SLO: {slo}\n")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    rows = []
    for name, d in variants(data).items():
        s = simulate(load_scenario(d, base_dir=base), workload=wl, plots=False).summary
        rows.append(cells(name, s))
        print(row(name, s), flush=True)
    if a.json:
        from bench.pages import write_result

        write_result(a.json, COLUMNS, rows, notes=[
            f"{path.name}: {len(wl)} requests at {data['workload']['arrivals'].get('rate', '?')} req/s over "
            f"{data['duration']:g} simulated s, the same arrivals for every config; SLO: {slo}. The "
            "simulator is deterministic: these figures do not depend on the machine's load."])


if __name__ == "__main__":
    main()
