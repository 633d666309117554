"""`slopilot query DIR 'PROMQL' (--time T | --start S --end E --step D)`.

Evaluates PromQL over a simulated run's series (DIR/series.om from `slopilot simulate
--export-series`, or an OpenMetrics file) and prints the answer in the JSON shape of Prometheus'
/api/v1/query (with --time) or /api/v1/query_range (with --start, --end and --step). Times are
seconds (the run's clock starts at 0) or RFC 3339; the step is seconds or a duration such as 15s.
The file is parsed once: its samples are cached beside it (FILE.cache.npz, rebuilt when the file
changes), so later queries on the same recording answer in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HELP = "evaluate PromQL over a simulated run's series, answering as Prometheus' query API does"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("series", help="a run's folder (its series.om) or an OpenMetrics file")
    parser.add_argument("query", help="the PromQL expression")
    parser.add_argument("--time", help="instant query at this time (seconds or RFC 3339)")
    parser.add_argument("--start", help="range query from this time")
    parser.add_argument("--end", help="range query up to this time")
    parser.add_argument("--step", help="range query resolution (seconds or a duration such as 15s)")
    parser.add_argument("--lookback-delta", default="5m", help="how far an instant selector looks back "
                        "(Prometheus' query.lookback-delta; default 5m)")


def seconds(text: str, flag: str) -> float:
    """A time: seconds or RFC 3339 (autoscaler.series' rules; plain seconds read without loading it)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if abs(value) <= 253_402_300_799:  # the year 9999, autoscaler.series.MAX_TIME
        return value
    from autoscaler.series import parse_time

    return parse_time(text, flag)[0]


def duration_ms(text: str, flag: str) -> int:
    """Seconds (a number) or a PromQL duration, in ms."""
    import promql_parser

    from promql.parse import ms

    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and not math.isfinite(number) or len(text) > 64:
        raise ValueError(f"{flag} {text[:64]!r}: not seconds nor a duration such as 15s")
    try:
        value = round(number * 1000) if number is not None else ms(promql_parser.parse_duration(text))
    except (ValueError, OverflowError):
        raise ValueError(f"{flag} {text!r}: not seconds nor a duration such as 15s") from None
    if value <= 0:
        raise ValueError(f"{flag} {text!r}: must be longer than 0")
    return value


_FLAGS = ("--time", "--start", "--end", "--step", "--lookback-delta", "--help")


def prepare_argv(argv: list[str]) -> list[str]:
    """A query starting with '-' (-Inf, -x, -sum(x)) is the query, not an option: argparse would
    say "expected one argument" or "unrecognized arguments", so such a word gets a leading space
    (PromQL ignores it). Flags (also abbreviated, or with =value) and their values are left alone."""
    out, takes_value = [], False
    for i, word in enumerate(argv):
        if word == "--":
            return out + argv[i:]
        flag = word.split("=", 1)[0]
        is_flag = word == "-h" or (word.startswith("--") and len(flag) > 2
                                   and any(f.startswith(flag) for f in _FLAGS))
        if takes_value or is_flag or not word.startswith("-"):
            out.append(word)
        else:
            out.append(" " + word)
        takes_value = is_flag and "=" not in word and word != "-h" and not "--help".startswith(flag)
    return out


def load(path: str):
    """The series of a run folder or an OpenMetrics file, as a store (cached beside the file)."""
    from promql.omcache import load_cached

    p = Path(path)
    if p.is_dir():
        p = p / "series.om"
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no series file (run `slopilot simulate ... --export-series`)")
    return load_cached(p)


def run(args: argparse.Namespace) -> int:
    from promql import PromQLError, compile_query
    from promql.api import instant_query, range_query, success

    ranged = [a is not None for a in (args.start, args.end, args.step)]
    if (args.time is None) == (not any(ranged)) or (any(ranged) and not all(ranged)):
        raise ValueError("give --time T, or --start S --end E --step D")
    lookback = duration_ms(args.lookback_delta, "--lookback-delta")
    try:
        tree = compile_query(args.query)
    except PromQLError as exc:
        raise ValueError(str(exc)) from None
    store = load(args.series)
    try:
        if args.time is not None:
            data = instant_query(store, tree, round(seconds(args.time, "--time") * 1000), lookback)
        else:
            start = round(seconds(args.start, "--start") * 1000)
            end = round(seconds(args.end, "--end") * 1000)
            data = range_query(store, tree, start, end, duration_ms(args.step, "--step"), lookback)
    except PromQLError as exc:
        raise ValueError(str(exc)) from None
    json.dump(success(data), sys.stdout)
    sys.stdout.write("\n")
    return 0
