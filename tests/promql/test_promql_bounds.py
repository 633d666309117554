"""Issue finding 11: hostile PromQL (30,000 nested parentheses, a 30,000-term sum, 5,000 nested sum(,
a subquery range past timedelta's) used to segfault, take gigabytes or raise a traceback in
`slopilot query`. Now the text is bounded before the one parser sees it (promql.compile_query: the
simulator, `slopilot query` and the scrape source use it), with a clear error and flat memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from promql import PromQLError, compile_query
from promql.bounds import MAX_NESTING, MAX_OPERATORS, query_problem
from tests.conftest import ROOT

HOSTILE = {
    "parens": ("(" * 30_000 + "x" + ")" * 30_000, "characters long"),
    "sum": ("+".join(["x"] * 3_000), "operators"),
    "nested_sum": ("sum(" * 5_000 + "x" + ")" * 5_000, "characters long"),
    "deep_short": ("(" * 100 + "x" + ")" * 100, "nests brackets 100 deep"),
    "subquery": ("max_over_time(x[1000000000d:1ms])", "duration is out of range"),
    "offset": ("x offset 1000000000d", "duration is out of range"),
}


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    p = tmp_path_factory.mktemp("q") / "s.om"
    p.write_text("# TYPE x gauge\nx 1 0\nx 2 10\n# EOF\n")
    return p


def peak_rss_mb_and_result(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    # VmHWM is this process image's own peak; getrusage's ru_maxrss would carry the forking parent's
    # (pytest's, over 1 GB late in a whole-suite run) across exec
    code = ("import re, sys; from slopilot.cli import main; rc = main(sys.argv[1:]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
            "sys.stderr.write('RSS %s\\n' % hwm); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    rss = next(int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("RSS "))
    return rss / 1024, r


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_queries_get_a_clear_error_from_slopilot_query(series, name):
    query, why = HOSTILE[name]
    rss, r = peak_rss_mb_and_result(["query", str(series), query, "--time", "10"])
    assert r.returncode == 2, r.stderr[-2000:]  # not -11 (segfault) nor 1 (traceback)
    assert "Traceback" not in r.stderr and why in r.stderr
    assert rss < 400  # the process's whole footprint (imports included), not 1.8 GB


def test_the_next_good_query_is_answered(series):
    _, r = peak_rss_mb_and_result(["query", str(series), "sum(x) + 1", "--time", "10"])
    assert r.returncode == 0 and '"3"' in r.stdout


def test_limits_sit_above_real_queries_on_every_path():
    real = ('histogram_quantile(0.9, sum by (le) '
            '(rate(vllm:time_to_first_token_seconds_bucket{model_name="m"}[1m])))')
    assert query_problem(real) is None
    assert query_problem("(" * MAX_NESTING + "x" + ")" * MAX_NESTING) is None
    assert query_problem("+".join(["x"] * MAX_OPERATORS)) is None
    assert query_problem('x{a="((((((((+++"}') is None  # brackets and operators in strings don't count
    compile_query(real)
    for query, _ in HOSTILE.values():
        with pytest.raises(PromQLError):
            compile_query(query)  # the one parser: the simulator's, `slopilot query`'s, the scrape source's
