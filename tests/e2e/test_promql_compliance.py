"""Prometheus' own PromQL compliance query set, expanded with its variants, asked of the evaluator
and of a real Prometheus (Debian's 2.42) over the same data.

The queries are a pinned copy of github.com/prometheus/compliance's promql-test-queries.yml (source,
commit and licence in its header: tests/data/promql_compliance/); its {{.name}} placeholders take
every value of variants.yml, as the compliance tester expands them. The data is generated here,
shaped like the PromLabs demo service the set is written for (three instances scraped every 5 s for
two hours: memory by type, CPU seconds by mode, disk usage, a batch job's last-success timestamp, an
API latency histogram, an intermittent metric, promhttp counters), backfilled with promtool.

Each query is compared as a range query (the last 30 minutes, every minute) and as instant queries
at two times. A query counts as equal when every answer agrees (to 1e-9 relative; both failing
counts as agreeing), refused when the evaluator says it does not support it; any other outcome is
different, and there must be none.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from promql import PromQLError, instant_query, range_query
from promql.openmetrics import read_openmetrics
from tests.e2e.test_promql_builtins_prometheus import same

DATA = Path(__file__).resolve().parents[1] / "data" / "promql_compliance"
HOST = "demo.promlabs.com"
STEP_S, HOURS = 5, 2
END = HOURS * 3600 - STEP_S  # s: the last sample
RANGE = (END - 1800, END, 60)
INSTANTS = (END, END - 1020)


def expanded() -> list[tuple[str, bool]]:
    """(query, should_fail) for every variant, in the compliance tester's order."""
    cases = yaml.safe_load((DATA / "promql-test-queries.yml").read_text())["test_cases"]
    variants = yaml.safe_load((DATA / "variants.yml").read_text())
    out = []
    for case in cases:
        names = case.get("variant_args") or []
        for values in itertools.product(*(variants[n] for n in names)):
            q = case["query"]
            for n, v in zip(names, values):
                q = q.replace("{{.%s}}" % n, v)
            out.append((q, bool(case.get("should_fail"))))
    return out


