import os
from pathlib import Path

import pytest

import engine  # noqa: F401  (before any test module loads torch: sets OpenMP's passive wait policy)

ROOT = Path(__file__).resolve().parent.parent


def find_shared_data() -> Path | None:
    """Public traces and GPU measurements live outside the project (never copied into it)."""
    candidates = [os.environ.get("SLOPILOT_SHARED_DATA"), ROOT.parent / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = find_shared_data()
    if path is None:
        pytest.skip("public data not found: set SLOPILOT_SHARED_DATA or place it at ../shared/data")
    return path
