"""capgate's forward-auth door behind real nginx, Caddy and Traefik, each configured as its page of
docs/gateways/ says (proxies.py), each test once per proxy.

The client is the official MCP SDK; the server is the probe (the official Python SDK's server, on
MCP 2026-07-28, which answers the headers it received) and, where the older protocol is the
point, @modelcontextprotocol/server-everything (2025-11-25). Each denial is checked twice: as
the SDK's caller receives it, and as the HTTP answer the proxy gave (sdk.Exchanges). The door
reads no body, so its JSON-RPC errors carry a null `id`, which the SDK replaces with its
request's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from mcp import MCPError
from mcp_types.jsonrpc import HEADER_MISMATCH

from conftest import ACCOUNT, CEILING, Fronted
from sdk import Exchanges, answered, connect, denial, probe_headers, run

MODERN = "2026-07-28"
# The header capgate reads a proxy's own request id from (the pages' --forward-auth-request-id-header).
REQUEST_ID_HEADER = "x-capgate-request-id"
# Where each proxy puts capgate's RateLimit headers: the client's response (nginx's add_header) or
# the request to the MCP server (Caddy's copy_headers, Traefik's authResponseHeaders).
RATELIMIT_TO = {"nginx": "client", "caddy": "upstream", "traefik": "upstream"}
# nginx asks twice for a denial (error_page, docs/gateways/nginx.md), and capgate replays its answer.
ASKS_AGAIN_ON_DENIAL = {"nginx"}


def leaves(group: BaseExceptionGroup) -> list[Any]:
    """The exceptions of `group` and of the groups within it (the SDK's task groups nest)."""
    return [leaf for inner in group.exceptions
            for leaf in (leaves(inner) if isinstance(inner, BaseExceptionGroup) else [inner])]


def test_the_proxy_is_the_version_its_page_names(fronted: Fronted) -> None:
    assert fronted.proxy.version() == fronted.proxy.checked_version()


# ── allowed ─────────────────────────────────────────────────────────────────


def test_an_allowed_call_reaches_the_server_with_the_account_and_without_the_key(fronted: Fronted) -> None:
    forged = {**fronted.caller(), "x-capgate-account": "forged-by-the-client", "x-capgate-decision-id": "forged"}

    async def scenario() -> Any:
        async with connect(fronted.url, forged) as (client, seen):
            listed = await client.list_tools()
            return client.session.protocol_version, listed, await client.call_tool("headers", {}), seen

    version, listed, result, seen = run(scenario)
    # mode="auto": `server/discover` passed, and the SDK stays on 2026-07-28, naming the method and
    # the tool in headers the door reads.
    assert seen.one("server/discover").status == 200 and version == MODERN
    assert {"headers", "limited", "erase"} <= {tool.name for tool in listed.tools}
    received = probe_headers(result)
    assert (received["mcp-method"], received["mcp-name"]) == ("tools/call", "headers")
    assert received["x-capgate-account"] == ACCOUNT
    # The caller's key was for capgate, and the proxy's token never leaves for the MCP server.
    assert "x-api-key" not in received and "x-capgate-gateway-token" not in received, received
    record = fronted.capgate.record(received["x-capgate-decision-id"])
    assert (record["outcome"], record["tool"], record["account_id"], record["door"], record["gateway"]) == (
        "allow", "probe__headers", ACCOUNT, "forward_auth", fronted.proxy.name)


# ── denied ──────────────────────────────────────────────────────────────────


def test_a_tool_without_a_grant_is_403_no_grant_matches(fronted: Fronted) -> None:
    async def scenario() -> Any:
        async with connect(fronted.url, fronted.caller()) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("erase", {})
            return refused.value, seen

    error, seen = run(scenario)
    data = denial(error, "no_grant_matches")
    assert answered(seen.one("tools/call", "erase"), 403, rpc_id=None)["data"] == data
    record = fronted.capgate.record(data["decision_id"])
    assert (record["outcome"], record["code"], record["tool"], record["door"]) == (
        "deny", "no_grant_matches", "probe__erase", "forward_auth")


def test_a_spent_ceiling_is_429_with_retry_after_whatever_request_id_the_client_sends(fronted: Fronted) -> None:
    # The client names a request id of its own in the header capgate reads the proxy's from: each
    # page's configuration replaces it (nginx, Caddy) or removes it (Traefik), else every call after
    # the first would get the first one's allow replayed, and the ceiling would never be reached.
    calls, _ = CEILING
    headers = {**fronted.caller(), REQUEST_ID_HEADER: "chosen-by-the-client"}

    async def scenario() -> Any:
        async with connect(fronted.url, headers) as (client, seen):
            allowed = [probe_headers(await client.call_tool("limited", {})) for _ in range(calls)]
            with pytest.raises(MCPError) as refused:
                await client.call_tool("limited", {})
            return allowed, refused.value, seen

    allowed, error, seen = run(scenario)
    rate_limits = [(e.headers, received) for e, received in zip(seen.of("tools/call", "limited"), allowed)]
    where = RATELIMIT_TO[fronted.proxy.name]
    shown = [response if where == "client" else received for response, received in rate_limits]
    assert [h.get("ratelimit-policy") for h in shown] == [f'"capgate";q={calls};w=3600'] * calls, rate_limits
    assert [h.get("ratelimit", "").split(";")[1:2] for h in shown] == [[f"r={calls - n - 1}"] for n in range(calls)]
    data = denial(error, "limit_exhausted")
    refused = seen.of("tools/call", "limited")[calls]
    assert answered(refused, 429, rpc_id=None)["data"] == data
    assert refused.headers["retry-after"] == "3600"
    record = fronted.capgate.record(data["decision_id"])
    assert (record["door"], record["tool"]) == ("forward_auth", "probe__limited")
    assert record["request_id"] != "chosen-by-the-client"


def test_an_unknown_usage_is_503_usage_unknown(own_fronted: Callable[[], Fronted]) -> None:
    # The counters' table gone from under the server, as tests/forward_auth.rs does: a capped call's
    # usage cannot be read. The capgate is this test's own, since its store is spoiled.
    spoiled = own_fronted()
    spoiled.capgate.database.break_counters()

    async def scenario() -> Any:
        async with connect(spoiled.url, spoiled.caller()) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("limited", {})
            uncapped = await client.call_tool("headers", {})
            return refused.value, uncapped, seen

    error, uncapped, seen = run(scenario)
    data = denial(error, "usage_unknown")
    refused = seen.one("tools/call", "limited")
    assert answered(refused, 503, rpc_id=None)["data"] == data
    assert refused.headers["retry-after"] == "1"
    # A grant without a ceiling reads no counter.
    assert probe_headers(uncapped)["x-capgate-account"] == ACCOUNT
    assert spoiled.capgate.record(data["decision_id"])["door"] == "forward_auth"


@pytest.mark.parametrize(("key", "challenge"), [
    (None, r'^Bearer$'),
    ("not-the-key", r'^Bearer error="invalid_token", error_description="credential_invalid"$'),
], ids=["no-key", "a-wrong-key"])
def test_a_caller_without_a_valid_key_is_401_with_a_challenge(fronted: Fronted, key: str | None,
                                                              challenge: str) -> None:
    headers = {} if key is None else {"x-api-key": key}

    async def scenario() -> Any:
        async with connect(fronted.url, headers) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("headers", {})
            return refused.value, seen

    error, seen = run(scenario)
    code = "credential_missing" if key is None else "credential_invalid"
    data = denial(error, code)
    refused = seen.one("tools/call", "headers")
    assert answered(refused, 401, rpc_id=None)["data"] == data
    # One challenge: a proxy that copied capgate's and added its own would show two, joined.
    assert re.match(challenge, refused.headers["www-authenticate"]), refused.headers
    record = fronted.capgate.record(data["decision_id"])
    assert (record["outcome"], record["door"]) == ("unauthenticated", "forward_auth")


# ── what the door cannot see ───────────────────────────────────────────────


def test_a_client_cannot_pass_off_its_post_as_a_get(fronted: Fronted) -> None:
    # A request without Mcp-Method passes only when the proxy says it was a GET or a DELETE. Each
    # page's proxy sets X-Forwarded-Method itself, over the client's; capgate reads that header
    # before X-Original-Method, which the client sends too.
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "erase", "arguments": {}}}
    lies = {**fronted.caller(), "x-forwarded-method": "GET", "x-original-method": "GET",
            "accept": "application/json, text/event-stream"}
    response = httpx2.post(fronted.url, json=call, headers=lies, timeout=20)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == -32600 and error["message"].startswith("no MCP method"), error


