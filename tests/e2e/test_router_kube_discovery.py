"""The router following a Service's EndpointSlices on the stand-in Kubernetes API server (the kube
tests' own), in front of emulated engines serving two models: each request goes only to endpoints
serving its model, an unknown model gets 404; endpoints join, drain when not ready, and leave with
their slice."""

from __future__ import annotations

import httpx
import openai
import pytest
from kubernetes import client

from controlplane.router.discovery import KubernetesEndpoints
from tests.e2e.conftest import wait_for
from tests.e2e.test_router_openai import start_router
from tests.kube.helpers import Cluster

LLAMA, OPT = "h100-llama2-70b-tp4", "a100-opt-13b-tp1"  # served as llama2-70b and opt-13b


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, install=False)
    try:
        yield c
    finally:
        c.close()


def endpoint_slice(name: str, url: str, ready: bool = True, service: str = "engines") -> dict:
    """One slice of `service` with one endpoint at url's address and port (as the EndpointSlice
    controller writes them, one per port set)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "serving",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
            "endpoints": [{"addresses": [host], "conditions": {"ready": ready}}]}


def served_by(router, model: str, n: int) -> dict[str, int]:
    """Sends n completions for `model`; how many each endpoint served."""
    before = {u: ep.served for u, ep in router.state.pool.endpoints.items()}
    api = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    for _ in range(n):
        answer = api.completions.create(model=model, prompt="hi there", max_tokens=2)
        assert answer.usage.completion_tokens == 2
    return {u: ep.served - before.get(u, 0) for u, ep in router.state.pool.endpoints.items()
            if ep.served > before.get(u, 0)}


def test_endpoint_slices_and_model_filtering(cluster, emulated_servers):
    llama = emulated_servers(2, model=LLAMA)
    opt = emulated_servers(1, model=OPT)
    cluster.namespace("serving")
    cluster.apply(endpoint_slice("engines-a", llama[0]))
    cluster.apply(endpoint_slice("engines-b", opt[0]))
    cluster.apply(endpoint_slice("other", llama[1], service="elsewhere"))  # another Service's
    api = client.DiscoveryV1Api(cluster.admin)
    found = KubernetesEndpoints("engines", "serving", port="http", interval=0.2, api=api)
    try:
        assert found() == sorted([llama[0], opt[0]])
        with start_router([], discover=found) as router:
            pool = router.state.pool
            wait_for(lambda: all(ep.models for ep in pool.endpoints.values()) and len(pool.endpoints) == 2,
                     10, what="both endpoints scraped")
            assert served_by(router, "llama2-70b", 6) == {llama[0]: 6}
            assert served_by(router, "opt-13b", 4) == {opt[0]: 4}
            with pytest.raises(openai.NotFoundError) as err:
                openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0).completions.create(
                    model="gpt-4", prompt="hi", max_tokens=2)
            assert err.value.status_code == 404 and err.value.body["type"] == "NotFoundError"
            assert "gpt-4" in err.value.body["message"]

            # a second llama endpoint joins: llama requests spread over both, opt's stay put
            cluster.apply(endpoint_slice("engines-c", llama[1]))
            wait_for(lambda: llama[1] in pool.endpoints, 10, what="the new slice's endpoint joined")
            wait_for(lambda: pool.endpoints[llama[1]].models, 10, what="the new endpoint scraped")
            spread = served_by(router, "llama2-70b", 12)
            assert set(spread) == {llama[0], llama[1]}
            assert served_by(router, "opt-13b", 2) == {opt[0]: 2}

            # not ready: it drains (gets nothing new); its slice deleted: it leaves
            cluster.apply(endpoint_slice("engines-a", llama[0], ready=False))
            wait_for(lambda: llama[0] not in pool.endpoints, 10, what="the unready endpoint left")
            assert served_by(router, "llama2-70b", 4) == {llama[1]: 4}
            cluster.delete("discovery.k8s.io/v1", "EndpointSlice", "serving", "engines-b")
            wait_for(lambda: opt[0] not in pool.endpoints, 10, what="the deleted slice's endpoint left")
            # no endpoint serves opt-13b any more: 404, not a wait
            r = httpx.post(router.url + "/v1/completions", json={"model": "opt-13b", "prompt": "x"},
                           trust_env=False, timeout=10)
            assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
            ids = [m["id"] for m in httpx.get(router.url + "/v1/models", trust_env=False).json()["data"]]
            assert ids == ["llama2-70b"]
    finally:
        found.close()
