"""The fleet: workload -> router -> pools of replicas, in simpy.

One simpy process per replica (simulator.replica), plus the arrival process here and, next to the
code they use, the scraper (simulator.scrape), each pool's autoscaler (simulator.autoscaling), the
timeline sampler (simulator.timeline) and failure injection (simulator.failures). What happened to
each request is kept in a RequestLog (simulator.requests). Internal time is integer picoseconds;
everything leaving the simulator is in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from engine.core.scheduler import RequestRejected
from routing.config import build_router
from routing.kv_index import KVBlockIndex
from routing.precise import IndexFeed, uses_index
from simulator.autoscaling import PoolPolicy, autoscaler_process, make_pool_policy
from simulator.failures import failure_process
from simulator.frontend import draw_ms
from simulator.gate import SimGate
from simulator.latency import load_latency_model
from simulator.metrics import MetricStore
from simulator.pd import PDService
from simulator.replica import Replica
from simulator.requests import RequestLog, SimSequence
from simulator.scenario import PoolSpec, Scenario
from simulator.scrape import scrape_process
from simulator.steptime import PS, StepTimer, seconds, to_ps
from simulator.timeline import progress_for, timeline_process
from simulator.tokens import prompt_token_ids
from simulator.workload import Workload


@dataclass
class Pool:
    index: int
    spec: PoolSpec
    timer: StepTimer
    model: object
    policy: PoolPolicy | None = None
    desired: int = 0
    replicas: list = field(default_factory=list)  # every replica ever created
    repairing: int = 0
    scale_events: list = field(default_factory=list)  # (time s, from, to)
    decisions: list = field(default_factory=list)  # (time s, desired, reason)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state in ("provisioning", "ready")]

    def count(self, state: str) -> int:
        return sum(1 for r in self.replicas if r.state == state)

    def replica_seconds(self, end_ps: int) -> float:
        """Replica lifetime from creation (provisioning included) to gone, or to end_ps."""
        return sum(((r.gone_at if r.gone_at is not None else end_ps) - r.created) for r in self.replicas) / PS

    def ready_seconds(self, end_ps: int) -> float:
        alive = [r for r in self.replicas if r.ready_at is not None]
        return sum(((r.gone_at if r.gone_at is not None else end_ps) - r.ready_at) for r in alive) / PS

    def busy_seconds(self) -> float:
        return sum(r.busy_ps for r in self.replicas) / PS


class Fleet:
    def __init__(
        self,
        scenario: Scenario,
        workload: Workload,
        seed: int | None = None,
        fast: bool = True,
        models: dict | None = None,
        progress: bool = False,
    ):
        self.sc = scenario
        self.wl = workload
        self.seed = scenario.seed if seed is None else seed
        self.fast = fast
        self.progress = progress
        self.env = simpy.Environment()
        ss = np.random.SeedSequence(self.seed)
        self.rng_startup, self.rng_fail, router_seed = (np.random.default_rng(s) for s in ss.spawn(3))
        r = scenario.router
        precise = uses_index(r.config.weights)
        # the live router's (routing.config); the precise scorer looks up the replicas' own cache keys:
        # hashes over their block size
        self.router = build_router(r.config, int(router_seed.integers(2**31)),
                                   scenario.pools[0].block_size if precise else None)
        if precise:  # fed by the replicas' block managers (_new_replica)
            self.router.kv_index = KVBlockIndex(scenario.pools[0].block_size)
        # the gateway queue, when the router has one; its rng after the three above: they keep theirs
        self.gate = SimGate(self, r, np.random.default_rng(ss.spawn(1)[0]), len(workload)) \
            if r.config.flow_control else None
        self.frontend_rng = np.random.default_rng(ss.spawn(1)[0])  # spawned last: the others keep theirs
        self.store = MetricStore(retention=max(4 * scenario.rate_window, 600.0))
        models = models or {}
        self.pools: list[Pool] = []
        for i, spec in enumerate(scenario.pools):
            model = models.get(spec.latency_model) or load_latency_model(spec.latency_model)
            pool = Pool(i, spec, StepTimer(model, spec.step_overhead_ms), model, desired=spec.replicas)
            pool.policy = make_pool_policy(spec, model)
            self.pools.append(pool)
        self._next_rid = 0
        self.ready: list[Replica] = []  # routable replicas, all pools
        self.backlog: list[SimSequence] = []  # requests waiting at the router for any ready replica
        n = len(workload)
        self.requests = RequestLog(n)
        self.arrival_ps = np.array([to_ps(t) for t in workload.times], dtype=np.int64)
        self.timeline: list[dict] = []
        self.needs_tokens = any(p.spec.prefix_caching for p in self.pools) or self.router.uses_prefix
        self.end_ps = to_ps(
            scenario.duration if scenario.duration is not None else (float(workload.times[-1]) if n else 0.0)
        )
        self.horizon = self.end_ps + (to_ps(scenario.max_drain) if scenario.drain_after_end else 0)
        self.arrived = 0
        self.pd = PDService(self, scenario.pd) if scenario.pd is not None else None

    # -- replicas ------------------------------------------------------------------------------
    def _new_replica(self, pool: Pool, immediate: bool = False) -> Replica:
        rep = Replica(self.env, self._next_rid, pool, pool.timer, self, fast=self.fast)
        if self.router.kv_index is not None:
            IndexFeed(self.router.kv_index, rep.id).attach(rep.bm)
        self._next_rid += 1
        pool.replicas.append(rep)
        delay = 0.0 if immediate else float(pool.spec.provisioning_delay.sample(self.rng_startup, 1)[0])
        rep.start(to_ps(max(delay, 0.0)))
        return rep

    def resize(self, pool: Pool) -> None:
        """Starts or drains replicas until the pool's live count matches its desired count."""
        live = pool.live()
        target = pool.desired - pool.repairing
        if len(live) < target:
            for _ in range(target - len(live)):
                self._new_replica(pool)
        elif len(live) > target:
            # provisioning ones go first, then the newest ready ones
            order = sorted(live, key=lambda r: (r.state != "provisioning", -r.created, -r.id))
            for rep in order[: len(live) - target]:
                if rep in self.ready:
                    self.ready.remove(rep)
                rep.drain()

    def set_desired(self, pool: Pool, desired: int, reason: str = "") -> None:
        now = seconds(self.env.now)
        pool.decisions.append((now, desired, reason))
        if desired != pool.desired:
            pool.scale_events.append((now, pool.desired, desired))
            pool.desired = desired
        self.resize(pool)

    def on_ready(self, rep: Replica) -> None:
        self.ready.append(rep)
        self.ready.sort(key=lambda r: r.id)
        if rep.pool.spec.failure is not None:
            self.env.process(failure_process(self, rep))
        backlog, self.backlog = self.backlog, []
        for seq in backlog:
            self.route(seq)
        if self.pd is not None:
            self.pd.on_ready(rep)
        if self.gate is not None:
            self.gate.pump()

    def on_gone(self, rep: Replica) -> None:
        self.router.forget(rep.id)
        self.store.forget((rep.pool.index, rep.id))

    def on_finish(self, rep: Replica, seq: SimSequence) -> None:
        if self.pd is not None and self.pd.on_finish(rep, seq):
            return  # a prefill hop: its request goes on to a decode replica
        self.requests.finished(seq)

    # -- requests ------------------------------------------------------------------------------
    def make_seq(self, i: int) -> SimSequence:
        wl = self.wl
        n = int(wl.prompt[i])
        ids = (
            prompt_token_ids(i, n, wl.hash_ids[i] if wl.hash_ids is not None else None)
            if self.needs_tokens
            else [0] * n
        )
        return SimSequence(i, ids, int(wl.output[i]), int(self.arrival_ps[i]))

    def route(self, seq: SimSequence) -> None:
        if self.gate is not None:
            return self.gate.hold(seq)
        if self.pd is not None:
            return self.pd.route(seq)
        if not self.ready:
            self.backlog.append(seq)
            return
        self.send(seq, self.ready)

    def send(self, seq: SimSequence, candidates: list[Replica]) -> None:
        k = self.router.pick(candidates, seq.token_ids if self.router.uses_prefix else None)
        rep = candidates[k]
        self.requests.routed(seq.index, rep.id, rep.pool.index)
        if rep.pool.spec.frontend is None:
            return self.deliver(seq, rep)
        self.env.timeout(self.frontend_ps(rep, seq)).callbacks.append(lambda _: self.deliver(seq, rep))

    def frontend_ps(self, rep: Replica, seq: SimSequence) -> int:
        """One draw of the replica's pool's HTTP front end for this request (0 when it models none)."""
        frontend = rep.pool.spec.frontend
        if frontend is None:
            return 0
        return to_ps(draw_ms(frontend, self.frontend_rng, seq.num_prompt_tokens) / 1000)

    def deliver(self, seq: SimSequence, rep: Replica) -> None:
        """The request reaches the replica's engine (after its front end, when the pool models one)."""
        if rep.state not in ("ready", "draining"):  # it failed or went while the request was on its way
            return self.route(seq)
        seq.replica_arrival = self.env.now
        try:
            rep.submit(seq)
        except RequestRejected:
            self.requests.rejected(seq.index)

    def _arrivals(self):
        env = self.env
        hop = to_ps(self.sc.router.latency_ms / 1000)  # the same for all: order is kept
        for i in range(len(self.wl)):
            t = int(self.arrival_ps[i])
            if t >= self.end_ps and self.sc.duration is not None:
                break
            t += hop
            if t > env.now:
                yield env.timeout(t - env.now)
            self.arrived += 1
            self.route(self.make_seq(i))

    # -- running -------------------------------------------------------------------------------
    def run(self) -> None:
        env = self.env
        for pool in self.pools:
            for _ in range(pool.desired):
                self._new_replica(pool, immediate=True)
        arrivals = env.process(self._arrivals())
        env.process(scrape_process(self))
        if self.gate is not None:
            env.process(self.gate.process())
        for pool in self.pools:
            env.process(autoscaler_process(self, pool))
        bar = progress_for(self, self.progress)
        env.process(timeline_process(self, bar))
        try:
            env.run(until=self.end_ps if self.end_ps > 0 else 1)
            if self.sc.drain_after_end:
                step = to_ps(self.sc.timeline_interval)
                while (
                    arrivals.is_alive or self.requests.done + self.requests.lost() < self.arrived
                ) and env.now < self.horizon:
                    env.run(until=min(env.now + step, self.horizon))
        finally:
            if bar is not None:
                bar[0].stop()
        self.end_time_ps = env.now
        self.requests.mark_unfinished(self.arrival_ps, env.now)
        for pool in self.pools:
            for rep in pool.replicas:
                for seq in list(rep.sched.running) + list(rep.sched.waiting):
                    self.requests.in_flight(seq)
