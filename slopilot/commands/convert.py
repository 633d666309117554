"""`slopilot convert splitwise|distserve FILE -o PROFILE.csv`: public GPU measurements -> profile CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "convert Splitwise perf_model.csv or DistServe fitted coefficients to the profile CSV format"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", choices=["splitwise", "distserve"])
    p.add_argument("file", type=Path, help="perf_model.csv (Splitwise) or profiler JSON (DistServe)")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--device", help="Splitwise: keep this hardware (e.g. h100-80gb); DistServe: the device "
                   "to write (default a100-80gb)")
    p.add_argument("--model", help="keep this model (e.g. llama2-70b, opt-13b)")
    p.add_argument("--tp", type=int, help="keep this tensor-parallel degree")


def run(args: argparse.Namespace) -> int:
    from simulator.latency.convert import DISTSERVE_COLUMNS, SPLITWISE_COLUMNS, distserve_rows, splitwise_rows
    from simulator.latency.profile import write_csv

    if args.source == "splitwise":
        rows, cols = splitwise_rows(args.file, args.device, args.model, args.tp), SPLITWISE_COLUMNS
    else:
        rows = distserve_rows(args.file, args.model, args.tp, args.device or "a100-80gb")
        cols = DISTSERVE_COLUMNS
    write_csv(args.output, cols, rows)
    groups = sorted({(r["device"], r["model"], r["tp"]) for r in rows})
    names = ", ".join(f"{d}/{m}/tp{t}" for d, m, t in groups)
    print(f"wrote {args.output}: {len(rows)} rows, groups {names}")
    return 0
