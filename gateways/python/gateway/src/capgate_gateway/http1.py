"""How `--listen` speaks HTTP/1.1: uvicorn's httptools protocol, with a response of known length
written in one piece.

uvicorn writes a response's head when the app starts it and its body when the app sends it: two
writes, two TCP segments on a connection with TCP_NODELAY, and the caller woken twice. Every
direct-path answer (direct.py) is a head with `Content-Length` and then, at once, its body, so
the head is held until the body's first write and the two go out together: one system call a
call fewer in the gateway, measured in docs/benchmarks.md. A response without `Content-Length`
(the SDK's SSE streams), the answer to a HEAD request and an empty body keep uvicorn's writes as
they are: nothing follows their head that it could wait for.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; each request's response goes through `_HeadWithBody`."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # A new request's cycle writes to the connection's transport; an upgrade made none.
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = _HeadWithBody(self.transport, cycle)


class _HeadWithBody:
    """The connection's transport as one response's cycle sees it: the response's head, when a
    body of known length must follow it, waits for that body's first write (or the connection's
    close) and is written with it.

    INVARIANT: the bytes, their order and the close are uvicorn's; only the number of writes
    changes. The head is uvicorn's first write after the cycle marked the response started
    (`100 Continue`, written before, is not a head)."""

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head_seen = False
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        cycle = self._cycle
        if not self._head_seen and cycle.response_started:
            self._head_seen = True
            if cycle.chunked_encoding is False and cycle.expected_content_length > 0 and cycle.scope["method"] != "HEAD":
                self._held = bytes(data)
                return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def close(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
