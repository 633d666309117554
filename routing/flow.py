"""Flow control at the gateway: priority bands (capacity, TTL), a saturation detector, dispatch in
priority order. Pure and clock-free: every call takes `now` (seconds) from its caller, so the
simulator (virtual time) and the live router (wall time) run the same code.

    queue = GatewayQueue([Band(10, capacity=64, ttl=5.0, name="high"), Band(0, capacity=256)])
    detector = SaturationDetector(queue_threshold=4, kv_threshold=0.9)
    if not queue.offer(request, priority, now):        # the band is full: answer 429
        ...
    expired = pump(queue, detector, replicas, dispatch, now)   # dispatch(held, room) sends one;
                                                                # expired ones get a 503

A request is held while every replica is saturated (or there are none: scaled to zero), and goes
out, highest band first and in arrival order within a band, as soon as one has room.

A band may stop earlier than the detector's thresholds: with `saturation` s < 1 its requests go only
to replicas whose utilization (waiting / queue threshold, KV usage / KV threshold, the larger) is under
s. A batch band held at s = 0.1 waits in the gateway as soon as the engines fill, while an interactive
band at 1.0 still dispatches: during a burst the capacity there is goes to the band that needs it now.
This is the one home of that rule: the simulator's fleet and the live router's gate both call `pump`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Band:
    priority: int = 0
    capacity: int = 1000  # requests held at most; one more is refused (429)
    ttl: float = 60.0  # seconds a request may wait in the gateway; then it is dropped (503)
    name: str = ""
    saturation: float = 1.0  # dispatch only to replicas whose utilization is under this (1: the detector's)

    def __post_init__(self):
        if not self.saturation > 0:
            raise ValueError(f"band {self.label}: saturation must be > 0, got {self.saturation}")

    @property
    def label(self) -> str:
        return self.name or str(self.priority)


@dataclass
class Held:
    item: Any
    band: Band
    enqueued: float
    deadline: float
    done: bool = field(default=False, compare=False)  # dispatched, expired or cancelled


class GatewayQueue:
    """FIFO queues, one per band, served highest priority first."""

    def __init__(self, bands: list[Band] | None = None):
        bands = sorted(bands or [Band()], key=lambda b: -b.priority)
        if len({b.priority for b in bands}) != len(bands):
            raise ValueError("priority bands must have distinct priorities")
        self.bands = bands
        self.queues: dict[int, deque[Held]] = {b.priority: deque() for b in bands}
        self.counts: dict[int, int] = {b.priority: 0 for b in bands}  # live (not done) per band

    def band_for(self, priority: int) -> Band:
        """The band of that priority, else the highest band below it, else the lowest band."""
        for b in self.bands:
            if b.priority <= priority:
                return b
        return self.bands[-1]

    def offer(self, item: Any, priority: int, now: float) -> Held | None:
        """Holds the item; None when its band is full."""
        band = self.band_for(priority)
        if self.counts[band.priority] >= band.capacity:
            return None
        held = Held(item, band, now, now + band.ttl)
        self.queues[band.priority].append(held)
        self.counts[band.priority] += 1
        return held

    def _settle(self, held: Held) -> None:
        held.done = True
        self.counts[held.band.priority] -= 1

    def pop(self, accept: Callable[[Held], bool] | None = None, band: Band | None = None) -> Held | None:
        """The next request to dispatch (highest band, oldest first), removed; None when empty.
        With `accept`, the first one it accepts (the others keep their places); with `band`, from that
        band only."""
        for b in self.bands if band is None else [band]:
            q = self.queues[b.priority]
            while q and q[0].done:
                q.popleft()
            if accept is None:
                if q:
                    held = q.popleft()
                    self._settle(held)
                    return held
                continue
            for i, held in enumerate(q):
                if not held.done and accept(held):
                    del q[i]
                    self._settle(held)
                    return held
        return None

    def cancel(self, held: Held) -> None:
        """The client gave up: its place is freed (removed lazily from the deque)."""
        if not held.done:
            self._settle(held)

    def expire(self, now: float) -> list[Held]:
        """Requests whose TTL has passed, removed. A band's TTL is one, so they are at its head."""
        out = []
        for b in self.bands:
            q = self.queues[b.priority]
            while q and (q[0].done or q[0].deadline <= now):
                held = q.popleft()
                if not held.done:
                    self._settle(held)
                    out.append(held)
        return out

    def next_deadline(self) -> float | None:
        """The earliest TTL among held requests (a band's oldest live one), or None."""
        heads = [next((h.deadline for h in q if not h.done), None) for q in self.queues.values()]
        return min((d for d in heads if d is not None), default=None)

    def sizes(self) -> dict[str, int]:
        return {b.label: self.counts[b.priority] for b in self.bands}

    def __len__(self) -> int:
        return sum(self.counts.values())


@dataclass
class SaturationDetector:
    """An endpoint is saturated when its waiting queue or its KV usage reaches a threshold."""

    queue_threshold: int = 5
    kv_threshold: float = 0.8

    def __post_init__(self):
        if self.queue_threshold < 1 or not 0 < self.kv_threshold <= 1:
            raise ValueError(f"saturation thresholds: queue_threshold must be >= 1 and kv_threshold in "
                             f"(0, 1], got {self.queue_threshold} and {self.kv_threshold}")

    def utilization(self, r) -> float:
        """1.0 at a threshold: max(waiting / queue_threshold, kv_usage / kv_threshold)."""
        return max(r.num_waiting / self.queue_threshold, r.kv_usage / self.kv_threshold)

    def has_room(self, r, level: float = 1.0) -> bool:
        """Utilization under `level` (1.0: both below their thresholds)."""
        return r.num_waiting < self.queue_threshold * level and r.kv_usage < self.kv_threshold * level

    def room(self, replicas: list, level: float = 1.0) -> list:
        return [r for r in replicas if self.has_room(r, level)]

    def saturation(self, replicas: list) -> float:
        """The pool's: the least utilised endpoint's (dispatch stops at 1.0); 1.0 with no endpoint."""
        return min((self.utilization(r) for r in replicas), default=1.0)


def pump(queue: GatewayQueue, detector: SaturationDetector, replicas: list,
         dispatch: Callable[[Held, list], None], now: float,
         eligible: Callable[[Held, list], list] | None = None) -> list[Held]:
    """Expires what outlived its TTL, then dispatches in priority order while a replica has room for
    the band (under the band's saturation level).

    dispatch(held, room) must send the request to one replica of `room` and update that replica's
    view (its waiting count), so the next round sees it. eligible(held, room), when given, narrows
    `room` to the replicas that can serve that request (its model): a request none of them serves
    keeps its place while later ones go. Returns the expired requests."""
    expired = queue.expire(now)
    while len(queue):
        held, room, rooms = None, [], {}  # rooms: saturation level -> replicas under it, this round
        for band in queue.bands:
            if not queue.counts[band.priority]:
                continue
            if band.saturation not in rooms:
                rooms[band.saturation] = detector.room(replicas, band.saturation)
            room = rooms[band.saturation]
            if not room:
                continue
            if eligible is None:
                held = queue.pop(band=band)
            else:
                fits: dict[int, list] = {}
                held = queue.pop(lambda h: bool(fits.setdefault(id(h), eligible(h, room))), band)
                room = fits[id(held)] if held is not None else room
            if held is not None:
                break
        if held is None:
            break
        dispatch(held, room)
    return expired
