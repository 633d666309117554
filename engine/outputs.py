"""What generate() returns for each request, shaped like vLLM's RequestOutput (flattened)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # stop | length | abort | error
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
