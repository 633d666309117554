"""`fleet up` of a P/D fleet: a prefill pool and a decode pool of emulated engines with KV transfer,
the router in P/D mode in front, one Prometheus scraping both pools by their `fleet` label, the
prefill pool's autoscaler reading only its own pool, the dashboard a row per pool; and the FLEET.yaml
errors of a `pd:` block, each naming its field."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from controlplane.fleet import load_fleet_config
from controlplane.pdrun import PDLocalRun
from slopilot.cli import main
from slopilot.commands.fleet import serve_flags
from tests.server_helpers import metric, wait_for

MODEL = "llama-3.1-70b@h100-sxm-tp4-bf16"  # derived: it knows its KV bytes per token


def spec(name: str, target: str, query: str) -> dict:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"name": target}, "pollingInterval": 1, "minReplicaCount": 1,
                     "maxReplicaCount": 2,
                     "triggers": [{"type": "prometheus", "name": "queue",
                                   "metadata": {"query": query, "threshold": "1000"}}]}}


FLEET = {"name": "pde2e", "emulate": MODEL, "drain_timeout": 2, "scrape_interval": 1,
         "engine": {"max_num_seqs": 16},
         "pd": {"threshold": 64, "kv_connector_extra_config": {"link": "tcp"},
                "prefill": {"replicas": 1, "autoscaler": spec("prefill-q", "pde2e-prefill",
                                                              'sum(vllm:num_requests_waiting{fleet="pde2e-prefill"})')},
                "decode": {"replicas": 1}}}


def prom(url: str, query: str) -> list[dict]:
    r = httpx.get(url + "/api/v1/query", params={"query": query}, timeout=10, trust_env=False)
    return r.json()["data"]["result"]


@pytest.mark.timeout(240)
def test_pd_fleet_up_routes_two_hops_and_shows_both_pools(tmp_path):
    with PDLocalRun(load_fleet_config(FLEET, engine_flags=serve_flags(), check_model=True), tmp_path,
                    with_load=False) as run:
        (p_url,), (d_url,) = run.pools["prefill"].endpoints(), run.pools["decode"].endpoints()
        assert {"router", "prefill replicas", "decode replicas"} <= set(run.urls())
        model = httpx.get(run.router.url + "/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
        long_prompt, short_prompt = "the quick brown fox " * 100, "hi there"  # 2,000 and 8 tokens (bytes)
        for prompt in (long_prompt, short_prompt, long_prompt[::-1]):
            got = httpx.post(run.router.url + "/v1/completions", timeout=60, trust_env=False,
                             json={"model": model, "prompt": prompt, "max_tokens": 8})
            assert got.status_code == 200, got.text
            assert got.json()["usage"]["completion_tokens"] == 8
        r = run.router.url
        assert metric(r, "slopilot_router_pd_decisions_total", decision="disaggregated") == 2
        assert metric(r, "slopilot_router_pd_decisions_total", decision="aggregated") == 1
        # the long prompts were computed by the prefill pool, their KV moved to the decode pool
        assert metric(p_url, "vllm:prompt_tokens_total") >= 2 * 2000
        assert metric(d_url, "vllm:nixl_bytes_transferred_count") == 2
        assert metric(d_url, "vllm:nixl_bytes_transferred_sum") > 0
        assert wait_for(lambda: metric(p_url, "vllm:kv_cache_usage_perc") == 0.0
                        and metric(d_url, "vllm:kv_cache_usage_perc") == 0.0, timeout=10)
        # one Prometheus scrapes both pools, told apart by their fleet label
        pu = run.prometheus.url
        assert wait_for(lambda: {s["metric"].get("fleet") for s in prom(pu, "up == 1")}
                        >= {"pde2e-prefill", "pde2e-decode"}, timeout=30)
        assert wait_for(lambda: prom(pu, 'sum(vllm:prompt_tokens_total{fleet="pde2e-prefill"})') != [],
                        timeout=30)
        # the prefill pool's autoscaler runs on its pool; the dashboard has a row per pool
        assert wait_for(lambda: run.pool_loops["prefill"].last_step is not None, timeout=30)
        time.sleep(1.5)  # a scrape more, so the dashboard reads both pools' counters
        run.dashboard.refresh()
        frame = run.dashboard.text()
        for cell in ("pde2e-prefill", "pde2e-decode", "prefill-q"):
            assert cell in frame, frame
        assert run.pools["prefill"].replicas().ready == 1 and run.pools["decode"].replicas().ready == 1
    summary = run.summary()
    assert summary["pools"]["prefill"]["autoscaler"] == "prefill-q"
    assert summary["pools"]["decode"]["autoscaler"] is None
    assert (tmp_path / "decisions-pde2e-prefill.csv").is_file()
    assert not run.pools["prefill"].processes() and not run.pools["decode"].processes()


@pytest.mark.slow  # ~20 s: a second fleet; the run above covers what it starts
@pytest.mark.timeout(180)
def test_fleet_up_cli_starts_a_pd_fleet(tmp_path, capsys):
    import yaml

    fleet = {**FLEET, "pd": {**FLEET["pd"], "prefill": {"replicas": 1}}}  # no autoscaler at all
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    assert main(["fleet", "up", str(tmp_path / "fleet.yaml"), "--out", str(tmp_path / "out"),
                 "--duration", "3", "--no-dashboard"]) == 0
    err = capsys.readouterr().err
    for line in ("starting P/D fleet pde2e: pde2e-prefill: 1 replica(s) (fixed), pde2e-decode: 1 replica(s)",
                 "  router: http://127.0.0.1:", "  prefill replicas: http://127.0.0.1:",
                 "  decode replicas: http://127.0.0.1:"):
        assert line in err, err
    assert (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.update(replicas=2), "fleet.yaml:.*replicas: belongs in pd.prefill and pd.decode"),
    (lambda f: f["pd"].pop("decode"), "decode"),
    (lambda f: f["pd"]["decode"].update(engine={"kv_transfer_config": "{}"}),
     "pd.decode.engine.kv_transfer_config: is set by the fleet"),
    (lambda f: f["pd"]["prefill"].update(replicas=3, max_replicas=2), "pd.prefill.replicas: must be within"),
    (lambda f: f["pd"]["prefill"].update(engine={"max_num_seq": 4}),
     "pd.prefill.engine.max_num_seq: is not a `slopilot serve` flag \\(did you mean max_num_seqs\\?\\)"),
    (lambda f: f["pd"].update(threshold=-1), "pd.threshold"),
])
def test_pd_block_errors_name_the_field(tmp_path, edit, message):
    import copy

    import yaml

    fleet = copy.deepcopy(FLEET)
    edit(fleet)
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    with pytest.raises(ValueError, match=message):
        load_fleet_config(tmp_path / "fleet.yaml", engine_flags=serve_flags())


def test_the_example_pd_fleet_loads():
    from pathlib import Path

    cfg = load_fleet_config(Path(__file__).resolve().parents[2] / "examples" / "fleet_pd.yaml",
                            engine_flags=serve_flags(), check_model=True)
    p, d = cfg.pd.prefill, cfg.pd.decode
    assert (cfg.pd.threshold, p.name, p.replicas, p.max_replicas, d.name, d.replicas) == \
        (256, "pd-local-prefill", 1, 2, "pd-local-decode", 2)
    assert p.autoscaler.name == "pd-local-prefill-queue" and d.autoscaler is None
    for pool, role in ((p, "kv_producer"), (d, "kv_consumer")):
        args = pool.serve_args(8000)
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "TcpConnector", "kv_connector_extra_config": {"link": "rdma"},
                      "kv_role": role}
        assert args[args.index("--max-num-seqs") + 1] == "64"
    assert cfg.load is not None and cfg.router is not None
