"""The shape of one engine step, as the latency model and the profile CSV describe it.

A sequence decodes in the step when it computes one token past its prompt; anything else (a fresh
prompt, a chunk of one, a preempted sequence recomputing) is prefill. Contexts are counted after the
step: a prefill chunk of t tokens on c cached ones attends over c + t, a decode over its whole KV.
The engine's step log, the emulated runner, the profiler and the simulator's replica all read a
step's shape from here.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.core.sequence import Sequence


class BatchShape(NamedTuple):
    prefill_tokens: int = 0
    prefill_context: int = 0
    prefill_seqs: int = 0
    cached_tokens: int = 0  # KV already computed under the prefill chunks
    decode_seqs: int = 0
    decode_context: int = 0

    @property
    def phase(self) -> str:
        if self.prefill_tokens and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"


def batch_shape(seqs: list[Sequence], num_new_tokens: list[int]) -> BatchShape:
    """The shape of a scheduled batch, read before the step runs."""
    pt = pc = pseq = cached = ds = dc = 0
    for seq, n in zip(seqs, num_new_tokens):
        c = seq.num_computed_tokens
        if n == 1 and c >= seq.num_prompt_tokens:
            ds += 1
            dc += c + 1
        else:
            pt += n
            pc += c + n
            pseq += 1
            cached += c
    return BatchShape(pt, pc, pseq, cached, ds, dc)
