"""The direct path: a tools/call in a handshake-era session, answered below the MCP SDK.

Why: the call is the gateway's hot request, and the SDK's server stack (dispatch, memory
streams, validation, SSE framing) was most of what the gateway added to it
(docs/decisions/0036-a-direct-path-for-tool-calls.md). The decision is the same code as the
SDK's handler (`Gateway.call_tool`); only the framing differs, and the upstream is reached
by `UpstreamPool.call_direct`.

A POST the edge has passed is taken here when it is, by its headers, JSON sent by a client
that accepts what the SDK requires (JSON and SSE), in a session the SDK holds whose
`initialize` was answered (`Mcp-Session-Id`), at a handshake-era `MCP-Protocol-Version` or
none; and, by its body, one JSON-RPC 2.0 tools/call with a string or integer id whose params
hold a string `name`, an object `arguments` or none, and `_meta` with nothing the 2026-07-28
envelope reserves. Anything else goes to the SDK as it came, which answers as before (404
for an unknown session, 406 for an Accept it refuses, -32602 for params it cannot read, …).
The answer is HTTP 200 with the JSON-RPC response as `application/json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.streamable_http import StreamableHTTPServerTransport, check_accept_headers
from mcp.shared.exceptions import MCPError
from mcp_types import methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Scope, Send

from capgate_gateway.gateway import Gateway

RESERVED_META = "io.modelcontextprotocol/"
"""The prefix of the `_meta` keys of the 2026-07-28 envelope: a request carrying one is the SDK's to classify."""

Call = tuple[str | int, str, dict[str, Any] | None]
"""A direct call: its JSON-RPC id, the tool's name, its arguments."""


class DirectPath:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.manager = gateway.server.session_manager

    def wants(self, scope: Scope, headers: dict[str, str]) -> bool:
        """By its headers alone (`headers` lowercased), whether a POST may be a direct call;
        its body is read only then."""
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        version = headers.get("mcp-protocol-version")
        session_id = headers.get("mcp-session-id")
        return (
            media_type == "application/json"
            and (version is None or version in HANDSHAKE_PROTOCOL_VERSIONS)
            and session_id is not None
            and all(check_accept_headers(Request(scope)))
            and self._held(session_id) is not None
        )

    async def answer(self, headers: dict[str, str], message: Any, send: Send) -> bool:
        """Answer `message` when it is a direct call; False leaves it to the SDK."""
        call = direct_call(message)
        session_id = headers["mcp-session-id"]
        held = self._held(session_id)
        if call is None or held is None:
            return False
        transport, connection = held
        request_id, name, arguments = call
        with _holding(transport):
            try:
                result = await self.gateway.call_tool(
                    self.gateway.http_credential(headers), name, arguments, self.gateway.upstreams.call_direct
                )
                body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "result": _wire(result, connection.protocol_version)}
            except MCPError as error:
                # The SDK's own serialization of an error: `data` only when there is some.
                wire = error.error.model_dump(by_alias=True, mode="json", exclude_unset=True)
                body = {"jsonrpc": "2.0", "id": request_id, "error": wire}
        content = json.dumps(body, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
            (b"mcp-session-id", session_id.encode("latin-1")),
        ]})
        await send({"type": "http.response.body", "body": content})
        return True

    def _held(self, session_id: str) -> tuple[StreamableHTTPServerTransport, Any] | None:
        """The SDK's transport and connection of a live, initialized, ownerless session."""
        transport = self.manager._server_instances.get(session_id)  # noqa: SLF001 - the SDK's table of live sessions
        connection = self.gateway.sessions.get(session_id)
        if transport is None or connection is None or transport.is_terminated or not connection.initialize_accepted:
            return None
        if session_id in self.manager._session_owners:  # noqa: SLF001 - the SDK checks the owner's credential
            return None
        if transport.idle_scope is not None and transport.idle_scope.cancel_called:
            return None  # timed out: the SDK is ending it
        return transport, connection


def direct_call(message: Any) -> Call | None:
    """`message` as a direct call, or None when it is anything else."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call":
        return None
    request_id = message.get("id")
    # A boolean is an int to Python, not to JSON-RPC (the SDK reads `"id": true` as no id).
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not set(params) <= {"name", "arguments", "_meta"}:
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or ("arguments" in params and not isinstance(arguments, dict)):
        return None
    if "_meta" in params and not _plain_meta(params["_meta"]):
        return None
    return request_id, name, arguments


def _plain_meta(meta: Any) -> bool:
    """A `_meta` the SDK reads without a word: an object, its progress token a string or an integer."""
    if not isinstance(meta, dict) or any(isinstance(k, str) and k.startswith(RESERVED_META) for k in meta):
        return False
    token = meta.get("progressToken", "")
    return isinstance(token, str | int) and not isinstance(token, bool)


def _wire(result: dict[str, Any] | types.CallToolResult, version: str) -> dict[str, Any]:
    """A result as the caller gets it: an upstream's own JSON as it came, the SDK client's
    result as the SDK's server would have written it at the session's version."""
    if isinstance(result, dict):
        return result
    try:
        return methods.serialize_server_result(
            "tools/call", version, result.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
    except ValidationError:
        raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None


@contextmanager
def _holding(transport: StreamableHTTPServerTransport) -> Iterator[None]:
    """A direct call keeps its session alive as a request the SDK serves does: the idle
    countdown waits while it runs and starts again when the last request ends (as in
    `StreamableHTTPServerTransport.handle_request`)."""
    scope, idle = transport.idle_scope, transport._idle_timeout  # noqa: SLF001
    if scope is None or idle is None:
        yield
        return
    transport._requests_in_flight += 1  # noqa: SLF001
    scope.deadline = math.inf
    try:
        yield
    finally:
        transport._requests_in_flight -= 1  # noqa: SLF001
        if not transport._requests_in_flight:  # noqa: SLF001
            scope.deadline = anyio.current_time() + idle
