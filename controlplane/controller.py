"""The live controller: every autoscaler reconciled at its polling interval by a few workers.

    loop = AutoscalerLoop(spec, policy, source, target, state=StateStore(dir), log=DecisionLog(...))
    Controller([loop], workers=5).run(stop_event)

Each tick is autoscaler.reconcile, the step the simulator runs: read the target's replicas, observe
(the metric source), decide, clamp, apply. What is the controller's own: a failing source is never
read as zero (its triggers count toward KEDA's fallback, any other policy holds), a failed scale keeps
the last applied state and is retried with backoff before the next tick, the policy's state is saved
after every decision, and every tick goes to the decision log and the controller's metrics. Like the
Kubernetes HPA controller (a sync period and a few workers), a heap of due times feeds a small pool
of worker threads; one autoscaler is never reconciled twice at once.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from autoscaler.observation import Observation
from autoscaler.policy import Policy
from autoscaler.reconcile import ScaleError, Step, reconcile
from controlplane.decision_log import DecisionLog
from controlplane.settings import ControllerArgs
from controlplane.source_health import SourceHealth, describe
from controlplane.state import StateStore
from controlplane.telemetry import Telemetry
from controlplane.trigger_silence import TriggerSilence

log = logging.getLogger("slopilot.control")
RETRY_FIRST, RETRY_MAX = 1.0, 60.0  # seconds: backoff of a failed scale, doubling


@dataclass
class Pending:
    desired: int
    reason: str
    attempt: int = 1


class AutoscalerLoop:
    """One autoscaler: its spec, policy, metric source and scale target, and what it remembers."""

    def __init__(self, spec, policy: Policy, source, target, state: StateStore | None = None,
                 log_file: DecisionLog | None = None, telemetry: Telemetry | None = None):
        self.spec, self.policy, self.source, self.target = spec, policy, source, target
        self.name = spec.name
        self.state, self.log, self.telemetry = state, log_file, telemetry
        self.triggers = [t.name for t in spec.triggers]
        self.pending: Pending | None = None  # a scale that failed, retried before the next tick
        self.next_tick = 0.0  # wall time of the next reconcile
        self.last_step: Step | None = None
        self.last_obs: Observation | None = None
        self.last_failures: dict[str, str] = {}  # metric -> error message, of the last tick
        self.lock = threading.Lock()
        self.health = SourceHealth(self.name, describe(source))
        self.silence = TriggerSilence(self.name, spec.triggers, ControllerArgs.silent_polls)
        if state is not None:
            saved = state.load(self.name)
            if saved is not None:
                policy.load_state_dict(saved.get("policy", {}))
                log.info("%s: resumed policy state saved at %s", self.name, saved.get("time"))

    @property
    def interval(self) -> float:
        return self.policy.polling_interval

    def tick(self, now: float) -> Step:
        """One reconcile at wall time `now`, rounded to the ms (the log holds what the policy saw)."""
        now = round(now, 3)
        started = time.perf_counter()
        current, ready = self.target.replicas()
        crashed = None
        try:
            obs = self.source.observe(self.spec, now, current, ready)
        except Exception as exc:  # an unexpected source failure is an outage, never a zero
            crashed = f"{type(exc).__name__}: {exc}"
            obs = Observation(now, current, ready, errors=set(self.triggers) or {"source"})
        starting = getattr(self.target, "starting", None)
        if starting is not None:
            obs.starting_replicas = starting()
        step = reconcile(self.policy, obs, self.target)
        self.last_failures = self.failures(obs, crashed)
        self.health.update(self.last_failures, self.policy, step.desired, step.decision.reason)
        self.silence.update(obs, self.source)
        self.pending = None if step.applied else self._failed(step)
        self.last_obs, self.last_step = obs, step
        self._save(now, step.desired if step.applied else current)
        if self.log is not None:
            self.log.write(obs, step)
        self._report(obs, step, current, time.perf_counter() - started)
        return step

    def failures(self, obs: Observation, crashed: str | None = None) -> dict[str, str]:
        """Each metric that failed this tick, with the source's message for it."""
        if crashed:
            return {name: crashed for name in obs.errors}
        said = getattr(self.source, "last_errors", {}) or {}
        return {name: said.get(name, f"{name}: failed") for name in sorted(obs.errors)}

    def retry(self) -> bool:
        """Applies the scale that failed; True when it went through."""
        p = self.pending
        try:
            self.target.scale(p.desired, p.reason)
        except ScaleError as exc:
            p.attempt += 1
            log.warning("%s: scale to %d failed again (attempt %d): %s", self.name, p.desired, p.attempt, exc)
            if self.telemetry:
                self.telemetry.scale_errors.labels(self.name).inc()
            return False
        log.info("%s: scaled to %d on retry %d (%s)", self.name, p.desired, p.attempt, p.reason)
        self.pending = None
        self._save(self.last_obs.time if self.last_obs else time.time(), p.desired)
        return True

    def _save(self, now: float, replicas: int) -> None:
        """The policy's state and the count the target holds (a restarted controller whose target
        cannot be read, a scale command, starts from it)."""
        if self.state is not None:
            record = {"time": now, "policy": self.policy.state_dict(), "replicas": replicas}
            self.state.save(self.name, record)

    def _failed(self, step: Step) -> Pending:
        """The scale to retry; the same count failing again keeps backing off (a fleet's bound, a
        broken command: each tick would otherwise start the backoff over)."""
        p = self.pending
        attempt = p.attempt + 1 if p is not None and p.desired == step.desired else 1
        return Pending(step.desired, step.decision.reason, attempt)

    def retry_delay(self) -> float:
        return min(RETRY_FIRST * 2 ** (self.pending.attempt - 1), RETRY_MAX)

    def _report(self, obs: Observation, step: Step, current: int, seconds: float) -> None:
        d = step.decision
        if step.error:
            log.warning("%s: scale %d -> %d failed: %s", self.name, current, step.desired, step.error)
        elif step.desired != current:
            log.info("%s: scale %d -> %d: %s", self.name, current, step.desired, d.reason)
        t = self.telemetry
        if t is None:
            return
        n = self.name
        t.desired.labels(n).set(step.desired)
        t.current.labels(n).set(step.desired if step.applied else current)
        t.ready.labels(n).set(obs.ready)
        t.decisions.labels(n, d.reason.split(":")[0].strip() or "none").inc()
        for metric in obs.errors:
            t.source_errors.labels(n, metric).inc()
        if step.error:
            t.scale_errors.labels(n).inc()
        t.fallback.labels(n).set(1 if obs.errors else 0)
        t.duration.labels(n).observe(seconds)
        if step.applied and not obs.errors:
            t.last_success.labels(n).set(obs.time)


