"""CPU threads on a shared machine: OpenMP workers that sleep instead of spinning.

torch's CPU kernels (oneDNN/MKL matmuls, our paged attention) run on OpenMP's thread pool. By default
GNU OpenMP keeps an idle worker spinning for a while after each parallel region, and each matmul is
split evenly between the workers. On a machine whose cores other processes also want, the spinning
workers take time slices from those processes and from each other, and every region ends waiting for
whichever worker was descheduled: measured on 2 cores with other jobs running (load 5-7), the tiny
model's 256 x 100 -> 32 run made 180-290 output tokens/s with the default policy, 740-1500 with one
thread and 800-2240 (median ~2000) with OMP_WAIT_POLICY=PASSIVE, where an idle worker sleeps at once.

The runtime reads its settings once, when torch loads it, so they must be in the environment before
torch is imported: importing `engine` sets OMP_WAIT_POLICY=PASSIVE unless the user set a policy (or
torch came first, which `spinning_openmp` then reports).
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "PASSIVE"
set_here = False  # whether configure_openmp put the policy in this process's environment


def configure_openmp() -> bool:
    """Sets the passive wait policy for OpenMP if torch is not loaded yet and the user chose none;
    True when the policy in force (or to come) is passive."""
    global set_here
    if "torch" not in sys.modules and not os.environ.get("OMP_WAIT_POLICY"):
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        set_here = True
    return not spinning_openmp()


def spinning_openmp() -> bool:
    """Whether OpenMP's idle workers spin: no passive policy in the environment (GOMP_SPINCOUNT=0,
    KMP_BLOCKTIME=0 count as passive too)."""
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == WAIT_POLICY:
        return False
    return os.environ.get("GOMP_SPINCOUNT") != "0" and os.environ.get("KMP_BLOCKTIME") != "0"


def child_env(env: dict[str, str]) -> dict[str, str]:
    """env for another program (vLLM, ...): without the wait policy configure_openmp put here, so
    it runs with its own OpenMP settings."""
    if set_here and env.get("OMP_WAIT_POLICY") == WAIT_POLICY:
        env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
    return env
