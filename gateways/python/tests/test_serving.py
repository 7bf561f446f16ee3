"""How `--listen` serves: with httptools' parser, and with TCP_NODELAY on every accepted connection
(without it, an answer written as headers then body waits ~40 ms for the caller's delayed ACK on a
kept connection — docs/benchmarks.md, the direct path's section).

In-process on a real socket: the gateway's own uvicorn config and listener, a trivial ASGI app, and
a caller that keeps its connection for several requests.
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
from capgate_gateway.__main__ import _Uvicorn, http_config, listening_socket
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serve_and_inspect() -> tuple[list[tuple[type, int]], int]:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = _Uvicorn(http_config(_app), f"http://127.0.0.1:{port}/mcp")
    seen: list[tuple[type, int]] = []
    answered = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            for _ in range(3):
                await stream.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                received = b""
                while not received.endswith(b"ok"):
                    received += await stream.receive()
                answered += received.startswith(b"HTTP/1.1 200")
            for protocol in server.server_state.connections:
                peer = protocol.transport.get_extra_info("socket")
                seen.append((type(protocol), peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        server.should_exit = True
    return seen, answered


def test_listen_serves_with_httptools_and_nodelay() -> None:
    connections, answered = anyio.run(_serve_and_inspect)
    assert answered == 3
    assert len(connections) == 1, connections
    protocol, nodelay = connections[0]
    assert issubclass(protocol, HttpToolsProtocol), protocol
    assert nodelay != 0, "an accepted connection without TCP_NODELAY"
