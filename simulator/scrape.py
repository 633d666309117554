"""What a Prometheus server would hold: every serving replica scraped at the scenario's interval.

Counters and histogram buckets go into the MetricStore as one vector per replica; the gauges
(waiting, running, KV usage) as of the scrape instant.
"""

from __future__ import annotations

from simulator.steptime import seconds, to_ps


def scrape_process(fleet):
    interval = to_ps(fleet.sc.scrape_interval)
    store = fleet.store
    while True:
        t = seconds(fleet.env.now)
        for pool in fleet.pools:
            for rep in pool.replicas:
                if rep.state not in ("ready", "draining"):
                    continue
                kv = rep.kv_usage_now()
                gauges = {"waiting": rep.num_waiting, "running": rep.num_running, "kv_usage": kv}
                store.scrape((pool.index, rep.id), t, rep.scrape_vector(), gauges)
        yield fleet.env.timeout(interval)
