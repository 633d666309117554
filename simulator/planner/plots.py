"""The plan report's figures (matplotlib, Agg): cost against SLO attainment with the Pareto front, and
capacity curves (each SLO's latency at its percentile against the rate one replica serves). Each
function returns the Figure; `save` writes it without metadata, so equal plans give equal bytes."""

from __future__ import annotations

from pathlib import Path

SLO_STYLE = {"color": "red", "ls": ":", "lw": 1.2}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_figure(result: dict):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5))
    cur = result["currency"]
    names = [c["name"] for c in result["candidates"]]
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    shown = set()
    for o in result["ranking"]:
        label = o["candidate"] if o["candidate"] not in shown else None
        shown.add(o["candidate"])
        ax.scatter(100 * (o["attainment"] or 0), o["cost_per_day"], color=colors[o["candidate"]], label=label,
                   marker="s" if o["policy"] is None else "o", edgecolors="black" if o["pareto"] else "none",
                   s=50, zorder=3)
    front = sorted((100 * (o["attainment"] or 0), o["cost_per_day"])
                   for o in result["ranking"] if o["pareto"])
    if front:
        ax.step(*zip(*front), where="post", color="black", lw=0.8, alpha=0.6, label="Pareto front")
    ax.set_xlabel("SLO attainment (% of requests within every SLO)")
    ax.set_ylabel(f"cost per day ({cur})")
    ax.set_title("Cost against SLO attainment (squares: static fleet at the peak; circles: a policy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def capacity_figure(result: dict):
    plt = _plt()
    slos = list(result["slo"])
    fig, axes = plt.subplots(1, len(slos), figsize=(5.5 * len(slos), 4.5), squeeze=False)
    seed = result["seeds"][0]
    for ax, metric in zip(axes[0], slos):
        for i, c in enumerate(result["candidates"]):
            pts = sorted((r[1], r[3].get(metric)) for r in c["capacity_runs"] if r[0] == seed)
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker=".", lw=1, color=plt.cm.tab10(i % 10), label=c["name"])
        seconds, pct = result["slo"][metric]["seconds"], result["slo"][metric]["percentile"]
        ax.axhline(seconds, **SLO_STYLE, label=f"SLO {metric} p{pct:g} <= {seconds:g} s")
        ax.set_yscale("log")
        ax.set_xlabel("requests per second, one replica")
        ax.set_ylabel(f"{metric.upper()} p{pct:g} (s)")
        ax.set_title(f"{metric.upper()} against load (seed {seed})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def save(fig, path: Path) -> str:
    fig.savefig(path, dpi=90, metadata={"Software": None})
    _plt().close(fig)
    return path.name
