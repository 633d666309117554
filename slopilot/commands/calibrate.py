"""`slopilot calibrate PROFILE.csv [-o MODEL.json]`: fit a latency model, report its held-out error.

The model goes to PROFILE.model.json unless -o says otherwise; a file that is not a latency model
(the profile's metadata, PROFILE.meta.json or the older PROFILE.json) is never overwritten."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "fit a step-latency model to a profile CSV; print held-out error per phase; write a residual plot"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "how a calibrated model is used: docs/guide.md (Plan capacity with the simulator)"
    p.add_argument("profile", type=Path, help="profile CSV (columns of DESIGN.md; extra columns allowed)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="model JSON to write (default: PROFILE.model.json, beside the profile)")
    p.add_argument("--select", metavar="EXPR", help='use only the rows matching EXPR, e.g. "tp == 4" '
                   "(needed when the CSV holds several device/model/dtype/tp groups)")
    p.add_argument("--holdout-where", metavar="EXPR",
                   help='hold out the rows matching EXPR, e.g. "batch_size > 16 or num_tokens > 2048"')
    p.add_argument("--holdout-frac", type=float, default=0.2, help="random hold-out fraction (default 0.2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--refit-all", action="store_true",
                   help="after measuring the hold-out, refit on every row "
                   "(the provenance keeps the held-out error)")
    p.add_argument("--match-mean", action="store_true",
                   help="scale the fit so its total step time equals the profile's (for a profile of a "
                   "serving run, `slopilot profile --from-run`: a simulated run adds up mean steps)")
    p.add_argument("--plot", type=Path, help="residual plot PNG (default: MODEL.residuals.png)")
    p.add_argument("--no-plot", action="store_true")


def check_output(path: Path) -> None:
    """-o may replace a latency model, never another file (a profile's metadata holds measurements)."""
    import json

    from simulator.latency.model import FORMAT

    if not path.exists():
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
        metadata = isinstance(data, dict) and "engine" in data
        what = "a profile's metadata" if metadata else "not a latency model"
        raise ValueError(f"-o {path}: the file exists and is {what}; it is kept (give another -o, e.g. "
                         f"{path.with_suffix('.model.json')})")


def run(args: argparse.Namespace) -> int:
    from simulator.latency.fit import calibrate, format_errors
    from simulator.latency.profile import read_profile
    from simulator.latency.where import evaluate_where

    args.output = args.output or args.profile.with_suffix(".model.json")
    check_output(args.output)
    prof = read_profile(args.profile)
    if args.select:
        prof = prof.subset(evaluate_where(args.select, prof))
        if len(prof) == 0:
            raise ValueError(f"--select {args.select!r} matches no row of {args.profile}")
    model, heldout, mask = calibrate(prof, args.holdout_where, args.holdout_frac, args.seed, args.refit_all,
                                     args.match_mean)
    if args.select:
        model.provenance["select"] = args.select
    model.save(args.output)
    split = f"rows matching {args.holdout_where!r}" if args.holdout_where else \
        f"random {args.holdout_frac:.0%} (seed {args.seed})"
    print(f"{model}: {int((~mask).sum())} training rows, {int(mask.sum())} held out ({split})")
    if heldout:
        print("held-out error:")
        print(format_errors(heldout))
    else:
        print("no rows held out: no held-out error")
    print(f"wrote {args.output}")
    if not args.no_plot:
        from simulator.latency.fit import fit
        from simulator.latency.plot import residual_plot

        plot = args.plot or args.output.with_suffix(".residuals.png")
        # the fit the hold-out measured
        shown = fit(prof.subset(~mask), args.match_mean) if args.refit_all else model
        residual_plot(plot, shown, prof, mask)
        print(f"wrote {plot}")
    return 0
