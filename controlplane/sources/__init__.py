"""Metric sources: live metrics into an autoscaler Observation (Prometheus, or a direct /metrics scrape)."""

from controlplane.sources.base import AGGREGATES, MetricSource, QuerySource
from controlplane.sources.prometheus import PrometheusSource
from controlplane.sources.scrape import ScrapeSource

__all__ = ["AGGREGATES", "MetricSource", "PrometheusSource", "QuerySource", "ScrapeSource"]
