"""A real Prometheus server for tests and the local fleet.

The `prometheus` binary (Debian's package) on a free loopback port, with a generated config that
scrapes a target list through file-based discovery (so the list can change while it runs: set_targets,
or the caller's own file_sd file, `sd_file`), its TSDB in a temporary folder. stop() then start()
restarts it on the same port and data.

    with PrometheusServer(["127.0.0.1:8001"], scrape_interval=1.0) as prom:
        prom.url  # http://127.0.0.1:PORT
        prom.set_targets([...])
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml

JOB = "engines"  # the job label of the engines' series (the scrape source uses the same)
READY_LINE = "Server is ready to receive web requests"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def target_groups(targets: list[str]) -> list[dict]:
    """file_sd groups for `host:port` or URLs (scheme and path ride in __scheme__/__metrics_path__)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for t in targets:
        parts = urlsplit(t if "://" in t else "http://" + t)
        path = parts.path if parts.path not in ("", "/") else "/metrics"
        groups.setdefault((parts.scheme, path), []).append(parts.netloc)
    return [{"targets": hosts, "labels": {"__scheme__": scheme, "__metrics_path__": path}}
            for (scheme, path), hosts in groups.items()]


class PrometheusServer:
    def __init__(self, targets: list[str] = (), *, scrape_interval: float = 1.0, binary: str = "prometheus",
                 port: int | None = None, data_dir: str | Path | None = None, job: str = JOB,
                 web_config: dict | None = None, retention: str = "1d", sd_file: str | Path | None = None):
        found = shutil.which(binary)
        if found is None:
            raise FileNotFoundError(f"prometheus binary {binary!r} not found (Debian package: prometheus)")
        self.binary = found
        self.scrape_interval = scrape_interval
        self.job = job
        self.web_config = web_config
        self.retention = retention
        self._fixed_port = port is not None
        self.port = port or free_port()
        self._own_dir = data_dir is None
        # absolute: Prometheus runs with this folder as its working directory
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="slopilot-prometheus-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.sd_file = Path(sd_file).resolve() if sd_file is not None else self.dir / "targets.json"
        self._write_config()
        if sd_file is None or targets:
            self.set_targets(list(targets))

    @property
    def url(self) -> str:
        tls = bool(self.web_config and self.web_config.get("tls_server_config"))
        return f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "prometheus.log"

    def _write_config(self) -> None:
        interval = _duration(self.scrape_interval)
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": self.job,
                "scrape_interval": interval,
                "scrape_timeout": _duration(min(self.scrape_interval, 10.0)),
                "file_sd_configs": [{"files": [str(self.sd_file.resolve())], "refresh_interval": "1s"}],
            }],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        if self.web_config is not None:
            (self.dir / "web.yml").write_text(yaml.safe_dump(self.web_config, sort_keys=False))

    def set_targets(self, targets: list[str]) -> None:
        """Replace the scraped targets (atomically; Prometheus picks the file up within a second)."""
        tmp = self.sd_file.with_name(f".{self.sd_file.name}.tmp")
        tmp.write_text(json.dumps(target_groups(targets)))
        os.replace(tmp, self.sd_file)

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        for _ in range(5):
            if self._spawn(timeout):
                return self
            if self._fixed_port:
                break
            self.port = free_port()  # someone took the port between picking and binding it
        raise RuntimeError(f"prometheus did not start; last log lines:\n{self._log_tail()}")

    def _spawn(self, timeout: float) -> bool:
        args = [self.binary, f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.tsdb.retention.time={self.retention}", "--web.enable-lifecycle"]
        if self.web_config is not None:
            args.append(f"--web.config.file={self.dir / 'web.yml'}")
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[start:].decode(errors="replace")
            if READY_LINE in text:
                return True
            if self.proc.poll() is not None:
                if "address already in use" in text:
                    return False
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self._log_tail()}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"prometheus not ready within {timeout:g}s:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; the data folder stays for a restart."""
        if not self.running:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        """Stop and remove the data folder when this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
