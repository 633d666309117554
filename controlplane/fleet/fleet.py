"""LocalFleet: engine replicas as local processes, kept at a desired count, as a scale target.

    cfg = load_fleet_config("examples/fleet_local.yaml")
    with LocalFleet(cfg, run_dir) as fleet:          # starts cfg.replicas and waits for them
        fleet.scale(3, "queue above target")         # spawns 2, returns once they answer /health 200
        fleet.replicas()                             # Replicas(current=3, ready=3)
        fleet.endpoints()                            # ready base URLs, oldest replica first
        fleet.file_sd_path                           # Prometheus file_sd targets, rewritten on change
    # leaving the block (also by Ctrl-C or an exception) stops every process the fleet started

One supervisor thread owns the processes, like a ReplicaSet controller: it reaps exits, probes
/health, spawns up to the desired count and SIGTERMs the surplus (not-ready replicas first, then the
newest). A replica that dies is replaced; meanwhile ready < current. A replica that dies before it
ever became ready is replaced after a back-off (1 s doubling to 30 s), like a crash loop. A live
replica that fails 3 probes in a row leaves the ready count (and endpoints()) until it answers again.

`scale` raises ScaleError and keeps the last state when the count is outside [min_replicas,
max_replicas], when the fleet is stopped, and (with wait_ready, the default) when a new replica
exits before becoming ready or is not ready within start_timeout: the new replicas are then stopped.
With wait_ready=False it returns as soon as the new count is set and failures show as ready < current.

Files in run_dir: `replicas/<id>.log` (each replica's stdout and stderr), `prometheus_targets.json`
(file_sd; a running Prometheus follows it) and `events.jsonl` (spawn, ready, unready, exit, stop).
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time
from pathlib import Path

import httpx

from controlplane.fleet.config import FleetConfig
from controlplane.fleet.file_sd import write_file_sd
from controlplane.fleet.replica import (
    READY,
    STARTING,
    TERMINATING,
    UNREADY,
    UNREADY_AFTER,
    Replica,
    free_port,
)
from controlplane.targets.base import Replicas, ScaleError, Target

TICK = 0.1  # seconds between supervisor passes
PROBE_STARTING = 0.2  # seconds between /health probes of a replica that is not ready
BACKOFF_MAX = 30.0


class LocalFleet(Target):
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

    # -- the supervisor ----------------------------------------------------------------------------

    def _ready_locked(self) -> int:
        return sum(1 for r in self._replicas if r.state == READY and r.alive())

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

    def _supervise(self) -> None:
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while not self._stopping:
                try:
                    self._tick(client)
                except Exception as exc:  # keep supervising; a bug here must not orphan replicas
                    self._event("error", "", detail=f"{type(exc).__name__}: {exc}")
                self._poke.wait(TICK)
                self._poke.clear()
        self._shutdown()

    def _tick(self, client: httpx.Client) -> None:
        now = time.monotonic()
        self._reap(now)
        self._probe(client, now)
        self._converge(now)
        self._publish()

    def _reap(self, now: float) -> None:
        for r in list(self._replicas):
            code = r.exit_code()
            if code is None:
                continue
            with self._changed:
                self._replicas.remove(r)
                if r.state != TERMINATING and not r.ever_ready:
                    self._failed(r.id, f"exited with code {code} before becoming ready: {r.log_tail(3)}", now)
                self._changed.notify_all()
            kind = "stopped" if r.state == TERMINATING else "died"
            self._event(kind, r.id, code=code, pid=r.pid)

    def _probe(self, client: httpx.Client, now: float) -> None:
        for r in list(self._replicas):
            if r.state == TERMINATING or now < r.next_probe:
                continue
            ok = r.probe(client)
            with self._changed:
                if r.state == TERMINATING:
                    continue
                if ok:
                    r.failed_probes = 0
                    if r.state != READY:
                        r.state, r.ready_at, r.ever_ready = READY, time.monotonic(), True
                        self._backoff = 0.0
                        self._changed.notify_all()
                        self._event("ready", r.id, after_s=round(r.ready_at - r.started_at, 3))
                else:
                    r.failed_probes += 1
                    if r.state == READY and r.failed_probes >= UNREADY_AFTER:
                        r.state = UNREADY
                        self._changed.notify_all()
                        self._event("unready", r.id)
                    elif r.state == STARTING and now - r.started_at > self.config.start_timeout:
                        why = f"not ready after {self.config.start_timeout:g} s (start_timeout)"
                        self._failed(r.id, f"{why}: {r.log_tail(3)}", now)
                        r.terminate()
                        self._event("terminate", r.id, pid=r.pid, state_was=STARTING)
                        self._changed.notify_all()
                r.next_probe = now + (self.health_interval if r.state == READY else PROBE_STARTING)

    def _converge(self, now: float) -> None:
        with self._lock:
            missing = self._desired - self._trim_locked()
            if now < self._next_spawn:
                missing = 0
        for _ in range(missing):
            self._spawn()

    def _trim_locked(self) -> int:
        """SIGTERMs replicas above the desired count; returns how many are left active."""
        active = [r for r in self._replicas if r.state != TERMINATING]
        surplus = len(active) - self._desired
        if surplus > 0:
            # not-ready replicas go first, then the newest (a ReplicaSet's order)
            order = sorted(active, key=lambda r: (r.state == READY, -self._serial_of(r)))
            for r in order[:surplus]:
                was = r.state
                r.terminate()
                self._event("terminate", r.id, pid=r.pid, state_was=was)
            self._changed.notify_all()
        return min(len(active), self._desired)

    def _spawn(self) -> None:
        with self._lock:
            self._serial += 1
            serial = self._serial
            taken = {r.port for r in self._replicas}
        rid = f"r{serial}"
        port = free_port(self.host)
        while port in taken:  # a port handed out twice in a row; a draining replica may still hold it
            port = free_port(self.host)
        r = Replica(rid, self.command + self.config.serve_args(port, self.host), port,
                    self.run_dir / "replicas" / f"{rid}.log", self.host)
        try:
            r.start()
        except OSError as exc:
            with self._changed:
                self._failed(rid, f"could not be started: {exc}", time.monotonic())
                self._changed.notify_all()
            self._event("spawn-failed", rid, detail=str(exc))
            return
        with self._changed:
            self._replicas.append(r)
            self._changed.notify_all()
        self._event("spawn", rid, pid=r.pid, port=port, log=str(r.log_path))

    def _failed(self, rid: str, why: str, now: float) -> None:
        """A replica that never got ready: scale waiters see it; the next spawn waits a back-off."""
        self._failures.append((int(rid[1:]), f"replica {rid} {why}"))
        self._backoff = min(max(2 * self._backoff, 1.0), BACKOFF_MAX)
        self._next_spawn = now + self._backoff

    @staticmethod
    def _serial_of(r: Replica) -> int:
        return int(r.id[1:])

    def _publish(self) -> None:
        targets = self.targets()
        if targets != self._published:
            write_file_sd(self.file_sd_path, targets)
            self._published = targets

    def _shutdown(self) -> None:
        """Runs on the supervisor thread when stop() is called: drain, then kill what is left."""
        with self._lock:
            self._desired = 0
            replicas = list(self._replicas)
        for r in replicas:
            if r.alive():
                r.terminate()
        deadline = time.monotonic() + self._grace
        while any(r.alive() for r in replicas) and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in replicas:
            if r.alive():
                r.kill()
                self._event("killed", r.id, pid=r.pid)
            r.proc.wait()
        with self._changed:
            self._replicas.clear()
            self._changed.notify_all()
        self._publish()
        self._event("fleet-stopped", "")

    def _event(self, kind: str, replica: str, **detail) -> None:
        ev = {"time": round(time.time(), 3), "event": kind, "replica": replica, **detail}
        self.events.append(ev)
        try:
            with open(self.run_dir / "events.jsonl", "a") as f:
                f.write(json.dumps(ev) + "\n")
        except OSError:
            pass

