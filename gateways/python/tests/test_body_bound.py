"""The bound on an inbound request body (`MAX_BODY_BYTES` in edge.py, 4 MiB, the same as the
TypeScript gateway's), against the real edge on a loopback port: the gateway's own listener and
uvicorn config (httptools), the edge, the direct path and the SDK's Streamable HTTP app behind it,
and a caller on raw sockets, so that which connection a request goes on is the test's to say.

The edge reads a body itself for a routed request (`Mcp-Method`/`Mcp-Name`) and for a direct-path
candidate (a POST in a live handshake-era session); a body over the bound is HTTP 413, JSON-RPC
-32600 "the request body is over 4 MiB", with a Content-Length or chunked alike, and answered
without waiting for the rest of a larger body. Any other POST goes to the SDK, whose own bound
(`RequestBodyLimitMiddleware`, 4 MiB) answers 413 in plain text, rewritten by the edge as JSON-RPC
-32600 with the SDK's words. A body of exactly 4 MiB is read whole.

After a 413 the app leaves the rest of the body unread. uvicorn's httptools protocol reads it
and drops it (`on_body` once the response is complete), resumes reading when the answer is sent,
then parses the next request: the 413 keeps the connection alive (no `Connection: close`) and a
client's next request on it is answered at once (1-3 ms in a try at up to 32 MiB over). (Node's
server leaves such a connection mid-body, so the TypeScript gateway's 413 says `Connection:
close`.) Either way is accepted here: where the 413 keeps the connection, the next request must be
answered on it; where it says close, the server must end it and a new one is answered.

The app is built as `__main__._serve_http` builds it (the SDK's app with its default body bound,
`Edge`, `DirectPath`), on the gateway's own `listening_socket` and `http_config`.

Nothing here reaches capgate or an upstream: capgate's address is a closed port and the pool has
no methods.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream
from capgate_client import CapgateClient
from capgate_gateway.__main__ import _Uvicorn, http_config, listening_socket
from capgate_gateway.direct import DirectPath
from capgate_gateway.edge import Edge, HostCheck
from capgate_gateway.gateway import Gateway
from mcp.server.transport_security import TransportSecuritySettings

BOUND = 4 * 1024 * 1024
"""The contract: 4 MiB of body bytes (not characters) are taken, one more is refused."""
LIMIT = 5.0
"""Seconds for any one network wait (a send, an answer, a close): each takes milliseconds; a
gateway that waits for a body that never ends, or a connection left mid-body, fails, not hangs."""
EDGE_REFUSAL = {"code": -32600, "message": "the request body is over 4 MiB"}
SDK_REFUSAL = {"code": -32600, "message": "Request body too large"}


@dataclass
class Served:
    port: int
    session_id: str
    """A live, initialized handshake-era session, for direct-path requests."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json_rpc_error(self) -> dict[str, Any]:
        """The error of a JSON-RPC error answer: jsonrpc 2.0, a null id, a numeric code, a message."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        parsed = json.loads(self.body)
        assert parsed["jsonrpc"] == "2.0" and parsed["id"] is None, parsed
        assert isinstance(parsed["error"]["code"], int) and isinstance(parsed["error"]["message"], str), parsed
        return parsed["error"]

    @property
    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


class Connection:
    """One HTTP/1.1 connection, written and read by hand."""

    def __init__(self, stream: SocketStream, port: int) -> None:
        self.stream = stream
        self.port = port
        self.buffer = bytearray()

    @classmethod
    async def open(cls, port: int) -> Connection:
        with anyio.fail_after(LIMIT):
            return cls(await anyio.connect_tcp("127.0.0.1", port), port)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def post(
        self, body: bytes, *, chunked: bool = False, declared: int | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        """POSTs `body` to /mcp: with its Content-Length (or `declared`, which may claim more than is
        sent), or chunked in 64 KiB pieces without one. A server that closes while it is sent
        (having answered) is left to `answer()`."""
        lines = [
            "POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Authorization: Bearer body-bound-token",
            "Content-Type: application/json", "Accept: application/json, text/event-stream",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
            piece = 64 * 1024
            pieces = [body[at : at + piece] for at in range(0, len(body), piece)]
            payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        else:
            lines.append(f"Content-Length: {len(body) if declared is None else declared}")
            payload = body
        with anyio.fail_after(LIMIT):
            try:
                await self.stream.send("\r\n".join(lines).encode() + b"\r\n\r\n" + payload)
            except (anyio.BrokenResourceError, ConnectionError):
                pass

    async def answer(self) -> Answer:
        """The next whole answer on this connection (Content-Length or chunked)."""
        with anyio.fail_after(LIMIT):
            head = (await self._until(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(head[0].split(" ")[1])
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = bytearray()
                while size := int((await self._until(b"\r\n")).split(b";")[0], 16):
                    body += await self._exactly(size)
                    await self._until(b"\r\n")
                await self._until(b"\r\n")
            else:
                body = await self._exactly(int(headers.get("content-length", "0")))
            return Answer(status, headers, bytes(body))

    async def is_closed_by_server(self) -> bool:
        """Whether the server ends this connection (nothing more is sent on it)."""
        with anyio.fail_after(LIMIT):
            try:
                while True:
                    self.buffer += await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                return not self.buffer

    async def _until(self, marker: bytes) -> bytes:
        while (at := self.buffer.find(marker)) < 0:
            self.buffer += await self.stream.receive()
        taken = bytes(self.buffer[:at])
        del self.buffer[: at + len(marker)]
        return taken

    async def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.buffer += await self.stream.receive()
        taken = bytes(self.buffer[:size])
        del self.buffer[:size]
        return taken


def padded(size: int, message: dict[str, Any]) -> bytes:
    """`message` as JSON padded with JSON whitespace to `size` bytes."""
    head = json.dumps(message, separators=(",", ":")).encode()
    return head + b" " * (size - len(head))


TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
TOOLS_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "helpdesk__get_ticket"}}


def routed(served: Served, size: int) -> tuple[bytes, dict[str, str]]:
    """A request the edge reads for its `Mcp-Method` check."""
    return padded(size, TOOLS_LIST), {"Mcp-Method": "tools/list"}


def direct(served: Served, size: int) -> tuple[bytes, dict[str, str]]:
    """A tools/call in a live handshake-era session: the edge reads it for the direct path."""
    return padded(size, TOOLS_CALL), {"Mcp-Session-Id": served.session_id, "MCP-Protocol-Version": "2025-11-25"}


def sdk(served: Served, size: int) -> tuple[bytes, dict[str, str]]:
    """Neither: the SDK reads it, with its own bound."""
    return padded(size, TOOLS_LIST), {}


ROUTES = {"routed": (routed, EDGE_REFUSAL), "direct": (direct, EDGE_REFUSAL), "sdk": (sdk, SDK_REFUSAL)}


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    capgate = CapgateClient("http://127.0.0.1:1", token="unused")  # a closed port: nothing is asked
    gateway = Gateway(capgate, None, SimpleNamespace())  # type: ignore[arg-type]
    app = gateway.server.streamable_http_app(
        streamable_http_path="/mcp", host="127.0.0.1",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    edge = Edge(app, HostCheck.for_bind("127.0.0.1", [], []), DirectPath(gateway))
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = _Uvicorn(http_config(edge), f"http://127.0.0.1:{port}/mcp")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(LIMIT):
                while not server.started:
                    await anyio.sleep(0.01)
            yield Served(port, await _session(port))
            server.should_exit = True
    finally:
        await capgate.close()


async def _session(port: int) -> str:
    connection = await Connection.open(port)
    try:
        await connection.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"},
        }}).encode())
        opened = await connection.answer()
        assert opened.status == 200, opened
        session_id = opened.headers["mcp-session-id"]
        await connection.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                              headers={"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"})
        assert (await connection.answer()).status == 202
        return session_id
    finally:
        await connection.aclose()


def assert_refused(answer: Answer, refusal: dict[str, Any]) -> None:
    assert answer.status == 413, f"expected 413, got {answer.status}: {answer.body[:200]!r}"
    assert answer.json_rpc_error() == refusal


async def assert_answers_next(served: Served, connection: Connection, previous: Answer | None) -> None:
    """The next request is answered: on `connection` where `previous` kept it alive (which must not
    be left mid-body), or on a new one where `previous` said `Connection: close` (and the server
    ended the old one). With no `previous`, `connection` is a new one."""
    if previous is not None and previous.closes:
        assert await connection.is_closed_by_server(), "Connection: close, but the connection stayed open"
        await connection.aclose()
        connection = await Connection.open(served.port)
    try:
        # Not JSON, with Mcp-Method: the edge answers -32700 itself.
        await connection.post(b"{", headers={"Mcp-Method": "tools/list"})
        following = await connection.answer()
        assert following.status == 400, following
        assert following.json_rpc_error()["code"] == -32700
    finally:
        await connection.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("over", [1, 1024 * 1024], ids=["1-byte-over", "1-MiB-over"])
async def test_a_body_over_4_mib_is_413_and_the_connection_answers_the_next_request(
    served: Served, route: str, chunked: bool, over: int,
) -> None:
    """Sent whole: the 413 comes before the rest is read by the app (at 1 MiB over, most of it), so a
    connection kept alive after it must not be left mid-body."""
    request, refusal = ROUTES[route]
    body, headers = request(served, BOUND + over)
    connection = await Connection.open(served.port)
    await connection.post(body, chunked=chunked, headers=headers)
    refused = await connection.answer()
    assert_refused(refused, refusal)
    await assert_answers_next(served, connection, refused)


@pytest.mark.anyio
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_of_exactly_4_mib_is_read_whole_and_parsed(served: Served, chunked: bool) -> None:
    connection = await Connection.open(served.port)
    # Valid JSON whose method the Mcp-Method header contradicts: answered past the parse, by the edge.
    await connection.post(padded(BOUND, TOOLS_LIST), chunked=chunked, headers={"Mcp-Method": "tools/call"})
    answer = await connection.answer()
    assert answer.status == 400, answer
    assert json.loads(answer.body) == {"jsonrpc": "2.0", "id": 1, "error": {
        "code": -32600, "message": "the Mcp-Method header does not match the request body's method"}}
    await assert_answers_next(served, connection, answer)


@pytest.mark.anyio
async def test_the_bound_counts_bytes_not_characters(served: Served) -> None:
    # "é" is 2 bytes of UTF-8: the body is BOUND + 2 bytes in about BOUND / 2 characters.
    head, tail = '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_":"', '"}}'
    body = f"{head}{'é' * ((BOUND + 2 - len(head) - len(tail)) // 2)}{tail}".encode()
    assert len(body) == BOUND + 2
    connection = await Connection.open(served.port)
    await connection.post(body, headers={"Mcp-Method": "tools/list"})
    refused = await connection.answer()
    assert_refused(refused, EDGE_REFUSAL)
    await assert_answers_next(served, connection, refused)


@pytest.mark.anyio
@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_body_declared_far_over_the_bound_is_refused_before_its_end(served: Served, route: str) -> None:
    """64 MiB declared, 4 MiB + 64 KiB sent and the request left open: the 413 must come without the
    rest (a gateway that read the whole body first would never answer). That connection is given
    up, its body never ending; the gateway answers on another."""
    request, refusal = ROUTES[route]
    body, headers = request(served, BOUND + 64 * 1024)
    connection = await Connection.open(served.port)
    try:
        await connection.post(body, declared=64 * 1024 * 1024, headers=headers)
        assert_refused(await connection.answer(), refusal)
    finally:
        await connection.aclose()
    await assert_answers_next(served, await Connection.open(served.port), None)
