"""The HTTP edge of each gateway: DNS-rebinding protection, and malformed input answered with a
4xx and a JSON-RPC error body — never a 500, never a plain-text page."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from harness import HttpGateway, start_http_gateway
from scenario import mint_caller

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
INITIALIZE = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
              b'"capabilities":{},"clientInfo":{"name":"edge-test","version":"1"}}}')
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_ARGUMENTS = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"probe-env__echo","arguments":'
                  + b'{"a":' * 5_000 + b"1" + b"}" * 5_000 + b"}}")

# (name, body, extra headers, whether it goes inside a 2025 session)
MALFORMED: list[tuple[str, bytes, dict[str, str], bool]] = [
    ("deep", DEEP, {}, False),
    ("deep_in_session", DEEP, {}, True),
    ("deep_modern", DEEP, {"Mcp-Protocol-Version": "2026-07-28"}, False),
    ("deep_with_mcp_method", DEEP, {"Mcp-Method": "tools/call"}, False),
    ("deep_arguments_in_session", DEEP_ARGUMENTS, {}, True),
    ("not_json", b"hello", {}, False),
    ("not_json_in_session", b"{", {}, True),
    ("empty", b"", {}, False),
    ("a_number", b"1", {}, False),
    ("empty_batch", b"[]", {}, True),
    ("no_method", b'{"jsonrpc":"2.0","id":1}', {}, True),
    ("wrong_version", b'{"jsonrpc":"1.0","id":1,"method":"ping"}', {}, True),
    ("params_not_an_object", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}', {}, True),
    ("invalid_utf8", b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":"\xff"}}', {}, False),
    ("text_plain", PING, {"Content-Type": "text/plain"}, False),
    ("unknown_session", PING, {"Mcp-Session-Id": "no-such-session"}, False),
    ("unknown_protocol_version", PING, {"Mcp-Protocol-Version": "1999-01-01"}, True),
    ("header_mismatch", PING, {"Mcp-Method": "tools/list"}, False),
    ("wrong_path", PING, {"x-path": "/other"}, False),
]


def headers_for(caller_headers: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**caller_headers, "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            **(extra or {})}


def assert_json_rpc_error(response: httpx2.Response, statuses: range = range(400, 500)) -> dict[str, Any]:
    assert response.status_code in statuses, f"HTTP {response.status_code}: {response.text[:300]}"
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    assert body.get("jsonrpc") == "2.0" and isinstance(body["error"]["code"], int) and body["error"]["message"], body
    return body["error"]


def open_session(url: str, headers: dict[str, str]) -> dict[str, str]:
    response = httpx2.post(url, content=INITIALIZE, headers=headers)
    assert response.status_code == 200, response.text
    session = {"Mcp-Session-Id": response.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
    httpx2.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**headers, **session})
    return session


@pytest.mark.parametrize(("name", "body", "extra", "in_session"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_is_a_4xx_with_a_json_rpc_error(gateway, name: str, body: bytes, extra: dict[str, str],  # noqa: ANN001
                                                        in_session: bool) -> None:
    caller = mint_caller(gateway.world, "ana")
    headers = headers_for(caller.http_headers())
    url = gateway.http.url
    if "x-path" in extra:
        url = url.removesuffix("/mcp") + extra.pop("x-path")
    if in_session:
        headers |= open_session(gateway.http.url, headers)
    response = httpx2.post(url, content=body, headers={**headers, **extra}, timeout=30)
    assert_json_rpc_error(response)


def test_a_foreign_host_or_origin_is_refused(gateway) -> None:  # noqa: ANN001
    """DNS rebinding: a page on evil.example.com whose name resolves to 127.0.0.1 reaches the
    gateway with its own Host (and a browser's Origin); a loopback gateway refuses both."""
    caller = mint_caller(gateway.world, "ana")
    headers = headers_for(caller.http_headers())
    url = gateway.http.url
    port = url.rsplit(":", 1)[1].split("/")[0]

    error = assert_json_rpc_error(httpx2.post(url, content=INITIALIZE, headers={**headers, "Host": "evil.example.com"}),
                                  range(421, 422))
    assert "Host" in error["message"]
    assert_json_rpc_error(httpx2.post(url, content=INITIALIZE, headers={**headers, "Origin": "http://evil.example.com"}),
                          range(403, 404))
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        response = httpx2.post(url, content=INITIALIZE, headers={**headers, "Host": host})
        assert response.status_code == 200, (host, response.status_code, response.text[:200])
    for origin in (f"http://localhost:{port}", "http://127.0.0.1:5173", "https://localhost"):
        response = httpx2.post(url, content=INITIALIZE, headers={**headers, "Origin": origin})
        assert response.status_code == 200, (origin, response.status_code, response.text[:200])


def test_allowed_hosts_replace_the_loopback_names(gateway, tmp_path) -> None:  # noqa: ANN001
    world = gateway.world
    http: HttpGateway = start_http_gateway(
        gateway.kind, world.capgate.url, world.gateway_token_file, world.gateway_env, tmp_path / "gateway.stderr",
        extra=["--allowed-host", "mcp.internal", "--allowed-host", "gw.example.com:8443",
               "--allowed-origin", "https://console.example.com"],
    )
    gateway.stdio_logs.append(tmp_path / "gateway.stderr")
    try:
        headers = headers_for(mint_caller(world, "ana").http_headers())
        statuses = {
            host: httpx2.post(http.url, content=INITIALIZE, headers={**headers, "Host": host}).status_code
            for host in ("mcp.internal", "mcp.internal:9000", "gw.example.com:8443", "gw.example.com:80", "localhost")
        }
        origins = {
            origin: httpx2.post(http.url, content=INITIALIZE,
                                headers={**headers, "Host": "mcp.internal", "Origin": origin}).status_code
            for origin in ("https://console.example.com", "http://mcp.internal:3000", "http://localhost")
        }
    finally:
        http.process.stop()
    assert statuses == {"mcp.internal": 200, "mcp.internal:9000": 200, "gw.example.com:8443": 200,
                        "gw.example.com:80": 421, "localhost": 421}, statuses
    assert origins == {"https://console.example.com": 200, "http://mcp.internal:3000": 200,
                       "http://localhost": 403}, origins
