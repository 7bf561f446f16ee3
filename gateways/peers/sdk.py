"""The official MCP client SDK through Envoy, and what each of its HTTP exchanges looked like.

The SDK shows its caller a denial as an `MCPError` and keeps the rest to itself: the HTTP status,
`Retry-After`, `WWW-Authenticate`, and the JSON-RPC `id` of the body (it puts the request's own
id in its place). `Exchanges` records every response of the very requests the SDK made, through
httpx's response hook, so a test asserts on both: what the SDK's caller received, and the
raw HTTP answer Envoy gave.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

T = TypeVar("T")
# What to expect in the `id` of a proxy's JSON-RPC error: the request's own id (a door that read
# the body), or null (a door that did not).
OWN_ID = object()
# One scenario's bound: its sessions, calls and answers together.
SCENARIO_TIMEOUT = 60.0


@dataclass
class Exchange:
    http_method: str
    request: dict[str, Any] | None
    """The JSON-RPC message sent, when the request had one."""
    status: int
    headers: httpx2.Headers
    body: Any
    """The parsed body of an answer of 400 or more (JSON), else None."""
    sent_headers: httpx2.Headers
    """The request's headers, as the SDK sent them."""

    @property
    def rpc_method(self) -> str | None:
        return None if self.request is None else self.request.get("method")


class Exchanges:
    def __init__(self) -> None:
        self.all: list[Exchange] = []

    async def record(self, response: httpx2.Response) -> None:
        request = response.request
        sent = json.loads(request.content) if request.content else None
        body = None
        if response.status_code >= 400:
            # An error answer is small and complete; the SDK reads it again from the cache.
            await response.aread()
            body = json.loads(response.content) if response.content else None
        self.all.append(Exchange(request.method, sent, response.status_code, response.headers, body, request.headers))

    def of(self, rpc_method: str, tool: str | None = None) -> list[Exchange]:
        return [e for e in self.all if e.rpc_method == rpc_method
                and (tool is None or (e.request or {}).get("params", {}).get("name") == tool)]

    def one(self, rpc_method: str, tool: str | None = None) -> Exchange:
        found = self.of(rpc_method, tool)
        assert len(found) == 1, f"one {rpc_method} {tool or ''} exchange, found {len(found)}: {self.all}"
        return found[0]


@asynccontextmanager
async def connect(url: str, headers: dict[str, str], *, mode: str = "auto",
                  exchanges: Exchanges | None = None) -> AsyncIterator[tuple[Client, Exchanges]]:
    """An SDK client session with `url`, sending `headers` on every request, its exchanges kept
    in `exchanges` (given, to read them when the session fails to open)."""
    exchanges = Exchanges() if exchanges is None else exchanges
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20.0),
                                  event_hooks={"response": [exchanges.record]}) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
            yield client, exchanges


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Runs one async scenario to its end, or fails it after SCENARIO_TIMEOUT."""
    async def bounded() -> T:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            return await scenario()
    return anyio.run(bounded)


def denial(error: MCPError, code: str) -> dict[str, Any]:
    """The SDK's error for a capgate denial: -32001 with capgate's reason code in `data`."""
    assert error.error.code == -32001, error.error
    assert isinstance(error.error.data, dict) and error.error.data["code"] == code, error.error
    return error.error.data


def answered(exchange: Exchange, status: int, rpc_id: Any = OWN_ID) -> dict[str, Any]:
    """The HTTP answer the proxy gave: `status`, and a JSON-RPC error whose `id` is `rpc_id` (by
    default the request's own); its `error`."""
    assert exchange.status == status, exchange
    assert exchange.headers["content-type"].startswith("application/json"), exchange.headers
    expected = exchange.request["id"] if rpc_id is OWN_ID else rpc_id
    assert exchange.body["jsonrpc"] == "2.0" and exchange.body["id"] == expected, exchange.body
    return exchange.body["error"]


def probe_headers(result: Any) -> dict[str, str]:
    """The headers the probe (echo_upstream.py) says its request carried."""
    return json.loads(result.content[0].text)
