"""`slopilot record --prometheus URL --spec SPEC.yaml --start S --end E [--step D] -o SERIES.csv`.

Asks Prometheus' /api/v1/query_range for each trigger's query over [S, E] every D (default: the
spec's polling interval) and writes the series CSV `slopilot replay` reads: a time column, then one
column per trigger holding what KEDA's Prometheus scaler would have read at that instant (empty =
an empty result, `error` = more than one series). `slopilot replay --prometheus URL --start S
--end E` does both in one step: how would this policy have scaled on last week's metrics?
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
from datetime import datetime, timezone
from pathlib import Path

HELP = "record a spec's trigger queries from Prometheus over a time range, as a series CSV for replay"
MAX_POINTS = 11_000  # Prometheus answers at most this many points a series in one query_range
TIMEOUT = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL (http://host:9090)")
    parser.add_argument("--spec", required=True, help="KEDA ScaledObject or InferenceAutoscaler YAML")
    add_range_arguments(parser)
    parser.add_argument("-o", "--output", required=True, help="the series CSV to write")


def add_range_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--start", required=required,
                        help="first instant (seconds since the epoch or RFC 3339)")
    parser.add_argument("--end", required=required, help="last instant (seconds since the epoch or RFC 3339)")
    parser.add_argument("--step", help="seconds between instants, or a duration such as 15s "
                        "(default: the spec's polling interval)")


def time_range(args, spec) -> tuple[int, int, int, bool]:
    """(start ms, end ms, step ms, times given as RFC 3339) from --start, --end, --step."""
    from autoscaler.series import parse_time
    from slopilot.commands.query import duration_ms

    start, rfc = parse_time(args.start, "--start")
    end, _ = parse_time(args.end, "--end")
    if end < start:
        raise ValueError(f"--end {args.end}: before --start {args.start}")
    step = duration_ms(args.step, "--step") if args.step else round(spec.polling_interval * 1000)
    return round(start * 1000), round(end * 1000), step, rfc


def _rfc3339(t_ms: int) -> str:
    return datetime.fromtimestamp(t_ms // 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + \
        f".{t_ms % 1000:03d}Z"


def query_range(client, query: str, start: int, end: int, step: int) -> dict[int, list[float]]:
    """t (ms) -> the values of every series at t, in chunks Prometheus accepts."""
    from prometheus_api_client import PrometheusApiClientException

    out: dict[int, list[float]] = {}
    chunk = step * (MAX_POINTS - 1)
    t = start
    while t <= end:
        last = min(end, t + chunk)
        dt = datetime.fromtimestamp(t / 1000, tz=timezone.utc)
        try:  # start/end as RFC 3339 strings: the client would round them to whole seconds
            result = client.custom_query_range(
                query, start_time=dt, end_time=dt, step=f"{step / 1000:g}",
                params={"start": _rfc3339(t), "end": _rfc3339(last)}, timeout=TIMEOUT)
        except PrometheusApiClientException as exc:
            raise ValueError(f"query {query!r}: prometheus answered {exc}") from None
        for series in result:
            for ts, value in series.get("values", []):
                out.setdefault(round(float(ts) * 1000), []).append(float(value))
        t = last + step
    return out


def cell(values: list[float] | None) -> str:
    """A trigger's cell: KEDA reads an empty result as no value and more than one series as an error."""
    from controlplane.decision_log import number

    if not values:
        return ""
    if len(values) > 1:
        return "error"
    v = values[0]
    return "NaN" if math.isnan(v) else number(v)


def record(url: str, spec, start: int, end: int, step: int, rfc3339: bool = False) -> str:
    """The series CSV (text) of the spec's triggers over [start, end] every step (ms)."""
    import requests
    from prometheus_api_client import PrometheusConnect

    from autoscaler.series import format_time

    if not spec.triggers:
        raise ValueError(f"spec {spec.name!r} has no Prometheus triggers to record")
    client = PrometheusConnect(url.rstrip("/"), disable_ssl=False)
    try:
        answers = {t.name: query_range(client, t.query, start, end, step) for t in spec.triggers}
    except requests.RequestException as exc:
        raise ValueError(f"prometheus at {url}: {type(exc).__name__}: {exc}") from None
    finally:
        client.close()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["time", *answers])
    for t in range(start, end + 1, step):
        w.writerow([format_time(t / 1000, rfc3339), *(cell(a.get(t)) for a in answers.values())])
    return buf.getvalue()


def load(path: str):
    from autoscaler.spec import load_spec

    p = Path(path)
    try:
        return load_spec(p.read_text(), str(p))
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith(str(p)) else f"{p}: {text}") from None


def run(args: argparse.Namespace) -> int:
    spec = load(args.spec)
    start, end, step, rfc = time_range(args, spec)
    text = record(args.prometheus, spec, start, end, step, rfc)
    out = Path(args.output)
    part = out.with_name(f".{out.name}.part")
    try:
        part.write_text(text)
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    print(f"wrote {out}: {text.count(chr(10)) - 1} instants of {len(spec.triggers)} trigger(s)")
    return 0
