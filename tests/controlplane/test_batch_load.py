"""A batch in the fleet's built-in load (controlplane.batch_load): its `load.batch` section, the input
file it uploads, and a submission through a live router's Batch API followed to its end."""

import json
import time

import httpx
import pytest

from controlplane.batch_load import BatchLoad, BatchSubmitter
from controlplane.loadgen import LoadSpec, RequestRecord, summarize
from controlplane.router.app import build_router_app
from controlplane.router.server import RouterServer
from routing.config import RouterConfig
from tests.fake_engine import FakeEngine


def test_the_load_section_and_its_errors():
    spec = LoadSpec.parse({"arrivals": {"rate": 1}, "duration": 10,
                           "batch": {"at": 5, "lines": 3, "completion_window": "90s",
                                     "prompt_tokens": 8, "output_tokens": 2, "model": "m"}})
    b = spec.batch
    assert (b.at, b.lines, b.window, b.model) == (5.0, 3, 90.0, "m")
    rows = [json.loads(x) for x in b.jsonl("m").decode().splitlines()]
    assert [r["custom_id"] for r in rows] == ["line-0", "line-1", "line-2"]
    assert all(len(r["body"]["prompt"]) == 8 and r["body"]["max_tokens"] == 2
               and r["url"] == "/v1/completions" for r in rows)
    assert b.jsonl("m") == b.jsonl("m")  # drawn from the seed
    with pytest.raises(ValueError, match="completion_window"):
        BatchLoad.parse({"lines": 3, "completion_window": "2d"})
    with pytest.raises(ValueError, match="completion_window"):
        BatchLoad.parse({"lines": 3, "completion_window": "48h"})
    with pytest.raises(ValueError, match="lines"):
        LoadSpec.parse({"arrivals": {"rate": 1}, "duration": 1, "batch": {"completion_window": "1h"}})


def test_tpot_percentiles_in_the_summary():
    recs = [RequestRecord(0, "u", 10, 11, 200, ttft=0.1, e2e=0.1 + 0.02 * 10 * (i + 1), tokens=11)
            for i in range(10)]
    s = summarize(recs, 1.0)
    assert s["tpot_s"]["p50"] == pytest.approx(0.11)  # (e2e - ttft) / 10 tokens after the first


def test_a_batch_submitted_at_its_second_is_followed_to_completed():
    eng = FakeEngine(chunks=2, chunk_delay=0.0).start()
    try:
        app = build_router_app(RouterConfig(refresh_interval=0.05), lambda: [eng.url])
        with RouterServer(app) as router:
            spec = BatchLoad.parse({"at": 0.5, "lines": 20, "completion_window": "60s", "model": "m",
                                    "prompt_tokens": 4, "output_tokens": 2})
            t0 = time.time()
            sub = BatchSubmitter(spec, router.url, t0, poll=0.2)
            out = sub.run()
            page = httpx.get(router.url + "/metrics", trust_env=False).text
    finally:
        eng.stop()
    assert out["status"] == "completed", out
    assert out["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert 0.5 <= out["created_s"] < out["ended_s"] <= out["deadline_s"]
    assert out["deadline_s"] == pytest.approx(out["created_s"] + 60)
    assert out["done_by_deadline"] and sub.finished.is_set()
    # the lines' tokens on the router's per-band counter (20 lines of 4 prompt and 2 output tokens)
    assert 'slopilot_router_request_tokens_total{kind="prompt",priority="0"} 80.0' in page, page
    assert 'slopilot_router_request_tokens_total{kind="max_output",priority="0"} 40.0' in page


def test_an_unreachable_router_is_reported_not_raised():
    spec = BatchLoad.parse({"lines": 1, "completion_window": "60s", "model": "m"})
    out = BatchSubmitter(spec, "http://127.0.0.1:9", time.time()).run()
    assert out["status"] == "submit failed" and "ConnectError" in out["error"]


def test_a_fleet_batch_needs_the_router():
    from controlplane.fleet import load_fleet_config

    trigger = {"type": "prometheus",
               "metadata": {"serverAddress": "http://x", "query": "q", "threshold": "1"}}
    so = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "a"},
          "spec": {"scaleTargetRef": {"name": "a"}, "triggers": [trigger]}}
    plain = {"arrivals": {"rate": 1}, "duration": 5}
    fleet = {"emulate": "h100-llama2-70b-tp4", "max_replicas": 2, "autoscaler": so,
             "load": {**plain, "batch": {"lines": 2, "completion_window": "1h"}}}
    with pytest.raises(ValueError, match="load.batch: a load with a batch needs the fleet's router"):
        load_fleet_config(fleet)
    with pytest.raises(ValueError, match="batch_engine_priority: the router's batch lines need"):
        load_fleet_config({**fleet, "load": plain, "batch_engine_priority": 1})
    cfg = load_fleet_config({**fleet, "router": True, "batch_engine_priority": 1})
    assert cfg.batch_engine_priority == 1 and cfg.load.batch.lines == 2
