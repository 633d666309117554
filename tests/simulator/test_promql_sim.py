"""PromQL in the simulator: trigger queries answered by the evaluator over the scraped series,
staleness of gone replicas, the endpoint picker's and kube-state-metrics' series, recording rules
(llm-d's SLO-aware rules and KEDA formula scale a pool), load-time refusals, export and query."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import simulator.autoscaling as autoscaling
from promql import Evaluator, compile_query
from simulator.metrics import keep_all_samples
from simulator.run import simulate
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def keda_scenario(query: str = "sum(vllm:num_requests_running)", threshold: str = "8") -> dict:
    return {
        "seed": 2, "duration": 600,
        "workload": {"arrivals": {"piecewise": [[0, 1], [120, 1], [150, 6], [360, 6], [420, 1], [600, 1]]},
                     "prompt_tokens": {"dist": "lognormal", "mean": 600, "median": 500, "max": 4000},
                     "output_tokens": {"dist": "lognormal", "mean": 120, "median": 90, "max": 1024}},
        "pools": [{
            "name": "decode", "latency_model": "h100-llama2-70b-tp4", "replicas": 1, "prefix_caching": False,
            "kv_memory": {"gpu_memory_gib": 74.5, "num_gpus": 4, "weights_gib": 130.4,
                          "kv_bytes_per_token": 327680},
            "provisioning_delay": 20,
            "autoscaler": {"spec": {
                "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "q"},
                "spec": {"scaleTargetRef": {"name": "decode"}, "pollingInterval": 15, "minReplicaCount": 1,
                         "maxReplicaCount": 6,
                         "advanced": {"horizontalPodAutoscalerConfig": {
                             "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}},
                         "triggers": [{"type": "prometheus", "name": "t",
                                       "metadata": {"query": query, "threshold": threshold}}]}}},
        }],
        "router": {"policy": "least_outstanding"},
        "metrics": {"scrape_interval": 5, "rate_window": 60},
    }


@pytest.fixture(scope="module")
def keda_run():
    """A run whose every trigger read is kept: (fleet, [(time, metrics, errors)])."""
    seen = []
    original = autoscaling.trigger_values

    def spy(fleet, queries, t, obs):
        original(fleet, queries, t, obs)
        seen.append((t, dict(obs.metrics), set(obs.errors)))

    autoscaling.trigger_values = spy
    try:
        with keep_all_samples():
            res = simulate(load_scenario(keda_scenario()), plots=False)
    finally:
        autoscaling.trigger_values = original
    return res.fleet, seen


def test_triggers_read_the_promql_answer_at_each_poll(keda_run):
    fleet, seen = keda_run
    tree = compile_query("sum(vllm:num_requests_running)")
    ev = Evaluator(fleet.store)
    assert len(seen) >= 40
    for t, metrics, errors in seen:
        # a poll runs before the scrape of the same instant: it saw the samples up to 1 ms before
        answer = ev.eval(tree, round(t * 1000) - 1)
        assert not errors and metrics["t"] == (answer[0][1] if answer else None), t
    assert max(m["t"] or 0 for _, m, _ in seen) > 8 and len(fleet.pools[0].scale_events) >= 2


def test_a_gone_replica_is_stale_at_the_next_scrape_but_stays_in_ranges(keda_run):
    fleet, _ = keda_run
    gone = [r for r in fleet.pools[0].replicas if r.gone_at is not None]
    assert gone, "the run scales down"
    rep = gone[0]
    t_gone = rep.gone_at / 1e12
    nxt = (int(t_gone // 5) + 1) * 5  # the scrape round after it went
    pod = f'{{pod="decode-{rep.id}"}}'
    ev = Evaluator(fleet.store)
    before = ev.eval(compile_query(f"vllm:num_requests_running{pod}"), round((nxt - 0.001) * 1000))
    after = ev.eval(compile_query(f"vllm:num_requests_running{pod}"), nxt * 1000)
    kept = ev.eval(compile_query(f"count_over_time(vllm:num_requests_running{pod}[1m])"), nxt * 1000)
    assert len(before) == 1 and after == [] and kept and kept[0][1] >= 1


def test_kube_state_metrics_and_the_endpoint_pickers_histograms(keda_run):
    fleet, _ = keda_run
    ev = Evaluator(fleet.store)
    end = fleet.end_time_ps // 10**12 // 5 * 5 * 1000  # the last scrape round
    ready = ev.eval(compile_query('kube_deployment_status_replicas_ready{deployment="decode"}'), end)
    assert ready[0][1] == fleet.pools[0].count("ready")
    log = fleet.requests
    count = ev.eval(compile_query("llm_d_epp_request_streaming_tpot_seconds_count"), end)[0][1]
    assert count == ((log.status == 1) & (log.generated > 1)).sum()
    ttft = ev.eval(compile_query("llm_d_epp_request_ttft_seconds_count"), end)[0][1]
    assert ttft == (log.first_token >= 0).sum()
    inf = ev.eval(compile_query('llm_d_epp_request_ttft_seconds_bucket{le="+Inf"}'), end)[0][1]
    assert inf == ttft


def test_a_query_with_several_series_is_a_trigger_error():
    seen = []
    original = autoscaling.trigger_values

    def spy(fleet, queries, t, obs):
        original(fleet, queries, t, obs)
        seen.append(set(obs.errors))

    autoscaling.trigger_values = spy
    try:
        sc = load_scenario(keda_scenario("vllm:num_requests_running"))
        sc.duration = 300
        simulate(sc, plots=False)
    finally:
        autoscaling.trigger_values = original
    assert {"t"} in seen and set() in seen  # one replica: a value; several: KEDA's error


@pytest.mark.parametrize("query, named", [
    ("limitk(1, vllm:num_requests_waiting)", "aggregation limitk()"),
    ("mad_over_time(vllm:num_requests_waiting[5m])", "function mad_over_time()"),
    ("vllm:num_requests_waiting[5m]", "range vector"),
    ("sum(vllm:num_requests_waiting", "does not parse"),
])
def test_unsupported_trigger_queries_are_refused_at_load(query, named):
    with pytest.raises(ValueError, match=r"pools\[0\]\.autoscaler: trigger 't': .*" + named.replace(
            "(", r"\(").replace(")", r"\)")):
        load_scenario(keda_scenario(query))


def _rules_file(tmp_path, text: str) -> dict:
    (tmp_path / "rules.yaml").write_text(text)
    sc = keda_scenario()
    sc["metrics"]["rule_files"] = [str(tmp_path / "rules.yaml")]
    return sc


@pytest.mark.parametrize("text, message", [
    ("groups: [{name: g, rules: [{expr: up}]}]", r"rule_files\[0\]: .*rules\[0\]\.record"),
    ("groups: [{name: g, rules: [{alert: High, expr: up > 1}]}]", "alerting rule 'High'"),
    ("groups: [{name: g, rules: [{record: r, expr: 'limitk(1, up)'}]}]", r"rules\[0\]\.expr: .*limitk"),
    ("groups: [{name: g, interval: soon, rules: []}]", r"groups\[0\]\.interval"),
    ("groups: [{name: g}, {name: g}]", "defined twice"),
    ("rules: []", "a list of groups"),
    ("groups: [{name: g, interval: 10ms, rules: []}]", "interval 10 ms is less than the limit"),
])
def test_rule_file_errors_name_the_file_and_field(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_scenario(_rules_file(tmp_path, text))


def test_recording_rules_run_at_their_interval_with_labels_and_staleness(tmp_path):
    sc = _rules_file(tmp_path, """
