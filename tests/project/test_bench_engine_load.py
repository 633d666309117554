"""bench/engine_background.py: the controlled background load of the engine benchmarks (busy processes,
one pinned per core, each in a session of its own, gone after the run), and the results file
bench/engine_sizes.py writes for the engine-throughput page."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import engine_background  # noqa: E402
import pages  # noqa: E402


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_processes_spin_pinned_in_their_own_sessions_and_stop():
    cores = engine_background.cores()
    with engine_background.background(3) as procs:
        assert len(procs) == 3
        first = {p.pid: cpu_ticks(p.pid) for p in procs}
        time.sleep(0.5)
        for i, p in enumerate(procs):
            assert p.poll() is None
            assert os.sched_getaffinity(p.pid) == {cores[i % len(cores)]}  # round robin over the cores
            assert os.getsid(p.pid) == p.pid != os.getsid(0)  # a session (a tenant) of its own
        assert all(cpu_ticks(p.pid) > first[p.pid] for p in procs)  # they do burn CPU
    assert all(p.returncode is not None for p in procs)  # killed and reaped at the end


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_cpu_seconds_counts_what_the_busy_processes_got():
    with engine_background.background(1) as procs:
        first = engine_background.busy_cpu_seconds(procs)
        time.sleep(0.6)
        got = engine_background.busy_cpu_seconds(procs) - first
    assert 0.05 < got <= 0.6 + 0.05  # one process spinning: at most the wall time it had
    assert engine_background.busy_cpu_seconds(procs) == 0.0  # gone: nothing to read
    assert engine_background.busy_cpu_seconds([]) == 0.0


def test_no_background_runs_nothing_and_a_negative_count_is_refused():
    with engine_background.background(0) as procs:
        assert procs == []
    with pytest.raises(ValueError, match=">= 0"):
        with engine_background.background(-1):
            pass


def test_results_file_renders_on_the_page(tmp_path, monkeypatch):
    import engine_sizes

    monkeypatch.setattr(sys, "argv", ["bench/engine_throughput.py", "--table", "reduced"])
    runs = {("80m", "float32", "W1", b, e): [(v, v * 2, 3.0 + b, 0.5), (v + 2, v * 2, 4.0 + b, 0.5),
                                             (v + 1, v, 5.0, 0.5)]
            for b in (0, 2) for e, v in (("ours", 100.0), ("vllm", 80.0))}
    medians = [{"size": "80m", "workload": "W1", "dtype": "float32", "background": b, "ours": 101.0,
                "vllm": 81.0, "ratio": 101 / 81, "ours_per_cpu_s": 200.0, "vllm_per_cpu_s": 160.0,
                "load_min": 3.0, "load_max": 5.0 + b, "ours_busy_cores": 1.4 * (b > 0),
                "vllm_busy_cores": 0.6 * (b > 0)} for b in (0, 2)]
    path = tmp_path / "engine_throughput.json"
    engine_sizes.write_json(str(path), medians, runs, 3, 600.0)
    result = json.loads(path.read_text())
    text = pages.render(result)
    quiet = ("| 80m | W1 | float32 | quiet | 101 | 81 | 1.25x | 1.25x | - | 3.0-5.0 | "
             "100, 102, 101 | 80, 82, 81 |")
    assert quiet in text
    assert "| 80m | W1 | float32 | 2 busy | 101 | 81 | 1.25x | 1.25x | 1.40 / 0.60 |" in text
    assert "--table reduced" in result["command"]
