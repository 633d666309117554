"""Policy state on disk, written after every decision, so a restarted controller resumes where the
last one stopped (stabilization records, scale events, fallback counters) instead of flapping."""

from __future__ import annotations

import json
import os
from pathlib import Path


class StateStore:
    """One JSON file per autoscaler under `directory`, replaced atomically."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def load(self, name: str) -> dict | None:
        """The saved record, or None when there is none; a corrupt file is an error naming it."""
        p = self.path(name)
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: saved policy state is not valid JSON: {exc}") from None

    def save(self, name: str, record: dict) -> None:
        p = self.path(name)
        tmp = p.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)  # a crash mid-write leaves the previous state, never half a file
