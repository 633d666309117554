"""Calibrated step-latency models (no torch): fit, derive, save/load, predict."""

from simulator.latency.loader import is_derived, load_latency_model, model_ref
from simulator.latency.model import LatencyModel, is_model_path, list_named

__all__ = ["LatencyModel", "is_derived", "is_model_path", "list_named", "load_latency_model", "model_ref"]
