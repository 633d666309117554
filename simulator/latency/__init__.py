"""Calibrated step-latency models (no torch): fit, save/load, predict."""

from simulator.latency.model import LatencyModel, list_named

__all__ = ["LatencyModel", "list_named"]
