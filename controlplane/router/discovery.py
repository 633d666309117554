"""Where the router's endpoints come from: a fixed list, a local fleet, a file_sd target file (what
`fleet up` writes for Prometheus) or a Kubernetes Service's EndpointSlices. Each is a callable
returning base URLs now, cheap enough to call every refresh (the Kubernetes one polls in a thread).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("slopilot.router")


def static(urls: list[str]) -> Callable[[], list[str]]:
    fixed = list(urls)
    return lambda: fixed


def file_sd(path: str | Path) -> Callable[[], list[str]]:
    """The targets of a Prometheus file_sd JSON file, re-read when it changes."""
    path = Path(path)
    cache: dict = {"mtime": None, "urls": []}

    def read() -> list[str]:
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime != cache["mtime"]:
            try:
                groups = json.loads(path.read_text())
                cache["urls"] = [f"http://{t}" for g in groups for t in g.get("targets", [])]
                cache["mtime"] = mtime
            except (ValueError, OSError) as exc:  # half-written or unreadable: keep the last list
                log.warning("%s: %s", path, exc)
        return cache["urls"]

    return read


class KubernetesEndpoints:
    """Ready addresses of a Service's EndpointSlices (label kubernetes.io/service-name), polled."""

    def __init__(self, service: str, namespace: str = "default", port: int | str | None = None,
                 interval: float = 2.0, api=None):
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.DiscoveryV1Api()
        self.api, self.service, self.namespace, self.port = api, service, namespace, port
        self.interval = interval
        self.urls: list[str] = []
        self._stop = threading.Event()
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="router-k8s-discovery", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        try:
            slices = self.api.list_namespaced_endpoint_slice(
                self.namespace, label_selector=f"kubernetes.io/service-name={self.service}")
        except Exception as exc:  # keep the last list through an API outage
            log.warning("EndpointSlices of %s/%s: %r", self.namespace, self.service, exc)
            return
        self.urls = endpoint_slice_urls(slices.items, self.port)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def close(self) -> None:
        self._stop.set()

    def __call__(self) -> list[str]:
        return self.urls


def endpoint_slice_urls(slices: list, port: int | str | None = None) -> list[str]:
    """http://address:port of every ready endpoint; `port` picks a port by name or number (default:
    the slice's first)."""
    urls = []
    for s in slices:
        ports = s.ports or []
        chosen = next((p for p in ports if port is not None and str(port) in (p.name, str(p.port))), None)
        if chosen is None and port is None and ports:
            chosen = ports[0]
        number = chosen.port if chosen is not None else (int(port) if str(port).isdigit() else None)
        if number is None:
            continue
        for ep in s.endpoints or []:
            ready = ep.conditions.ready if ep.conditions is not None else True
            if ready is False:
                continue
            urls += [f"http://{a}:{number}" for a in ep.addresses or []]
    return sorted(set(urls))
