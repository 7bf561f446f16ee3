"""The HTTP edge in front of the MCP SDK: what is refused before any MCP processing.

* No `Authorization` header (or not a Bearer one): HTTP 401 with `WWW-Authenticate: Bearer`.
* `Mcp-Method` / `Mcp-Name` headers (MCP 2026-07-28) that disagree with the JSON-RPC body:
  HTTP 400 with JSON-RPC error -32600, whatever protocol revision the body speaks. The SDK
  checks them as well on 2026-07-28 requests (with its own code, -32020); checking here
  first gives one answer for every revision.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

INVALID_REQUEST = -32600
MAX_BODY_BYTES = 4 * 1024 * 1024


def bearer_token(headers: dict[str, str]) -> str | None:
    """The token of an `Authorization: Bearer` header ("" when empty), or None without one."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


class Edge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if bearer_token(headers) is None:
            await _respond(send, 401, b'{"error":"a bearer token is required"}', [(b"www-authenticate", b"Bearer")])
            return
        if scope["method"] != "POST" or ("mcp-method" not in headers and "mcp-name" not in headers):
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        if not complete:
            await _respond(send, 413, b'{"error":"the request body is too large"}')
            return
        mismatch = _routing_mismatch(headers, body)
        if mismatch is not None:
            request_id, reason = mismatch
            error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": INVALID_REQUEST, "message": reason}}
            await _respond(send, 400, json.dumps(error).encode())
            return
        await self.app(scope, _replay(body, receive), send)


def _routing_mismatch(headers: dict[str, str], body: bytes) -> tuple[Any, str] | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None  # not JSON: the SDK answers the parse error
    if not isinstance(message, dict):
        return None
    request_id = message.get("id")
    method = message.get("method")
    if "mcp-method" in headers and headers["mcp-method"] != method:
        return request_id, "the Mcp-Method header does not match the request body's method"
    if "mcp-name" in headers:
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        name = params.get("name", params.get("uri"))
        if headers["mcp-name"] != name and not _base64_equal(headers["mcp-name"], name):
            return request_id, "the Mcp-Name header does not match the request body's name"
    return None


def _base64_equal(header: str, value: Any) -> bool:
    """MCP encodes a header value that is not a plain token as `=?base64?<b64>?=`."""
    if not (isinstance(value, str) and header.startswith("=?base64?") and header.endswith("?=")):
        return False
    try:
        return base64.b64decode(header[len("=?base64?") : -2], validate=True).decode() == value
    except (binascii.Error, UnicodeDecodeError):
        return False


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return b"", False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, downstream: Receive) -> Receive:
    """The body already read, then the connection's own events (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await downstream()

    return receive


async def _respond(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
