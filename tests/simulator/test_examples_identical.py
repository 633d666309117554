"""Every example scenario's shortened run gives the same bytes as before the layout refactor.

The checksums were recorded on the commit before the refactor (`slopilot simulate EXAMPLE
--duration D --no-plots`); a change that moves code without changing behaviour keeps them. A change
that means to alter simulated behaviour updates them in the same commit and says why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from simulator.run import simulate
from simulator.scenario import load_scenario
from tests.conftest import find_shared_data

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# example, duration (s), closed-form fast path, sha256 of requests.csv, sha256 of timeline.csv
CASES = [
    ("keda_queue", 1500, True,
     "a1e18c1d5d7052b73ad73f8f252bc65cc3e82a2963a13ac4e955e1048d512b30",
     "ac221a144e346e743d4e54f189b566e189911508fbc380f21083897747316275"),
    ("diurnal_schedule", 3300, True,
     "2d9144971722c62eb6cf24fa146876b69a52b45463e72f4916532046bc55634d",
     "8138476f27dac3835328163b177a170587b07ecd227bcd79136434490f6c1cab"),
    ("slo_model_autoscale", 2400, True,
     "65c5055df2e805261599dc18309dc45aa46aa1cc4270e310bc262cdffb10efdf",
     "7a313c9c76f5df76d971a4cfb85022575af6fc70b4539192e3834657f66a8cd5"),
    ("azure_conv_h100", 600, True,
     "4872c8f0c2d9ecda83bfc5db38d0f6877bf19ea330d44c1ea46c132af3b2264a",
     "a15111148c9d47f9fdccbe34d92f3bb79278e34f13a7744388e71fd71fa5524f"),
    ("mooncake_prefix", 300, True,
     "a0076b7e542313cbe28d7171ada12d8e353814163624db2413a44208976ebb07",
     "2b3c9fc630726f789f46e7a0199b32a9f43240c0a6818e0b06d0df8672299b46"),
    ("keda_queue", 300, False,
     "ba00b2a679ceb27187805ed45c276f7321661d743519d8395a10a5253ab3dead",
     "0aadd079f1b7c05a632b9d5bfabbdbfd1d45661fac501454c45f69570a14e543"),
]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name,duration,fast,requests_sha,timeline_sha", CASES,
                         ids=[f"{c[0]}-{c[1]}s{'' if c[2] else '-step'}" for c in CASES])
def test_example_output_is_byte_identical(name, duration, fast, requests_sha, timeline_sha, tmp_path):
    if name == "mooncake_prefix" and find_shared_data() is None:
        pytest.skip("the Mooncake trace lives in the shared data folder, which is absent")
    sc = load_scenario(EXAMPLES / f"{name}.yaml")
    sc.duration = duration
    simulate(sc, tmp_path, fast=fast, plots=False)
    assert _sha(tmp_path / "requests.csv") == requests_sha
    assert _sha(tmp_path / "timeline.csv") == timeline_sha
