"""The Kubernetes controller: watches autoscaler resources and runs one KubeLoop per resource while
it holds the lease.

    ctl = KubeController(connect(), ControllerArgs(namespace=None, scaled_objects=False, prometheus=None))
    ctl.run(stop_event)

InferenceAutoscalers are always ours. KEDA ScaledObjects are ours only when asked (`scaled_objects`,
or the annotation `slopilot.dev/managed: "true"` on one), so that it never fights a running KEDA.
HPAs and ScaledObjects are watched anyway, to refuse targets they own. The loops run only on the
leader; a controller that loses the lease stops writing at once (every write checks the lease) and
drops its loops; the next leader loads each policy's state from the resources' status.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from kubernetes import client

from autoscaler.schema import GROUP, VERSION
from autoscaler.spec import load_spec
from controlplane.assemble import build_loop, source_for
from controlplane.controller import Controller
from controlplane.kube import leader
from controlplane.kube.events import EventRecorder, object_ref
from controlplane.kube.informer import Informer
from controlplane.kube.kinds import Resolver, Resource, target_ref
from controlplane.kube.loop import KubeLoop
from controlplane.kube.ownership import owner_conflict
from controlplane.kube.pods import PodEndpoints
from controlplane.kube.scale import KubeScaleTarget
from controlplane.kube.status import StatusWriter, blocked_conditions, merge_conditions, now_rfc3339
from controlplane.settings import ControllerArgs
from controlplane.sources import ScrapeSource
from controlplane.sources.prometheus import raw_triggers
from controlplane.telemetry import Telemetry

log = logging.getLogger("slopilot.kube")
INFERENCE_AUTOSCALERS = Resource(GROUP, VERSION, "inferenceautoscalers", "InferenceAutoscaler")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
MANAGED_ANNOTATION = "slopilot.dev/managed"
RETRY_INVALID = 30.0  # seconds before a resource that could not be set up is tried again


class KubeController:
    """settings: a ControllerArgs; keywords (namespace=..., leader_election=...) override its fields."""

    def __init__(self, api_client: client.ApiClient, settings: ControllerArgs | None = None, *,
                 latency_model=None, telemetry: Telemetry | None = None, **overrides):
        s = self.settings = dataclasses.replace(settings or ControllerArgs(), **overrides)
        self.custom, self.core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        self.namespace, self.scaled_objects, self.prometheus = s.namespace, s.scaled_objects, s.prometheus
        self.latency_model, self.telemetry = latency_model, telemetry
        self.identity = s.identity or leader.identity()
        self.elector = leader.LeaderElector(client.CoordinationV1Api(api_client),
                                            s.lease_namespace or "default", s.lease_name, self.identity,
                                            s.lease_duration, s.renew_deadline, s.retry_period) \
            if s.leader_election else None
        self.recorder = EventRecorder(self.core, self.identity, self.is_leader)
        self.resolver = Resolver(api_client)
        self.wake = threading.Event()
        self.informers = {r.kind: Informer(self.custom, r, s.namespace, self.wake.set, s.resync)
                          for r in (INFERENCE_AUTOSCALERS, SCALED_OBJECTS, HPAS)}
        self.writers = {r.kind: StatusWriter(self.custom, r, self.is_leader)
                        for r in (INFERENCE_AUTOSCALERS, SCALED_OBJECTS)}
        self.loops: dict[tuple[str, str, str], KubeLoop] = {}
        self.generations: dict[tuple[str, str, str], int] = {}
        self.failed: dict[tuple[str, str, str], tuple[int, float, str]] = {}  # key -> (generation, when, why)
        self.controller: Controller | None = None
        self._ctl_stop: threading.Event | None = None
        self._ctl_thread: threading.Thread | None = None

    # -- who we are and what is ours -------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def handed_to_us(self, so: dict) -> bool:
        annotations = (so.get("metadata") or {}).get("annotations") or {}
        return self.scaled_objects or str(annotations.get(MANAGED_ANNOTATION, "")).lower() == "true"

    def ours(self) -> dict[tuple[str, str, str], dict]:
        out = {}
        for obj in self.informers["InferenceAutoscaler"].items():
            out[("InferenceAutoscaler", obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
        for obj in self.informers["ScaledObject"].items():
            if self.handed_to_us(obj):
                out[("ScaledObject", obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
        return out

    def conflict_of(self, obj: dict):
        return owner_conflict(obj, self.informers["HorizontalPodAutoscaler"].items(),
                              self.informers["ScaledObject"].items(), list(self.ours().values()),
                              self.handed_to_us)

    # -- running ---------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        threads = [threading.Thread(target=inf.run, args=(stop,), name=f"watch-{kind}", daemon=True)
                   for kind, inf in self.informers.items()]
        if self.elector is not None:
            threads.append(threading.Thread(target=self.elector.run, args=(stop,), name="lease", daemon=True))
        for t in threads:
            t.start()
        if self.telemetry is not None:
            self.telemetry.alive = lambda: not stop.is_set()
        try:
            while not stop.is_set() and not all(i.synced.is_set() for i in self.informers.values()):
                stop.wait(0.05)
            if self.telemetry is not None:
                self.telemetry.ready_to_serve.set()  # followers are ready too: they wait for the lease
            while not stop.is_set():
                leading = self.is_leader()
                if leading and self.controller is None:
                    self._start_loops()
                elif not leading and self.controller is not None:
                    log.warning("%s: not the leader any more: stopping every loop", self.identity)
                    self._stop_loops()
                if self.controller is not None:
                    self.sync()
                self.wake.wait(0.2)
                self.wake.clear()
        finally:
            self._stop_loops()
            for inf in self.informers.values():
                inf.stop()
            for t in threads:
                t.join(timeout=10)

    def _start_loops(self) -> None:
        log.info("%s: leading: starting the autoscaler loops", self.identity)
        self.controller = Controller([], workers=self.settings.workers)
        self._ctl_stop = threading.Event()
        self._ctl_thread = threading.Thread(target=self.controller.run, args=(self._ctl_stop,), name="loops",
                                            daemon=True)
        self._ctl_thread.start()

    def _stop_loops(self) -> None:
        if self.controller is None:
            return
        self._ctl_stop.set()
        self._ctl_thread.join(timeout=30)
        for loop in self.loops.values():
            _close(loop)
        self.loops.clear()
        self.generations.clear()
        self.failed.clear()
        self.controller = None

    # -- following the watched resources -----------------------------------------------------
    def sync(self) -> None:
        """Adds, rebuilds (spec changed) and removes loops to match the resources that are ours."""
        wanted = self.ours()
        for key in [k for k in self.loops if k not in wanted]:
            self.controller.remove(self.loops[key].name)
            _close(self.loops.pop(key))
            self.generations.pop(key, None)
        for key in [k for k in self.failed if k not in wanted]:
            del self.failed[key]
        for key, obj in wanted.items():
            generation = obj["metadata"].get("generation", 0)
            if key in self.loops and self.generations.get(key) == generation:
                continue
            failed = self.failed.get(key)
            if failed and failed[0] == generation and time.monotonic() - failed[1] < RETRY_INVALID:
                continue
            old = self.loops.pop(key, None)
            if old is not None:
                self.controller.remove(old.name)
                _close(old)
            try:
                loop = self.build(key, obj, old)
            except Exception as exc:  # a bad spec or an unknown target kind: a condition, tried again later
                self._invalid(key, obj, generation, exc)
                continue
            self.failed.pop(key, None)
            self.loops[key], self.generations[key] = loop, generation
            self.controller.add(loop)

    def build(self, key, obj: dict, old: KubeLoop | None) -> KubeLoop:
        kind, ns, name = key
        meta = obj["metadata"]
        spec = load_spec({"apiVersion": obj.get("apiVersion"), "kind": kind,
                          "metadata": {"name": meta["name"], "namespace": ns}, "spec": obj.get("spec")},
                         f"{kind} {ns}/{name}")
        informer = self.informers[kind]

        def target_for(spec) -> KubeScaleTarget:
            api_version, target_kind, target_name = target_ref(obj)
            res = self.resolver.resolve(api_version, target_kind)
            return KubeScaleTarget(self.custom, res, ns, target_name, may_write=self.is_leader)

        def make(policy, source, target, log_file) -> KubeLoop:
            return KubeLoop(obj, spec, policy, source, target, self.writers[kind], self.recorder,
                            lambda: informer.get(ns, name), self.conflict_of, self.telemetry, log_file)

        loop = build_loop(spec, self.settings, target_for,
                          lambda spec, target: self.source(spec, ns, target, meta.get("annotations") or {}),
                          self.latency_model, where=f"{kind} {ns}/{name}", log_name=f"{ns}.{name}", make=make)
        policy = loop.policy
        if old is not None and old.spec.policy_type == spec.policy_type:
            try:  # a changed spec keeps what the policy remembers
                policy.load_state_dict(old.policy.state_dict())
            except Exception:
                pass
        return loop

    def source(self, spec, namespace: str, target: KubeScaleTarget, annotations: dict):
        """Prometheus when one is given (flag or trigger serverAddress), else the target's pods."""
        address = self.prometheus or next((t.server_address for t in spec.triggers if t.server_address), None)
        if address:
            if any((raw or {}).get("authenticationRef") for raw in raw_triggers(spec).values()):
                raise ValueError("triggers with authenticationRef are not read in Kubernetes mode yet")
            return source_for(spec, dataclasses.replace(self.settings, scrape=None))
        s = self.settings
        pods = PodEndpoints(self.core, namespace, lambda: target.selector, annotations)
        source = ScrapeSource(pods, engine=s.engine, timeout=s.timeout, window=s.window)
        source.start(s.scrape_interval)
        return source

    def _invalid(self, key, obj: dict, generation: int, exc: Exception) -> None:
        why = str(exc)
        first = self.failed.get(key)
        self.failed[key] = (generation, time.monotonic(), why)
        if first is not None and first[2] == why:
            return
        kind, ns, name = key
        log.warning("%s %s/%s: cannot run: %s", kind, ns, name, why)
        self.recorder.emit(object_ref(obj), "Warning", "InvalidSpec", why)
        stamp = now_rfc3339()

        def mutate(status: dict) -> None:
            status["conditions"] = merge_conditions(status.get("conditions"),
                                                    blocked_conditions("InvalidSpec", why),
                                                    stamp)
            status["observedGeneration"] = generation

        try:
            self.writers[kind].write(obj, mutate)
        except Exception as err:
            log.warning("%s %s/%s: status write failed: %s", kind, ns, name, err)


def _close(loop: KubeLoop) -> None:
    close = getattr(loop.source, "close", None)
    if close is not None:
        close()
    if loop.log is not None:
        loop.log.close()
