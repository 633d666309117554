"""The router in a background thread of this process (for `fleet up` and tests):

    with RouterServer(build_router_app(cfg, fleet.endpoints)) as router:
        router.url             # http://127.0.0.1:PORT
        router.state           # the app's RouterState: pool, gate, metrics
"""

from __future__ import annotations

import threading
import time

from controlplane.prometheus_server import free_port
from controlplane.router.app import RouterApp
from controlplane.router.httpserver import HttpServer
from controlplane.router.limits import ServerLimits


class RouterServer:
    def __init__(self, app: RouterApp, host: str = "127.0.0.1", port: int | None = None,
                 limits: ServerLimits | None = None):
        self.app, self.host, self.port = app, host, port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.state = app.state.router
        self.server = HttpServer(app.handle, app.startup, app.shutdown, host, self.port,
                                 limits or ServerLimits())
        self._thread = threading.Thread(target=self.server.run, name="router", daemon=True)

    def start(self, timeout: float = 15.0) -> RouterServer:
        if self._thread.is_alive():
            return self
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the router did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> RouterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
