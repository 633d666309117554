"""Is an autoscaler's metric source down? Said once, clearly, and told to /readyz.

The reconcile step already treats a failed query as an outage (KEDA's fallback, or a hold), but a
user reading the log saw only `scale 1 -> 5: hpa: ScaleUpLimit (errors: ...)`. Here, per autoscaler:
the first failed poll logs the source's address and the error at warning, the first good one after it
logs the recovery at info; a KEDA fallback (or a hold on failed metrics) logs its start and its end
with the replicas it sets; `down(n)` says why the source has failed n polls in a row or more, for
/readyz (controlplane.telemetry).
"""

from __future__ import annotations

import logging

log = logging.getLogger("slopilot.control")


def describe(source) -> str:
    """Where a source reads from: a Prometheus URL, the scraped endpoints, or its class."""
    url = getattr(source, "url", None)
    if url:
        return f"prometheus {url}"
    urls = getattr(source, "endpoints", None)
    try:
        urls = list(urls()) if callable(urls) else list(urls or [])
    except Exception:  # a fleet's endpoints may not be readable yet: the class says enough
        urls = []
    if urls:
        return "scrape " + ", ".join(map(str, list(urls)[:3])) + (" ..." if len(urls) > 3 else "")
    return type(source).__name__


def fallback_kind(policy, reason: str) -> str | None:
    """'fallback' while KEDA's fallback sets the count, 'hold' while failed metrics hold it, else None."""
    fb = getattr(getattr(policy, "cfg", None), "fallback", None)
    failures = getattr(policy, "failures", {}) or {}
    if fb is not None and any(n > fb.failure_threshold for n in failures.values()):
        return "fallback"
    if reason.startswith("hold: metrics unavailable"):
        return "hold"
    return None


class SourceHealth:
    def __init__(self, name: str, where: str):
        self.name, self.where = name, where
        self.failed_polls = 0  # in a row
        self.reason = ""
        self.mode: str | None = None  # fallback / hold in force

    def update(self, failed: dict[str, str], policy, desired: int, reason: str) -> None:
        """After a tick: `failed` maps each failed metric to its error message ({} when all read)."""
        if failed:
            self.failed_polls += 1
            self.reason = next(iter(failed.values()))
            if self.failed_polls == 1:
                log.warning("%s: metric source %s failing: %s", self.name, self.where,
                            "; ".join(failed.values()))
        elif self.failed_polls:
            log.info("%s: metric source %s recovered after %d failed poll(s)", self.name, self.where,
                     self.failed_polls)
            self.failed_polls, self.reason = 0, ""
        mode = fallback_kind(policy, reason)
        if mode != self.mode:
            if mode == "fallback":
                fb = policy.cfg.fallback
                log.warning("%s: fallback started: %d replicas (fallback.replicas, behavior %s); desired %d "
                            "now (%s)", self.name, fb.replicas, fb.behavior, desired, reason)
            elif mode == "hold":
                log.warning("%s: holding %d replicas while metrics fail (%s)", self.name, desired, reason)
            else:
                log.info("%s: %s ended: %d replicas (%s)", self.name,
                         "fallback" if self.mode == "fallback" else "hold", desired, reason)
            self.mode = mode

    def down(self, polls: int) -> str | None:
        """Why the source counts as down (failed `polls` polls in a row or more), else None."""
        if self.failed_polls < polls:
            return None
        return (f"{self.name}: metric source {self.where} down for {self.failed_polls} polls: "
                f"{self.reason}")
