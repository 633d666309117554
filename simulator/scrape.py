"""What a Prometheus server would hold: every serving replica scraped at the scenario's interval.

Counters and histogram buckets go into the MetricStore as one vector per replica; the gauges
(waiting, running, KV usage) as of the scrape instant. The same rounds are kept as labelled series,
with the target labels a Kubernetes scrape of vLLM carries (job = the pool's name, namespace, pod,
instance, model_name, engine), for the PromQL evaluator. Besides the replicas, two more targets:

- kube-state-metrics (job "kube-state-metrics"): each pool as a Deployment, its desired
  (kube_deployment_spec_replicas), non-terminating (kube_deployment_status_replicas) and ready
  (kube_deployment_status_replicas_ready) pod counts;
- the router as llm-d's endpoint picker (job "epp"): its request latency histograms, with its
  buckets: llm_d_epp_request_ttft_seconds (arrival at the router to the first token, observed
  when the token comes) and llm_d_epp_request_streaming_tpot_seconds ((e2e - TTFT) / (tokens - 1),
  observed when the request ends). Scraped only when a query or rule reads them, or when the series
  are kept for export: finding the new first tokens walks every running request.

The router's own counters, as the live router exports them, are a third target (job "epp" too),
scraped every ROUTER_SCRAPE_INTERVAL seconds, faster than the engines, when a query reads them:
llm_d_epp_request_total{model_name,priority} (arrivals, by priority band) and
llm_d_epp_flow_control_queue_size{priority,inference_pool} (the gateway queue, by band label).

A replica no longer scraped (gone, failed) gets a staleness marker at the next round. The
scenario's recording rules run here too, as Prometheus runs them, each group at its interval.
"""

from __future__ import annotations

import numpy as np

from promql import LOOKBACK, lookbehind
from promql.parse import Selector
from promql.rules import evaluate_group
from promql.storage import labels_of
from promql.targets import Column
from promql.tree import walk
from simulator.metrics import histogram_columns, replica_columns
from simulator.requests import OK
from simulator.steptime import PS, seconds, to_ps

NAMESPACE = "default"
KSM = ("kube_deployment_spec_replicas", "kube_deployment_status_replicas",
       "kube_deployment_status_replicas_ready")
# the endpoint picker's histograms and buckets (llm-d router)
EPP_TTFT = ("llm_d_epp_request_ttft_seconds", (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2,
                                               3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120))
EPP_TPOT = ("llm_d_epp_request_streaming_tpot_seconds", (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06,
                                                         0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6,
                                                         0.8, 1, 2))
ROUTER_SCRAPE_INTERVAL = 2.0  # seconds; a fast signal for policies that read the router's arrivals
ROUTER_NAMES = ("llm_d_epp_request_total", "llm_d_epp_flow_control_queue_size")


def replica_target(pool, rep) -> dict[str, str]:
    """A replica's target labels: the pool's `labels` where it sets them (pod: a pattern)."""
    given = pool.spec.labels
    pod = given.get("pod", "{pool}-{replica}").replace("{pool}", pool.spec.name).replace("{replica}",
                                                                                          str(rep.id))
    return {"job": pool.spec.name, "namespace": given.get("namespace", NAMESPACE), "pod": pod,
            "instance": f"{pod}:8000", "engine": given.get("engine", "0"),
            "model_name": given.get("model_name") or getattr(pool.model, "model", "") or pool.spec.name}


def ksm_columns(pools) -> list[Column]:
    target = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080", "namespace": NAMESPACE}
    return [Column(name, "gauge", labels_of({**target, "deployment": p.spec.name, "__name__": name}),
                   3 * i + k) for i, p in enumerate(pools) for k, name in enumerate(KSM)]


class Epp:
    """The endpoint picker's TTFT and TPOT histograms, fed from the requests' own times."""

    def __init__(self, fleet):
        n = len(fleet.requests.status)
        self.ttft_seen = np.zeros(n, dtype=bool)
        self.tpot_seen = np.zeros(n, dtype=bool)
        self.ttft = np.zeros(len(EPP_TTFT[1]) + 3)  # per-bucket counts (+Inf last), sum, count
        self.tpot = np.zeros(len(EPP_TPOT[1]) + 3)
        model = next((getattr(p.model, "model", "") for p in fleet.pools), "") or "model"
        target = {"job": "epp", "namespace": NAMESPACE, "pod": "epp-0", "instance": "epp-0:9090",
                  "model_name": model, "target_model_name": model}
        k = len(self.ttft)
        self.columns = (histogram_columns(EPP_TTFT[0], target, EPP_TTFT[1], 0, k - 2)
                        + histogram_columns(EPP_TPOT[0], target, EPP_TPOT[1], k, k + len(self.tpot) - 2))

    @staticmethod
    def _observe(hist: np.ndarray, buckets, values: np.ndarray) -> None:
        if len(values):
            np.add.at(hist, np.searchsorted(buckets, values, side="left"), 1)  # le: value <= bound
            hist[-2] += values.sum()
            hist[-1] += len(values)

    def scrape(self, fleet) -> np.ndarray:
        now = fleet.env.now
        seen = self.ttft_seen
        first = []  # requests in flight whose first token came since the last scrape
        for pool in fleet.pools:
            for rep in pool.replicas:
                if rep.state in ("ready", "draining"):
                    first += [(s.index, s.first_token_time - s.arrival_time)
                              for s in (*rep.sched.running, *rep.sched.waiting)
                              if s.first_token_time is not None and s.first_token_time <= now
                              and not seen[s.index]]
        log = fleet.requests
        done = np.flatnonzero((log.status == OK) & ~self.tpot_seen)
        fresh = done[~self.ttft_seen[done]]
        ttft = [t for _, t in first] + list(log.first_token[fresh] - fleet.arrival_ps[fresh])
        self.ttft_seen[[i for i, _ in first]] = True
        self.ttft_seen[fresh] = True
        self._observe(self.ttft, EPP_TTFT[1], np.asarray(ttft, dtype=float) / PS)
        long = done[log.generated[done] > 1]
        tpot = (log.finish[long] - log.first_token[long]) / PS / (log.generated[long] - 1)
        self._observe(self.tpot, EPP_TPOT[1], tpot)
        self.tpot_seen[done] = True
        out = np.concatenate((self.ttft, self.tpot))
        for start, hist in ((0, self.ttft), (len(self.ttft), self.tpot)):  # cumulative in le, as exposed
            out[start:start + len(hist) - 2] = np.cumsum(hist[:-2])
        return out


