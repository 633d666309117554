"""slopilot: autoscaling control plane and SLO simulator for LLM inference fleets."""

__version__ = "0.1.0"
