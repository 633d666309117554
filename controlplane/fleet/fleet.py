"""LocalFleet: engine replicas as local processes, kept at a desired count, as a scale target.

    cfg = load_fleet_config("examples/fleet_local.yaml")
    with LocalFleet(cfg, run_dir) as fleet:          # starts cfg.replicas and waits for them
        fleet.scale(3, "queue above target")         # spawns 2, returns once they answer /health 200
        fleet.replicas()                             # Replicas(current=3, ready=3)
        fleet.endpoints()                            # ready base URLs, oldest replica first
        fleet.file_sd_path                           # Prometheus file_sd targets, rewritten on change
    # leaving the block (also by Ctrl-C or an exception) stops every process the fleet started

One supervisor thread (controlplane.fleet.supervisor) owns the processes, like a ReplicaSet
controller: it reaps exits, probes /health, spawns up to the desired count and SIGTERMs the surplus
(not-ready replicas first, then the newest). A replica that dies is replaced; meanwhile ready <
current. A replica that dies before it ever became ready is replaced after a back-off (1 s doubling
to 30 s), like a crash loop. A live replica that fails 3 probes in a row leaves the ready count (and
endpoints()) until it answers again.

`scale` raises ScaleError and keeps the last state when the count is outside [min_replicas,
max_replicas], when the fleet is stopped, and (with wait_ready, the default) when a new replica
exits before becoming ready or is not ready within start_timeout: the new replicas are then stopped.
With wait_ready=False it returns as soon as the new count is set and failures show as ready < current.

Files in run_dir: `replicas/<id>.log` (each replica's stdout and stderr), `prometheus_targets.json`
(file_sd; a running Prometheus follows it) and `events.jsonl` (spawn, ready, unready, exit, stop).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from pathlib import Path

from controlplane.fleet.config import FleetConfig
from controlplane.fleet.file_sd import write_file_sd
from controlplane.fleet.replica import (
    READY,
    STARTING,
    TERMINATING,
    Replica,
)
from controlplane.fleet.supervisor import TICK, Supervisor
from controlplane.targets.base import Replicas, ScaleError, Target


class LocalFleet(Supervisor, Target):
    """A scale target made of `slopilot serve` processes on free loopback ports (see the module doc).

    command: the program and subcommand that serve a replica; `config.serve_args(port)` follows it.
    `command` and `config` are read again at every spawn: replacing them changes later replicas.
    """

    def __init__(self, config: FleetConfig, run_dir: str | Path, *, wait_ready: bool = True,
                 health_interval: float = 1.0, command: list[str] | None = None, host: str = "127.0.0.1"):
        self.config = config
        self.name = config.name
        self.run_dir = Path(run_dir)
        self.file_sd_path = self.run_dir / "prometheus_targets.json"
        self.wait_ready = wait_ready
        self.health_interval = health_interval
        self.command = command or [sys.executable, "-m", "slopilot.cli", "serve"]
        self.host = host
        self.events: list[dict] = []
        self._replicas: list[Replica] = []  # oldest first
        self._desired = 0
        self._serial = 0
        self._failures: list[tuple[int, str]] = []  # (replica serial, why) of replicas that never got ready
        self._backoff = 0.0
        self._next_spawn = 0.0
        self._published: dict | None = None
        self._grace = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._poke = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the Target interface ----------------------------------------------------------------------

    def scale(self, desired: int, reason: str = "") -> None:
        """Sets the desired count (see the module doc for when it waits and when it raises)."""
        cfg = self.config
        with self._lock:
            if self._thread is None or self._stopping:
                raise ScaleError(f"fleet {self.name}: not running")
            if not cfg.min_replicas <= desired <= cfg.max_replicas:
                raise ScaleError(f"fleet {self.name}: {desired} replicas is outside "
                                 f"[{cfg.min_replicas}, {cfg.max_replicas}]")
            previous, self._desired = self._desired, desired
            mark = self._serial  # replicas spawned from now on have serials above mark
            if desired != previous:
                self._event("scale", "", frm=previous, to=desired, reason=reason)
            self._trim_locked()  # a scale-down takes effect now: replicas() never shows stale ready
        self._poke.set()
        if desired > previous and self.wait_ready:
            try:  # a moment more than a replica's own limit, so its failure (with its log) is the one told
                self._await_ready(desired, mark, cfg.start_timeout + 1.0)
            except ScaleError as exc:
                with self._lock:
                    if self._desired == desired:  # nobody scaled since: go back
                        self._desired = previous
                        self._event("scale", "", frm=desired, to=previous, reason=f"rolled back: {exc}")
                self._poke.set()
                raise

    def replicas(self) -> Replicas:
        with self._lock:
            ready = sum(1 for r in self._replicas if r.state == READY and r.alive())
            return Replicas(self._desired, ready)

    def starting(self) -> int:
        with self._lock:
            return sum(1 for r in self._replicas if r.state == STARTING and r.alive())

    # -- what others read --------------------------------------------------------------------------

    def endpoints(self) -> list[str]:
        """Base URLs of the ready replicas, oldest first (for load and a direct metrics scrape)."""
        with self._lock:
            return [r.url for r in self._replicas if r.state == READY and r.alive()]

    def targets(self) -> dict[str, dict[str, str]]:
        """host:port -> labels of every replica not being stopped, ready or not (what Prometheus
        scrapes; the file_sd file holds the same). Labels: fleet (its name) and replica (its id)."""
        with self._lock:
            return {r.address: {"fleet": self.name, "replica": r.id}
                    for r in self._replicas if r.state != TERMINATING}

    def replica_seconds(self, start: float, end: float) -> float:
        """Seconds of replica processes alive between wall times start and end, from the events: each
        replica from its spawn to its exit (a draining replica still holds its GPUs), or to `end`."""
        spans: dict[str, list[float]] = {}
        for ev in list(self.events):
            if ev["event"] == "spawn":
                spans[ev["replica"]] = [ev["time"], end]
            elif ev["event"] in ("stopped", "died", "killed") and ev["replica"] in spans:
                spans[ev["replica"]][1] = min(spans[ev["replica"]][1], ev["time"])
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans.values())

    def processes(self) -> dict[str, dict]:
        """id -> {pid, port, url, state}, oldest first, including replicas still draining."""
        with self._lock:
            return {r.id: {"pid": r.pid, "port": r.port, "url": r.url, "state": r.state}
                    for r in self._replicas}

    # -- life cycle --------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> LocalFleet:
        """Starts the supervisor and config.replicas replicas; waits until they are ready.

        Raises ScaleError (after stopping what it started) if they are not ready within timeout
        (default: config.start_timeout).
        """
        if self._thread is not None:
            raise RuntimeError(f"fleet {self.name}: already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_file_sd(self.file_sd_path, {})
        self._published = {}
        self._desired = self.config.replicas
        self._thread = threading.Thread(target=self._supervise, name=f"fleet-{self.name}", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        try:
            self._await_ready(self._desired, 0, self.config.start_timeout if timeout is None else timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_ready(self, timeout: float) -> bool:
        """Waits until ready == current; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._ready_locked() >= self._desired:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, TICK))
            return True

    def stop(self, grace: float | None = None) -> None:
        """SIGTERMs every replica, waits up to `grace` seconds (default drain_timeout + 5) for them to
        drain and exit, SIGKILLs what is left. Idempotent; also registered with atexit by start()."""
        with self._lock:
            if self._thread is None or self._stopping:
                thread = self._thread
            else:
                self._stopping = True
                self._grace = self.config.drain_timeout + 5.0 if grace is None else grace
                thread = self._thread
        self._poke.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalFleet:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _await_ready(self, desired: int, mark: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                failed = [why for serial, why in self._failures if serial > mark]
                if failed:
                    raise ScaleError(f"fleet {self.name}: {failed[0]}")
                ready = self._ready_locked()
                if ready >= desired:
                    return
                if self._stopping:
                    raise ScaleError(f"fleet {self.name}: stopped while scaling")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ScaleError(f"fleet {self.name}: {ready} of {desired} replicas ready after "
                                     f"{timeout:g} s (start_timeout)")
                self._changed.wait(min(left, TICK))
