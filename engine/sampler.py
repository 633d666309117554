"""Next-token sampling: greedy, temperature, top-k, top-p, one torch.Generator per request.

Each random row draws only from its own request's generator, so what a request samples does not
depend on which other requests share the batch.

Numerically safe for any temperature > 0 and any logits: NaN logits never win, +inf logits win
(equally), and the temperature divides logits shifted so their maximum is 0, in float64, so a tiny
temperature tends to greedy instead of overflowing. A row with nothing left to pick (every logit
NaN or -inf) raises SamplingError for that row's request.
"""

from __future__ import annotations

import math

import torch

from engine.core.sampling_params import SamplingParams


class SamplingError(ValueError):
    """A row that cannot be sampled; row is its index in the batch."""

    def __init__(self, row: int, message: str):
        super().__init__(f"sampling row {row}: {message}")
        self.row = row


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row [vocab]: logits outside the top-k, then outside the top-p nucleus, set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens before it already reach top_p (the first one always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sanitize(logits: torch.Tensor) -> torch.Tensor:
    """Rows [n, vocab]: NaN -> -inf; in a row with any +inf logit, those alone stay (as 0s)."""
    logits = torch.nan_to_num(logits, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    top = torch.isposinf(logits)
    has_top = top.any(dim=-1, keepdim=True)
    if bool(has_top.any()):
        only_top = torch.full_like(logits, -math.inf).masked_fill(top, 0.0)
        logits = torch.where(has_top, only_top, logits)
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [n, vocab] (float32) -> n token ids; generators[i] is only used by non-greedy rows."""
    if not (logits.shape[0] == len(params) == len(generators)):
        raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators")
    logits = sanitize(logits)
    best = logits.argmax(dim=-1)
    dead = torch.isneginf(logits.gather(-1, best[:, None])).flatten().nonzero()
    if len(dead):
        raise SamplingError(int(dead[0]), "every logit is NaN or -inf")
    out = best.tolist()  # greedy rows are done; random ones are overwritten below
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        if not math.isfinite(p.temperature) or p.temperature < 0:
            raise SamplingError(i, f"temperature must be a finite number >= 0, got {p.temperature}")
        row = logits[i].double()
        scaled = (row - row[out[i]]) / p.temperature  # <= 0 everywhere, the maximum exactly 0
        probs = torch.softmax(filter_logits(scaled, p.top_k, p.top_p), dim=-1)
        out[i] = int(torch.multinomial(probs, 1, generator=g).item())
    return out
