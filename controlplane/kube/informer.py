"""A list-then-watch cache of one resource type (the informer of client-go, small).

List (resourceVersion of the list), then watch from it with bookmarks and a server-side timeout;
a watch that ends is resumed from the last resourceVersion seen; a 410 Gone (too old) and every
resync period mean a fresh list. A resource type the server does not serve (404: its CRD is not
installed, e.g. KEDA's) reads as empty and is listed again each resync period. `on_change()` is
called after every change to the cache.
"""

from __future__ import annotations

import logging
import threading
import time

from kubernetes import client, watch

from controlplane.kube.client import TIMEOUT, ApiException
from controlplane.kube.kinds import Resource
from controlplane.settings import RESYNC

log = logging.getLogger("slopilot.kube")
WATCH_TIMEOUT = 60  # seconds the server keeps one watch open


class Informer:
    def __init__(self, api: client.CustomObjectsApi, res: Resource, namespace: str | None = None,
                 on_change=None, resync: float = RESYNC, watch_timeout: int = WATCH_TIMEOUT):
        self.api, self.res, self.namespace = api, res, namespace
        self.on_change = on_change or (lambda: None)
        self.resync, self.watch_timeout = resync, watch_timeout
        self.synced = threading.Event()  # set after the first list
        self.served = False  # the server serves this type
        self._items: dict[tuple[str, str], dict] = {}
        self._lock = threading.Lock()
        self._watch: watch.Watch | None = None

    def items(self) -> list[dict]:
        with self._lock:
            return list(self._items.values())

    def get(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            return self._items.get((namespace, name))

    def _list_fn(self):
        r = self.res
        if self.namespace:
            return self.api.list_namespaced_custom_object, (r.group, r.version, self.namespace, r.plural)
        return self.api.list_cluster_custom_object, (r.group, r.version, r.plural)

    @staticmethod
    def _key(obj: dict) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace", ""), meta.get("name", "")

    def _relist(self) -> str | None:
        fn, args = self._list_fn()
        try:
            listed = fn(*args, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.served = False
            listed = {"items": [], "metadata": {}}
        else:
            self.served = True
        with self._lock:
            self._items = {self._key(o): o for o in listed.get("items", [])}
        self.synced.set()
        self.on_change()
        return (listed.get("metadata") or {}).get("resourceVersion") if self.served else None

    def run(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                rv = self._relist()
                relist_at = time.monotonic() + self.resync
                while rv is not None and not stop.is_set() and time.monotonic() < relist_at:
                    rv = self._watch_from(rv, min(self.watch_timeout, max(1,
                                                                          int(relist_at - time.monotonic()))))
                if rv is None:
                    stop.wait(min(self.resync, 30.0))
                backoff = 1.0
            except ApiException as exc:
                if stop.is_set():
                    return
                if exc.status != 410:
                    log.warning("%s: list/watch failed: %s %s", self.res.plural, exc.status, exc.reason)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except Exception as exc:  # connection trouble: back off and list again
                if stop.is_set():
                    return
                log.warning("%s: list/watch failed: %s", self.res.plural, exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch_from(self, rv: str, timeout: int) -> str:
        """Watches from `rv` until the server closes the stream; the last resourceVersion seen."""
        fn, args = self._list_fn()
        w = self._watch = watch.Watch()
        for event in w.stream(fn, *args, resource_version=rv, timeout_seconds=timeout,
                              allow_watch_bookmarks=True, _request_timeout=(TIMEOUT[0], timeout + 15)):
            kind, obj = event["type"], event["raw_object"]
            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
            if kind == "BOOKMARK":
                continue
            with self._lock:
                if kind == "DELETED":
                    self._items.pop(self._key(obj), None)
                else:
                    self._items[self._key(obj)] = obj
            self.on_change()
        return rv

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
