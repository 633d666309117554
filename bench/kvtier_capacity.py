"""GPUs needed with and without a KV offload tier, approximate vs precise prefix routing (docs/kv_tiers.md).

    python bench/kvtier_capacity.py [examples/kvtier_mooncake_70b.yaml] [--start 12] [--duration S] [--json F]

The scenario's first pool holds the tier (kv_offload) and its router the approximate prefix scorer;
the variants drop the tier and/or put the precise scorer (precise_prefix, fed from what each simulated
replica really holds, by tier) in the approximate one's place at the same weight. For each, the fewest
replicas meeting every SLO on the workload replayed as recorded (simulator.planner.replay_sizing),
their GPUs and cost an hour (the tier's host memory included), and at that size the hit rates by tier
and the prompt tokens computed.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscaler.yamlfile import parse  # noqa: E402
from routing.scorers import SCORER_PLUGINS  # noqa: E402
from simulator.fleet import Fleet  # noqa: E402, F401  (its import registers the precise scorer)
from simulator.latency import load_latency_model  # noqa: E402
from simulator.planner.replay_sizing import fewest_replicas  # noqa: E402

PRECISE = "precise_prefix"  # routing.precise's scorer


def variants(data: dict, precise: bool) -> dict[str, dict]:
    """name -> scenario dict: with and without the first pool's tier, approximate (and precise) routing."""
    out = {}
    for tier in (False, True):
        for route in ("approximate", "precise") if precise else ("approximate",):
            sc = copy.deepcopy(data)
            if not tier:
                sc["pools"][0].pop("kv_offload", None)
            if route == "precise":
                w = sc["router"]["weights"]
                w[PRECISE] = w.pop("prefix")
            out[f"{'256 GiB tier' if tier else 'GPU only'} / {route}"] = sc
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "examples" / "kvtier_mooncake_70b.yaml"))
    ap.add_argument("--start", type=int, default=12, help="replicas tried first")
    ap.add_argument("--duration", type=float, help="in place of the scenario's")
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args(argv)
    path = Path(args.scenario)
    data = parse(path.read_text(), str(path)).data
    if args.duration:
        data["duration"] = args.duration
    precise = PRECISE in SCORER_PLUGINS
    if not precise:
        print(f"(no {PRECISE} scorer registered: approximate routing only)")
    gpus = load_latency_model(data["pools"][0]["latency_model"]).tp
    rows = {}
    for name, sc in variants(data, precise).items():
        t0 = time.time()
        print(f"{name}:", flush=True)
        found = fewest_replicas(sc, args.start, base_dir=path.resolve().parent, log=print)
        n = found["replicas"]
        s = found["runs"].get(n) if n else None
        pool = next(iter(s["pools"].values())) if s else None
        tiers = pool["kv_tiers"] if pool else {}
        rows[name] = {"replicas": n, "gpus": n * gpus if n else None,
                      "cost_per_hour": s["costs"]["per_hour_at_peak"] if s else None,
                      **{k: tiers.get(k) for k in ("hit_rate", "device_hit_rate", "offload_hit_rate",
                                                   "prefill_tokens_computed")},
                      "slo": {k: v["value_at_percentile"] for k, v in s["slo"].items()} if s else None,
                      "runs": len(found["runs"]), "wall_s": time.time() - t0}
    print(f"\n{'variant':<28} {'replicas':>8} {'GPUs':>5} {'cost/h':>8} {'hit':>6} {'device':>7} {'tier':>6} "
          f"{'prompt tokens computed':>23}")
    for name, r in rows.items():
        if r["replicas"] is None:
            print(f"{name:<28} {'none':>8}")
            continue
        print(f"{name:<28} {r['replicas']:>8} {r['gpus']:>5} {r['cost_per_hour']:>8.2f} "
              f"{r['hit_rate']:>6.1%} {r['device_hit_rate']:>7.1%} {r['offload_hit_rate']:>6.1%} "
              f"{r['prefill_tokens_computed']:>23,}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
