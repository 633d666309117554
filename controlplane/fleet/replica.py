"""One engine replica as a process: spawn on a free loopback port, probe /health, SIGTERM, SIGKILL.

Each replica leads its own process group (so a signal reaches everything it started, and a Ctrl-C
in the parent's terminal is not delivered to it behind the fleet's back). On Linux the replica is also
started through `setpriv --pdeathsig TERM`: if the process that spawned it dies, even by SIGKILL, the
kernel sends it SIGTERM and it drains and exits instead of living on as an orphan.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTING, READY, UNREADY, TERMINATING = "starting", "ready", "unready", "terminating"
UNREADY_AFTER = 3  # failed probes in a row that take a ready replica out of the ready count


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _death_signal_prefix() -> list[str]:
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


class Replica:
    """A `slopilot serve` process. `state` is one of starting, ready, unready, terminating."""

    def __init__(self, rid: str, command: list[str], port: int, log_path: Path, host: str = "127.0.0.1"):
        self.id, self.command, self.port, self.host, self.log_path = rid, command, port, host, log_path
        self.state = STARTING
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # monotonic seconds
        self.ready_at: float | None = None
        self.ever_ready = False
        self.failed_probes = 0
        self.next_probe = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        """Spawns the process (stdout and stderr to its log file); OSError if it cannot be started."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(_death_signal_prefix() + self.command, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        """None while running."""
        return self.proc.poll() if self.proc else -1

    def alive(self) -> bool:
        return self.exit_code() is None

    def probe(self, client: httpx.Client) -> bool:
        """One GET /health; True on 200."""
        try:
            return client.get(f"{self.url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, sig: int) -> None:
        """Signals the replica's process group (nothing if it already exited)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """SIGTERM: the server stops accepting, finishes in-flight requests (its --drain-timeout), exits."""
        self.state = TERMINATING
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])
