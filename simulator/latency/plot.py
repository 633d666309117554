"""Residual plot of a calibration: predicted vs measured, and the signed error of every row."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def residual_plot(path: str | Path, model, profile, holdout: np.ndarray, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y = profile.num["latency_ms"]
    pred = model.predict_profile(profile)
    err = 100 * (pred / y - 1)
    phase = profile.phase
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = {"prefill": "tab:blue", "decode": "tab:orange", "mixed": "tab:green"}
    for name in sorted(set(phase.tolist())):
        for held, marker, label in ((False, "o", "train"), (True, "x", "held out")):
            sel = (phase == name) & (holdout == held)
            if sel.any():
                kw = dict(color=colors.get(name, "gray"), marker=marker, s=18, label=f"{name} {label}",
                          linewidths=1.2, alpha=0.8 if held else 0.45)
                ax1.scatter(y[sel], pred[sel], **kw)
                ax2.scatter(y[sel], err[sel], **kw)
    lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
    ax1.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax1.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms",
            title="predicted vs measured")
    ax2.axhline(0, color="black", lw=0.8)
    ax2.set(xscale="log", xlabel="measured ms", ylabel="error % (predicted / measured - 1)",
            title="residuals")
    ax2.legend(fontsize=8)
    fig.suptitle(title or f"{model.device} {model.model} {model.dtype} tp{model.tp}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
