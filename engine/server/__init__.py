"""OpenAI-compatible engine server: real (weights) or emulated (a latency model), same API and metrics.

build_engine makes the LLMEngine, build_app wraps it in the HTTP API, serve runs uvicorn with a
SIGTERM drain; BackgroundServer runs one in a thread on a free loopback port (tests, benchmarks).
The names load on first use, so the CLI can read engine.server.defaults without FastAPI or uvicorn.
"""

from __future__ import annotations

import importlib

__all__ = ["BackgroundServer", "build_engine", "build_server", "serve"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("engine.server.run"), name)
    raise AttributeError(f"module 'engine.server' has no attribute {name!r}")
