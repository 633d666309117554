"""Leader election on a coordination.k8s.io/v1 Lease, with controller-runtime's timings (lease 15 s,
renew deadline 10 s, retry 2 s).

Candidates try every retry period. The holder renews; a candidate takes over once the record it sees
has not changed for a lease duration (its own clock, as client-go does: no clock-skew trust), trying
again at that very moment rather than at its next period, so that a dead leader is replaced within
a lease duration plus one retry period of its last renew. The
leader acts only while its last successful renew is younger than the renew deadline: is_leader()
turns False at once when renewing fails for that long or when another holder is seen, which is
before anyone else may take over (deadline < lease duration). On stop the lease is released, so the
next candidate takes over at its next try. (The client library's own leaderelection module calls the
API through the default configuration and has no release or deadline check, hence this one.)
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from kubernetes import client

from controlplane.kube.client import TIMEOUT, ApiException
from controlplane.settings import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD

log = logging.getLogger("slopilot.kube")


def identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    def __init__(self, api: client.CoordinationV1Api, namespace: str, name: str, ident: str | None = None,
                 lease_duration: float = LEASE_DURATION, renew_deadline: float = RENEW_DEADLINE,
                 retry_period: float = RETRY_PERIOD, clock=time.monotonic):
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self.api, self.namespace, self.name = api, namespace, name
        self.identity = ident or identity()
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.changed = threading.Event()  # set when leadership starts or ends
        self._lock = threading.Lock()
        self._leading = False
        self._renewed = float("-inf")  # clock() of the last successful acquire/renew
        self._observed: tuple | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = float("-inf")

    def is_leader(self) -> bool:
        with self._lock:
            return self._leading and self.clock() - self._renewed < self.renew_deadline

    def run(self, stop: threading.Event) -> None:
        """Tries to acquire or renew every retry period until `stop`; then releases the lease."""
        while not stop.is_set():
            ok = self._try()
            now = self.clock()
            with self._lock:
                was = self._leading
                if ok:
                    self._renewed = now
                    self._leading = True
                elif self._leading and (now - self._renewed >= self.renew_deadline or self._lost):
                    self._leading = False
                changed = was != self._leading
            if changed:
                log.info("%s: %s the lease %s/%s", self.identity, "acquired" if self._leading else "lost",
                         self.namespace, self.name)
                self.changed.set()
            wait = self.retry_period
            if not self._leading and self._expires is not None:  # another's lease: try when it expires
                wait = min(wait, max(0.0, self._expires - self.clock()) + 0.01)
            stop.wait(wait)
        self.release()

    _lost = False  # set by _try when another holder is seen while we lead
    _expires: float | None = None  # clock() at which another holder's lease runs out, as we saw it

    def _try(self) -> bool:
        self._lost, self._expires = False, None
        now = datetime.now(timezone.utc)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s/%s: %s %s", self.namespace, self.name, exc.status, exc.reason)
                return False
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                                  spec=self._spec(now, now, 0))
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=TIMEOUT)
                return True
            except (ApiException, OSError):
                return False
        except OSError as exc:
            log.warning("reading lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.holder_identity or ""
        if holder and holder != self.identity:
            if self._leading:
                self._lost = True
            expires = self._observed_at + (spec.lease_duration_seconds or self.lease_duration)
            if self.clock() < expires:
                self._expires = expires
                return False  # held by another and not expired
        mine = holder == self.identity
        transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
        lease.spec = self._spec(spec.acquire_time if mine and spec.acquire_time else now, now, transitions)
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=TIMEOUT)
            return True
        except (ApiException, OSError):  # a 409: another candidate wrote first
            return False

    def _spec(self, acquired: datetime, renewed: datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(holder_identity=self.identity,
                                  lease_duration_seconds=int(self.lease_duration),
                                  acquire_time=acquired, renew_time=renewed, lease_transitions=transitions)

    def release(self) -> None:
        """Gives the lease up (holder cleared, 1-s duration) so that a candidate takes over at once."""
        with self._lock:
            leading, self._leading = self._leading, False
        if not leading:
            return
        self.changed.set()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=TIMEOUT)
            if (lease.spec.holder_identity or "") != self.identity:
                return
            now = datetime.now(timezone.utc)
            lease.spec = client.V1LeaseSpec(holder_identity="", lease_duration_seconds=1, acquire_time=now,
                                            renew_time=now, lease_transitions=lease.spec.lease_transitions)
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=TIMEOUT)
            log.info("%s: released the lease %s/%s", self.identity, self.namespace, self.name)
        except (ApiException, OSError) as exc:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, exc)
