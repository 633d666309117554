"""What a Prometheus server would hold: every serving replica scraped at the scenario's interval.

Counters and histogram buckets go into the MetricStore as one vector per replica; the gauges
(waiting, running, KV usage) as of the scrape instant. The same rounds are kept as labelled series,
with the target labels a Kubernetes scrape of vLLM carries (job = the pool's name, namespace, pod,
instance, model_name, engine), for the PromQL evaluator. Besides the replicas, two more targets:

- the router as llm-d's endpoint picker (job "epp"): the pool-wide request latency histograms
  (llm_d_epp_request_ttft_seconds, llm_d_epp_request_streaming_tpot_seconds), summed over every
  replica that ever served, with vLLM's buckets;
- kube-state-metrics (job "kube-state-metrics"): each pool as a Deployment, its desired
  (kube_deployment_spec_replicas), non-terminating (kube_deployment_status_replicas) and ready
  (kube_deployment_status_replicas_ready) pod counts.

A replica no longer scraped (gone, failed) gets a staleness marker at the next round. The
scenario's recording rules run here too, as Prometheus runs them, each group at its interval.
"""

from __future__ import annotations

import numpy as np

from simulator.metrics import HISTOGRAMS, LAYOUT, SIZE, histogram_columns, replica_columns
from simulator.promql import LOOKBACK, lookbehind
from simulator.promql.rules import evaluate_group
from simulator.promql.storage import labels_of
from simulator.promql.targets import Column
from simulator.steptime import seconds, to_ps

NAMESPACE = "default"
EPP_HISTOGRAMS = {"time_to_first_token_seconds": "llm_d_epp_request_ttft_seconds",
                  "request_time_per_output_token_seconds": "llm_d_epp_request_streaming_tpot_seconds"}
KSM = ("kube_deployment_spec_replicas", "kube_deployment_status_replicas",
       "kube_deployment_status_replicas_ready")


def replica_target(pool, rep) -> dict[str, str]:
    pod = f"{pool.spec.name}-{rep.id}"
    return {"job": pool.spec.name, "namespace": NAMESPACE, "pod": pod, "instance": f"{pod}:8000",
            "model_name": getattr(pool.model, "model", "") or pool.spec.name, "engine": "0"}


def epp_columns(model_name: str) -> list[Column]:
    target = {"job": "epp", "namespace": NAMESPACE, "pod": "epp-0", "instance": "epp-0:9090",
              "model_name": model_name, "target_model_name": model_name}
    cols, start = [], 0
    for h, family in EPP_HISTOGRAMS.items():
        n = len(HISTOGRAMS[h]) + 1
        cols += histogram_columns(family, target, HISTOGRAMS[h], start, start + n)
        start += n + 2
    return cols


def epp_row(totals: np.ndarray) -> np.ndarray:
    """The EPP's histograms (buckets, sum, count of each) out of a summed replica vector."""
    parts = []
    for h in EPP_HISTOGRAMS:
        sl = LAYOUT[h + "_bucket"]
        parts += [totals[sl], totals[LAYOUT[h + "_sum"]:LAYOUT[h + "_sum"] + 2]]
    return np.concatenate(parts)


def ksm_columns(pools) -> list[Column]:
    target = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080", "namespace": NAMESPACE}
    return [Column(name, "gauge", labels_of({**target, "deployment": p.spec.name, "__name__": name}),
                   3 * i + k) for i, p in enumerate(pools) for k, name in enumerate(KSM)]


def keep_history(fleet) -> None:
    """Keeps as much history as the triggers and rules read (an avg_over_time over an hour...)."""
    trees = [tree for pool in fleet.pools if pool.policy for _, tree in pool.policy.queries]
    trees += [r.tree for g in fleet.sc.rules for r in g.rules]
    needed = max((lookbehind(tree, LOOKBACK) for tree in trees), default=0) / 1000
    fleet.store.retention = max(fleet.store.retention, needed + 2 * fleet.sc.scrape_interval)


def rules_process(fleet, group):
    """One rule group, evaluated every interval from time 0, its output kept as long as the scrapes."""
    step = round(fleet.sc.evaluation_interval * 1000)
    interval = group.interval or step
    store = fleet.store
    while True:
        t = round(seconds(fleet.env.now) * 1000)
        evaluate_group(group, store, store.recorded, t, step)
        store.recorded.prune(t - store.retention * 1000)
        yield fleet.env.timeout(to_ps(interval / 1000))


def scrape_process(fleet):
    interval = to_ps(fleet.sc.scrape_interval)
    store = fleet.store
    keep_history(fleet)
    for group in fleet.sc.rules:
        fleet.env.process(rules_process(fleet, group))
    model = next((getattr(p.model, "model", "") for p in fleet.pools), "") or "model"
    retired = np.zeros(SIZE)  # what replicas no longer scraped had counted (the EPP's totals keep it)
    gone: set[int] = set()
    while True:
        t = seconds(fleet.env.now)
        t_ms = round(t * 1000)
        up = set()
        served = retired.copy()
        for pool in fleet.pools:
            for rep in pool.replicas:
                if rep.state not in ("ready", "draining"):
                    if rep.state in ("gone", "failed") and rep.id not in gone:
                        gone.add(rep.id)
                        retired += rep.metrics.cumulative()
                        served += rep.metrics.cumulative()
                    continue
                kv = rep.kv_usage_now()
                vector = rep.scrape_vector()
                gauges = {"waiting": rep.num_waiting, "running": rep.num_running, "kv_usage": kv}
                store.scrape((pool.index, rep.id), t, vector, gauges)
                row = np.concatenate((vector, (rep.num_waiting, rep.num_running, kv)))
                store.targets.scrape((pool.index, rep.id), t_ms, row,
                                     lambda p=pool, r=rep: replica_columns(replica_target(p, r)))
                up.add((pool.index, rep.id))
                served += vector
        store.targets.scrape("epp", t_ms, epp_row(served), lambda: epp_columns(model))
        ksm = [float(x) for p in fleet.pools
               for x in (p.desired, p.count("provisioning") + p.count("ready"), p.count("ready"))]
        store.targets.scrape("kube-state-metrics", t_ms, np.array(ksm), lambda: ksm_columns(fleet.pools))
        store.targets.end_round(t_ms, up | {"epp", "kube-state-metrics"})
        yield fleet.env.timeout(interval)
