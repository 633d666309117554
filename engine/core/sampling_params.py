"""Per-request generation settings, shaped like vLLM's SamplingParams."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# a request's seed seeds a 64-bit generator (torch.Generator.manual_seed accepts this range)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables top-k
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        # NaN fails every comparison, so each range is checked as "inside", never as "not outside"
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must fit in 64 bits ({SEED_MIN}..{SEED_MAX}), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
