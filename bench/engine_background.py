"""A controlled background load for the engine benchmarks: N busy processes, a second tenant.

Each process spins in a loop, pinned to one core (process i on the i-th core this process may use,
round robin), in a session of its own: the kernel's autogroup scheduling shares a CPU between
sessions first, so the load behaves like another tenant's job, not like extra threads of the bench.
The benchmark starts it before each engine run and stops it after, so both engines run beside the
same load, whatever else the machine is doing (the load average printed beside each run still shows
the rest).

    with background(2):
        run_one_engine()
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

# the child pins itself (a preexec_fn is unsafe in a parent with threads, as vLLM's process has)
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def busy_cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """User + system CPU the busy processes have used so far (what the second tenant got)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in procs:
        try:
            fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def background(n: int) -> Iterator[list[subprocess.Popen]]:
    """Runs n busy processes (one per core, round robin) for the body's duration; n = 0 runs none."""
    if n < 0:
        raise ValueError(f"background load must be >= 0 processes, got {n}")
    cpus = cores()
    procs: list[subprocess.Popen] = []
    try:
        for i in range(n):
            cpu = cpus[i % len(cpus)]
            procs.append(subprocess.Popen(
                [sys.executable, "-c", SPIN, str(cpu)], start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if procs:
            time.sleep(0.2)  # let them start spinning before the timed work begins
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