def test_the_server_checks_the_tool_the_headers_name_against_the_body(fronted: Fronted) -> None:
    # The door decides on Mcp-Name; the body could name another tool. A 2026-07-28 server (here the
    # official SDK's) refuses a request whose headers and body disagree: replaying the SDK's own
    # allowed call with `erase` in the body gets the tool decided (an allow for `headers`) and
    # refused by the server.
    async def scenario() -> Any:
        async with connect(fronted.url, fronted.caller(), mode=MODERN) as (client, seen):
            await client.call_tool("headers", {})
            return seen

    sent = run(scenario).one("tools/call", "headers")
    body = {**sent.request, "params": {**sent.request["params"], "name": "erase"}}
    headers = {name: value for name, value in sent.sent_headers.items() if name not in ("content-length", "host")}
    before = {row["decision_id"] for row in fronted.capgate.audit()}
    response = httpx2.post(fronted.url, json=body, headers=headers, timeout=20)
    assert "erased" not in response.text, response.text
    answer = response.json()
    assert answer["error"]["code"] == HEADER_MISMATCH, answer
    decided = [row for row in fronted.capgate.audit() if row["decision_id"] not in before]
    assert [(row["outcome"], row["tool"]) for row in decided] == [("allow", "probe__headers")], decided


def test_a_client_on_the_handshake_protocol_cannot_connect(fronted: Fronted) -> None:
    # server-everything speaks 2025-11-25: the SDK's `server/discover` passes the door and is
    # answered with an error by the server, and the SDK falls back to the handshake, whose requests
    # name no method in headers. The door, with no body to read, cannot tell the `initialize` from
    # a tool call, and refuses it: the client never connects.
    proxy = fronted.in_front_of(fronted.upstreams.everything)
    seen = Exchanges()

    async def scenario() -> list[MCPError]:
        refused: list[MCPError] = []
        try:
            async with connect(proxy.url, fronted.caller(), exchanges=seen):
                pass
        except* MCPError as group:
            refused = leaves(group)
        return refused

    errors = run(scenario)
    assert len(errors) == 1, errors
    error = errors[0]
    assert error.error.code == -32600 and error.error.message.startswith("no MCP method"), error.error
    assert [(e.rpc_method, e.status) for e in seen.all] == [("server/discover", 400), ("initialize", 403)]
    assert answered(seen.one("initialize"), 403, rpc_id=None)["message"] == error.error.message


