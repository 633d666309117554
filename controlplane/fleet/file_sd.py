"""Prometheus file-based service discovery: the fleet's scrape targets as a JSON target file.

The format is Prometheus's `file_sd_configs` one: a list of groups, each `{"targets": ["host:port"],
"labels": {...}}`. Prometheus watches the file and re-reads it on change, so a running server follows
the fleet. The file is written to a temporary name and renamed over the old one, so a reader never
sees half a file. A Prometheus scrape job pointing at it:

    scrape_configs:
      - job_name: fleet
        file_sd_configs: [{files: [/path/to/prometheus_targets.json], refresh_interval: 5s}]
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def file_sd_groups(targets: dict[str, dict[str, str]]) -> list[dict]:
    """One group per target (address -> its labels), so every replica keeps its own labels."""
    return [{"targets": [address], "labels": dict(labels)} for address, labels in targets.items()]


def write_file_sd(path: Path, targets: dict[str, dict[str, str]]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(file_sd_groups(targets), indent=2) + "\n")
    os.replace(tmp, path)
