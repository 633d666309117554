"""Request bookkeeping: what happened to each request of the workload, in one place.

A simulated request is the engine's own Sequence (so the real scheduler and block manager run it)
plus the few fields only the fleet needs, declared here. Every time inside the simulator, the
Sequence's arrival and the scheduler's timestamps included, is integer picoseconds
(simulator.steptime); the report converts to seconds.
"""

from __future__ import annotations

import numpy as np

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

# status codes of RequestLog.status
PENDING, OK, REJECTED, FAILED, UNFINISHED = range(5)
STATUS = ("pending", "ok", "rejected", "failed", "unfinished")


class SimSequence(Sequence):
    """One attempt at serving workload request `index` (a retry after a failure is a new one)."""

    def __init__(self, index: int, token_ids: list[int], max_tokens: int, arrival_ps: int):
        super().__init__(
            token_ids,
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            request_id=str(index),
            arrival_time=arrival_ps,
        )
        self.index = index
        self.first_cached = -1  # tokens found in the prefix cache at first admission; -1 = not yet
        self.replica_arrival = -1  # when the router handed it to a replica


class RequestLog:
    """Per-request columns (numpy, one row per workload request); -1 where a time does not exist."""

    def __init__(self, n: int):
        self.replica = np.full(n, -1, dtype=np.int64)
        self.pool = np.full(n, -1, dtype=np.int64)
        self.first_sched = np.full(n, -1, dtype=np.int64)
        self.first_token = np.full(n, -1, dtype=np.int64)
        self.finish = np.full(n, -1, dtype=np.int64)
        self.cached = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.retries = np.zeros(n, dtype=np.int64)
        self.done = 0  # requests with a final outcome (ok or rejected)

    def routed(self, i: int, replica: int, pool: int) -> None:
        self.replica[i] = replica
        self.pool[i] = pool

    def rejected(self, i: int) -> None:
        self.status[i] = REJECTED
        self.done += 1

    def failed(self, i: int, replica: int) -> None:
        """Lost with its replica (no retry)."""
        self.status[i] = FAILED
        self.replica[i] = replica

    def finished(self, seq: SimSequence) -> None:
        i = seq.index
        self.first_sched[i] = seq.first_scheduled_time
        self.first_token[i] = seq.first_token_time
        self.finish[i] = seq.finish_time
        self.cached[i] = seq.first_cached
        self.generated[i] = seq.num_output_tokens
        self.preemptions[i] = seq.num_preemptions
        self.status[i] = OK
        self.done += 1

    def in_flight(self, seq: SimSequence) -> None:
        """A request still running when the run ends keeps what it did (first token, tokens so far)."""
        i = seq.index
        if seq.first_token_time is not None:
            self.first_token[i] = seq.first_token_time
        if seq.first_scheduled_time is not None:
            self.first_sched[i] = seq.first_scheduled_time
        self.generated[i] = seq.num_output_tokens
        self.preemptions[i] = seq.num_preemptions

    def mark_unfinished(self, arrival_ps: np.ndarray, now: int) -> None:
        for i in np.flatnonzero(self.status == PENDING):
            if arrival_ps[i] < now:
                self.status[i] = UNFINISHED

    def lost(self) -> int:
        return int(np.count_nonzero(self.status == FAILED))