class RouterCounters:
    """The router's arrival counter per priority band and its gateway queue size per band."""

    def __init__(self, fleet):
        bands = fleet.gate.bands if fleet.gate is not None else []
        self.priorities = [b.priority for b in bands] or [0]
        self.slot = {p: i for i, p in enumerate(self.priorities)}
        self.arrivals = np.zeros(len(self.priorities))
        self.seen = 0  # requests counted so far (in arrival order)
        model = next((getattr(p.model, "model", "") for p in fleet.pools), "") or "model"
        target = {"job": "epp", "namespace": NAMESPACE, "pod": "epp-0", "instance": "epp-0:9090"}
        name = ROUTER_NAMES[0]
        self.columns = [Column(name[:-6], "counter", labels_of({**target, "__name__": name,
                                                                "model_name": model, "priority": str(p)}), i)
                        for i, p in enumerate(self.priorities)]
        name, k = ROUTER_NAMES[1], len(self.priorities)
        pool = fleet.pools[0].spec.name
        self.columns += [Column(name, "gauge", labels_of({**target, "__name__": name, "priority": b.label,
                                                          "inference_pool": pool}), k + i)
                         for i, b in enumerate(bands)]
        self.bands = bands

    def scrape(self, fleet) -> np.ndarray:
        if fleet.gate is not None:
            new = fleet.gate.band[self.seen:fleet.arrived]
            for p, n in zip(*np.unique(new, return_counts=True)):
                self.arrivals[self.slot[int(p)]] += n
        else:
            self.arrivals[0] += fleet.arrived - self.seen
        self.seen = fleet.arrived
        queue = [fleet.gate.queue.counts[b.priority] for b in self.bands]
        return np.concatenate((self.arrivals, np.asarray(queue, dtype=float)))


def router_process(fleet, counters: RouterCounters):
    interval = to_ps(ROUTER_SCRAPE_INTERVAL)
    while True:
        t_ms = round(seconds(fleet.env.now) * 1000)
        fleet.store.targets.scrape("router", t_ms, counters.scrape(fleet), lambda: counters.columns)
        yield fleet.env.timeout(interval)


def reads_router(trees) -> bool:
    """Whether any query selects the router's arrival counter or gateway queue."""
    return any(isinstance(n, Selector) and n.name in ROUTER_NAMES for tree in trees for n in walk(tree))


def reads_epp(trees) -> bool:
    """Whether any query may select the endpoint picker's series."""
    for tree in trees:
        for node in walk(tree):
            if isinstance(node, Selector):
                name = node.name
                if name is None or (name.startswith("llm_d_epp_") and name not in ROUTER_NAMES):
                    return True
    return False


def queries(fleet) -> list:
    """Every compiled query the run evaluates: the triggers' and the recording rules'."""
    trees = [tree for pool in fleet.pools if pool.policy for _, tree in pool.policy.queries]
    return trees + [r.tree for g in fleet.sc.rules for r in g.rules]


def keep_history(fleet, trees) -> None:
    """Keeps as much history as the queries read (an avg_over_time over an hour...)."""
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
    trees = queries(fleet)
    keep_history(fleet, trees)
    epp = Epp(fleet) if store.keep_all or reads_epp(trees) else None
    router = reads_router(trees)
    if router:
        fleet.env.process(router_process(fleet, RouterCounters(fleet)))
    for group in fleet.sc.rules:
        fleet.env.process(rules_process(fleet, group))
    while True:
        t = seconds(fleet.env.now)
        t_ms = round(t * 1000)
        up = {"kube-state-metrics", "router"} if router else {"kube-state-metrics"}
        for pool in fleet.pools:
            for rep in pool.replicas:
                if rep.state not in ("ready", "draining"):
                    continue
                kv = rep.kv_usage_now()
                vector = rep.scrape_vector()
                gauges = {"waiting": rep.num_waiting, "running": rep.num_running, "kv_usage": kv}
                store.scrape((pool.index, rep.id), t, vector, gauges)
                row = np.concatenate((vector, (rep.num_waiting, rep.num_running, kv)))
                store.targets.scrape((pool.index, rep.id), t_ms, row,
                                     lambda p=pool, r=rep: replica_columns(replica_target(p, r)))
                up.add((pool.index, rep.id))
        ksm = [float(x) for p in fleet.pools
               for x in (p.desired, p.count("provisioning") + p.count("ready"), p.count("ready"))]
        store.targets.scrape("kube-state-metrics", t_ms, np.array(ksm), lambda: ksm_columns(fleet.pools))
        if epp is not None:
            store.targets.scrape("epp", t_ms, epp.scrape(fleet), lambda: epp.columns)
            up.add("epp")
        store.targets.end_round(t_ms, up)
        yield fleet.env.timeout(interval)
