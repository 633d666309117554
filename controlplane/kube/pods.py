"""Pod discovery for the direct scrape: the target's ready pods, found with the label selector its
Scale reports (status.selector), each as http://POD_IP:PORT/PATH, so that a cluster without
Prometheus still works.

The port: the autoscaler's `slopilot.dev/metrics-port` annotation (a number or a container port name),
else the pod's `prometheus.io/port` annotation, else a container port named `metrics` or `http`, else
the first container port, else vLLM's 8000. The path: `slopilot.dev/metrics-path`, the pod's
`prometheus.io/path`, or /metrics.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from kubernetes import client

from controlplane.kube.client import TIMEOUT, ApiException

log = logging.getLogger("slopilot.kube")
PORT_ANNOTATION, PATH_ANNOTATION = "slopilot.dev/metrics-port", "slopilot.dev/metrics-path"
DEFAULT_PORT = 8000


def pod_ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    if st.get("phase") != "Running" or not st.get("podIP") or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def pod_port(pod: dict, wanted: str | None) -> int:
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    if wanted:
        if str(wanted).isdigit():
            return int(wanted)
        named = next((p["containerPort"] for p in ports if p.get("name") == wanted), None)
        if named is not None:
            return named
    annotated = (pod["metadata"].get("annotations") or {}).get("prometheus.io/port", "")
    if annotated.isdigit():
        return int(annotated)
    for name in ("metrics", "http"):
        named = next((p["containerPort"] for p in ports if p.get("name") == name), None)
        if named is not None:
            return named
    return ports[0]["containerPort"] if ports else DEFAULT_PORT


class PodEndpoints:
    """A callable returning the current metrics URLs (ScrapeSource takes it as its endpoints)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, selector: Callable[[], str | None],
                 annotations: dict | None = None):
        self.core, self.namespace, self.selector = core, namespace, selector
        annotations = annotations or {}
        self.port, self.path = annotations.get(PORT_ANNOTATION), annotations.get(PATH_ANNOTATION)
        self.last: list[str] = []

    def __call__(self) -> list[str]:
        selector = self.selector()
        if not selector:
            return []
        try:  # read as plain JSON: a pod the typed models would refuse must not stop the scrape
            response = self.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                                     _request_timeout=TIMEOUT, _preload_content=False)
            pods = json.loads(response.data)["items"]
        except (ApiException, OSError, ValueError, KeyError) as exc:
            log.warning("%s: listing pods (%s) failed: %s; keeping the last %d endpoints", self.namespace,
                        selector, exc, len(self.last))
            return self.last
        out = []
        for pod in pods:
            if pod_ready(pod):
                path = self.path or (pod["metadata"].get("annotations") or {}).get("prometheus.io/path") \
                    or "/metrics"
                out.append(f"http://{pod['status']['podIP']}:{pod_port(pod, self.port)}{path}")
        self.last = sorted(out)
        return self.last
