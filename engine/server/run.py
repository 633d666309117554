"""Making and running a server: the engine (real or emulated), the app, uvicorn with a drain.

serve() returns 0 when every request finished (a SIGTERM drain included), EXIT_DRAIN_INCOMPLETE when
the drain timeout ended requests with a 503, and EXIT_ENGINE_DIED when the engine loop died (the
process exits at once rather than linger unable to serve) or the server could not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
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
from engine.server import defaults
from engine.server.app import build_app
from engine.server.async_engine import AsyncEngine
from engine.server.guard import GuardedHttpTools

log = logging.getLogger("slopilot.server")

# uvicorn's own deadline, after ours: time for the 503s written at our drain timeout to go out
CUT_OFF_GRACE_S = 2.0


def build_engine(args: EngineArgs | None = None, latency: StepTimeModel | None = None,
                 kv_bytes_per_token: float | None = None) -> tuple[LLMEngine, str]:
    """(engine, default served model name). With a latency model the engine is emulated: no weights,
    each step sleeps for the model's prediction, and the name is the model's `model` (if it has one).
    kv_bytes_per_token sizes an emulated engine's offload tier (default: from a preset model's shape)."""
    args = args or EngineArgs()
    if latency is None:
        return LLMEngine(args), args.model
    model_len = args.max_model_len or DEFAULT_MAX_MODEL_LEN
    name = getattr(latency, "model", None) or args.model
    if kv_bytes_per_token is None:
        kv_bytes_per_token = preset_kv_bytes_per_token(name, args.dtype)
    runner = EmulatedRunner(latency, num_kv_blocks=args.kv_blocks(model_len), block_size=args.block_size,
                            max_model_len=model_len, kv_bytes_per_token=kv_bytes_per_token,
                            offload_bandwidth_gbs=args.kv_offloading_bandwidth)
    return LLMEngine(replace(args, model=name), runner=runner), name


def preset_kv_bytes_per_token(model: str, dtype: str) -> float | None:
    """K and V bytes per token of a preset model (None for any other name)."""
    from engine.model import PRESETS

    c = PRESETS.get(model)
    if c is None:
        return None
    return 2.0 * c.num_layers * c.num_kv_heads * c.head_dim * (4 if dtype == "float32" else 2)


def build_server(engine: LLMEngine, model_name: str, *, api_key: str | None = None,
                 protect_metrics: bool = False, max_waiting: int | None = defaults.MAX_WAITING,
                 max_request_bytes: int = defaults.MAX_REQUEST_BYTES, health_hold: float = 0.0,
                 kv_transfer=None, body_timeout: float = defaults.BODY_TIMEOUT_S) -> FastAPI:
    """health_hold: seconds /health answers 503 after start, as while a real server loads weights.
    kv_transfer: an engine.kv_transfer KVTransferConfig (a P/D role), or None."""
    bm = engine.block_manager
    args = engine.args
    cache_info = {"block_size": bm.block_size, "num_gpu_blocks": bm.num_blocks, "cache_dtype": "auto",
                  "enable_prefix_caching": bm.enable_prefix_caching,
                  # vLLM's labels for its offload settings; num_cpu_blocks: the tier's blocks here
                  "kv_offloading_size": args.kv_offloading_size,
                  "kv_offloading_backend": args.kv_offloading_backend,
                  "num_cpu_blocks": bm.offload.num_slots if bm.offload is not None else None}
    metrics = EngineMetrics(model_name, engine.max_model_len, cache_info, offload=bm.offload is not None)
    metrics.update_gauges(engine)
    async_engine = AsyncEngine(engine, metrics)
    if kv_transfer is not None:
        async_engine.set_kv_transfer(kv_transfer, model_name)
    return build_app(async_engine, model_name, api_key=api_key,
                     protect_metrics=protect_metrics, max_waiting=max_waiting,
                     max_request_bytes=max_request_bytes, health_hold=health_hold, body_timeout=body_timeout)


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after its graceful shutdown (so the process dies of it);
    we drain instead, and at the drain timeout end what still runs with a 503 (a body, or a stream's
    last error event) before uvicorn's own deadline cancels the tasks mid-response."""

    def __init__(self, config: uvicorn.Config, drain_timeout: float):
        super().__init__(config)
        self.drain_timeout = drain_timeout
        state = getattr(getattr(config.app, "state", None), "server", None)
        self.engine: AsyncEngine | None = state.engine if state is not None else None
        self.cut_off = 0  # requests the drain timeout ended

    async def shutdown(self, sockets=None) -> None:
        timer = asyncio.get_running_loop().call_later(self.drain_timeout, self._cut_off)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut_off(self) -> None:
        if self.engine is not None:
            self.cut_off = self.engine.close("the server shut down before this request finished "
                                             f"(drain timeout {self.drain_timeout:g} s)")
            if self.cut_off:
                log.warning("drain timeout: %d requests still running were ended with 503", self.cut_off)

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


def _server(app: FastAPI, host: str, port: int, drain_timeout: float, log_level: str) -> DrainingServer:
    # uvicorn stops accepting on shutdown and waits for in-flight responses; we end them at drain_timeout
    # httptools and uvloop (C) rather than h11 and asyncio's loop (Python): under
    # tests/engine/test_server_load.py
    # the event loop's thread needs 7-9 s of CPU instead of 18-22 s, the draining of refused bodies most
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False,
                            http=GuardedHttpTools, loop="uvloop",
                            timeout_graceful_shutdown=drain_timeout + CUT_OFF_GRACE_S, timeout_keep_alive=30)
    return DrainingServer(config, drain_timeout)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
          drain_timeout: float = defaults.DRAIN_TIMEOUT_S,
          log_level: str = "warning") -> int:
    """Runs until SIGTERM/SIGINT or until the engine loop dies; the exit code (see the module doc)."""
    server = _server(app, host, port, drain_timeout, log_level)
    if server.engine is not None:
        server.engine.on_death.append(lambda: setattr(server, "should_exit", True))
    # what exists now (the model, torch, the app) lives as long as the process: kept out of every later
    # collection, so a full collection scans only requests, not the ~66,000 objects of the start
    gc.collect()
    gc.freeze()
    server.run()
    if not server.started or (server.engine is not None and server.engine.error):
        return defaults.EXIT_ENGINE_DIED
    return defaults.EXIT_DRAIN_INCOMPLETE if server.cut_off else 0


class BackgroundServer:
    """A server in a thread on a free loopback port: `with BackgroundServer(app) as s: s.url`."""

    def __init__(self, app: FastAPI, drain_timeout: float = 5.0):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = _server(app, "127.0.0.1", self.port, drain_timeout, "warning")
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
