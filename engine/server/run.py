"""Making and running a server: the engine (real or emulated), the app, uvicorn with a drain."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from dataclasses import replace

import uvicorn
from fastapi import FastAPI

from engine.args import EngineArgs
from engine.emulated import DEFAULT_MAX_MODEL_LEN, EmulatedRunner, StepTimeModel
from engine.llm_engine import LLMEngine
from engine.metrics import EngineMetrics
from engine.server.app import build_app
from engine.server.async_engine import AsyncEngine


def build_engine(args: EngineArgs | None = None,
                 latency: StepTimeModel | None = None) -> tuple[LLMEngine, str]:
    """(engine, default served model name). With a latency model the engine is emulated: no weights,
    each step sleeps for the model's prediction, and the name is the model's `model` (if it has one)."""
    args = args or EngineArgs()
    if latency is None:
        return LLMEngine(args), args.model
    model_len = args.max_model_len or DEFAULT_MAX_MODEL_LEN
    runner = EmulatedRunner(latency, num_kv_blocks=args.kv_blocks(model_len), block_size=args.block_size,
                            max_model_len=model_len)
    name = getattr(latency, "model", None) or args.model
    return LLMEngine(replace(args, model=name), runner=runner), name


def build_server(engine: LLMEngine, model_name: str, *, api_key: str | None = None,
                 max_waiting: int | None = None, health_hold: float = 0.0) -> FastAPI:
    """health_hold: seconds /health answers 503 after start, as while a real server loads weights."""
    bm = engine.block_manager
    cache_info = {"block_size": bm.block_size, "num_gpu_blocks": bm.num_blocks, "cache_dtype": "auto",
                  "enable_prefix_caching": bm.enable_prefix_caching}
    metrics = EngineMetrics(model_name, engine.max_model_len, cache_info)
    metrics.update_gauges(engine)
    return build_app(AsyncEngine(engine, metrics), model_name, api_key, max_waiting, health_hold)


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after its graceful shutdown (so the process dies of it);
    we drain and then exit 0, as a replica that finished its in-flight work should."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def _config(app: FastAPI, host: str, port: int, drain_timeout: float, log_level: str) -> uvicorn.Config:
    # uvicorn stops accepting on shutdown and waits up to drain_timeout for in-flight responses
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=drain_timeout, timeout_keep_alive=30)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
          log_level: str = "warning") -> int:
    server = DrainingServer(_config(app, host, port, drain_timeout, log_level))
    server.run()
    return 0 if server.started else 1


class BackgroundServer:
    """A server in a thread on a free loopback port: `with BackgroundServer(app) as s: s.url`."""

    def __init__(self, app: FastAPI, drain_timeout: float = 5.0):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = DrainingServer(_config(app, "127.0.0.1", self.port, drain_timeout, "warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
