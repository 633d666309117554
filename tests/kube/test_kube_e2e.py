"""Kube mode end to end: `slopilot control --kube` (a process, with the controller's ServiceAccount)
scales a Deployment of emulated engines (`serve --emulate`, started and stopped by the fake kubelet)
under a load ramp, reading the engines' /metrics from the pods it finds through the Scale's selector;
then the autoscaler's status conditions and Events are checked against what happened.

The timeline is sampled from the API (the Deployment's spec and status, the autoscaler's status)
and printed with the figures: when the queue crossed the threshold, when the scale-up came, when the
scale-down came after the load stopped.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import httpx
import pytest

from controlplane.loadgen import LoadGenerator, LoadSpec
from controlplane.prometheus_server import free_port
from tests.kube.helpers import deployment, queue_autoscaler, wait_for
from tests.kube.kubelet import FakeKubelet

POLL, SCRAPE, WINDOW = 2.0, 1.0, 10
# 1 req/s, a ramp to 10 req/s (one replica with 4 sequences at a time serves about 4), then nothing
RAMP = [[0, 1], [6, 1], [12, 10], [22, 10], [22.01, 0], [24, 0]]


def waiting(urls: list[str]) -> float:
    total = 0.0
    for u in urls:
        try:
            for line in httpx.get(u + "/metrics", timeout=1, trust_env=False).text.splitlines():
                if line.startswith("vllm:num_requests_waiting"):
                    total += float(line.rsplit(" ", 1)[1])
        except httpx.HTTPError:
            pass
    return total


@pytest.mark.timeout(300)
def test_controller_scales_emulated_engines_under_a_ramp(cluster):
    ns = cluster.namespace("llm")
    cluster.apply(deployment("llama"), ns)
    kubelet = FakeKubelet(cluster.store, ns, serve_args=("--max-num-seqs", "4")).start()
    try:
        wait_for(lambda: len(kubelet.ready_urls("llama")) == 1, 60, "the first engine ready")
        behavior = {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleDown": {"stabilizationWindowSeconds": WINDOW}}}}
        cluster.apply(queue_autoscaler("llama", "llama", threshold=4, max_replicas=3, poll=POLL,
                                       advanced=behavior), ns)
        port = free_port()
        proc = cluster.controller_process("--namespace", ns, "--scrape-interval", str(SCRAPE),
                                          "--metrics-port", str(port))
        wait_for(lambda: cluster.condition(ns, "llama", "Ready"), 30, "the controller's first status")
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/readyz", trust_env=False).status_code == 200

        samples, stop = [], threading.Event()
        t0 = time.time()

        def sample():
            while not stop.is_set():
                d = cluster.get("apps/v1", "Deployment", ns, "llama")
                ia = cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", ns, "llama")
                ready = (d.get("status") or {}).get("readyReplicas", 0)
                desired = (ia.get("status") or {}).get("desiredReplicas")
                queue = waiting(kubelet.ready_urls("llama"))
                samples.append((time.time() - t0, d["spec"]["replicas"], ready, desired, queue))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = LoadGenerator(LoadSpec.parse({"arrivals": {"piecewise": RAMP}, "prompt_tokens": 256,
                                             "output_tokens": 32, "seed": 1}),
                             lambda: kubelet.ready_urls("llama"))
        result = load.run()
        load_end = time.time() - t0
        wait_for(lambda: cluster.get("apps/v1", "Deployment", ns, "llama")["spec"]["replicas"] == 1
                 and samples and max(s[1] for s in samples) > 1, 90, "back to one replica")
        wait_for(lambda: (cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", ns, "llama")["status"]
                          .get("desiredReplicas")) == 1, 10, "the scale-down in the status")
        page = httpx.get(base + "/metrics", trust_env=False).text
        assert 'slopilot_autoscaler_desired_replicas{autoscaler="llm/llama"} 1.0' in page
        stop.set()
        sampler.join()
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM: finishes and exits 0
    finally:
        kubelet.stop()

    print(f"{'t (s)':>6} {'spec':>4} {'ready':>5} {'desired':>7} {'queue':>6}")
    for t, spec, ready, desired, queue in samples[::2]:
        print(f"{t:6.1f} {spec:>4} {ready:>5} {desired!s:>7} {queue:6.0f}")
    print(f"load: {len(result.records)} requests, ended at {load_end:.1f} s; {kubelet.started} engines "
          f"started")
    ups = [s for s in samples if s[1] > 1]
    assert ups, "never scaled up"
    level = 4 * 1.1  # the threshold for one replica, beyond the HPA's tolerance
    crossing = next(t for t, *_, q in samples if q > level)
    first_up, last_up = ups[0][0], ups[-1][0]
    print(f"queue above {level:g} at {crossing:.1f} s, scale-up at {first_up:.1f} s "
          f"({first_up - crossing:+.1f} s); last seen above 1 at {last_up:.1f} s, {last_up - load_end:.1f} s "
          f"after the load ended (window {WINDOW} s)")
    assert first_up - crossing <= 2 * POLL + SCRAPE + 1.0  # (sampled every 0.5 s)
    assert last_up - load_end >= WINDOW - 2 * POLL
    assert max(s[2] for s in samples) >= 2  # the kubelet's engines became ready

    # what the status says: the last decision, and conditions that match an idle fleet at its minimum
    ia = cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", ns, "llama")
    st = ia["status"]
    conds = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    print("conditions:", conds)
    assert st["desiredReplicas"] == 1 and st["currentReplicas"] > 1  # (as the HPA: the count it scaled from)
    assert conds["Ready"] == ("True", "Reconciled")
    assert conds["AbleToScale"][0] == "True"
    assert conds["Fallback"] == ("False", "MetricsAvailable")
    assert conds["ScalingLimited"][0] == "False"
    assert conds["Active"][0] == "False"  # no queue any more
    assert st["observedGeneration"] == ia["metadata"]["generation"]
    assert st["policyState"]["policy"]["hpa"]  # the stabilization records, for a restarted controller

    # the Events tell every scale, in order, as the Deployment's own history has them
    events = sorted((e for e in cluster.events(ns, "llama") if e["reason"] == "SuccessfulRescale"),
                    key=lambda e: int(e["metadata"]["resourceVersion"]))
    sizes = [int(e["message"].split("New size: ")[1].split()[0]) for e in events]
    history = replica_history(cluster, ns, "llama")
    print("scale events:", sizes, "the Deployment's spec.replicas over time:", history)
    assert history[0] == 1 and sizes == history[1:]
    assert datetime.fromisoformat(st["lastScaleTime"].replace("Z", "+00:00")) == \
        datetime.fromisoformat(events[-1]["lastTimestamp"].replace("Z", "+00:00"))
    assert not [e for e in cluster.events(ns, "llama") if e["type"] == "Warning"]


def replica_history(cluster, ns: str, name: str) -> list[int]:
    """spec.replicas of the Deployment at each change, from the stand-in's write history."""
    out = []
    for _, key, ons, kind, obj, _ in list(cluster.store.history):
        if key == ("apps", "deployments") and ons == ns and obj["metadata"]["name"] == name:
            n = obj["spec"]["replicas"]
            if not out or out[-1] != n:
                out.append(n)
    return out
