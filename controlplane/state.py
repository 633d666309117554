"""Policy state on disk, written after every decision, so a restarted controller resumes where the
last one stopped (stabilization records, scale events, fallback counters) instead of flapping."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# a Kubernetes object name (DNS-1123 subdomain): no '/', no '..', never empty, so it is a safe file name
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def name_problem(name: object) -> str | None:
    """Why `name` is not a Kubernetes object name (None: it is one), said for an error message."""
    if isinstance(name, str) and len(name) <= 253 and _NAME.match(name):
        return None
    return (f"{name!r} is not a Kubernetes name: lower-case letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most 253 characters (it names the state file and the "
            f"decision log)")


class StateStore:
    """One JSON file per autoscaler under `directory`, replaced atomically."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        problem = name_problem(name)
        if problem is not None:  # never a path outside the folder
            raise ValueError(f"autoscaler name {problem}")
        return self.dir / f"{name}.json"

    def load(self, name: str) -> dict | None:
        """The saved record, or None when there is none; a corrupt file is an error naming it."""
        p = self.path(name)
        if not p.exists():
            return None
        try:
            record = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{p}: saved policy state is not valid JSON: {exc}") from None
        if not isinstance(record, dict) or not isinstance(record.get("policy", {}), dict):
            raise ValueError(f"{p}: saved policy state must be a JSON object with a 'policy' object, "
                             f"got {type(record).__name__}; move the file away to start afresh")
        return record

    def save(self, name: str, record: dict) -> None:
        p = self.path(name)
        tmp = p.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)  # a crash mid-write leaves the previous state, never half a file
