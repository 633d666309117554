"""Step durations in integer picoseconds, from a latency model.

Integer time makes the closed-form fast path exact: the sum of k decode steps whose context grows
by `seqs` tokens a step, k*A + B*(k*C + seqs*k*(k-1)/2), is the same integer whether computed at
once or step by step. The latency model's (a_ms, b_ms) are rounded to picoseconds once per batch
shape (an error below 1e-9 s a step).
"""

from __future__ import annotations

import math

PS = 10**12  # picoseconds per second
PS_PER_MS = 10**9


def seconds(t_ps: int | float) -> float:
    return t_ps / PS


def to_ps(t_s: float) -> int:
    return int(round(t_s * PS))


class StepTimer:
    """(A, B) in ps for a batch shape, with step_ps = A + B * decode_context."""

    def __init__(self, model, overhead_ms: float = 0.0):
        self.model = model
        self.overhead_ps = int(round(overhead_ms * PS_PER_MS))
        self._decode: dict[int, tuple[int, int]] = {}
        self._mixed: dict[tuple[int, int, int, int], tuple[int, int]] = {}

    def coeffs(
        self, prefill_tokens: int, prefill_context: int, decode_seqs: int, prefill_seqs: int
    ) -> tuple[int, int]:
        if prefill_tokens == 0:
            c = self._decode.get(decode_seqs)
            if c is None:
                c = self._decode[decode_seqs] = self._compute(0, 0, decode_seqs, 0)
            return c
        key = (prefill_tokens, prefill_context, decode_seqs, prefill_seqs)
        c = self._mixed.get(key)
        if c is None:
            if len(self._mixed) > 200_000:
                self._mixed.clear()
            c = self._mixed[key] = self._compute(*key)
        return c

    def _compute(self, pt: int, pc: int, ds: int, pseq: int) -> tuple[int, int]:
        try:
            a, b = self.model.decode_coeffs(pt, pc, ds, max(pseq, 1))
        except TypeError:  # a model without the prefill_seqs argument
            a, b = self.model.decode_coeffs(pt, pc, ds)
        return max(1, int(round(a * PS_PER_MS)) + self.overhead_ps), max(0, int(round(b * PS_PER_MS)))

    def step_ps(self, pt: int, pc: int, ds: int, dc: int, pseq: int = 1) -> int:
        a, b = self.coeffs(pt, pc, ds, pseq if pt else 0)
        return a + b * dc


def sum_steps(a: int, b: int, c0: int, seqs: int, k: int) -> int:
    """Total ps of k decode steps: step j lasts a + b*(c0 + seqs*j)."""
    return k * a + b * (k * c0 + seqs * (k * (k - 1) // 2))


def steps_reaching(a: int, b: int, c0: int, seqs: int, elapsed: int) -> int:
    """Smallest k >= 1 with sum_steps(k) >= elapsed (the step in progress at `elapsed` completes)."""
    if elapsed <= a + b * c0:
        return 1
    # b*seqs/2 k^2 + (a + b*c0 - b*seqs/2) k - elapsed = 0
    qa = b * seqs / 2.0
    qb = a + b * c0 - qa
    if qa > 0:
        k = int((-qb + math.sqrt(qb * qb + 4 * qa * elapsed)) / (2 * qa))
    else:
        k = int(elapsed // max(qb, 1))
    k = max(k, 1)
    while k > 1 and sum_steps(a, b, c0, seqs, k - 1) >= elapsed:
        k -= 1
    while sum_steps(a, b, c0, seqs, k) < elapsed:
        k += 1
    return k


class AffineStepModel:
    """A tiny stand-in latency model (for tests and back-of-the-envelope scenarios): a fixed cost per
    step, per prefill token, per decode sequence and per decode context token."""

    def __init__(
        self,
        base_ms: float = 10.0,
        prefill_token_ms: float = 0.05,
        decode_seq_ms: float = 0.2,
        decode_kv_ms: float = 0.0005,
    ):
        self.base_ms, self.prefill_token_ms = base_ms, prefill_token_ms
        self.decode_seq_ms, self.decode_kv_ms = decode_seq_ms, decode_kv_ms

    def decode_coeffs(
        self, prefill_tokens: int, prefill_context: int, decode_seqs: int
    ) -> tuple[float, float]:
        a = self.base_ms + self.prefill_token_ms * prefill_tokens + self.decode_seq_ms * decode_seqs
        return a, self.decode_kv_ms if decode_seqs else 0.0

    def step_ms(
        self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_context: int
    ) -> float:
        a, b = self.decode_coeffs(prefill_tokens, prefill_context, decode_seqs)
        return a + b * decode_context
