"""A scriptable fake engine for the router's hardening tests: an asyncio HTTP/1.1 server in a thread
with the few routes the router uses (/metrics, /health, /v1/completions, /v1/chat/completions) and
knobs for the broken behaviours a real fleet shows.

    eng = FakeEngine().start()
    eng.waiting = "+Inf"          # what its /metrics says for vllm:num_requests_waiting
    eng.mode = "hang"             # ok | hang (accept, never answer) | hang_all (/health, /metrics too)
                                  # | 429 | 500 | big (a huge JSON answer)
    eng.producer = True           # answer a do_remote_decode request with kv_transfer_params (P/D)
    eng.kv = "0.5"                # its vllm:kv_cache_usage_perc
    eng.kv_seen                   # the kv_transfer_params of each completion request, in order
    eng.active, eng.aborted       # requests being handled now; requests whose client left first
    eng.stop()
"""

from __future__ import annotations

import asyncio
import json
import threading
import time


class FakeEngine:
    def __init__(self, chunks: int = 5, chunk_delay: float = 0.02, first_delay: float = 0.0):
        self.waiting = "0"
        self.running = "0"
        self.mode = "ok"
        self.producer = False
        self.kv = "0.1"
        self.kv_seen: list[dict | None] = []
        self.chunks, self.chunk_delay, self.first_delay = chunks, chunk_delay, first_delay
        self.big_bytes = 64 * 2**20
        self.active = 0
        self.aborted = 0
        self.served = 0
        self.requests = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-engine")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeEngine:
        self._thread.start()
        assert self._ready.wait(10), "the fake engine did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            # end every open connection first: a handler left suspended on a closed loop is collected
            # later, in whatever code runs then (an unraisable 'Event loop is closed' mid-import)
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(5)
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _close_all(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.close()

    def metrics_page(self) -> bytes:
        return (f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
                f'vllm:num_requests_running{{model_name="m"}} {self.running}\n'
                f'vllm:kv_cache_usage_perc{{model_name="m"}} {self.kv}\n').encode()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].decode()
                length = next((int(x.split(b":")[1]) for x in lines
                               if x.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                if self.mode == "hang_all":  # a hung process: nothing answered at all
                    await self._gone(reader, None)
                    return
                if path.startswith("/metrics"):
                    self._send(writer, 200, self.metrics_page(), b"text/plain")
                elif path == "/health":
                    self._send(writer, 200, b"")
                elif path.startswith("/v1/"):
                    self.requests += 1
                    self.active += 1
                    try:
                        if not await self._complete(reader, writer, json.loads(body or b"{}")):
                            return
                    finally:
                        self.active -= 1
                else:
                    self._send(writer, 404, b"{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _send(writer, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, ctype, len(body), body))

    async def _gone(self, reader: asyncio.StreamReader, seconds: float | None) -> bool:
        """Waits up to `seconds` (None: for ever) for the client to close; True when it did."""
        try:
            data = await asyncio.wait_for(reader.read(1), seconds)
        except asyncio.TimeoutError:
            return False
        return data == b""

    async def _complete(self, reader, writer, req: dict) -> bool:
        """One completion; False when the client left before the end (the connection is done)."""
        if self.mode == "hang":
            await self._gone(reader, None)
            self.aborted += 1
            return False
        self.kv_seen.append(req.get("kv_transfer_params"))
        if self.mode in ("429", "500"):
            status = int(self.mode)
            self._send(writer, status, json.dumps({"error": {"message": "busy", "code": status}}).encode())
            return True
        if self.first_delay and await self._gone(reader, self.first_delay):
            self.aborted += 1
            return False
        if self.mode == "big":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                         % self.big_bytes)
            block = b" " * 2**20
            try:
                for _ in range(self.big_bytes // len(block)):
                    writer.write(block)
                    await writer.drain()
            except ConnectionError:
                self.aborted += 1
                return False
            self.served += 1
            return True
        if req.get("stream"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for i in range(self.chunks):
                data = b'data: {"choices": [{"text": "t%d"}]}\n\n' % i
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                try:
                    await writer.drain()
                except ConnectionError:
                    self.aborted += 1
                    return False
                if await self._gone(reader, self.chunk_delay):
                    self.aborted += 1
                    return False
            writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            self.served += 1
            return True
        t_end = time.monotonic() + self.chunk_delay * self.chunks
        if await self._gone(reader, max(0.0, t_end - time.monotonic())):
            self.aborted += 1
            return False
        answer = {"object": "text_completion", "choices": [{"text": "hi"}], "port": self.port}
        if self.producer and (req.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer["kv_transfer_params"] = {"do_remote_prefill": True, "remote_port": self.port}
        self._send(writer, 200, json.dumps(answer).encode())
        self.served += 1
        return True
