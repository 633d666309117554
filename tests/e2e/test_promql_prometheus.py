"""`slopilot query` answers as a real Prometheus does.

A simulated run (a KEDA-scaled pool: replicas come and go, so series start, stop and carry gaps)
writes its series with --export-series; hand-made families add the edge cases a run does not make
(counter resets, NaN and Inf samples, empty and non-monotonic buckets, a histogram without +Inf, a
series silent for longer than the lookback). `promtool tsdb create-blocks-from openmetrics`
backfills the file into the Debian Prometheus, started here; then every query below is asked of
both at 100+ instants through /api/v1/query (and the range API once per query) and the answers must
agree to 1e-9 relative (both empty or both NaN count as equal)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from promql import instant_query, range_query
from promql.openmetrics import read_openmetrics

ROOT = Path(__file__).resolve().parents[2]
EVAL_INTERVAL = 60.0  # the server's global evaluation_interval: the default subquery step, as ours
START, END, STEP = 20_000, 1_210_000, 10_000  # ms: 120 instants, past the run's end into staleness

SCENARIO = """
name: promql-check
seed: 5
duration: 900
workload:
  arrivals:
    piecewise: [[0, 1], [200, 1], [300, 6], [600, 6], [700, 1], [900, 1]]
  prompt_tokens: {dist: lognormal, mean: 600, median: 500, max: 4000}
  output_tokens: {dist: lognormal, mean: 120, median: 90, max: 1024}
pools:
  - name: decode
    latency_model: h100-llama2-70b-tp4
    replicas: 1
    kv_memory: {gpu_memory_gib: 74.5, num_gpus: 4, weights_gib: 130.4, kv_bytes_per_token: 327680}
    prefix_caching: false
    provisioning_delay: 30
    autoscaler:
      spec:
        apiVersion: keda.sh/v1alpha1
        kind: ScaledObject
        metadata: {name: q}
        spec:
          scaleTargetRef: {name: decode}
          pollingInterval: 15
          minReplicaCount: 1
          maxReplicaCount: 6
          advanced:
            horizontalPodAutoscalerConfig:
              behavior: {scaleDown: {stabilizationWindowSeconds: 30}}
          triggers:
            - type: prometheus
              name: running
              metadata: {query: sum(vllm:num_requests_running), threshold: "8"}
