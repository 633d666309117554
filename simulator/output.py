"""The run's output folder: requests.csv, timeline.csv, summary.json, plots and report.html.

Everything written is a pure function of the run, so the same seed gives byte-identical files
(plots carry no timestamps or version metadata).
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

import numpy as np

from simulator.report import request_table
from simulator.requests import STATUS

REQUEST_COLUMNS = (
    "id",
    "arrival",
    "queue",
    "first_token",
    "finish",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "ttft",
    "tpot",
    "e2e",
    "replica",
    "pool",
    "preemptions",
    "retries",
    "status",
)
TIMELINE_COLUMNS = (
    "time",
    "pool",
    "desired",
    "provisioning",
    "ready",
    "draining",
    "arrival_rate",
    "waiting",
    "running",
    "kv_usage",
)


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "" if np.isnan(v) else f"{float(v):.6f}"
    return str(v)


def write_requests_csv(fleet, path: Path) -> None:
    req = request_table(fleet)
    cols = [req[c] for c in REQUEST_COLUMNS]
    # a P/D service adds each request's hops after the status (simulator.pd): seconds, NaN when whole
    pd = fleet.pd.table() if getattr(fleet, "pd", None) is not None else {}
    pd_cols = [pd[k].astype(int) if k == "disaggregated" else pd[k] for k in pd]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*REQUEST_COLUMNS, *(f"pd_{k}" for k in pd)])
        status_names = STATUS
        for i in range(len(req["id"])):
            row = [_fmt(c[i]) for c in cols[:-1]]
            row.append(status_names[int(cols[-1][i])])
            row += [_fmt(c[i]) for c in pd_cols]
            w.writerow(row)


def write_timeline_csv(fleet, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TIMELINE_COLUMNS)
        for r in fleet.timeline:
            w.writerow([_fmt(r[c]) if isinstance(r[c], float) else r[c] for c in TIMELINE_COLUMNS])


def write_outputs(fleet, summary: dict, out: Path, plots: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_requests_csv(fleet, out / "requests.csv")
    write_timeline_csv(fleet, out / "timeline.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    images = []
    if plots:
        from simulator.plots import plot_all

        images = plot_all(fleet, request_table(fleet), out)
    write_html(summary, images, out / "report.html")


def write_html(summary: dict, images: list[str], path: Path) -> None:
    def row(k, v):
        return f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>slopilot: {html.escape(summary['scenario'])}</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left}img{max-width:100%}</style></head><body>",
        f"<h1>Simulation report: {html.escape(summary['scenario'])}</h1>",
        "<h2>Requests</h2><table>",
    ]
    parts += [row(k, v) for k, v in summary["requests"].items()]
    parts += [
        "</table><h2>SLOs</h2><table><tr><th>SLO</th><th>threshold (s)</th><th>percentile</th>"
        "<th>value at percentile (s)</th><th>met</th><th>request attainment</th></tr>"
    ]
    for name, s in summary["slo"].items():
        parts.append(
            f"<tr><td>{name}</td><td>{s['threshold']}</td><td>{s['percentile']}</td>"
            f"<td>{_fmt(s['value_at_percentile'])}</td><td>{s['met']}</td><td>{_fmt(s['attainment'])}</td></tr>"
        )
    parts.append("</table><table>")
    for k in (
        "slo_attainment_joint",
        "slo_window_attainment",
        "goodput_rps",
        "throughput_rps",
        "output_tokens_per_s",
        "replica_hours",
        "scale_events",
    ):
        parts.append(row(k, summary[k]))
    costs = summary["costs"]
    cur = html.escape(costs["currency"])
    parts.append("</table><h2>Cost</h2><table>")
    for k, label in (
        ("total", f"total ({cur})"),
        ("during_workload", f"while the workload ran ({cur})"),
        ("drain", f"draining after it ({cur}), {costs['drain_seconds']:.0f} s"),
        ("per_hour_at_peak", f"per hour at the peak ({cur}/h)"),
        ("gpu_hours", "GPU-hours"),
        ("per_million_output_tokens", f"per million output tokens ({cur})"),
    ):
        parts.append(row(label, costs[k]))
    parts.append(
        "</table><h2>Latency (s)</h2><table><tr><th></th><th>mean</th><th>p50</th><th>p90</th>"
        "<th>p99</th></tr>"
    )
    for k, v in summary["latency"].items():
        parts.append(
            f"<tr><th>{k}</th>"
            + "".join(f"<td>{_fmt(v.get(c, float('nan')))}</td>" for c in ("mean", "p50", "p90", "p99"))
            + "</tr>"
        )
    parts.append(
        "</table><h2>Pools</h2><table><tr><th>pool</th><th>replica-hours</th><th>GPUs a replica</th>"
        "<th>GPU-hours</th><th>peak replicas</th><th>cost per hour at peak</th><th>cost</th>"
        "<th>utilization</th><th>scale events</th><th>prefix hit rate</th><th>peak KV</th></tr>"
    )
    for name, p in summary["pools"].items():
        parts.append(
            f"<tr><td>{html.escape(name)}</td>"
            + "".join(
                f"<td>{_fmt(p[c])}</td>"
                for c in (
                    "replica_hours",
                    "gpus_per_replica",
                    "gpu_hours",
                    "peak_replicas",
                    "cost_per_hour_at_peak",
                    "cost",
                    "utilization",
                    "scale_events",
                    "prefix_cache_hit_rate",
                    "peak_kv_usage",
                )
            )
            + "</tr>"
        )
    parts.append("</table>")
    for img in images:
        parts.append(
            f"<h2>{html.escape(Path(img).stem.replace('_', ' '))}</h2><img src='{html.escape(img)}'>"
        )
    parts.append("</body></html>\n")
    path.write_text("\n".join(parts))
