"""A trigger whose query matches no series is said, not read as zero (issue: a ScaledObject filtering on
`{model_name="llama-70b"}` while the simulated engines label `llama2-70b` held the fleet at 2 replicas
with 7,700 requests waiting, and `plan` ranked it). simulate and compare print it with the label values
that exist and a "did you mean"; plan marks the policy invalid instead of ranking it; a pool's
`labels` set what its engines export."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from promql import compile_query
from promql.parse import Selector
from promql.tree import walk
from simulator.run import simulate
from simulator.trigger_watch import selector_hint
from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
TYPO = 'sum(vllm:num_requests_waiting{model_name="llama-70b"})'
MESSAGE = ("warning: pool h100: trigger 'queue' matched nothing over the whole run "
           '(sum(vllm:num_requests_waiting{model_name="llama-70b"})): vllm:num_requests_waiting has '
           'model_name="llama2-70b", none model_name="llama-70b" (did you mean model_name="llama2-70b"?)')


def scenario(query: str = TYPO, labels: dict | None = None, duration: int = 300) -> dict:
    sc = yaml.safe_load((ROOT / "examples" / "keda_queue.yaml").read_text())
    sc["duration"] = duration
    sc["workload"]["arrivals"] = {"rate": 4}
    pool = sc["pools"][0]
    pool["autoscaler"]["spec"]["spec"]["triggers"][0]["metadata"]["query"] = query
    if labels:
        pool["labels"] = labels
    return sc


def test_simulate_says_which_trigger_matched_nothing_and_what_exists(tmp_path, capsys):
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(scenario()))
    assert main(["simulate", str(tmp_path / "sc.yaml"), "--out", str(tmp_path / "out"), "--no-plots",
                 "--no-progress"]) in (0, 1)
    assert capsys.readouterr().out.splitlines()[0] == MESSAGE
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [w["trigger"] for w in summary["unmatched_triggers"]] == ["queue"]


def test_a_query_that_matches_is_not_reported_and_pool_labels_are_exported():
    fine = simulate(scenario("sum(vllm:num_requests_waiting)"), plots=False)
    assert fine.summary["unmatched_triggers"] == []
    labels = {"model_name": "llama-70b", "namespace": "serving", "pod": "vllm-{replica}"}
    res = simulate(scenario(TYPO, labels), plots=False)
    assert res.summary["unmatched_triggers"] == []
    seen = {dict(c.labels)["pod"]: dict(c.labels) for t in res.fleet.store.targets.targets.values()
            for c in t.columns if dict(c.labels).get("__name__") == "vllm:num_requests_waiting"}
    assert seen and all(p.startswith("vllm-") for p in seen)
    assert {(d["model_name"], d["namespace"]) for d in seen.values()} == {("llama-70b", "serving")}


def test_hints_for_a_misspelled_metric_and_a_filter():
    labels = [(("__name__", "vllm:num_requests_waiting"), ("model_name", "m"))]
    sel = next(n for n in walk(compile_query("sum(vllm:num_request_waiting)")) if isinstance(n, Selector))
    assert selector_hint(sel, labels) == ("no series is named vllm:num_request_waiting "
                                          "(did you mean vllm:num_requests_waiting?)")
    res = simulate(scenario("sum(vllm:num_requests_waiting) > 1e9"), plots=False)
    assert res.summary["unmatched_triggers"][0]["hint"] == \
        "its series exist, but the query filtered every sample out"


def test_compare_prints_the_warning_for_the_spec(tmp_path, capsys):
    sc = scenario()
    spec = sc["pools"][0].pop("autoscaler")["spec"]
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(spec))
    main(["compare", str(tmp_path / "sc.yaml"), "--spec", str(tmp_path / "typo.yaml"), "--out",
          str(tmp_path / "out"), "--no-bounds", "--no-plots", "--no-progress", "--workers", "1"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("warning: llama-queue: pool h100: trigger 'queue' matched nothing") and \
        'did you mean model_name="llama2-70b"?' in first


PLAN = f"""name: typo
seeds: [1]
duration: 3600
compress: 12
workload:
  arrivals: {{diurnal: {{mean: 2, amplitude: 0.5, period: 3600}}}}
  prompt_tokens: {{dist: lognormal, mean: 1155, median: 1020, max: 8000}}
  output_tokens: {{dist: lognormal, mean: 211, median: 129, max: 2048}}
slo:
  ttft: {{percentile: 90, seconds: 2.0}}
startup_delay: 30
deployments:
  - {{name: h100-tp8, latency_model: h100-llama2-70b-tp8, price_per_gpu_hour: 3.0, max_model_len: 16384,
      prefix_caching: false}}
policies:
  - name: typo
    spec:
      apiVersion: keda.sh/v1alpha1
      kind: ScaledObject
      metadata: {{name: q}}
      spec:
        scaleTargetRef: {{name: llama}}
        minReplicaCount: 1
        maxReplicaCount: 8
        triggers:
          - type: prometheus
            name: queue
            metadata: {{query: '{TYPO}', threshold: "5"}}
search: {{duration: 60, peak_duration: 60, check_duration: 60, drain: 120, start_rate: 2.0}}
"""


def test_plan_marks_the_policy_invalid_instead_of_ranking_it(tmp_path, capsys):
    (tmp_path / "plan.yaml").write_text(PLAN)
    assert main(["plan", str(tmp_path / "plan.yaml"), "--out", str(tmp_path / "out"), "--workers", "1",
                 "--no-progress", "--no-plots"]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [o["policy"] for o in result["ranking"]] == [None]  # the static fleet only
    assert result["invalid"] == [{"candidate": "h100-tp8", "policy": "typo", "reason": (
        'trigger queue matched nothing (vllm:num_requests_waiting has model_name="llama2-70b", none '
        'model_name="llama-70b" (did you mean model_name="llama2-70b"?))')}]
    assert ('invalid: h100-tp8 typo: trigger queue matched nothing (vllm:num_requests_waiting has '
            'model_name="llama2-70b"') in out
    assert "invalid: trigger queue matched nothing" in (tmp_path / "out" / "report.html").read_text()
    assert "autoscaled with policy typo" not in result["answer"]["text"]
