"""The HTTP edge in front of the MCP SDK: what is refused before any MCP processing.

In this order:

* A `Host` (or `Origin`) header the gateway does not answer to: HTTP 421 (403 for `Origin`),
  JSON-RPC -32600 — DNS-rebinding protection, on by default for a loopback bind
  (`HostCheck`).
* No `Authorization` header (or not a Bearer one): HTTP 401 with `WWW-Authenticate: Bearer`.
* A path other than `/mcp`: HTTP 404, JSON-RPC -32600.
* `Mcp-Method` / `Mcp-Name` headers (MCP 2026-07-28) that disagree with the JSON-RPC body:
  HTTP 400 with JSON-RPC error -32600, whatever protocol revision the body speaks. The SDK
  checks them as well on 2026-07-28 requests (with its own code, -32020); checking here
  first gives one answer for every revision. A body that is not JSON, or nested too deeply
  to parse, is -32700 here.

Then a tools/call in a handshake-era session takes the direct path (direct.py), past the
SDK; everything else goes on to the SDK.

INVARIANT: every 4xx or 5xx answer, whoever made it, carries a JSON-RPC error body: the SDK's
few plain-text refusals (a wrong `Content-Type`, …) are rewritten on their way out.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from capgate_gateway.direct import DirectPath

INVALID_REQUEST = -32600
PARSE_ERROR = -32700
INTERNAL_ERROR = -32603
MAX_BODY_BYTES = 4 * 1024 * 1024
MCP_PATH = "/mcp"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def bearer_token(headers: dict[str, str]) -> str | None:
    """The token of an `Authorization: Bearer` header ("" when empty), or None without one."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_host(value: str) -> tuple[str, str | None]:
    """`name[:port]` or `[v6][:port]` → (lowercased name without brackets, port or None)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, colon, port = value.rpartition(":")
    if not colon or ":" in name:  # no port, or a bare IPv6 address
        return value, None
    return name, port


@dataclass(frozen=True)
class HostCheck:
    """Which `Host` and `Origin` headers the gateway answers to (DNS-rebinding protection).

    `hosts` are names (any port) or `name:port` (that port only); an `Origin` is accepted when
    it is one of `origins` or its host is an accepted `Host`. A request without `Origin` (any
    client that is not a browser) is checked on its `Host` alone.
    """

    hosts: tuple[str, ...]
    origins: tuple[str, ...] = ()

    @classmethod
    def for_bind(cls, bind_host: str, hosts: list[str], origins: list[str]) -> HostCheck | None:
        """The check for a listener: the operator's `--allowed-host`s, else the loopback names
        for a loopback bind, else none (a gateway on a routable address sits behind a proxy
        that picks the names)."""
        if hosts:
            return cls(tuple(h.lower() for h in hosts), tuple(o.lower().rstrip("/") for o in origins))
        if is_loopback(bind_host):
            return cls(LOOPBACK_NAMES, tuple(o.lower().rstrip("/") for o in origins))
        return None

    def host_allowed(self, value: str | None) -> bool:
        if not value:
            return False
        name, port = _split_host(value)
        for allowed in self.hosts:
            allowed_name, allowed_port = _split_host(allowed)
            if name == allowed_name and (allowed_port is None or allowed_port == port):
                return True
        return False

    def origin_allowed(self, value: str | None) -> bool:
        if value is None:
            return True
        origin = value.strip().lower().rstrip("/")
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(parts.netloc) and self.host_allowed(parts.netloc)


class Edge:
    def __init__(self, app: ASGIApp, host_check: HostCheck | None = None, direct: DirectPath | None = None) -> None:
        self.app = app
        self.host_check = host_check
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _json_rpc_errors(send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.host_check is not None:
            if not self.host_check.host_allowed(headers.get("host")):
                await _error(send, 421, INVALID_REQUEST, "the Host header names no host this gateway answers to")
                return
            if not self.host_check.origin_allowed(headers.get("origin")):
                await _error(send, 403, INVALID_REQUEST, "the Origin header names no origin this gateway answers to")
                return
        if bearer_token(headers) is None:
            await _respond(send, 401, b'{"error":"a bearer token is required"}', [(b"www-authenticate", b"Bearer")])
            return
        if scope["path"] != MCP_PATH:
            await _error(send, 404, INVALID_REQUEST, f"not found: MCP is served at {MCP_PATH}")
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        routed = "mcp-method" in headers or "mcp-name" in headers
        direct = self.direct if self.direct is not None and self.direct.wants(scope, headers) else None
        if not routed and direct is None:
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        if not complete:
            await _error(send, 413, INVALID_REQUEST, "the request body is over 4 MiB")
            return
        try:
            message = json.loads(body)
        except (ValueError, RecursionError) as error:
            if not routed:  # the SDK answers it, as it would have
                await self.app(scope, _replay(body, receive), send)
                return
            # RecursionError: a body nested deeper than the parser goes is as unreadable as bad JSON.
            reason = "nested too deeply" if isinstance(error, RecursionError) else "not JSON"
            await _error(send, 400, PARSE_ERROR, f"Parse error: the body is {reason}")
            return
        mismatch = _routing_mismatch(headers, message) if routed else None
        if mismatch is not None:
            request_id, reason = mismatch
            await _error(send, 400, INVALID_REQUEST, reason, request_id)
            return
        if direct is not None and await direct.answer(headers, message, send):
            return
        await self.app(scope, _replay(body, receive), send)


def _routing_mismatch(headers: dict[str, str], message: Any) -> tuple[Any, str] | None:
    if not isinstance(message, dict):
        return None  # a batch or a scalar: the SDK refuses it
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


def _json_rpc_errors(send: Send) -> Send:
    """`send`, with any error answer whose body is not JSON rewritten as a JSON-RPC error.

    The SDK answers a few refusals in plain text (a wrong `Content-Type`, a missing route);
    an MCP client reads JSON-RPC, so the text becomes the error's message and the status stays.
    """
    held: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] >= 400 and not content_type.startswith(b"application/json"):
                held = message
                return
            await send(message)
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        status = held["status"]
        text = b"".join(chunks).decode("utf-8", "replace").strip() or f"HTTP {status}"
        code = INVALID_REQUEST if status < 500 else INTERNAL_ERROR
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": text}}).encode()
        kept = [(k, v) for k, v in held.get("headers", []) if k.lower() not in (b"content-type", b"content-length")]
        await send({**held, "headers": [*_json_headers(body), *kept]})
        await send({"type": "http.response.body", "body": body})

    return wrapped


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


async def _error(send: Send, status: int, code: int, message: str, request_id: Any = None) -> None:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    await _respond(send, status, json.dumps(body).encode())


async def _respond(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [*_json_headers(body), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
