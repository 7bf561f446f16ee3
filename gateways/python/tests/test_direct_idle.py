"""A direct call holds its session as a request the SDK serves does: the SDK's idle timeout does
not end a session while a direct call in it is still being answered.

In-process but on real sockets: the gateway's edge and the SDK's Streamable HTTP app under
uvicorn with a 1 s idle timeout, a gRPC DecisionService whose Decide takes 1.5 s (then denies),
and a caller on the 2025-11-25 wire.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import anyio
import grpc.aio
import httpx2
import pytest
import uvicorn
from capgate_client import CapgateClient
from capgate_client._proto import decisions, decisions_grpc
from capgate_gateway.direct import DirectPath
from capgate_gateway.edge import Edge
from capgate_gateway.gateway import Gateway
from mcp.server.transport_security import TransportSecuritySettings

IDLE_SECONDS = 1.0
DECIDE_SECONDS = 1.5


class _Slow(decisions_grpc.DecisionServiceServicer):
    async def Decide(self, request, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        await asyncio.sleep(DECIDE_SECONDS)
        return decisions.DecideResponse(decision_id="0193-d", policy_version="sha256:ab", decision=decisions.Decision(
            outcome=decisions.OUTCOME_DENY,
            reason=decisions.Reason(code=decisions.REASON_CODE_NO_GRANT_MATCHES, path="/grants", message="no grant"),
        ))


@pytest.fixture
async def gateway_url() -> AsyncIterator[str]:
    server = grpc.aio.server()
    decisions_grpc.add_DecisionServiceServicer_to_server(_Slow(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    capgate = CapgateClient(f"http://127.0.0.1:{port}", token="t")
    # No secret and no upstream is reached: every Decide is denied.
    gateway = Gateway(capgate, None, SimpleNamespace(call=None, call_direct=None))  # type: ignore[arg-type]
    app = gateway.server.streamable_http_app(
        streamable_http_path="/mcp", host="127.0.0.1", session_idle_timeout=IDLE_SECONDS,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    http = uvicorn.Server(uvicorn.Config(Edge(app, None, DirectPath(gateway)), log_config=None, lifespan="on"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(http.serve, [sock])
            while not http.started:
                await anyio.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
            http.should_exit = True
    finally:
        await capgate.close()
        await server.stop(None)


async def _post(http: httpx2.AsyncClient, url: str, session_id: str | None, body: dict[str, Any]) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "Authorization": "Bearer caller"}
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
    return await http.post(url, content=json.dumps(body).encode(), headers=headers)


async def _session(http: httpx2.AsyncClient, url: str) -> str:
    opened = await _post(http, url, None, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    session_id = opened.headers["mcp-session-id"]
    assert (await _post(http, url, session_id, {"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
    return session_id


PING = {"jsonrpc": "2.0", "id": 9, "method": "ping"}


@pytest.mark.anyio
async def test_a_direct_call_longer_than_the_idle_timeout_keeps_its_session(gateway_url: str) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        session_id = await _session(http, gateway_url)
        call = await _post(http, gateway_url, session_id, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                           "params": {"name": "payments__refund"}})
        assert call.headers["content-type"] == "application/json", "not the direct path"
        assert call.json()["error"]["data"]["code"] == "no_grant_matches"
        assert (await _post(http, gateway_url, session_id, PING)).status_code == 200


@pytest.mark.anyio
async def test_an_idle_session_ends(gateway_url: str) -> None:
    """What the test above would see without the hold."""
    async with httpx2.AsyncClient(timeout=10) as http:
        session_id = await _session(http, gateway_url)
        await anyio.sleep(DECIDE_SECONDS)
        assert (await _post(http, gateway_url, session_id, PING)).status_code == 404
