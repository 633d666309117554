"""The label, time and series functions, topk/bottomk/count_values, @ and negative offsets answer as
a real Prometheus (Debian's 2.42) does, on instant and range queries.

Hand-made series (ties, NaN, counter resets, epoch-second gauges across years, labels for
label_replace) are backfilled with `promtool tsdb create-blocks-from openmetrics`; each query is asked
of both at every instant through /api/v1/query and once through /api/v1/query_range. Where the
answer's order is the answer (sort, sort_desc, topk, bottomk at one instant) the order must match
too on series without ties (`uniq`): Prometheus' sort is not stable, so among equal values only
which series are kept is compared.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import httpx
import pytest

from promql import PromQLError, compile_query, instant_query, range_query
from promql.openmetrics import read_openmetrics

START, END, STEP = 0, 1_200_000, 15_000

QUERIES = [
    # topk / bottomk / count_values (ties and NaN among the inputs)
    "topk(2, gauge)", "bottomk(2, gauge)", "topk(1, gauge) by (job)", "bottomk(3, gauge) without (inst)",
    "topk(2.9, gauge)", "topk(0, gauge)", "topk(10, tied)", "topk(2, tied)", "bottomk(2, tied)",
    "topk(scalar(count(tied)) - 2, tied)", "topk(3, uniq)", "bottomk(2, uniq)",
    "topk(1, -gauge)", 'count_values("v", tied)',
    'count_values("job", gauge) by (job)', 'count_values("v", gauge) without (inst)',
    # labels
    'label_replace(gauge, "dst", "$1-$2", "inst", "([a-z]+)-(.*)")',
    'label_replace(gauge, "dst", "${1}x$1x", "inst", "(.*)")',
    'label_replace(gauge, "inst", "", "inst", "b-.*")',
    'label_replace(gauge, "job", "$name", "inst", "(?P<name>[a-c])-.*")',
    'label_replace(gauge, "dst", "y", "nolabel", "")',
    'label_replace(gauge, "dst", "$$1$", "inst", "a.*")',
    'label_replace(gauge, "__name__", "renamed", "inst", ".*")',
    'label_join(gauge, "dst", ",", "job", "inst")', 'label_join(gauge, "dst", "-", "nolabel")',
    'label_join(gauge, "job", "", "inst", "job")', 'sum by (dst) (label_join(gauge, "dst", "", "job"))',
    # absent
    "absent(gauge)", 'absent(nope{job="x", inst=~"a"})', 'absent(nope{job="x", job="y", k="v"})',
    'absent(sum(nope{job="x"}))', "absent(gauge > 1e9)", 'absent_over_time(nope{job="x"}[1m])',
    "absent_over_time(sparse[1m])", "absent_over_time(gauge[1m])",
    # time
    "timestamp(gauge)", "timestamp(sparse)", "timestamp(sparse offset 2m)", "timestamp(sum(gauge))",
    "day_of_week(epoch)", "day_of_month(epoch)", "day_of_year(epoch)", "days_in_month(epoch)",
    "hour(epoch)", "minute(epoch)", "month(epoch)", "year(epoch)", "year()", "minute()", "hour()",
    "day_of_week()", "days_in_month(timestamp(gauge))", "year(vector(-1))", "day_of_week(vector(-86400.9))",
    "hour(epoch - 2.5e9)", "day_of_year(epoch - 1.2e9)",
    # series
    "changes(counter_total[2m])", "resets(counter_total[5m])", "changes(gauge[5m])", "deriv(gauge[2m])",
    "deriv(counter_total[5m])", "predict_linear(counter_total[5m], 300)", "predict_linear(gauge[2m], -60)",
    "deriv(tied[1m])",
    # sort and element-wise
    "sort(uniq)", "sort_desc(uniq)", "sort(gauge)", "sgn(gauge - 2)", "deg(uniq)", "rad(uniq)",
    "sin(uniq)", "cos(uniq)", "tan(uniq)", "asin(uniq / 10)", "acos(uniq / 10)", "atan(uniq)",
    "sinh(uniq)", "cosh(uniq)", "tanh(uniq)", "asinh(uniq)", "acosh(uniq)", "atanh(uniq / 10)", "pi()",
    # @ and negative offsets
    "gauge offset -1m", "rate(counter_total[1m] offset -30s)", "gauge @ 300", "sum(gauge @ 600.5)",
    "rate(counter_total[2m] @ 900)", "gauge @ start()", "gauge @ end()", "max_over_time(gauge[2m] @ end())",
    "avg_over_time(sum(gauge)[2m:30s] @ 450)", "sum(gauge) - sum(gauge @ start() offset -1m)",
    "timestamp(sparse @ 700)",
]


def om() -> str:
    lines = ["# TYPE gauge gauge"]
    cycle = [1, 2, 3, 2, "NaN", 5, 2, 0.5]
    for i in range(0, 81):
        for j, inst in enumerate(("a-1", "b-2", "c-3", "d-4")):
            v = cycle[(i + 3 * j) % 8]
            lines.append(f'gauge{{job="{"x" if j < 2 else "y"}",inst="{inst}"}} {v} {15 * i}')
    lines.append("# TYPE tied gauge")
    lines += [f'tied{{k="{k}"}} {[4, 4, 1][n] if i % 20 < 10 else 7} {15 * i}'
              for i in range(81) for n, k in enumerate("pqr")]
    lines.append("# TYPE uniq gauge")
    lines += [f'uniq{{k="{k}"}} {(n + 1) * 1.7 - (i % 5) * 0.3} {15 * i}'
              for i in range(81) for n, k in enumerate("pqrs")]
    lines.append("# TYPE counter counter")
    counts = [0, 4, 9, 9, 2, 6, 11, 1, 1, 5]
    lines += [f'counter_total{{k="c"}} {counts[i % 10] + i} {15 * i}' for i in range(81)]
    lines.append("# TYPE epoch gauge")
    lines += [f'epoch{{k="e"}} {951782400 + i * 3_157_000.5 - 7 * 86400} {15 * i}' for i in range(81)]
    lines.append("# TYPE sparse gauge")
    lines += [f'sparse{{k="s"}} {t} {t}' for t in (100, 130, 400, 690, 1100)]
    return "\n".join(lines) + "\n# EOF\n"


def same(a: dict, b: dict, ordered: bool) -> str | None:
    if a["resultType"] != b["resultType"]:
        return f"result types {a['resultType']} vs {b['resultType']}"
    if a["resultType"] == "scalar":
        rows = [({}, [a["result"]], [b["result"]])]
    else:
        key = "values" if a["resultType"] == "matrix" else "value"
        if ordered and [r["metric"] for r in a["result"]] != [r["metric"] for r in b["result"]]:
            return f"order {[r['metric'] for r in a['result']]} vs {[r['metric'] for r in b['result']]}"
        ours = {tuple(sorted(r["metric"].items())): r[key] for r in a["result"]}
        theirs = {tuple(sorted(r["metric"].items())): r[key] for r in b["result"]}
        if ours.keys() != theirs.keys():
            return f"series {sorted(ours)} vs {sorted(theirs)}"
        rows = [(k, *(([ours[k]], [theirs[k]]) if key == "value" else (ours[k], theirs[k]))) for k in ours]
    for labels, xs, ys in rows:
        if [p[0] for p in xs] != [p[0] for p in ys]:
            return f"{labels}: times differ"
        for (t, u), (_, v) in zip(xs, ys):
            fu, fv = float(u), float(v)
            close = abs(fu - fv) <= 1e-9 * max(abs(fu), abs(fv))
            if not (fu == fv or math.isnan(fu) and math.isnan(fv) or close):
                return f"{labels} at {t}: {u} vs {v}"
    return None


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package: prometheus)")
    d = tmp_path_factory.mktemp("builtins")
    (d / "data.om").write_text(om())
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(d / "data.om"),
                          str(d / "prom" / "data")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from controlplane.prometheus_server import PrometheusServer

    server = PrometheusServer([], scrape_interval=60.0, data_dir=d / "prom").start()
    try:
        with (d / "data.om").open() as f:
            store = read_openmetrics(f, "data.om")
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client, store
    finally:
        server.cleanup()


@pytest.mark.parametrize("query", QUERIES)
def test_builtin_equals_prometheus(prom, query):
    client, store = prom
    ordered = query.split("(")[0] in ("sort", "sort_desc", "topk", "bottomk") and "uniq" in query
    theirs = client.get("/api/v1/query_range", params={"query": query, "start": START / 1000,
                                                        "end": END / 1000, "step": STEP / 1000}).json()
    assert theirs["status"] == "success", theirs
    why = same(range_query(store, query, START, END, STEP), theirs["data"], False)
    assert why is None, f"range: {why}"
    nonempty = 0
    for t in range(START, END + 1, STEP):
        theirs = client.get("/api/v1/query", params={"query": query, "time": t / 1000}).json()
        assert theirs["status"] == "success", theirs
        why = same(instant_query(store, query, t), theirs["data"], ordered)
        assert why is None, f"at {t / 1000:g}: {why}"
        nonempty += bool(theirs["data"]["result"]) if theirs["data"]["resultType"] != "scalar" else 1
    if not query.startswith(("absent", "topk(0")):
        assert nonempty > 0


@pytest.mark.parametrize("query,why", [
    ('label_replace(gauge, "d", "$1", "inst", "(a)(?=b)")', "RE2"),
    ('label_replace(gauge, "d", "$1", "inst", "(a)\\\\1")', "RE2"),
    ('label_replace(gauge, "1d", "x", "inst", ".*")', "invalid destination label name"),
    ('label_replace(gauge, "d", "x", "inst", "(")', "invalid regular expression"),
    ('count_values("a-b", gauge)', "invalid label name"),
    ("topk(scalar(nope), gauge)", "overflows int64"),
    ("hour(gauge * 1e300)", "not supported"),
])
def test_refused_or_errors(prom, query, why):
    _, store = prom
    with pytest.raises(PromQLError, match=why):
        instant_query(store, compile_query(query), 600_000)
