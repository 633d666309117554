"""A tiny fake kubelet (and Deployment/StatefulSet controller) for the stand-in API server: it keeps
one emulated engine process (`slopilot serve --emulate MODEL --port P`) per replica of every
Deployment and StatefulSet of a namespace, with a Pod object for each (labels from the template,
pod IP 127.0.0.1, the process's port as the container port), marks pods Ready when /health answers,
removes the newest (not ready first) on scale-down, and writes the workload's status (replicas,
readyReplicas, ...), as the real controllers do. It talks to the store in-process, so the API
server's audit log holds only what the controller and kubectl asked."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from controlplane.prometheus_server import free_port
from tests.kube.apiserver.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]
MODEL = "h100-llama2-70b-tp4"
WORKLOADS = (("apps", "deployments"), ("apps", "statefulsets"))


@dataclass
class Replica:
    pod: str
    port: int
    proc: subprocess.Popen
    log: object
    started: float = field(default_factory=time.monotonic)
    ready: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FakeKubelet:
    def __init__(self, store, namespace: str, model: str = MODEL, serve_args: tuple[str, ...] = (),
                 period: float = 0.2):
        self.store, self.namespace, self.model = store, namespace, model
        self.serve_args, self.period = list(serve_args), period
        self.replicas: dict[tuple[str, str], list[Replica]] = {}  # (plural, workload) -> replicas
        self.started = 0  # processes started, in total
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self._client = httpx.Client(timeout=0.5, trust_env=False)

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for reps in self.replicas.values():
            for r in reps:
                self._kill(r)
        self._client.close()

    def ready_urls(self, workload: str, plural: str = "deployments") -> list[str]:
        return [r.url for r in list(self.replicas.get((plural, workload), [])) if r.ready]

    def processes(self) -> int:
        return sum(1 for reps in self.replicas.values() for r in reps if r.proc.poll() is None)

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            seen = set()
            for group, plural in WORKLOADS:
                t = self.store.types[(group, plural)]
                items, _ = self.store.list(t, self.namespace)
                for obj in items:
                    key = (plural, obj["metadata"]["name"])
                    seen.add(key)
                    try:
                        self._sync(t, obj, self.replicas.setdefault(key, []))
                    except ApiError:
                        pass  # deleted meanwhile: the next round sees it gone
            for key in [k for k in self.replicas if k not in seen]:  # workload deleted
                for r in self.replicas.pop(key):
                    self._remove(r)
            self._stop.wait(self.period)

    def _sync(self, t, obj: dict, reps: list[Replica]) -> None:
        want = int((obj.get("spec") or {}).get("replicas", 1))
        for r in [r for r in reps if r.proc.poll() is not None]:  # died: the pod fails, a new one comes
            reps.remove(r)
            self._remove(r)
        while len(reps) < want:
            reps.append(self._spawn(obj))
        if len(reps) > want:
            victims = sorted(reps, key=lambda r: (r.ready, r.started))[: len(reps) - want]
            for r in victims:
                reps.remove(r)
                self._remove(r)
        for r in reps:
            if not r.ready and self._healthy(r):
                r.ready = True
                self._pod_status(r, ready=True)
        ready = sum(r.ready for r in reps)
        status = {**(obj.get("status") or {}), "replicas": len(reps), "readyReplicas": ready,
                  "availableReplicas": ready, "updatedReplicas": len(reps),
                  "observedGeneration": obj["metadata"].get("generation", 1)}
        if status != obj.get("status"):
            self.store.update(t, self.namespace, obj["metadata"]["name"], {**obj, "status": status}, "status")

    def _spawn(self, obj: dict) -> Replica:
        port = free_port()
        name = f"{obj['metadata']['name']}-{uuid.uuid4().hex[:5]}"
        log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "slopilot.cli", "serve", "--emulate", self.model, "--port", str(port),
               *self.serve_args]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.started += 1
        template = (obj.get("spec") or {}).get("template") or {}
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        pods = self.store.types[("", "pods")]
        owner = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                 "uid": obj["metadata"]["uid"], "controller": True}
        self.store.create(pods, self.namespace, {
            "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
            "spec": {"containers": [{"name": "engine", "image": "slopilot:emulated",
                                     "ports": [{"name": "http", "containerPort": port}]}]}})
        r = Replica(name, port, proc, log)
        self._pod_status(r, ready=False)
        return r

    def _pod_status(self, r: Replica, ready: bool) -> None:
        pods = self.store.types[("", "pods")]
        try:
            pod = self.store.get(pods, self.namespace, r.pod)
        except ApiError:
            return
        flag = "True" if ready else "False"
        pod["status"] = {"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                         "conditions": [{"type": "Ready", "status": flag}, {"type": "ContainersReady",
                                                                            "status": flag}],
                         "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0,
                                                "image": "slopilot:emulated", "imageID": "slopilot:emulated",
                                                "started": True, "state": {"running": {}}}]}
        pod["metadata"].pop("resourceVersion", None)
        self.store.update(pods, self.namespace, r.pod, pod, "status")

    def _healthy(self, r: Replica) -> bool:
        try:
            return self._client.get(r.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _remove(self, r: Replica) -> None:
        try:
            self.store.delete(self.store.types[("", "pods")], self.namespace, r.pod)
        except ApiError:
            pass
        threading.Thread(target=self._kill, args=(r,), daemon=True).start()  # drains in the background

    @staticmethod
    def _kill(r: Replica, grace: float = 5.0) -> None:
        if r.proc.poll() is None:
            r.proc.terminate()
            try:
                r.proc.wait(grace)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
        try:
            r.log.close()
        except OSError:
            pass
