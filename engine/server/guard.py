"""uvicorn's httptools protocol with the limits a server facing clients needs and uvicorn lacks: the
request head (line and headers) must arrive within HEADER_TIMEOUT of the connection's start or the
request's first byte (else 408 and close), and may not pass MAX_HEAD_BYTES (431, before the parser
has buffered more: httptools joins a header's pieces by concatenation, so a 50 MB header took
seconds of the event loop). Idle keep-alive connections are uvicorn's timeout_keep_alive; the body's
deadline is the gate's (engine.server.gate)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT = 10.0
MAX_HEAD_BYTES = 64 * 1024 + 8192  # headers and the request line


class GuardedHttpTools(HttpToolsProtocol):
    _timer: asyncio.TimerHandle | None = None
    _in_head = True
    _head_bytes = 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and self._head_bytes >= 0 and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, b"the request head is larger than %d bytes" % MAX_HEAD_BYTES)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        if self._timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, -1  # -1: nothing of the next request yet (keep-alive's)

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(HEADER_TIMEOUT, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, b"the request head did not arrive in time")

    def _refuse(self, status: int, why: bytes) -> None:
        self._disarm()
        phrase = b"Request Timeout" if status == 408 else b"Request Header Fields Too Large"
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, phrase, len(why), why))
        self.transport.close()
