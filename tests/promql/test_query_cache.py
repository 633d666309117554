"""`slopilot query` on a recording: queries starting with '-', and the cache beside the file (written
once, read after, rebuilt when the file changes, ignored when broken, skipped in a read-only folder)."""

from __future__ import annotations

import json
import os

import pytest

from promql import instant_query
from promql.omcache import CachedStorage, cache_path, load_cached
from promql.openmetrics import read_openmetrics
from slopilot.cli import main

OM = """# TYPE x gauge
x{pod="a"} 1 0
x{pod="b"} 5 0
x{pod="a"} 2 30
x{pod="b"} 4 30
# TYPE req counter
req_total{pod="a"} 0 0
req_total{pod="a"} 30 30
"""


@pytest.fixture
def recording(tmp_path):
    p = tmp_path / "rec.om"
    p.write_text(OM + "# EOF\n")
    return p


def answer(capsys, *argv) -> dict:
    assert main(["query", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("query, expected", [
    ("-Inf", [30, "-Inf"]),
    ("-1", [30, "-1"]),
    ("-x", [{"metric": {"pod": "a"}, "value": [30, "-2"]}, {"metric": {"pod": "b"}, "value": [30, "-4"]}]),
    ("-sum(x) + 10", [{"metric": {}, "value": [30, "4"]}]),
])
def test_a_query_starting_with_a_dash_is_the_query(recording, capsys, query, expected):
    for argv in ([str(recording), query, "--time", "30"], ["--time", "30", str(recording), query],
                 ["--time=30", str(recording), query]):
        assert answer(capsys, *argv)["data"]["result"] == expected


def test_a_range_query_starting_with_a_dash(recording, capsys):
    got = answer(capsys, str(recording), "-x", "--start", "0", "--end", "30", "--step", "30")
    assert got["data"]["result"][0]["values"] == [[0, "-1"], [30, "-2"]]


def test_an_unknown_flag_is_still_refused(recording, capsys):
    with pytest.raises(SystemExit):
        main(["query", str(recording), "x", "--tim", "30", "--bogus", "1"])


def test_the_cache_is_written_once_then_read(recording):
    first = load_cached(recording)
    assert not isinstance(first, CachedStorage) and cache_path(recording).is_file()
    second = load_cached(recording)
    assert isinstance(second, CachedStorage)
    with recording.open() as f:
        parsed = read_openmetrics(f)
    for q in ("x", "sum(rate(req_total[1m]))", "x[1m]", "-x"):
        assert instant_query(second, q, 30_000) == instant_query(parsed, q, 30_000), q


def test_a_changed_file_is_parsed_again(recording, capsys):
    assert answer(capsys, str(recording), "sum(x)", "--time", "30")["data"]["result"][0]["value"][1] == "6"
    recording.write_text(OM + 'x{pod="a"} 100 60\n# EOF\n')
    os.utime(recording, ns=(1, 1))  # even a file written back with an old time: its size changed
    assert answer(capsys, str(recording), "sum(x)", "--time", "60")["data"]["result"][0]["value"][1] == "104"
    assert isinstance(load_cached(recording), CachedStorage)


def test_a_broken_cache_is_ignored(recording, capsys):
    load_cached(recording)
    cache_path(recording).write_bytes(b"not a cache")
    assert answer(capsys, str(recording), "count(x)", "--time", "30")["data"]["result"][0]["value"][1] == "2"
    assert isinstance(load_cached(recording), CachedStorage)  # rewritten


def test_a_folder_that_refuses_the_cache_still_answers(recording, capsys, monkeypatch):
    from promql import omcache

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(omcache.tempfile, "mkstemp", refuse)  # what a read-only folder does
    assert answer(capsys, str(recording), "count(x)", "--time", "30")["data"]["result"][0]["value"][1] == "2"
    assert not cache_path(recording).exists()
