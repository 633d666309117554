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
    """One point per option: a candidate's static fleet (square; attainment in its runs at the peak) or
    a policy over the curve (circle; a marker per policy), hollow when it misses an SLO; the Pareto
    front outlined and joined; the recommended option pointed at."""
    plt = _plt()
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(10, 5.5))
    names = [c["name"] for c in result["candidates"]]
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    policies = sorted({o["policy"] for o in result["ranking"] if o["policy"]})
    markers = {None: "s", **{p: "o^vD<>"[i % 6] for i, p in enumerate(policies)}}
    for o in result["ranking"]:  # an option that misses an SLO is hollow: not a choice
        color = colors[o["candidate"]]
        ax.scatter(100 * (o["attainment"] or 0), o["cost_per_day"], marker=markers[o["policy"]], s=55,
                   zorder=3, facecolors=color if o["met"] else "none",
                   edgecolors="black" if o["pareto"] else (color if not o["met"] else "none"))
    best = result["answer"].get("best_option")
    if best:
        at = (100 * (best["attainment"] or 0), best["cost_per_day"])
        xs = [100 * (o["attainment"] or 0) for o in result["ranking"]]
        ys = [o["cost_per_day"] for o in result["ranking"]]
        # the label points inwards, so that it never sits on the axis's tick labels
        dx = 20 if at[0] <= (min(xs) + max(xs)) / 2 else -90
        dy = 22 if at[1] <= (min(ys) * max(ys)) ** 0.5 else -26
        ax.annotate("recommended", at, xytext=(dx, dy), textcoords="offset points", fontsize=9,
                    arrowprops={"arrowstyle": "->", "lw": 0.8})
    front = sorted((100 * (o["attainment"] or 0), o["cost_per_day"])
                   for o in result["ranking"] if o["pareto"])
    if len(front) > 1:
        ax.plot(*zip(*front), color="black", lw=0.8, alpha=0.6)
    handles = [Line2D([], [], ls="", marker="o", color=colors[n], label=n) for n in names]
    handles += [Line2D([], [], ls="", marker=m, color="grey", label=p or "static fleet at the peak")
                for p, m in markers.items()]
    handles.append(Line2D([], [], ls="-", marker="o", color="black", markerfacecolor="none", lw=0.8,
                          label="Pareto front"))
    ax.set_yscale("log")
    ax.set_xlabel("SLO attainment (% of requests within every SLO)")
    ax.set_ylabel(f"cost per day ({result['currency']})")
    ax.set_title("Cost against SLO attainment, every option")
    ax.grid(alpha=0.3, which="both")
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
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
