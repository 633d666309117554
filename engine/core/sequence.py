"""One request's state as the scheduler and the model runner see it."""

from __future__ import annotations

import itertools
from enum import Enum, auto

from engine.core.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


_ids = itertools.count()


class Sequence:
    def __init__(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
    ):
        self.request_id = request_id if request_id is not None else str(next(_ids))
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling_params = sampling_params or SamplingParams()
        self.arrival_time = arrival_time
        self.priority = priority  # lower value = served first (vLLM's convention)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of those, tokens found in the prefix cache at admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hash of each full block, in order
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.error: str | None = None
        # timings, set by whoever owns the clock (engine or simulator)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.request_id}, len={len(self)}, computed={self.num_computed_tokens}, "
                f"status={self.status.name})")
