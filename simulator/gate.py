"""The simulated gateway queue: the live gate's admission (controlplane.router.gate) in virtual time,
over the same flow control (routing.flow: bands, saturation detector, `pump`).

    gate = SimGate(fleet, router, rng, n_requests)   # router: the scenario's (SimRouter)
    gate.hold(seq)     # its band drawn by the shares; full band: refused (a 429 at the router)
    gate.pump()        # dispatch to replicas with room; past a band's TTL: expired (a 503)

The fleet calls `pump` when a replica becomes ready, and `process` pumps every `interval` as capacity
frees (replicas never call in).
"""

from __future__ import annotations

import numpy as np

from routing.flow import GatewayQueue, pump
from simulator.requests import SimSequence
from simulator.scenario_router import SimRouter
from simulator.steptime import seconds, to_ps


class SimGate:
    def __init__(self, fleet, router: SimRouter, rng: np.random.Generator, n_requests: int):
        self.fleet = fleet
        self.queue = GatewayQueue(router.config.bands)
        self.detector = router.config.detector()
        self.interval_ps = to_ps(router.interval)
        self.rng = rng
        self.cdf = np.cumsum(router.shares) / sum(router.shares)
        self.bands = router.config.bands  # in the scenario's order, as the shares
        self.refused = self.expired = 0
        self.band = np.full(n_requests, -1, dtype=np.int64)  # each request's band priority

    def hold(self, seq: SimSequence) -> None:
        band = self.bands[int(np.searchsorted(self.cdf, self.rng.random(), side="right"))]
        self.band[seq.index] = band.priority
        fleet = self.fleet
        if self.queue.offer(seq, band.priority, seconds(fleet.env.now)) is None:
            self.refused += 1  # the band is full: a 429 at the router
            fleet.requests.rejected(seq.index)
            return
        self.pump()

    def pump(self) -> None:
        fleet = self.fleet
        for held in pump(self.queue, self.detector, fleet.ready, lambda h, room: fleet.send(h.item, room),
                         seconds(fleet.env.now)):
            self.expired += 1  # waited past its band's TTL: a 503 at the router
            fleet.requests.rejected(held.item.index)

    def process(self):
        """Dispatches as capacity frees and expires what waited too long."""
        while True:
            yield self.fleet.env.timeout(self.interval_ps)
            if len(self.queue):
                self.pump()
