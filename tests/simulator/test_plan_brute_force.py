"""`slopilot plan` on a small plan (2 GPU types x 2 tensor-parallel degrees x 2 max_num_seqs, a short
curve) against `slopilot simulate` runs with the same seeds:

- the static fleet at the peak equals the exhaustive search (every count from 1 up) and its cost;
- each policy's cost per day and attainment equal a simulate run of the same curve;
- the capacity is tight: every seed meets at it, and a run 1.05x above it misses.

The scenarios come from the plan's own scenarios/ folder, checked first to hold what plan.json says
(the peak rate, the candidate's model and engine settings, the seeds' runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simulator.planner.verdict import meets
from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [1, 2]
GRID = [(gpu, tp, price) for gpu, price in (("h100", 3.0), ("a100", 1.8)) for tp in (4, 8)]
DEPLOYMENTS = "\n".join(
    f"  - {{name: {gpu}-tp{tp}, latency_model: {gpu}-llama2-70b-tp{tp}, price_per_gpu_hour: {price}, "
    f"max_model_len: 16384, prefix_caching: false}}" for gpu, tp, price in GRID)
PLAN = f"""
name: small
seeds: {SEEDS}
duration: 3600
compress: 12
workload:
  arrivals: {{process: gamma, cv: 1.09, diurnal: {{mean: 3, amplitude: 0.5, period: 3600}}}}
  prompt_tokens: {{dist: lognormal, mean: 1155, median: 1020, max: 8000}}
  output_tokens: {{dist: lognormal, mean: 211, median: 129, max: 2048}}
slo:
  ttft: {{percentile: 90, seconds: 2.0}}
  tpot: {{percentile: 90, seconds: 0.1}}
startup_delay: 30
deployments:
{DEPLOYMENTS}
engine:
  max_num_seqs: [16, 64]
policies:
  - name: slo-model
    spec: {ROOT / "examples" / "slo_model_spec.yaml"}
search: {{duration: 60, drain: 120, start_rate: 2.0}}
"""


def run_plan(root: Path, text: str) -> tuple[Path, dict]:
    """`slopilot plan` of the plan text in root, in this process: its output folder and plan.json."""
    (root / "plan.yaml").write_text(text)
    assert main(["plan", str(root / "plan.yaml"), "--out", str(root / "out"), "--workers", "1",
                 "--no-progress"]) == 0
    return root / "out", json.loads((root / "out" / "plan.json").read_text())


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    return run_plan(tmp_path_factory.mktemp("plan"), PLAN)


def scenario(out: Path, candidate: str, what: str) -> dict:
    name = f"{candidate}-{what}".replace("/", "_").replace("=", "") + ".yaml"
    return yaml.safe_load((out / "scenarios" / name).read_text())


def folder(*parts) -> str:
    return "-".join(str(p) for p in parts).replace("/", "_")


def simulate(sc: dict, seed: int, tmp: Path) -> dict:
    """`slopilot simulate` of the scenario (written to a file) with this seed; its summary.json."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sc.yaml").write_text(yaml.safe_dump(sc))
    assert main(["simulate", str(tmp / "sc.yaml"), "--out", str(tmp / "run"), "--seed", str(seed),
                 "--no-plots", "--no-progress"]) in (0, 1)
    return json.loads((tmp / "run" / "summary.json").read_text())


def test_small_plan_has_every_candidate(planned):
    _, result = planned
    names = [c["name"] for c in result["candidates"]]
    assert len(names) == 8 and len(set(names)) == 8
    assert {(c["latency_model"], c["engine"]["max_num_seqs"]) for c in result["candidates"]} == {
        (f"{gpu}-llama2-70b-tp{tp}", m) for gpu, tp, _ in GRID for m in (16, 64)}
    assert result["answer"]["met"] and result["answer"]["text"].startswith(
        f"{result['answer']['replicas_at_peak']} replica")


def test_static_fleet_equals_exhaustive_simulate_runs(planned, tmp_path):
    out, result = planned
    for c in result["candidates"]:
        peak = scenario(out, c["name"], "peak")
        pool = peak["pools"][0]
        assert peak["workload"]["arrivals"]["rate"] == result["workload"]["peak_rps"]
        assert pool["latency_model"] == c["latency_model"]
        assert pool["max_num_seqs"] == c["engine"]["max_num_seqs"]
        smallest = None
        for n in range(1, c["static"]["replicas"] + 1):  # every count up to the plan's answer
            sc = {**peak, "pools": [{**pool, "replicas": n}]}
            runs = []
            for seed in SEEDS:
                runs.append(simulate(sc, seed, tmp_path / folder(c["name"], n, seed)))
                if not meets(runs[-1]):
                    break
            if all(meets(s) for s in runs):
                smallest = n
                break
        assert smallest == c["static"]["replicas"], c["name"]
        assert runs[0]["costs"]["per_hour_at_peak"] == pytest.approx(c["static"]["cost_per_hour"])
        assert c["static"]["cost_per_hour"] == pytest.approx(
            smallest * c["gpus_per_replica"] * c["price_per_gpu_hour"])
        assert min(s["slo_attainment_joint"] for s in runs) == c["static"]["attainment_at_peak"]


def test_policy_costs_equal_simulate_runs(planned, tmp_path):
    out, result = planned
    per_day = 86400 / 3600 * 12  # the plan's curve, compressed 12x, scaled to a day
    ran = 0
    for c in result["candidates"]:
        for name, p in c["policies"].items():
            s = simulate(scenario(out, c["name"], name), SEEDS[0], tmp_path / folder(c["name"], name))
            assert s["costs"]["during_workload"] * per_day == pytest.approx(p["cost_per_day"])
            assert s["slo_attainment_joint"] == p["attainment"]
            assert meets(s) == p["met"]
            ran += 1
    assert ran == 4  # the cheapest engine setting of each of the 4 deployments


def test_capacity_is_tight(planned, tmp_path):
    out, result = planned
    for c in result["candidates"]:
        cap = c["capacity"]
        at, above = scenario(out, c["name"], "capacity"), scenario(out, c["name"], "capacity-next")
        assert at["workload"]["arrivals"]["rate"] == cap["rps"] > 0
        assert above["workload"]["arrivals"]["rate"] == pytest.approx(1.05 * cap["rps"])
        assert at["pools"][0]["replicas"] == 1
        for seed in SEEDS:
            assert meets(simulate(at, seed, tmp_path / folder(c["name"], "at", seed))), c["name"]
        assert cap["next_missed_by"], c["name"]
        seed = cap["next_missed_by"][0]
        assert not meets(simulate(above, seed, tmp_path / folder(c["name"], "above"))), c["name"]
        assert cap["spread"]["min"] <= cap["rps"] <= cap["spread"]["max"]
