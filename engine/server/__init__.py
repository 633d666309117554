"""OpenAI-compatible engine server: real (weights) or emulated (a latency model), same API and metrics.

build_engine makes the LLMEngine, build_app wraps it in the HTTP API, serve runs uvicorn with a
SIGTERM drain; BackgroundServer runs one in a thread on a free loopback port (tests, benchmarks).
"""

from engine.server.run import BackgroundServer, build_engine, build_server, serve

__all__ = ["BackgroundServer", "build_engine", "build_server", "serve"]
