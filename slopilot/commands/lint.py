"""`slopilot lint FILE ...`: warnings for what parses but is probably not meant (units, placement).

A spec (ScaledObject, InferenceAutoscaler), scenario, plan or fleet file: SLO seconds above 10 for TPOT
or 600 for TTFT, durations over 7 days, scrape or polling intervals longer than the run, keys under a
trigger's `metadata` that KEDA does not read there. It reads the YAML only (the commands that load a
file report its errors); warnings never fail it unless --strict. replay, simulate and control print
the same warnings when they load a file.
"""

from __future__ import annotations

import argparse

HELP = "warn about likely unit and placement mistakes in a spec, scenario, plan or fleet file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML file(s) to check")
    p.add_argument("--strict", action="store_true", help="exit 1 when there is any warning (for CI)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simulator.lint import lint_file

    total = 0
    for f in args.files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"{f}: no such file")
        warnings = lint_file(f)
        for w in warnings:
            print(f"warning: {w}")
        if not warnings:
            print(f"{f}: no warnings")
        total += len(warnings)
    return 1 if args.strict and total else 0
