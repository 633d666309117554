"""The P/D autoscaler under the Kubernetes stand-in: two InferenceAutoscalers of type pdModel (role
prefill, role decode) scale two Deployments through their scale subresources, each reading only its
own pool's pods (found through its Scale's selector), each with its own status and Events."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from simulator.latency import load_latency_model
from tests.kube.helpers import deployment, set_ready, wait_for


class PoolPage:
    """One pool's engine /metrics: finished-request counters rising at `rate` req/s with the given
    prompt and output lengths, and the running and KV gauges."""

    def __init__(self, rate: float, prompt: float, output: float, running: float, kv: float):
        self.t0, self.rate, self.prompt, self.output = time.monotonic(), rate, prompt, output
        self.running, self.kv = running, kv
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                n = page.rate * (time.monotonic() - page.t0)
                body = "".join([
                    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n",
                    f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {page.running}\n",
                    f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {page.kv}\n",
                    f"# TYPE vllm:request_success counter\nvllm:request_success_total {n}\n",
                    "# TYPE vllm:request_prompt_tokens histogram\n",
                    f"vllm:request_prompt_tokens_sum {n * page.prompt}\n",
                    f'vllm:request_prompt_tokens_bucket{{le="+Inf"}} {n}\n',
                    f"vllm:request_prompt_tokens_count {n}\n",
                    "# TYPE vllm:request_generation_tokens histogram\n",
                    f"vllm:request_generation_tokens_sum {n * page.output}\n",
                    f'vllm:request_generation_tokens_bucket{{le="+Inf"}} {n}\n',
                    f"vllm:request_generation_tokens_count {n}\n",
                ]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def pod(self, cluster, namespace: str, name: str, labels: dict) -> None:
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                       "spec": {"containers": [{"name": "engine", "image": "x",
                                                "ports": [{"name": "http", "containerPort": self.port}]}]}},
                      namespace)
        pods = cluster.store.types[("", "pods")]
        pod = cluster.store.get(pods, namespace, name)
        pod["status"] = {"phase": "Running", "podIP": "127.0.0.1",
                         "conditions": [{"type": "Ready", "status": "True"}]}
        cluster.store.update(pods, namespace, name, pod, "status")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def pd_autoscaler(role: str, target: str) -> dict:
    slo = {"ttft": {"percentile": 90, "seconds": 3.0}, "tpot": {"percentile": 90, "seconds": 0.1}}
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": {"name": target},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
                     "minReplicas": 1, "maxReplicas": 8, "pollingInterval": 0.5, "startupDelaySeconds": 0,
                     "slo": slo,
                     "policy": {"type": "pdModel", "pdModel": {"role": role, "forecastWindowSeconds": 5}}}}


@pytest.mark.slow  # ~25 s: the stand-in, two scrape loops and their rate windows
def test_two_deployments_scale_through_their_scale_subresources(cluster):
    ns = cluster.namespace("pd")
    # prefill: 12 prompts/s of 4000 tokens (~5 s of prefill a second: several replicas; the 60-s rate
    # reads less while its window fills); decode: 6 requests/s, 300-token outputs, a light batch but its
    # KV at 95% on one replica (the floor: 2)
    prefill = PoolPage(12.0, 4000, 1, running=1, kv=0.1)
    decode = PoolPage(6.0, 4000, 300, running=20, kv=0.95)
    try:
        for name, page in (("llama-prefill", prefill), ("llama-decode", decode)):
            cluster.apply(deployment(name), ns)
            set_ready(cluster, ns, name, 1)
            page.pod(cluster, ns, f"{name}-0", {"app": name})
        cluster.apply(pd_autoscaler("prefill", "llama-prefill"), ns)
        cluster.apply(pd_autoscaler("decode", "llama-decode"), ns)
        ctl = cluster.controller(namespace=ns, leader_election=False,
                                 latency_model=load_latency_model("h100-llama2-70b-tp4"))

        def replicas(name: str) -> int:
            return cluster.get("apps/v1", "Deployment", ns, name)["spec"]["replicas"]

        wait_for(lambda: replicas("llama-prefill") >= 3, 60, "the prefill Deployment scaled")
        wait_for(lambda: replicas("llama-decode") >= 2, 60, "the decode Deployment scaled")
        wait_for(lambda: all((cluster.condition(ns, n, "AbleToScale") or {}).get("status") == "True"
                             for n in ("llama-prefill", "llama-decode")), 10, "statuses")
        cluster.stop_controller(ctl)
    finally:
        prefill.close()
        decode.close()
    # the prefill pool's size came from its prompt tokens, the decode pool's from its own KV; neither
    # from the other's pages (the decode pool's KV floor would be 2, the prefill pool's is 1)
    assert replicas("llama-prefill") > replicas("llama-decode") >= 2
    used = {(e["verb"], e["resource"], e["subresource"], e.get("name"))
            for e in cluster.controller_requests()}
    for name in ("llama-prefill", "llama-decode"):
        assert ("update", "deployments", "scale", name) in used
        status = cluster.get("slopilot.dev/v1alpha1", "InferenceAutoscaler", ns, name)["status"]
        assert status["desiredReplicas"] == replicas(name)
        assert any("pdModel" in e.get("message", "") for e in cluster.events(ns, name))
