"""The report's PNG plots (matplotlib, Agg): replicas against load, latency percentiles over time, CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# no timestamps or version strings in the files, so equal runs give equal bytes
_META = {"Software": None}


def plot_all(fleet, req: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    tl = fleet.timeline
    ok = req["status"] == 1

    fig, ax = plt.subplots(figsize=(10, 4))
    for pool in fleet.pools:
        rows = [r for r in tl if r["pool"] == pool.spec.name]
        t = np.array([r["time"] for r in rows]) / 60
        ax.step(t, [r["ready"] for r in rows], where="post", label=f"{pool.spec.name} ready")
        ax.step(t, [r["desired"] for r in rows], where="post", ls="--", label=f"{pool.spec.name} desired")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    rows = [r for r in tl if r["pool"] == fleet.pools[0].spec.name]
    ax2.plot(
        np.array([r["time"] for r in rows]) / 60,
        [r["arrival_rate"] for r in rows],
        color="grey",
        alpha=0.5,
        lw=0.8,
        label="arrivals/s",
    )
    ax2.set_ylabel("arrivals / s")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Replicas against load")
    names.append(_save(fig, out, "replicas_vs_load.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    minute = (req["arrival"] // 60).astype(np.int64)
    for ax, key, label in ((axes[0], "ttft", "TTFT (s)"), (axes[1], "tpot", "TPOT (s)")):
        ms, p50, p90, p99 = [], [], [], []
        for m in np.unique(minute[ok]):
            v = req[key][ok & (minute == m)]
            v = v[~np.isnan(v)]
            if len(v):
                ms.append(m)
                a, b, c = np.percentile(v, [50, 90, 99])
                p50.append(a), p90.append(b), p99.append(c)
        for ys, lab in ((p50, "p50"), (p90, "p90"), (p99, "p99")):
            ax.plot(ms, ys, label=lab)
        for slo in fleet.sc.slos:
            if slo.name == key or (key == "tpot" and slo.name == "itl"):
                ax.axhline(slo.threshold, color="red", ls=":", label=f"SLO p{slo.percentile:g}")
        ax.set_xlabel("arrival minute")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("Latency percentiles over time")
    names.append(_save(fig, out, "latency_over_time.png"))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key in zip(axes, ("ttft", "tpot", "e2e")):
        v = np.sort(req[key][ok][~np.isnan(req[key][ok])])
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v))
        ax.set_xscale("log")
        ax.set_xlabel(f"{key} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle("Latency CDFs")
    names.append(_save(fig, out, "latency_cdfs.png"))
    return names


def _save(fig, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=90, metadata=_META)
    plt.close(fig)
    return name
