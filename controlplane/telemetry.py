"""The controller's own metrics and health: /metrics, /healthz, /readyz on one small HTTP server.

Per autoscaler: desired, current and ready replicas, decisions by reason kind (the text before the
first colon: `hpa`, `sloModel`, `hold`, ...), source errors by metric, scale errors, whether a
fallback or a hold is in force, the reconcile duration and the time of the last successful one.
/healthz: the scheduler runs. /readyz: the first round is done and no autoscaler's metric source has
failed `down_after_polls` polls in a row (the reasons in the body; controlplane.source_health).
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app


class Telemetry:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        a = ["autoscaler"]
        p = "slopilot_autoscaler_"
        self.desired = Gauge(p + "desired_replicas", "Replicas the last decision asked for", a, registry=r)
        self.current = Gauge(p + "current_replicas", "The target's replica count", a, registry=r)
        self.ready = Gauge(p + "ready_replicas", "The target's ready replicas", a, registry=r)
        self.decisions = Counter(p + "decisions", "Decisions by reason kind", a + ["reason"], registry=r)
        self.source_errors = Counter(p + "source_errors", "Failed metric reads", a + ["metric"], registry=r)
        self.scale_errors = Counter(p + "scale_errors", "Failed scale calls", a, registry=r)
        self.fallback = Gauge(p + "fallback_active",
                              "1 while KEDA fallback replicas or a hold on failed metrics is in force", a,
                              registry=r)
        self.duration = Histogram(p + "reconcile_duration_seconds", "One reconcile, seconds", a, registry=r,
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.last_success = Gauge(p + "last_success_timestamp_seconds",
                                  "Time of the last reconcile whose metrics and scale both succeeded", a,
                                  registry=r)
        self.ready_to_serve = threading.Event()  # set after the first round of reconciles
        self.alive = lambda: True  # replaced by the controller: is its scheduler running?
        # replaced by the controller: why each autoscaler whose source failed n polls in a row is down
        self.sources_down = lambda polls: []
        self.down_after_polls = 3  # /readyz fails while a source has failed this many polls in a row
        self._server: WSGIServer | None = None

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Starts the HTTP server in a thread; returns the bound port (0 picks a free one)."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if path in ("/healthz", "/readyz"):
                ok = self.alive() if path == "/healthz" else self.ready_to_serve.is_set() and self.alive()
                down = self.sources_down(self.down_after_polls) if path == "/readyz" and ok else []
                ok = ok and not down
                status = "200 OK" if ok else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain")])
                body = "ok\n" if ok else "not ready\n" + "".join(f"{why}\n" for why in down)
                return [body.encode()]
            return metrics_app(environ, start_response)

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args) -> None:  # probes every few seconds would flood the log
                pass

        self._server = make_server(host, port, app, handler_class=Quiet)
        threading.Thread(target=self._server.serve_forever, name="telemetry", daemon=True).start()
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