class Controller:
    """Runs every loop at its polling interval (the first tick at once) until `stop` is set.

    Loops may be added and removed while it runs (the Kubernetes controller follows its watched
    resources): an added loop ticks at once, a removed one finishes the reconcile under way and stops.
    """

    def __init__(self, loops: list[AutoscalerLoop], workers: int = 5, clock=time.time,
                 telemetry: Telemetry | None = None):
        names = [lp.name for lp in loops]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"two autoscalers share the name {', '.join(dup)}: names must be unique")
        self.loops, self.workers, self.clock, self.telemetry = list(loops), workers, clock, telemetry
        self._thread_alive = False
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, AutoscalerLoop]] = []  # (due time, sequence, loop)
        self._seq = 0
        self._busy: set[int] = set()  # id() of loops being reconciled
        self._live = {id(lp) for lp in self.loops}  # id() of loops not removed
        for lp in self.loops:
            self._push(self.clock(), lp)

    def _push(self, when: float, loop: AutoscalerLoop) -> None:
        self._seq += 1
        heapq.heappush(self._due, (when, self._seq, loop))

    def add(self, loop: AutoscalerLoop) -> None:
        """Starts reconciling `loop` (at once); its name must not be running already."""
        with self._lock:
            if any(lp.name == loop.name for lp in self.loops):
                raise ValueError(f"an autoscaler named {loop.name} already runs")
            self.loops.append(loop)
            self._live.add(id(loop))
            self._push(self.clock(), loop)

    def remove(self, name: str) -> AutoscalerLoop | None:
        """Stops reconciling the loop named `name`; returns it (None when there was none)."""
        with self._lock:
            for i, lp in enumerate(self.loops):
                if lp.name == name:
                    del self.loops[i]
                    self._live.discard(id(lp))
                    return lp
        return None

    def sources_down(self, polls: int) -> list[str]:
        """Why each autoscaler whose source failed `polls` polls in a row or more counts as down."""
        with self._lock:
            loops = list(self.loops)
        return [why for lp in loops if (why := lp.health.down(polls))]

    def run(self, stop: threading.Event) -> None:
        """Blocks until stop is set; the reconciles under way finish before it returns."""
        if self.telemetry is not None:
            self.telemetry.alive = lambda: self._thread_alive
            self.telemetry.sources_down = self.sources_down
        self._thread_alive = True
        first_round = {id(lp) for lp in self.loops}
        if not first_round and self.telemetry is not None:
            self.telemetry.ready_to_serve.set()

        def work(loop: AutoscalerLoop) -> None:
            now = self.clock()
            try:
                if loop.pending is not None and now < loop.next_tick:
                    loop.retry()  # between ticks only the failed scale is tried again
                else:
                    loop.next_tick = now + loop.interval
                    loop.tick(now)
            except Exception:
                log.exception("%s: reconcile failed", loop.name)
            delay = loop.next_tick - self.clock()
            if loop.pending is not None:
                delay = min(delay, loop.retry_delay())
            with self._lock:
                self._busy.discard(id(loop))
                if id(loop) in self._live:  # not removed meanwhile
                    self._push(self.clock() + max(delay, 0.0), loop)
                first_round.discard(id(loop))
                if not first_round and self.telemetry is not None:
                    self.telemetry.ready_to_serve.set()

        with ThreadPoolExecutor(self.workers, thread_name_prefix="reconcile") as pool:
            try:
                while not stop.is_set():
                    with self._lock:
                        ready = []
                        now = self.clock()
                        while self._due and self._due[0][0] <= now:
                            _, _, loop = heapq.heappop(self._due)
                            if id(loop) not in self._busy and id(loop) in self._live:
                                self._busy.add(id(loop))
                                ready.append(loop)
                        wait = (self._due[0][0] - now) if self._due else 0.1
                    for loop in ready:
                        pool.submit(work, loop)
                    stop.wait(min(max(wait, 0.0), 0.1) if not ready else 0)
            finally:
                self._thread_alive = False