def demo_service() -> str:
    """OpenMetrics text of three demo-service instances, a sample every 5 s."""
    rng = np.random.default_rng(7)
    n = HOURS * 3600 // STEP_S
    t = np.arange(n) * STEP_S
    fam: dict[tuple[str, str], list[str]] = {}

    def put(family, kind, name, labels, values, times=t):
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        rows = fam.setdefault((family, kind), [])
        rows.extend(f"{name}{{{text}}} {float(v)!r} {s}" for s, v in zip(times, values))

    for i, port in enumerate((10000, 10001, 10002)):
        base = {"instance": f"{HOST}:{port}", "job": "demo"}
        for j, kind in enumerate(("buffers", "cached", "free", "used")):
            v = 1e9 * (1 + j) + 2e8 * np.sin(t / (600 + 100 * i)) + rng.normal(0, 1e6, n)
            put("demo_memory_usage_bytes", "gauge", "demo_memory_usage_bytes", {**base, "type": kind},
                v.round())
        put("demo_num_cpus", "gauge", "demo_num_cpus", base, np.full(n, 4.0 + i))
        for mode, speed in (("idle", 3.2), ("system", 0.3), ("user", 0.5)):
            v = np.cumsum(rng.uniform(0, 2 * speed * STEP_S, n))
            if mode == "user":
                v[n // 2:] -= v[n // 2 - 1]  # a restart: the counter resets once
            put("demo_cpu_usage_seconds", "counter", "demo_cpu_usage_seconds_total", {**base, "mode": mode},
                v)
        disk = (np.cumsum(rng.uniform(0, 2e5, n)) % 5e8) + 1e8
        put("demo_disk_usage_bytes", "gauge", "demo_disk_usage_bytes", base, disk.round())
        last = 1.7e9 + 1e6 * i + (t // 300) * 300  # a batch succeeds every 5 minutes
        put("demo_batch_last_success_timestamp_seconds", "gauge", "demo_batch_last_success_timestamp_seconds",
            base, last.astype(float))
        up = (t // 600 + i) % 3 != 0  # intermittent: 10 minutes away out of every 30
        put("demo_intermittent_metric", "gauge", "demo_intermittent_metric", base,
            np.full(int(up.sum()), 1.0 + i), t[up])
        in_flight = "promhttp_metric_handler_requests_in_flight"
        put(in_flight, "gauge", in_flight, base, np.ones(n))
        for code, share in (("200", 1.0), ("500", 0.02), ("503", 0.0)):
            put("promhttp_metric_handler_requests", "counter", "promhttp_metric_handler_requests_total",
                {**base, "code": code}, np.floor(np.arange(n) * share))
        bounds = ["0.0001", "0.00015", "0.0002", "0.0003", "0.0005", "0.001", "0.005", "0.01", "+Inf"]
        for method, path, status in (("GET", "/api/foo", "200"), ("POST", "/api/foo", "200"),
                                     ("GET", "/api/bar", "200"), ("GET", "/api/bar", "500")):
            lb = {**base, "method": method, "path": path, "status": status}
            count = np.cumsum(rng.poisson(20 if status == "200" else 1, n)).astype(float)
            shares = np.minimum(np.cumsum(rng.dirichlet(np.ones(len(bounds)) * 5, n), axis=1), 1)
            family = ("demo_api_request_duration_seconds", "histogram")
            for k, le in enumerate(bounds):
                cum = count if le == "+Inf" else np.floor(count * shares[:, k])
                put(*family, "demo_api_request_duration_seconds_bucket", {**lb, "le": le}, cum)
            put(*family, "demo_api_request_duration_seconds_count", lb, count)
            put(*family, "demo_api_request_duration_seconds_sum", lb, count * 0.0004)
    lines = []
    for (family, kind), rows in fam.items():
        lines.append(f"# TYPE {family} {kind}")
        lines += rows
    return "\n".join(lines) + "\n# EOF\n"


def _ours(store, q: str):
    """('ok', [answers]) or ('refused', why) or ('error', why)."""
    try:
        answers = [range_query(store, q, RANGE[0] * 1000, RANGE[1] * 1000, RANGE[2] * 1000)]
        answers += [instant_query(store, q, t * 1000) for t in INSTANTS]
        return "ok", answers
    except PromQLError as exc:
        refused = "not supported" in str(exc) or "unknown function" in str(exc)
        return ("refused" if refused else "error"), str(exc)


def _theirs(client, q: str):
    r = client.get("/api/v1/query_range", params={"query": q, "start": RANGE[0], "end": RANGE[1],
                                                   "step": RANGE[2]}).json()
    if r["status"] != "success":
        return "error", r.get("error")
    answers = [r["data"]]
    for t in INSTANTS:
        r = client.get("/api/v1/query", params={"query": q, "time": t}).json()
        if r["status"] != "success":
            return "error", r.get("error")
        answers.append(r["data"])
    return "ok", answers


@pytest.mark.slow
def test_compliance_queries_equal_prometheus(tmp_path):
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package: prometheus)")
    queries = expanded()
    assert len(queries) > 500
    (tmp_path / "demo.om").write_text(demo_service())
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "demo.om"),
                          str(tmp_path / "prom" / "data")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with (tmp_path / "demo.om").open() as f:
        store = read_openmetrics(f, "demo.om")
    from controlplane.prometheus_server import PrometheusServer

    server = PrometheusServer([], scrape_interval=60.0, data_dir=tmp_path / "prom").start()
    equal, refused, different, both_fail = [], [], [], []
    nonempty = 0
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for q, should_fail in queries:
                ours, theirs = _ours(store, q), _theirs(client, q)
                if ours[0] == "refused" and theirs[0] == "ok":
                    refused.append(f"{q}: {ours[1][:100]}")
                elif ours[0] != "ok" and theirs[0] == "error":
                    equal.append(q)  # both refuse it
                    both_fail.append(f"{q} (should_fail: {should_fail}): {str(theirs[1])[:80]}")
                elif ours[0] == "ok" and theirs[0] == "ok":
                    whys = [same(a, b, False) for a, b in zip(ours[1], theirs[1])]
                    nonempty += bool(theirs[1][0]["result"])
                    why = next((w for w in whys if w), None)
                    (different if why else equal).append(q if not why else f"{q}: {why}")
                else:
                    different.append(f"{q}: ours {ours[0]} ({str(ours[1])[:100]}), Prometheus {theirs[0]} "
                                     f"({str(theirs[1])[:100]})")
    finally:
        server.cleanup()
    total = len(queries)
    print(f"\n{total} expanded compliance queries: {len(equal)} equal to Prometheus "
          f"({100 * len(equal) / total:.1f}%), {len(refused)} refused, {len(different)} different; "
          f"{nonempty} with a non-empty range answer")
    print(f"of the equal, {len(both_fail)} fail on both (an error from each):")
    for line in both_fail:
        print("  both fail:", line)
    for line in refused:
        print("  refused:", line)
    assert not different, "\n".join(different)
    assert len(equal) + len(refused) == total
    assert nonempty > 0.8 * total  # real answers, not agreeing empty ones
