"""Log set-up for the long-running commands: plain lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "info", json_lines: bool = False) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    plain = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    handler.setFormatter(JsonFormatter() if json_lines else plain)
    root = logging.getLogger("slopilot")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    return root
