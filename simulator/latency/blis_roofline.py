"""A baseline for the derived model's held-out table: BLIS's roofline step time, re-implemented.

BLIS (github.com/inference-sim/inference-sim) prices a step from a model config and a GPU sheet with
no fit of its own to our rows. This follows the formulas of its `sim/roofline_step.go` and the
constants of its `hardware_config.json` ("H100" and "A100-SXM" entries) at commit 006cae8, written
here from their description (not its code):

    per prefill request of t new tokens after p cached ones (effective context p + (t - 1) / 2):
        GEMM FLOPs  layers * 2t (d^2 + 2 d d_kv + d^2 + 3 d d_ff)   (SwiGLU assumed, d_ff = 4d if unset)
        attention   layers * (4 heads t ctx d_head + 4 heads t ctx)  on vector units at 10% of peak
        bytes       weights (the same layer shapes, no embeddings) + KV written and 92% of the cached KV
                    read + 0.85 layers d bytes t of activations
    compute = GEMM / tp^0.13 / (peak * 0.65 * 2.2) + attention / tp^0.13 / (peak * 0.1)
    prefill = max(compute, bytes / tp / (HBM * 0.72 * 0.75))
    decode: the same with t = 1 (context p), GEMM at peak * 0.12 * 1.8, TP dividing compute, 80% of
    the KV read, 0.75 of the activations, bytes at HBM * 0.72 * 0.92
    step = phase time(s) + 2 * layers * 20 us (TP > 1) + 500 us (scaled up with the batch) +
           500 us per request of a prefill-only step
"""

from __future__ import annotations

import numpy as np

from simulator.latency.arch import Arch

# hardware_config.json at inference-sim 006cae8: the same calibration for both GPUs
CALIB = {
    "bw_eff": 0.72,
    "overhead_us": 500.0,
    "mfu_prefill": 0.65 * 2.20,
    "mfu_decode": 0.12 * 1.80,
    "allreduce_us": 20.0,
    "tp_exp_prefill": 0.13,
    "prefill_bw": 0.75,
    "decode_bw": 0.92,
    "vector": 0.10,
    "prefill_overhead_us": 500.0,
}
SHEETS = {"a100-80gb": (312e12, 2.039e12), "h100-sxm": (989.5e12, 3.35e12)}  # its A100-SXM, H100


def _shape(arch: Arch) -> tuple[float, float, float, float, float]:
    d, heads = float(arch.hidden), float(arch.heads)
    d_head = d / heads
    return d, float(arch.layers), heads, float(arch.kv_heads) * d_head, float(arch.ffn or 4 * d)


def _phase(arch: Arch, tokens, prior, requests, peak, bw, tp, prefill: bool) -> np.ndarray:
    """max(compute, memory) seconds of `requests` equal requests of `tokens` new tokens each."""
    c = CALIB
    d, layers, heads, d_kv, d_ff = _shape(arch)
    ctx = prior + (tokens - 1) / 2 if prefill else prior
    gemm = layers * 2 * tokens * (d * (d + 2 * d_kv) + d * d + 3 * d * d_ff) * requests
    vector = layers * (4 * heads * tokens * ctx * (d / heads) + 4 * heads * tokens * ctx) * requests
    weights = layers * (d * (d + 2 * d_kv) + d * d + 3 * d * d_ff) * 2
    kv = 2 * layers * d_kv * 2
    dynamic = kv * tokens + kv * prior * (0.92 if prefill else 0.80)
    dynamic += layers * d * 2 * tokens * (0.85 if prefill else 0.75)
    div = tp ** c["tp_exp_prefill"] if prefill else tp
    mfu = c["mfu_prefill"] if prefill else c["mfu_decode"]
    compute = gemm / div / (peak * mfu) + vector / div / (peak * c["vector"])
    bw_phase = bw * c["bw_eff"] * (c["prefill_bw"] if prefill else c["decode_bw"])
    memory = (weights + dynamic * requests) / tp / bw_phase
    return np.maximum(compute, memory)


def blis_step_ms(arch: Arch, gpu: str, tp: int, shape: dict) -> np.ndarray:
    """BLIS roofline step times (ms) of prefill-only and decode-only step shapes (simulator's columns)."""
    if gpu not in SHEETS:
        raise ValueError(f"BLIS's hardware_config has no sheet for {gpu!r} (known: {', '.join(SHEETS)})")
    peak, bw = SHEETS[gpu]
    c = CALIB
    pt, pc = np.asarray(shape["prefill_tokens"], float), np.asarray(shape["prefill_context"], float)
    ps = np.maximum(np.asarray(shape["prefill_seqs"], float), 1.0)
    ds, dc = np.asarray(shape["decode_seqs"], float), np.asarray(shape["decode_context"], float)
    if np.any((pt > 0) & (ds > 0)):
        raise ValueError("mixed prefill/decode steps are not priced by this baseline")
    has_p = pt > 0
    t = np.where(has_p, pt / ps, 1.0)
    prefill = _phase(arch, t, np.maximum(pc - pt, 0) / ps, ps, peak, bw, tp, True)
    decode = _phase(arch, 1.0, dc / np.maximum(ds, 1), ds, peak, bw, tp, False)
    hw = np.where(has_p, prefill, decode)
    comm = 2 * arch.layers * c["allreduce_us"] * 1e-6 if tp > 1 else 0.0
    n = np.where(has_p, ps, ds)
    decode_ratio = np.where(has_p, 0.0, 1.0)
    scale = np.where(n > 2, 1 + 0.15 * np.log2(np.maximum(n, 2) / 2) * (0.3 + 2 * decode_ratio), 1.0)
    overhead = c["overhead_us"] * scale + np.where(has_p, ps * c["prefill_overhead_us"], 0.0)
    return 1e3 * (hw + comm + overhead * 1e-6)


def blis_errors(groups: list) -> dict:
    """MAPE and p90 absolute % error per phase of BLIS's roofline on derive_fit's measured groups."""
    from simulator.latency.catalog import get_arch
    from simulator.latency.fit import ape_table

    ape, phase = [], []
    for g in groups:
        pred = blis_step_ms(get_arch(g.model), g.gpu, g.tp, g.shape)
        ape.append(100 * np.abs(pred / g.y - 1))
        phase.append(np.where(g.shape["prefill_tokens"] > 0, "prefill", "decode"))
    return ape_table(np.concatenate(ape), np.concatenate(phase))
