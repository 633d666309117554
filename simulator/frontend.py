"""A served model's HTTP front end as the client meets it: the delay between a request leaving the
client and the engine taking it (with the first token's way back), drawn per request.

Black-box calibration (calibrate --from-server) measures it on the probe's requests to an idle server:
each one's TTFT less the fitted prefill step. Those delays are not one number. On our own server the
middle 80% spread over about 2-6.5 ms around a 3.3-ms median (likely the event loop and the engine
thread sharing the GIL and the core). A constant put every simulated first token at the median, and
the simulated TTFT p90 came out a quarter below the served one. The model keeps the delays'
quantiles; a pool with `frontend_from_model` draws each request's delay from them (inverse CDF,
linear between quantiles).
"""

from __future__ import annotations

import numpy as np

QUANTILES = 101  # recorded at 0, 1, ..., 100 percent: a p90 falls between recorded points 1% apart


def delay_quantiles(delays_ms: np.ndarray) -> list[float]:
    """The recorded form of measured delays (ms, none below zero)."""
    q = np.percentile(np.maximum(np.asarray(delays_ms, dtype=float), 0.0), np.linspace(0, 100, QUANTILES))
    return [round(float(x), 4) for x in q]


def frontend_from_provenance(prov: dict) -> dict:
    """The front end a latency model's provenance records: its delay quantiles (ms) and the part that
    grows with the prompt (ms a token). ValueError when the model was not calibrated from a server."""
    quantiles = prov.get("frontend_ms_quantiles")
    if quantiles is None and "frontend_ms" in prov:
        quantiles = [prov["frontend_ms"]]  # a model from before the quantiles were kept: its median
    if not quantiles:
        raise ValueError("the latency model records no front end (`calibrate --from-server` measures one)")
    q = np.asarray(quantiles, dtype=float)
    if not np.all(np.isfinite(q)) or q.min() < 0 or np.any(np.diff(q) < 0):
        raise ValueError("the latency model's frontend_ms_quantiles are not non-negative and ascending")
    per_token = float(prov.get("frontend_ms_per_prompt_token", 0.0))
    if not np.isfinite(per_token) or per_token < 0:
        raise ValueError(f"the latency model records frontend_ms_per_prompt_token = {per_token}")
    return {"quantiles_ms": tuple(float(x) for x in q), "per_prompt_token_ms": per_token}


def draw_ms(frontend: dict, rng: np.random.Generator, prompt_tokens: int) -> float:
    """One request's front-end delay in ms."""
    q = frontend["quantiles_ms"]
    base = float(np.interp(rng.random(), np.linspace(0.0, 1.0, len(q)), q)) if len(q) > 1 else q[0]
    return base + frontend["per_prompt_token_ms"] * prompt_tokens