groups:
  - name: pool
    interval: 10s
    rules:
      - record: pool:running:sum
        expr: sum(vllm:num_requests_running)
        labels: {team: llm}
      - record: pod:running:busy
        expr: vllm:num_requests_running > 5
      - record: pool:running:doubled
        expr: pool:running:sum * 2
""")
    with keep_all_samples():
        fleet = simulate(load_scenario(sc), plots=False).fleet
    recorded = fleet.store.recorded
    (total,) = recorded.by_name["pool:running:sum"]
    assert dict(total.labels) == {"__name__": "pool:running:sum", "team": "llm"}
    assert all(t % 10_000 == 0 for t in total.ts) and total.ts[1] - total.ts[0] == 10_000
    (doubled,) = recorded.by_name["pool:running:doubled"]
    assert doubled.vs == [2 * v for v in total.vs]  # later rules read earlier ones at the same instant
    busy = recorded.by_name["pod:running:busy"]
    assert busy and any(s.stale for s in busy)  # a pod that stops being busy gets a staleness marker
    ev = Evaluator(fleet.store)
    for s in busy:
        t = s.stale[0]
        assert all(lb != s.labels for lb, _ in ev.eval(compile_query("pod:running:busy"), t))


def llmd(tmp_path, tpot_slo: float | None = None):
    """The llm-d example, shortened (2 -> 10 -> 1 req/s over 40 minutes)."""
    d = yaml.safe_load((EXAMPLES / "llmd_slo_aware.yaml").read_text())
    d["duration"] = 2400
    d["workload"]["arrivals"]["piecewise"] = [[0, 2], [300, 2], [360, 10], [1200, 10], [1260, 1], [2400, 1]]
    if tpot_slo is not None:  # the guide's first tunable: the SLO targets in the recording rules
        rules = (EXAMPLES / "llmd" / "slo-aware-rules.yaml").read_text()
        assert rules.count("/ 0.1)") == 2
        (tmp_path / "rules.yaml").write_text(rules.replace("/ 0.1)", f"/ {tpot_slo})"))
        d["metrics"]["rule_files"] = [str(tmp_path / "rules.yaml")]
    with keep_all_samples():  # the test reads the whole signal afterwards
        return simulate(load_scenario(d, base_dir=EXAMPLES), plots=False).fleet


def test_llmd_slo_aware_rules_and_formula_scale_the_pool_as_published(tmp_path):
    fleet = llmd(tmp_path)
    pool = fleet.pools[0]
    ev = Evaluator(fleet.store)
    signal = [ev.eval(compile_query("epp:saturation:smoothed"), t * 1000) for t in range(60, 2400, 60)]
    assert all(len(s) == 1 for s in signal)
    assert max(s[0][1] for s in signal) > 0.55  # the load step breaches the band's top
    ups = [(t, a, b) for t, a, b in pool.scale_events if b > a]
    assert ups and ups[0][0] >= 360 and ups[0][1] == 3  # from the floor, after the step
    assert max(b for _, _, b in pool.scale_events) == 8  # up to the cap
    assert any("hpa" in r for _, _, r in pool.decisions)


def test_llmd_drains_back_when_the_tpot_slo_is_retuned(tmp_path):
    pool = llmd(tmp_path, tpot_slo=0.15).pools[0]
    peak = max(b for _, _, b in pool.scale_events)
    assert peak > 3 and pool.desired < peak
    downs = [t for t, a, b in pool.scale_events if b < a]
    assert any(t > 1260 for t in downs)  # one pod at a time after the load fell (HPA: 1 pod / 120 s)


def test_export_series_and_query_from_the_command_line(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(keda_scenario()))
    run = [sys.executable, "-m", "slopilot.cli"]
    out = subprocess.run([*run, "simulate", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"),
                          "--no-plots", "--export-series", "--duration", "200"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "out" / "series.om").read_text()
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text and text.endswith("# EOF\n")
    q = subprocess.run([*run, "query", str(tmp_path / "out"), "sum by (job) (vllm:num_requests_running)",
                        "--time", "100"], cwd=ROOT, capture_output=True, text=True)
    assert q.returncode == 0, q.stderr
    answer = json.loads(q.stdout)
    assert answer["status"] == "success" and answer["data"]["resultType"] == "vector"
    assert answer["data"]["result"][0]["metric"] == {"job": "decode"}
    bad = subprocess.run([*run, "query", str(tmp_path / "out"), "limitk(1, up)", "--time", "1"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "limitk()" in bad.stderr
