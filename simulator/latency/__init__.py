"""Calibrated step-latency models (no torch): fit, save/load, predict."""

from simulator.latency.model import LatencyModel, is_model_path, list_named, load_latency_model

__all__ = ["LatencyModel", "is_model_path", "list_named", "load_latency_model"]