def test_a_server_on_the_handshake_protocol_runs_what_the_body_says_whatever_the_headers_claim(
        fronted: Fronted) -> None:
    # Why the pages say to front only 2026-07-28 servers: a client that sends `Mcp-Method: ping` on
    # every request has each passed without a decision, and server-everything, which does not read
    # the header, runs the tool the body names, granted to nobody (`get-env`).
    proxy = fronted.in_front_of(fronted.upstreams.everything)

    async def scenario() -> Any:
        async with connect(proxy.url, {**fronted.caller(), "mcp-method": "ping"}) as (client, _):
            return await client.call_tool("get-env", {})

    result = run(scenario)
    assert not result.is_error and "PATH" in result.content[0].text
    assert not [row for row in fronted.capgate.audit() if row["tool"] == "everything__get-env"]


def test_every_decision_through_the_proxy_is_audited_at_the_forward_auth_door(fronted: Fronted) -> None:
    # Last in the module: the rows of every test before it with this proxy.
    rows = fronted.capgate.audit()
    assert rows and {(row["door"], row["gateway"]) for row in rows} == {("forward_auth", fronted.proxy.name)}
    replayed = sorted(str(row["request_id"]) for row in rows if row["outcome"] == "replayed")
    denied = sorted(str(row["request_id"]) for row in rows if row["outcome"] not in ("allow", "replayed"))
    # nginx asks for each denial twice, with its own id, and the second is answered from the first.
    expected = denied if fronted.proxy.name in ASKS_AGAIN_ON_DENIAL else []
    assert denied and replayed == expected, json.dumps(rows, indent=1)
    answers = fronted.capgate.door_answers()
    assert set(answers) <= {200, 401, 403, 429}, answers
