"""`slopilot predict MODEL.json ROWS.csv [-o OUT.csv]`: add predicted_ms to profile-format rows."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "predict step latency for profile-format rows (adds predicted_ms; with latency_ms, prints the error)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "latency models and their checks: docs/guide.md (Plan capacity with the simulator)"
    p.add_argument("model", help="a model JSON path, or a shipped model name (e.g. h100-llama2-70b-tp4)")
    p.add_argument("rows", type=Path, help="CSV in the profile format; latency_ms may be absent")
    p.add_argument("-o", "--output", type=Path, help="CSV to write (default: stdout)")


def mismatches(model, prof) -> list[str]:
    """What the rows are that the model was not fitted on: another device, model, dtype or tp."""
    out = []
    for column, want in (("device", model.device), ("model", model.model), ("dtype", model.dtype),
                         ("tp", str(model.tp))):
        values = prof.text[column]
        if column == "tp":
            values = [str(int(float(v))) for v in values]
        other = sorted(set(values) - {want})
        if other:
            n = sum(v != want for v in values)
            out.append(f"{model} was fitted on {column} {want}, but {n} of {len(values)} rows are for "
                       f"{column} {', '.join(other)}: their predictions are not calibrated")
    return out


def run(args: argparse.Namespace) -> int:
    import csv

    import numpy as np

    from simulator.latency import load_latency_model
    from simulator.latency.fit import ape_table, format_errors
    from simulator.latency.profile import read_profile

    model = load_latency_model(args.model)
    prof = read_profile(args.rows, require_latency=False)
    for line in mismatches(model, prof):
        print(f"warning: {line}", file=sys.stderr)
    pred = model.predict_profile(prof)
    columns = [c for c in prof.columns if c != "predicted_ms"] + ["predicted_ms"]
    out = open(args.output, "w", newline="") if args.output else sys.stdout
    try:
        w = csv.writer(out)
        w.writerow(columns)
        for i in range(len(prof)):
            w.writerow([prof.text[c][i] for c in columns[:-1]] + [f"{pred[i]:.4f}"])
    finally:
        if args.output:
            out.close()
    report = sys.stdout if args.output else sys.stderr
    unfitted = sorted(set(prof.text["phase"]) - set(model.fit_range.get("phases", prof.text["phase"])))
    if unfitted:
        print(f"warning: {model} was fitted without {', '.join(unfitted)} rows: those predictions are "
              "not calibrated", file=report)
    if prof.has_latency:
        ape = 100 * np.abs(pred / prof.num["latency_ms"] - 1)
        print(f"error of {model} on {args.rows}:", file=report)
        print(format_errors(ape_table(ape, prof.phase)), file=report)
    if args.output:
        print(f"wrote {args.output} ({len(prof)} rows)", file=report)
    return 0
