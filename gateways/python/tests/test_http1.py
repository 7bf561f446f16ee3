"""The HTTP/1.1 protocol `--listen` serves with (http1.py): a response of known length in one write,
everything else written as uvicorn writes it.

The gateway's own uvicorn config and protocol, fed a request by hand, writing to a transport that
records each write: the number of writes is what a socket cannot show (the peer may read two
segments at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from capgate_gateway.__main__ import http_config
from capgate_gateway.http1 import OneWriteProtocol
from uvicorn.server import ServerState

GET = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEAD = b"HEAD /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class _Recording(asyncio.Transport):
    """A transport that keeps what is written to it, one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _serve(app: Any, request: bytes, until: Any = None) -> _Recording:
    """`request` through the gateway's protocol to `app`; returns once the app's task has ended
    (or, with `until`, once that awaitable has)."""
    transport = _Recording()
    protocol = OneWriteProtocol(config=http_config(app), server_state=ServerState(), app_state={})
    protocol.connection_made(transport)
    protocol.data_received(request)
    tasks = list(protocol.tasks)
    await (until if until is not None else asyncio.gather(*tasks))
    return transport


def _sized(body: bytes) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def test_a_response_of_known_length_is_one_write() -> None:
    transport = asyncio.run(_serve(_sized(b'{"ok":true}'), GET))
    assert len(transport.writes) == 1, transport.writes
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b'\r\n\r\n{"ok":true}')


def test_the_bytes_are_uvicorns() -> None:
    """What goes out is what uvicorn would have written, joined."""
    transport = asyncio.run(_serve(_sized(b"abc"), GET))
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert body == b"abc"
    assert b"content-length: 3" in head.split(b"\r\n")


def test_a_body_in_parts_goes_with_its_first_part() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await send({"type": "http.response.body", "body": b"cd"})

    transport = asyncio.run(_serve(app, GET))
    assert len(transport.writes) == 2, transport.writes
    assert transport.writes[0].endswith(b"\r\n\r\nab")
    assert transport.writes[1] == b"cd"


def test_a_stream_has_its_head_written_before_its_body() -> None:
    """No Content-Length (an SSE stream): the caller gets the head while the body is still to come."""

    async def scenario() -> None:
        head_out = asyncio.Event()
        release = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            head_out.set()
            await release.wait()
            await send({"type": "http.response.body", "body": b"data: 1\n\n"})

        transport = await _serve(app, GET, until=head_out.wait())
        assert len(transport.writes) == 1
        assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
        release.set()
        await asyncio.sleep(0.01)
        assert len(transport.writes) == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [(HEAD, b"abc"), (GET, b"")],
    ids=["a HEAD request", "an empty body"],
)
def test_a_head_nothing_follows_is_written_at_once(request_bytes: bytes, body: bytes) -> None:
    async def scenario() -> None:
        head_out = asyncio.Event()
        release = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            head_out.set()
            await release.wait()
            await send({"type": "http.response.body", "body": b"" if request_bytes is HEAD else body})

        transport = await _serve(app, request_bytes, until=head_out.wait())
        assert len(transport.writes) == 1
        assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        release.set()

    asyncio.run(scenario())


def test_a_held_head_is_written_before_the_connection_closes() -> None:
    """An app that fails between the head and the body: uvicorn closes the connection, and the head
    it had written goes out first, as before."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
        raise RuntimeError("the app failed")

    transport = asyncio.run(_serve(app, GET))
    assert transport.closed
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\n\r\n")


def test_requests_on_one_connection_each_get_one_write() -> None:
    async def scenario() -> _Recording:
        transport = _Recording()
        protocol = OneWriteProtocol(config=http_config(_sized(b"ok")), server_state=ServerState(), app_state={})
        protocol.connection_made(transport)
        for _ in range(3):
            protocol.data_received(GET)
            await asyncio.gather(*protocol.tasks)
        return transport

    transport = asyncio.run(scenario())
    assert len(transport.writes) == 3
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b"\r\n\r\nok") for w in transport.writes)
