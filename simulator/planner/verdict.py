"""Did a run meet its SLOs? Every SLO's percentile over all arrived requests, a request that never
finished counting as infinitely late: the fraction of requests within the threshold is at least the
percentile. (The run summary's `met` reads the percentile of finished requests only, which an
overloaded run cut off at the end of its drain would pass.)"""

from __future__ import annotations


def meets(summary: dict) -> bool:
    slos = summary["slo"]
    return bool(slos) and all(
        s["attainment"] is not None and s["attainment"] >= s["percentile"] / 100.0 for s in slos.values()
    )
