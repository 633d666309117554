"""The SLO target: a latency metric's percentile must stay within a number of seconds.

One class for policy specs and simulator scenarios. In YAML (both files):

    ttft: {percentile: 90, seconds: 2.0}   # the documented spelling
    ttft: {percentile: 90, threshold: 2.0} # also accepted (older scenarios)

A scenario may also give the seconds alone (`ttft: 2.0`, at the default percentile).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PERCENTILE = 90.0

# a metric's target, as JSON Schema; `threshold` is another name for `seconds`
SLO_TARGET = {
    "type": "object",
    "additionalProperties": False,
    "x-exactly-one": ["seconds", "threshold"],
    "properties": {
        "percentile": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
        "seconds": {"type": "number", "exclusiveMinimum": 0},
        "threshold": {"type": "number", "exclusiveMinimum": 0},
    },
}


@dataclass
class SloTarget:
    metric: str  # ttft, tpot (policies and simulator); itl, e2e (simulator reports)
    percentile: float  # e.g. 90
    seconds: float

    @classmethod
    def from_yaml(cls, metric: str, value: dict | float) -> SloTarget:
        """From an already validated YAML value: seconds alone, or a mapping in either spelling."""
        if not isinstance(value, dict):
            return cls(metric, DEFAULT_PERCENTILE, float(value))
        seconds = value["seconds"] if "seconds" in value else value["threshold"]
        return cls(metric, float(value.get("percentile", DEFAULT_PERCENTILE)), float(seconds))

    # the simulator's report and plots read these older names
    @property
    def name(self) -> str:
        return self.metric

    @property
    def threshold(self) -> float:
        return self.seconds