router: {policy: least_outstanding}
metrics: {scrape_interval: 5, rate_window: 60}
"""

TTFT = "vllm:time_to_first_token_seconds_bucket"
QUERIES = [
    # KEDA's and vLLM's usual autoscaling queries
    "sum(vllm:num_requests_waiting)",
    "sum(vllm:num_requests_running)",
    "avg(vllm:kv_cache_usage_perc)",
    "max by (pod) (vllm:num_requests_running)",
    "sum(rate(vllm:request_success_total[1m]))",
    "sum(rate(vllm:generation_tokens_total[30s]))",
    "sum(increase(vllm:prompt_tokens_total[2m]))",
    "irate(vllm:generation_tokens_total[1m])",
    f"histogram_quantile(0.9, sum(rate({TTFT}[1m])) by (le))",
    "histogram_quantile(0.99, sum by (le, pod) (rate(vllm:e2e_request_latency_seconds_bucket[2m])))",
    "histogram_quantile(0.5, rate(vllm:inter_token_latency_seconds_bucket[1m]))",
    "sum(rate(vllm:request_prompt_tokens_sum[1m])) / sum(rate(vllm:request_prompt_tokens_count[1m]))",
    "rate(vllm:time_to_first_token_seconds_sum[1m]) / rate(vllm:time_to_first_token_seconds_count[1m])",
    'max(kube_deployment_status_replicas{namespace="default",deployment="decode"})',
    "kube_deployment_status_replicas_ready / kube_deployment_spec_replicas",
    # llm-d's SLO-aware recording rules, as published (predicted series absent: the fallback answers)
    "((histogram_quantile(0.9, sum(rate(llm_d_epp_request_predicted_ttft_seconds_bucket[1m])) by (le)) >= 0)"
    " or (histogram_quantile(0.9, sum(rate(llm_d_epp_request_ttft_seconds_bucket[1m])) by (le)) >= 0))"
    " or vector(0)",
    "((histogram_quantile(0.9, sum(rate(llm_d_epp_request_predicted_tpot_seconds_bucket[1m])) by (le)) >= 0)"
    " or (histogram_quantile(0.9, sum(rate(llm_d_epp_request_streaming_tpot_seconds_bucket[1m])) by (le))"
    " >= 0)) or vector(0)",
    "avg_over_time(clamp_max(histogram_quantile(0.9, sum by (le) (rate(llm_d_epp_request_ttft_seconds_bucket"
    "[1m]))) / 3.0, 2.0)[45s:15s])",
    # every function
    "avg_over_time(vllm:num_requests_waiting[1m])",
    "max_over_time(vllm:kv_cache_usage_perc[2m])",
    "min_over_time(vllm:num_requests_running[1m])",
    "sum_over_time(vllm:num_requests_waiting[30s])",
    "count_over_time(vllm:num_requests_running[1m])",
    "last_over_time(vllm:num_requests_running[1m])",
    "quantile_over_time(0.9, vllm:num_requests_running[2m])",
    "stddev_over_time(vllm:kv_cache_usage_perc[1m])",
    "stdvar_over_time(vllm:num_requests_running[1m])",
    "present_over_time(vllm:num_requests_waiting[1m])",
    "clamp_min(sum(vllm:num_requests_waiting), 1)",
    "clamp_max(avg(vllm:kv_cache_usage_perc) * 100, 50)",
    "clamp(sum(vllm:num_requests_running) / 4, 1, 5)",
    "abs(delta(vllm:num_requests_running[1m]))",
    "ceil(sum(vllm:num_requests_running) / 8)",
    "floor(avg(vllm:num_requests_running))",
    "round(avg(vllm:kv_cache_usage_perc), 0.01)",
    "scalar(sum(vllm:num_requests_running)) / 2",
    "sum(vllm:num_requests_waiting) or vector(0)",
    "time() - 20",
    # aggregations, comparisons, bool, set operators, vector matching
    "stddev(vllm:num_requests_running)",
    "quantile(0.5, vllm:num_requests_running)",
    "count(vllm:num_requests_running > 3)",
    "sum without (pod, instance) (vllm:num_requests_running)",
    "vllm:num_requests_waiting > 0",
    "sum(vllm:num_requests_running) > bool 10",
    "vllm:num_requests_running and on(pod) vllm:num_requests_waiting > 0",
    "vllm:num_requests_running unless on(pod) vllm:num_requests_waiting > 0",
    f"rate({TTFT}[1m]) / ignoring(le) group_left rate(vllm:time_to_first_token_seconds_count[1m])",
    "max by (job) (vllm:kv_cache_usage_perc) * on(job) group_right vllm:num_requests_running",
    "-sum(vllm:num_requests_running) % 3 + 2 ^ 2",
    'sum(vllm:num_requests_running{pod=~"decode-[0-3]", pod!="decode-1"})',
    'count(vllm:num_requests_running{pod!~"decode-0"})',
    "vllm:num_requests_running offset 1m",
    'sum(rate(vllm:request_success_total{finished_reason="length"}[1m] offset 30s))',
    # subqueries (with and without a step)
    "avg_over_time(sum(vllm:num_requests_running)[2m:15s])",
    "max_over_time(rate(vllm:generation_tokens_total[1m])[5m:])",
    "rate(sum(vllm:generation_tokens_total)[2m:10s])",  # the sum drops when a replica leaves: a reset
    # edge cases: missing series, resets, NaN/Inf, empty and odd buckets, gaps beyond the lookback
    "sum(no_such_metric)",
    "rate(no_such_metric_total[1m]) or vector(0)",
    "rate(edge_requests_total[30s])",
    "increase(edge_requests_total[1m])",
    "irate(edge_requests_total[20s])",
    "edge_values",
    "max_over_time(edge_values[30s])",
    "avg(edge_values) + sum_over_time(edge_values[20s])",
    "edge_values > 1",
    "histogram_quantile(0.5, rate(edge_latency_seconds_bucket[30s]))",
    "histogram_quantile(0.9, edge_latency_seconds_bucket)",
    "histogram_quantile(1.5, sum by (le) (rate(edge_latency_seconds_bucket[1m])))",
    "edge_gappy",
    "count_over_time(edge_gappy[10m])",
]


def edge_families() -> str:
    """OpenMetrics families for the edge cases, every 5 s over the run."""
    lines = ["# TYPE edge_requests counter"]
    counts = [0, 5, 10, 2, 7, 12, 0, 3, 3, 9]  # two resets each cycle
    lines += [f'edge_requests_total{{pod="r"}} {counts[i % 10] + 20 * (i // 10 % 2)} {5 * i}'
              for i in range(180)]
    lines.append("# TYPE edge_values gauge")
    cycle = ["1", "NaN", "3", "+Inf", "2", "-Inf", "0.5", "NaN"]
    lines += [f'edge_values{{pod="n"}} {cycle[i % 8]} {5 * i}' for i in range(180)]
    lines.append("# TYPE edge_latency_seconds histogram")
    for i in range(180):
        c = i // 20  # flat (empty buckets when rated) for 100 s at a time
        for pod, buckets in (("a", [("0.1", c), ("1.0", 2 * c), ("+Inf", 3 * c)]),
                             ("b", [("0.1", 2 * c), ("1.0", c), ("+Inf", 3 * c)]),  # non-monotonic
                             ("c", [("0.1", c), ("1.0", 2 * c)])):  # no +Inf bucket
            lines += [f'edge_latency_seconds_bucket{{le="{le}",pod="{pod}"}} {v} {5 * i}'
                      for le, v in buckets]
    lines.append("# TYPE edge_gappy gauge")
    lines += [f'edge_gappy{{pod="g"}} {t / 100} {t}' for t in (10, 20, 30, 500, 510, 900)]
    return "\n".join(lines) + "\n"


def same(a: dict, b: dict) -> str | None:
    """None when the two API answers agree, else what differs."""
    if a["resultType"] != b["resultType"]:
        return f"result types {a['resultType']} vs {b['resultType']}"
    if a["resultType"] == "scalar":
        pairs = [((), a["result"], b["result"])]
    else:
        key = "values" if a["resultType"] == "matrix" else "value"
        ours = {tuple(sorted(r["metric"].items())): r[key] for r in a["result"]}
        theirs = {tuple(sorted(r["metric"].items())): r[key] for r in b["result"]}
        if ours.keys() != theirs.keys():
            return f"series {sorted(ours)} vs {sorted(theirs)}"
        pairs = [(k, ours[k], theirs[k]) for k in ours]
    for labels, x, y in pairs:
        xs, ys = (x, y) if isinstance(x[0], list) else ([x], [y])
        if [p[0] for p in xs] != [p[0] for p in ys]:
            return f"{dict(labels)}: times {[p[0] for p in xs]} vs {[p[0] for p in ys]}"
        for (t, u), (_, v) in zip(xs, ys):
            fu, fv = float(u), float(v)
            if not (fu == fv or (math.isnan(fu) and math.isnan(fv))
                    or abs(fu - fv) <= 1e-9 * max(abs(fu), abs(fv))):
                return f"{dict(labels)} at {t}: {u} vs {v}"
    return None


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package: prometheus)")
    d = tmp_path_factory.mktemp("promql")
    (d / "scenario.yaml").write_text(SCENARIO)
    run = subprocess.run([sys.executable, "-m", "slopilot.cli", "simulate", str(d / "scenario.yaml"),
                          "-o", str(d / "run"), "--no-plots", "--export-series"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = (d / "run" / "series.om").read_text()
    assert text.endswith("# EOF\n")
    (d / "all.om").write_text(text[: -len("# EOF\n")] + edge_families() + "# EOF\n")
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(d / "all.om"),
                          str(d / "prom" / "data")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from controlplane.prometheus_server import PrometheusServer

    server = PrometheusServer([], scrape_interval=EVAL_INTERVAL, data_dir=d / "prom").start()
    try:
        with (d / "all.om").open() as f:
            store = read_openmetrics(f, "all.om")
        yield d, server.url, store
    finally:
        server.cleanup()


def test_the_run_exported_what_prometheus_holds(backfilled):
    d, url, store = backfilled
    got = httpx.get(f"{url}/api/v1/query", params={"query": "count({__name__=~'.+'})", "time": "600"},
                    timeout=10).json()["data"]["result"]
    ours = instant_query(store, "count({__name__=~'.+'})", 600_000)["result"]
    assert got and got[0]["value"][1] == ours[0]["value"][1]
    assert int(got[0]["value"][1]) > 300  # a few replicas' series, the EPP's, kube-state-metrics'


def test_slopilot_query_prints_the_api_answer(backfilled):
    d, url, _ = backfilled
    q = "sum(rate(vllm:generation_tokens_total[1m]))"
    out = subprocess.run([sys.executable, "-m", "slopilot.cli", "query", str(d / "all.om"), q,
                          "--start", "60", "--end", "900", "--step", "15s"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ours = json.loads(out.stdout)
    theirs = httpx.get(f"{url}/api/v1/query_range", params={"query": q, "start": 60, "end": 900, "step": 15},
                       timeout=10).json()
    assert ours["status"] == theirs["status"] == "success"
    assert len(ours["data"]["result"][0]["values"]) == 57
    assert same(ours["data"], theirs["data"]) is None


def test_same_answers_as_prometheus(backfilled):
    _, url, store = backfilled
    assert len(QUERIES) >= 40
    instants = list(range(START, END + 1, STEP))
    assert len(instants) >= 100
    failures, nonempty = [], 0
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as client:
        for q in QUERIES:
            theirs = client.get("/api/v1/query_range",
                                params={"query": q, "start": START / 1000, "end": END / 1000,
                                        "step": STEP / 1000}).json()
            assert theirs["status"] == "success", (q, theirs)
            why = same(range_query(store, q, START, END, STEP), theirs["data"])
            if why:
                failures.append(f"{q} (range): {why}")
            for t in instants:
                theirs = client.get("/api/v1/query", params={"query": q, "time": t / 1000}).json()
                assert theirs["status"] == "success", (q, t, theirs)
                why = same(instant_query(store, q, t), theirs["data"])
                if why:
                    failures.append(f"{q} at {t / 1000:g}: {why}")
                    break
                nonempty += bool(theirs["data"]["result"])
    print(f"{len(QUERIES)} queries x {len(instants)} instants in {time.monotonic() - started:.1f} s; "
          f"{nonempty} non-empty answers")
    assert not failures, "\n".join(failures)
    assert nonempty > len(QUERIES) * len(instants) // 2  # mostly real answers, not empty ones
