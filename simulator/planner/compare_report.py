"""`slopilot compare`'s output folder: compare.json (every row, with its run's summary), replicas.png
(replicas over time for every row, the arrival rate behind) and report.html (the table and the plot)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from simulator.planner.fmt import num, percent, seconds, times, yes_no
from simulator.planner.plots import save
from simulator.planner.rank import money
from simulator.planner.report import STYLE, html_table

HEAD = ["row", "attainment (requests)", "attainment (1-min windows)", "SLO values at percentile", "SLOs met",
        "GPU-hours", "x oracle", "cost", "cost/h at peak", "peak replicas", "scale events"]


def table_rows(result: dict) -> list[list]:
    """The table's cells as text: percentages, latencies with their unit, money with its currency."""
    cur = result["currency"]
    out = []
    for r in result["rows"]:
        slo = ", ".join(f"{k} {seconds(v)}" for k, v in r["slo"].items()) or None
        out.append([r["name"], percent(r["attainment"], 2), percent(r["window_attainment"]), slo,
                    yes_no(r["met"]), num(r["gpu_hours"]), times(r.get("x_oracle")), money(r["cost"], cur),
                    money(r["cost_per_hour_at_peak"], cur), r["peak_replicas"], r["scale_events"]])
    return out


def replicas_figure(result: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(11, 4.8))
    for r in result["rows"]:
        t, n = [p[0] / 60 for p in r["timeline"]], [p[1] for p in r["timeline"]]
        style = {"color": "black", "lw": 1.6} if r["kind"] == "oracle" else {"lw": 1.1}
        ax.step(t, n, where="post", label=r["name"], **style)
    # the workload's span, not the slowest row's drain (which would squeeze every other row to the left)
    end = max((p[0] for r in result["rows"] for p in r["timeline"]), default=0.0)
    arrivals_end = result.get("duration") or max(
        (p[0] for r in result["rows"] for p in r["timeline"] if p[2]), default=end)
    ax.set_xlim(0, max(arrivals_end, 60.0) / 60)
    if end > arrivals_end:
        ax.annotate(f"drains after the last arrival (to minute {end / 60:.0f}) not shown",
                    (1, -0.12), xycoords="axes fraction", ha="right", fontsize=7, color="grey")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("replicas (provisioning + ready)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    first = next((r for r in result["rows"] if r["kind"] != "oracle"), None)
    if first is not None:
        ax2 = ax.twinx()
        ax2.plot([p[0] / 60 for p in first["timeline"]], [p[2] for p in first["timeline"]], color="grey",
                 alpha=0.4, lw=0.8, label="arrivals / s")
        ax2.set_ylabel("arrivals / s (grey)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"Replicas over time: {result['scenario']}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_compare_outputs(result: dict, out: Path, plots: bool = True) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    images = [save(replicas_figure(result), out / "replicas.png")] if plots else []
    cur = result["currency"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>slopilot compare: "
             f"{html.escape(result['scenario'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>Policies compared: {html.escape(result['scenario'])}</h1>",
             f"<p>The same workload (seed {result['seed']}) under every row; costs in {html.escape(cur)}, "
             "GPU-hours and cost including the drain after the last arrival (the oracle: the workload only)."
             "</p>", html_table(HEAD, table_rows(result))]
    if result.get("bounds"):
        parts.append(f"<p>No static or oracle rows: {html.escape(result['bounds'])}.</p>")
    for img in images:
        parts.append(f"<img src='{html.escape(img)}'>")
    parts.append("</body></html>\n")
    (out / "report.html").write_text("\n".join(parts))
    return ["compare.json", "report.html", *images]
