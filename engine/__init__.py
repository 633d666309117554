"""Paged-KV inference engine.

`engine.core` (scheduler, block manager) never imports torch, so the simulator can reuse it;
LLM and the model code are imported lazily, on first use.
"""

from __future__ import annotations

from engine.core.sampling_params import SamplingParams
from engine.threads import configure_openmp

configure_openmp()  # before anything loads torch: OpenMP reads its settings once, at load

__all__ = ["LLM", "SamplingParams", "native_available"]


def native_available() -> bool:
    """True when the C++ page allocator (csrc/page_allocator.cpp) is built and importable."""
    try:
        import engine._page_allocator  # noqa: F401
    except ImportError:
        return False
    return True


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
