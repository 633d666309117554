"""The fleet: workload -> router -> pools of replicas, with autoscalers, metrics and failures, in simpy.

One simpy process per replica (simulator.replica), plus the arrival process, the Prometheus-like
scraper, each pool's autoscaler loop, the timeline sampler and failure injection. Internal time is
integer picoseconds; everything leaving this module is in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import RequestRejected
from engine.core.sequence import Sequence
from simulator.autoscaling import build_observation, make_pool_policy
from simulator.metrics import MetricStore
from simulator.replica import Replica
from simulator.router import Router
from simulator.scenario import PoolSpec, Scenario
from simulator.steptime import PS, StepTimer, seconds, to_ps
from simulator.tokens import prompt_token_ids
from simulator.workload import Workload

STATUS = ("pending", "ok", "rejected", "failed", "unfinished")


def load_latency_model(name_or_path: str):
    from simulator.latency import LatencyModel

    if name_or_path.endswith(".json") or "/" in name_or_path:
        return LatencyModel.load(name_or_path)
    return LatencyModel.load_named(name_or_path)


@dataclass
class Pool:
    index: int
    spec: PoolSpec
    timer: StepTimer
    model: object
    policy: object = None
    desired: int = 0
    replicas: list = field(default_factory=list)  # every replica ever created
    repairing: int = 0
    scale_events: list = field(default_factory=list)  # (time s, from, to)
    decisions: list = field(default_factory=list)  # (time s, desired, reason)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state in ("provisioning", "ready")]

    def count(self, state: str) -> int:
        return sum(1 for r in self.replicas if r.state == state)


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
        self.router = Router(
            r["policy"],
            r["weights"],
            int(router_seed.integers(2**31)),
            r["prefix_lru_blocks"],
            kv_threshold=r["kv_threshold"],
            queue_threshold=r["queue_threshold"],
        )
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
        self.backlog: list[Sequence] = []  # requests waiting at the router for any ready replica
        n = len(workload)
        self.req_replica = np.full(n, -1, dtype=np.int64)
        self.req_pool = np.full(n, -1, dtype=np.int64)
        self.req_first_sched = np.full(n, -1, dtype=np.int64)
        self.req_first_token = np.full(n, -1, dtype=np.int64)
        self.req_finish = np.full(n, -1, dtype=np.int64)
        self.req_cached = np.zeros(n, dtype=np.int64)
        self.req_generated = np.zeros(n, dtype=np.int64)
        self.req_preempt = np.zeros(n, dtype=np.int64)
        self.req_status = np.zeros(n, dtype=np.int8)
        self.req_retries = np.zeros(n, dtype=np.int64)
        self.arrival_ps = np.array([to_ps(t) for t in workload.times], dtype=np.int64)
        self.timeline: list[dict] = []
        self.finished = 0
        self.needs_tokens = any(p.spec.prefix_caching for p in self.pools) or self.router.uses_prefix
        self.end_ps = to_ps(
            scenario.duration if scenario.duration is not None else (float(workload.times[-1]) if n else 0.0)
        )
        self._arrivals_window: list[int] = [0] * len(self.pools)
        self.arrived = 0

    # -- replicas ------------------------------------------------------------------------------
    def _new_replica(self, pool: Pool, immediate: bool = False) -> Replica:
        rep = Replica(self.env, self._next_rid, pool, pool.timer, self, fast=self.fast)
        self._next_rid += 1
        pool.replicas.append(rep)
        delay = 0.0 if immediate else float(pool.spec.startup_delay.sample(self.rng_startup, 1)[0])
        rep.start(to_ps(max(delay, 0.0)))
        return rep

    def reconcile(self, pool: Pool) -> None:
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
        self.reconcile(pool)

    def on_ready(self, rep: Replica) -> None:
        self.ready.append(rep)
        self.ready.sort(key=lambda r: r.id)
        if rep.pool.spec.failure is not None:
            self.env.process(self._failure(rep))
        backlog, self.backlog = self.backlog, []
        for seq in backlog:
            self._route(seq)

    def on_gone(self, rep: Replica) -> None:
        self.router.forget(rep.id)
        self.store.forget((rep.pool.index, rep.id))

    def on_finish(self, rep: Replica, seq: Sequence) -> None:
        i = seq.req_index
        self.req_first_sched[i] = seq.first_scheduled_time
        self.req_first_token[i] = seq.first_token_time
        self.req_finish[i] = seq.finish_time
        self.req_cached[i] = seq.first_cached
        self.req_generated[i] = seq.num_output_tokens
        self.req_preempt[i] = seq.num_preemptions
        self.req_status[i] = 1
        self.finished += 1

    def _failure(self, rep: Replica):
        f = rep.pool.spec.failure
        yield self.env.timeout(to_ps(float(self.rng_fail.exponential(f.mtbf))))
        if rep.state not in ("ready", "draining"):
            return
        pool = rep.pool
        was_live = rep.state == "ready"
        if rep in self.ready:
            self.ready.remove(rep)
        seqs = rep.fail()
        self.on_gone(rep)
        for seq in seqs:
            if f.on_failure == "retry":
                self.req_retries[seq.req_index] += 1
                self._route(self._make_seq(seq.req_index))
            else:
                self.req_status[seq.req_index] = 3
                self.req_replica[seq.req_index] = rep.id
        if was_live:
            pool.repairing += 1
            self.reconcile(pool)
            yield self.env.timeout(to_ps(float(f.repair.sample(self.rng_fail, 1)[0])))
            pool.repairing -= 1
            self.reconcile(pool)

    # -- requests ------------------------------------------------------------------------------
    def _make_seq(self, i: int) -> Sequence:
        wl = self.wl
        n = int(wl.prompt[i])
        ids = (
            prompt_token_ids(i, n, wl.hash_ids[i] if wl.hash_ids is not None else None)
            if self.needs_tokens
            else [0] * n
        )
        seq = Sequence(
            ids,
            SamplingParams(max_tokens=int(wl.output[i]), ignore_eos=True),
            request_id=str(i),
            arrival_time=seconds(int(self.arrival_ps[i])),
        )
        seq.req_index = i
        seq.first_cached = -1
        seq.fleet_arrival = int(self.arrival_ps[i])
        return seq

    def _route(self, seq: Sequence) -> None:
        if not self.ready:
            self.backlog.append(seq)
            return
        k = self.router.pick(self.ready, seq.token_ids if self.router.uses_prefix else None)
        rep = self.ready[k]
        i = seq.req_index
        seq.replica_arrival = self.env.now
        self.req_replica[i] = rep.id
        self.req_pool[i] = rep.pool.index
        try:
            rep.submit(seq)
        except RequestRejected:
            self.req_status[i] = 2
            self.finished += 1
            return

    def _arrivals(self):
        env = self.env
        hop = to_ps(self.sc.router.get("latency_ms", 0.0) / 1000)  # the same for all: order is kept
        for i in range(len(self.wl)):
            t = int(self.arrival_ps[i])
            if t >= self.end_ps and self.sc.duration is not None:
                break
            t += hop
            if t > env.now:
                yield env.timeout(t - env.now)
            self.arrived += 1
            self._route(self._make_seq(i))

    def _autoscale(self, pool: Pool):
        interval = to_ps(pool.policy.polling_interval)
        while True:
            obs = build_observation(self, pool)
            d = pool.policy.decide(obs)
            self.set_desired(pool, max(0, int(d.desired_replicas)), d.reason)
            yield self.env.timeout(interval)

    def _scrape(self):
        interval = to_ps(self.sc.scrape_interval)
        while True:
            t = seconds(self.env.now)
            for pool in self.pools:
                for rep in pool.replicas:
                    if rep.state in ("ready", "draining"):
                        self.store.scrape(
                            (pool.index, rep.id),
                            t,
                            rep.scrape_vector(),
                            {
                                "waiting": rep.num_waiting,
                                "running": rep.num_running,
                                "kv_usage": rep.kv_usage_now(),
                            },
                        )
            yield self.env.timeout(interval)

    def _sample_timeline(self):
        interval = to_ps(self.sc.timeline_interval)
        last_arrived = 0
        while True:
            yield self.env.timeout(interval)
            t = seconds(self.env.now)
            arrived = self.arrived - last_arrived
            last_arrived = self.arrived
            for pool in self.pools:
                reps = [r for r in pool.replicas if r.state in ("ready", "draining")]
                ready = [r for r in reps if r.state == "ready"]
                self.timeline.append(
                    {
                        "time": t,
                        "pool": pool.spec.name,
                        "desired": pool.desired,
                        "provisioning": pool.count("provisioning"),
                        "ready": len(ready),
                        "draining": pool.count("draining"),
                        "arrival_rate": arrived / self.sc.timeline_interval if pool.index == 0 else 0.0,
                        "waiting": sum(r.num_waiting for r in reps)
                        + (len(self.backlog) if pool.index == 0 else 0),
                        "running": sum(r.num_running for r in reps),
                        "kv_usage": float(np.mean([r.kv_usage_now() for r in ready])) if ready else 0.0,
                    }
                )
            if self._bar is not None:
                self._bar[0].update(self._bar[1], completed=min(self.env.now, self._horizon))

    # -- running -------------------------------------------------------------------------------
    def run(self) -> None:
        env = self.env
        for pool in self.pools:
            for _ in range(pool.desired):
                self._new_replica(pool, immediate=True)
        self._arrival_proc = env.process(self._arrivals())
        env.process(self._scrape())
        for pool in self.pools:
            env.process(self._autoscale(pool))
        self._bar = None
        self._horizon = self.end_ps + (to_ps(self.sc.max_drain) if self.sc.drain_after_end else 0)
        env.process(self._sample_timeline())
        progress = None
        if self.progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(
                TextColumn("simulating"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                transient=True,
            )
            progress.start()
            self._bar = (progress, progress.add_task("sim", total=self._horizon))
        try:
            env.run(until=self.end_ps if self.end_ps > 0 else 1)
            if self.sc.drain_after_end:
                step = to_ps(self.sc.timeline_interval)
                limit = self._horizon
                while (
                    self._arrival_proc.is_alive or self.finished + self._lost() < self.arrived
                ) and env.now < limit:
                    env.run(until=min(env.now + step, limit))
        finally:
            if progress is not None:
                progress.stop()
        self.end_time_ps = env.now
        for i in np.flatnonzero(self.req_status == 0):
            if self.arrival_ps[i] < env.now:
                self.req_status[i] = 4  # unfinished
        self._collect_in_flight()

    def _lost(self) -> int:
        return int(np.count_nonzero(self.req_status == 3))

    def _collect_in_flight(self) -> None:
        """Requests still running at the end keep what they did (first token, tokens so far)."""
        for pool in self.pools:
            for rep in pool.replicas:
                for seq in list(rep.sched.running) + list(rep.sched.waiting):
                    i = seq.req_index
                    if seq.first_token_time is not None:
                        self.req_first_token[i] = seq.first_token_time
                    if seq.first_scheduled_time is not None:
                        self.req_first_sched[i] = seq.first_scheduled_time
                    self.req_generated[i] = seq.num_output_tokens
                    self.req_preempt[i] = seq.num_preemptions

    def replica_seconds(self, pool: Pool) -> float:
        end = self.end_time_ps
        return sum(((r.gone_at if r.gone_at is not None else end) - r.created) for r in pool.replicas) / PS

    def busy_seconds(self, pool: Pool) -> float:
        return sum(r.busy_ps for r in pool.replicas) / PS

    def ready_seconds(self, pool: Pool) -> float:
        end = self.end_time_ps
        return (
            sum(
                ((r.gone_at if r.gone_at is not None else end) - r.ready_at)
                for r in pool.replicas
                if r.ready_at is not None
            )
            / PS
        )
