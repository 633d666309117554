"""Issue finding 9: a Prometheus that drips its answer one byte every 2 s got past `--timeout 5` (each
read was in time), so no decision was made for minutes. Now the timeout bounds the whole answer (as
Go's http.Client.Timeout does for KEDA), for the Prometheus source and the direct scrape alike: the
tick fails that read, holds or falls back, and the next tick runs on time."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from autoscaler import load_spec, make_policy
from autoscaler.prometheus import QueryError
from controlplane.controller import AutoscalerLoop
from controlplane.sources.prometheus import PrometheusSource
from controlplane.sources.scrape import ScrapeSource
from controlplane.targets import MemoryTarget
from controlplane.telemetry import Telemetry

SPEC = """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: drip}
spec:
  scaleTargetRef: {name: llama}
  minReplicaCount: 1
  maxReplicaCount: 10
  triggers:
  - type: prometheus
    name: queue
    metadata: {serverAddress: "http://127.0.0.1:1", query: "sum(x)", threshold: "5"}
"""
ANSWER = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"12"]}]}}'


class Dripper:
    """Accepts, reads a request head, then sends an answer one byte every `gap` s (the head too when
    `head` is set), for ever (or until the client leaves)."""

    def __init__(self, gap: float = 0.3, head: bool = False, body: bytes = ANSWER):
        self.gap, self.head, self.body = gap, head, body
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" \
                    % (len(self.body) * 100)
                if not self.head:
                    conn.sendall(head)
                for byte in (head if self.head else b"") + self.body * 100:
                    conn.sendall(bytes([byte]))
                    time.sleep(self.gap)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("head", [False, True], ids=["drip-body", "drip-head"])
def test_a_dripping_prometheus_is_a_failed_read_within_the_timeout(head):
    drip = Dripper(head=head)
    src = PrometheusSource(drip.url, timeout=1.0, override=True)
    try:
        t0 = time.monotonic()
        with pytest.raises(QueryError, match="no answer within 1s"):
            src.query("sum(x)")
        assert time.monotonic() - t0 < 2.0
        spec = load_spec(SPEC)
        tel = Telemetry()
        loop = AutoscalerLoop(spec, make_policy(spec), src, MemoryTarget(2), telemetry=tel)
        for i in range(3):  # each tick on time, each a failed read: a hold, counted
            src.begin()
            t0 = time.monotonic()
            step = loop.tick(15.0 * i)
            assert time.monotonic() - t0 < 2.0 and step.desired == 2
        assert tel.source_errors.labels("drip", "queue")._value.get() == 3
    finally:
        src.close()
        drip.close()


@pytest.mark.parametrize("head", [False, True], ids=["drip-body", "drip-head"])
def test_a_dripping_metrics_page_fails_that_scrape_only(head):
    drip = Dripper(body=b"vllm:num_requests_waiting 1\n", head=head)
    src = ScrapeSource([drip.url], timeout=1.0)
    before = set(threading.enumerate())
    try:
        t0 = time.monotonic()
        errors = src.scrape()
        assert time.monotonic() - t0 < 2.0
        assert "no complete page within 1s" in next(iter(errors.values()))
        # nothing left behind that the interpreter joins at exit (a pool's worker stuck on the drip
        # hung a whole test session's exit); a dripped body is dropped at the deadline, its thread ends
        left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
        assert all(t.daemon for t in left), left
        if not head:
            for t in left:
                t.join(timeout=2.0)
                assert not t.is_alive()
    finally:
        drip.close()
