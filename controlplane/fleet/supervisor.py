"""The local fleet's supervisor (controlplane.fleet.fleet.LocalFleet runs it on one thread), like a
ReplicaSet controller: each pass reaps exits, probes /health, spawns up to the desired count (after a
back-off when replicas die before becoming ready) and SIGTERMs the surplus (not-ready replicas first,
then the newest), then rewrites the Prometheus file_sd targets; every change goes to events.jsonl."""

from __future__ import annotations

import json
import time

import httpx

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

TICK = 0.1  # seconds between supervisor passes
PROBE_STARTING = 0.2  # seconds between /health probes of a replica that is not ready
BACKOFF_MAX = 30.0


class Supervisor:
    """The supervisor's passes, as methods of the fleet whose state they keep (a mixin of LocalFleet:
    _replicas, _desired, _lock and _changed, config, run_dir, ...)."""

    def _ready_locked(self) -> int:
        return sum(1 for r in self._replicas if r.state == READY and r.alive())

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

