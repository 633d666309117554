"""Next-token sampling: greedy, temperature, top-k, top-p, one torch.Generator per request.

Each random row draws only from its own request's generator, so what a request samples does not
depend on which other requests share the batch.
"""

from __future__ import annotations

import torch

from engine.core.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row [vocab]: logits outside the top-k, then outside the top-p nucleus, set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (the first one always stays)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [n, vocab] (float32) -> n token ids; generators[i] is only used by non-greedy rows."""
    if not (logits.shape[0] == len(params) == len(generators)):
        raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators")
    out = logits.argmax(dim=-1).tolist()  # greedy rows are done; random ones are overwritten below
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        row = filter_logits(logits[i].float() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        out[i] = int(torch.multinomial(probs, 1, generator=g).item())
    return out
