"""Next-token sampling: greedy, temperature, top-k, top-p, one torch.Generator per request.

The whole batch goes through a fixed number of tensor ops: greedy rows are one argmax, random rows
are scaled, filtered and turned into cumulative distributions together, and each picks its token by
inverse CDF with one uniform number drawn from its own request's generator. That draw is the only
per-row call, and it is what keeps a seeded request reproducible: what a request samples does not
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


def filter_logits(logits: torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor
                  ) -> torch.Tensor:
    """Rows [..., vocab]: logits outside the top-k, then outside the top-p nucleus, set to -inf.

    top_k and top_p are one value for all rows or one per row (top_k <= 0 or >= vocab disables it).
    """
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    k = torch.as_tensor(top_k, device=rows.device).reshape(-1, 1).expand(rows.shape[0], 1)
    p = torch.as_tensor(top_p, dtype=rows.dtype, device=rows.device).reshape(-1, 1)
    k = torch.where((k > 0) & (k < vocab), k, vocab)
    ordered, order = torch.sort(rows, dim=-1, descending=True)
    # ties with the k-th logit stay, as with a per-row `logits < topk(...).values[-1]`
    ordered = ordered.masked_fill(ordered < ordered.gather(-1, k - 1), float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    # drop a token when the tokens before it already reach top_p (the first one always stays)
    drop = ((probs.cumsum(-1) - probs) >= p) & (p < 1.0)
    drop[:, 0] = False  # even where top_p rounds to 0 in the rows' dtype
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(rows).scatter_(-1, order, ordered).reshape(logits.shape)


def sanitize(logits: torch.Tensor) -> torch.Tensor:
    """Rows [n, vocab]: NaN -> -inf; in a row with any +inf logit, those alone stay (as 0s)."""
    logits = torch.nan_to_num(logits, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    top = torch.isposinf(logits)
    has_top = top.any(dim=-1, keepdim=True)
    if bool(has_top.any()):
        only_top = torch.full_like(logits, -math.inf).masked_fill(top, 0.0)
        logits = torch.where(has_top, only_top, logits)
    return logits


def argmax_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits with NaN and +inf handled, each row's argmax); raises for a row with nothing to pick."""
    top, best = logits.max(dim=-1)  # max with indices is faster than argmax on CPU
    # the maximum is NaN or +inf when a row has one, so finite maxima mean nothing to clean
    if bool(torch.isfinite(top).all()):
        return logits, best
    logits = sanitize(logits)
    best = logits.argmax(dim=-1)
    dead = torch.isneginf(logits.gather(-1, best[:, None])).flatten().nonzero()
    if len(dead):
        raise SamplingError(int(dead[0]), "every logit is NaN or -inf")
    return logits, best


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [n, vocab] (float32) -> n token ids; generators[i] is only used by non-greedy rows."""
    if not (logits.shape[0] == len(params) == len(generators)):
        raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators")
    logits, best = argmax_rows(logits)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return best.tolist()
    device = logits.device
    temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float64, device=device)
    bad = (~torch.isfinite(temps) | (temps < 0)).nonzero()
    if len(bad):
        t = params[rows[int(bad[0])]].temperature
        raise SamplingError(rows[int(bad[0])], f"temperature must be a finite number >= 0, got {t}")
    index = torch.tensor(rows, device=device)
    x = logits[index].double()
    x.sub_(x.gather(-1, best[index, None])).div_(temps[:, None])  # <= 0 everywhere, the maximum exactly 0
    top_k = torch.tensor([params[i].top_k for i in rows], device=device)
    top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float64, device=device)
    if bool(((top_k > 0) & (top_k < x.shape[-1])).any() or (top_p < 1.0).any()):
        x = filter_logits(x, top_k, top_p)  # a sort of the rows, only when some row filters
    cdf = torch.softmax(x, dim=-1).cumsum(-1)
    # one uniform per row from its own generator: the only per-row call
    u = torch.cat([torch.rand(1, dtype=torch.float64, device=device, generator=generators[i]) for i in rows])
    # the first token whose cumulative probability passes u (zero-probability tokens never do); when
    # u times the total rounds up to the total, none does, and the row takes its most likely token
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).flatten()
    picked = torch.where(picked < cdf.shape[-1], picked, best[index])
    out = best.index_put((index,), picked)
    return out.tolist()
