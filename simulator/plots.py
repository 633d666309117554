"""The report's PNG plots (matplotlib, Agg): replicas against load, latency percentiles over time, CDFs,
queue and KV-cache usage over time. Replica axes count whole replicas, every line is in a legend, and
each SLO is drawn where its metric is plotted (at its seconds, with its percentile on the CDFs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.requests import PENDING
from simulator.steptime import PS

# no timestamps or version strings in the files, so equal runs give equal bytes
_META = {"Software": None}
SLO_STYLE = {"color": "red", "ls": ":", "lw": 1.2}


def plot_all(fleet, req: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")

    ok = req["status"] == 1
    return [
        _replicas_vs_load(fleet, out),
        _latency_over_time(fleet, req, ok, out),
        _latency_cdfs(fleet, req, ok, out),
        _queue_and_kv(fleet, out),
    ]


def _pool_rows(fleet, pool) -> tuple[np.ndarray, list[dict]]:
    rows = [r for r in fleet.timeline if r["pool"] == pool.spec.name]
    return np.array([r["time"] for r in rows]) / 60, rows


def _slos_for(fleet, metric: str) -> list:
    """The scenario's SLOs on this metric (an itl target is drawn on the TPOT plots)."""
    return [s for s in fleet.sc.slos if s.metric == metric or (metric == "tpot" and s.metric == "itl")]


def _replicas_vs_load(fleet, out: Path) -> str:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(10, 4))
    for pool in fleet.pools:
        t, rows = _pool_rows(fleet, pool)
        ax.step(t, [r["ready"] for r in rows], where="post", label=f"{pool.spec.name} ready")
        ax.step(t, [r["desired"] for r in rows], where="post", ls="--", label=f"{pool.spec.name} desired")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("replicas")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    t, rows = _pool_rows(fleet, fleet.pools[0])  # fleet-wide arrivals sit on the first pool's rows
    ax2.plot(t, [r["arrival_rate"] for r in rows], color="grey", alpha=0.5, lw=0.8, label="arrivals/s")
    ax2.set_ylabel("arrivals / s")
    ax2.set_ylim(bottom=0)
    _legend(ax, ax2)
    ax.set_title("Replicas against load")
    return _save(fig, out, "replicas_vs_load.png")


def _latency_over_time(fleet, req: dict, ok: np.ndarray, out: Path) -> str:
    """Percentiles by arrival minute. A request with no first token by the end of the run counts in the
    TTFT percentiles at its wait so far (a lower bound), so a backlog shows as rising lines, not as an
    empty plot; the share of such requests is drawn too. TPOT needs a finished request."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    minute = (req["arrival"] // 60).astype(np.int64)
    arrived = req["status"] != PENDING
    waiting = arrived & np.isnan(req["ttft"])  # never served: unfinished, rejected or lost
    ttft = np.where(waiting, fleet.end_time_ps / PS - req["arrival"], req["ttft"])
    last = int(minute[arrived].max()) if arrived.any() else 0
    for ax, key, ylabel in ((axes[0], "ttft", "TTFT (s)"), (axes[1], "tpot", "TPOT (s)")):
        values, counted = (ttft, arrived) if key == "ttft" else (req[key], ok)
        ms, pcts, unserved = [], [], []
        for m in np.unique(minute[counted]):
            sel = counted & (minute == m)
            v = values[sel]
            v = v[~np.isnan(v)]
            if len(v):
                ms.append(m)
                pcts.append(np.percentile(v, [50, 90, 99]))
                unserved.append(waiting[sel].sum() / len(v) if key == "ttft" else 0.0)
        pcts = np.array(pcts).reshape(-1, 3)
        for j, (q, lab) in enumerate(((50, "p50"), (90, "p90"), (99, "p99"))):
            (line,) = ax.plot(ms, pcts[:, j], label=lab)
            # where the unserved reach this percentile it is only a lower bound: hollow markers
            low = np.array(unserved) > 1 - q / 100
            if low.any():
                first = not any(h.get_label().startswith("o: ") for h in ax.get_lines())
                ax.plot(np.array(ms)[low], pcts[low, j], "o", mfc="none", ms=4, color=line.get_color(),
                        label="o: at least (unserved at their wait)" if first else "_nolegend_")
        for slo in _slos_for(fleet, key):
            slo_label = f"SLO {slo.metric} p{slo.percentile:g} <= {slo.seconds:g} s"
            ax.axhline(slo.seconds, **SLO_STYLE, label=slo_label)
        ax.set_xlabel("arrival minute")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.set_xlim(0, max(last, 1))
        ax.legend(fontsize=8, loc="upper left")
    if waiting.any():
        ms = np.arange(last + 1)
        share = [100 * waiting[minute == m].sum() / max(arrived[minute == m].sum(), 1) for m in ms]
        ax2 = axes[0].twinx()
        ax2.plot(ms, share, color="grey", alpha=0.6, lw=0.9, ls="--", label="unserved (% of arrivals)")
        ax2.set_ylim(0, 100)
        ax2.set_ylabel("no first token by the end (%)")
        _legend(axes[0], ax2)
    fig.suptitle("Latency percentiles by arrival minute")
    return _save(fig, out, "latency_over_time.png")


def _latency_cdfs(fleet, req: dict, ok: np.ndarray, out: Path) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key in zip(axes, ("ttft", "tpot", "e2e")):
        v = np.sort(req[key][ok][~np.isnan(req[key][ok])])
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=f"{key} ({len(v)} requests)")
        for slo in _slos_for(fleet, key):
            ax.axvline(slo.seconds, **SLO_STYLE, label=f"SLO {slo.seconds:g} s")
            ax.axhline(slo.percentile / 100, color="red", ls="--", lw=0.8, label=f"p{slo.percentile:g}")
        ax.set_xscale("log")
        ax.set_xlabel(f"{key} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency CDFs")
    return _save(fig, out, "latency_cdfs.png")


def _queue_and_kv(fleet, out: Path) -> str:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for pool in fleet.pools:
        t, rows = _pool_rows(fleet, pool)
        name = pool.spec.name
        top.step(t, [r["waiting"] for r in rows], where="post", label=f"{name} waiting")
        top.step(t, [r["running"] for r in rows], where="post", ls="--", label=f"{name} running")
        bottom.plot(t, [100 * r["kv_usage"] for r in rows], label=f"{name} mean KV-cache usage")
    top.set_ylabel("requests")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_ylim(bottom=0)
    top.legend(fontsize=8, loc="upper left")
    top.set_title("Queue and KV-cache usage over time")
    bottom.set_ylabel("KV cache used (%, ready replicas)")
    bottom.set_ylim(0, 100)
    bottom.set_xlabel("time (min)")
    bottom.legend(fontsize=8, loc="upper left")
    return _save(fig, out, "queue_and_kv.png")


def _legend(*axes) -> None:
    """One legend for the lines of several axes (a twin axis' lines included)."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    axes[0].legend(handles, labels, loc="upper left", fontsize=8)


def _save(fig, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=90, metadata=_META)
    plt.close(fig)
    return name
