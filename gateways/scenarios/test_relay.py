"""What a gateway relays besides tools: closed by default, open per upstream with `--relay`.

relay.json opens server-everything (a public server, 2025-11-25) for resources, prompts,
completions and logging, and our stdio upstream (2026-07-28) for resources and prompts. A
caller reaches an opened upstream when capgate shows them one of its tools, and the request
runs as that tool's account; every relayed request is logged with capgate's listing record,
which names the caller.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from harness import EVERYTHING, SCENARIOS, Caller, HttpGateway, json_event, mcp_client, render, sha256, start_http_gateway
from scenario import mint_caller, transcript

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

FEATURES_DOC = "demo://resource/static/document/features.md"
DYNAMIC_TEXT = "demo://resource/dynamic/text/7"


@pytest.fixture(scope="module")
def relaying(gateway) -> Iterator[HttpGateway]:  # noqa: ANN001
    """The gateway under test again, with `--relay relay.json`."""
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: run `npm ci` in gateways/conformance, as gateways/run-tests.sh does")
    world = gateway.world
    relay_file = world.directory / "relay.json"
    relay_file.write_text(render((SCENARIOS / "relay.json").read_text(), world.values))
    log = world.directory / f"{gateway.kind.name}-relaying.stderr"
    gateway.stdio_logs.append(log)
    http = start_http_gateway(gateway.kind, world.capgate.url, world.gateway_token_file, world.gateway_env, log,
                              extra=["--relay", str(relay_file)])
    yield http
    http.process.stop()


def drive(gateway_http: HttpGateway, caller: Caller, work: Any, *, transport: str = "http-legacy",
          on_message: Any = None) -> Any:
    async def run() -> Any:
        with anyio.fail_after(60):
            async with mcp_client(transport, gateway=gateway_http, caller=caller, message_handler=on_message) as client:
                return await work(client)

    return anyio.run(run)


async def refused(call: Any) -> MCPError:
    try:
        answer = await call
    except MCPError as error:
        return error
    raise AssertionError(f"expected a refusal, got {transcript(answer)}")


def relayed_events(gateway_http: HttpGateway) -> list[dict[str, Any]]:
    return [e for line in gateway_http.process.lines if (e := json_event(line)) and e.get("event") == "relayed"]


def assert_attributed(gateway, gateway_http: HttpGateway, caller: Caller, methods: set[str]) -> None:  # noqa: ANN001
    """Each relayed request of `caller` is logged with a listing record that names them."""
    records = {r["decision_id"]: r for r in gateway.world.capgate.audit() if r.get("kind") == "list"}
    mine = [e for e in relayed_events(gateway_http) if records.get(e.get("listing_id", ""), {}).get("subject") == caller.subject]
    assert methods <= {e["method"] for e in mine}, (methods, mine)
    for event in relayed_events(gateway_http):
        assert event.get("listing_id") in records, f"a relayed request without its listing record: {event}"


# ── closed by default ───────────────────────────────────────────────────────


def test_nothing_but_tools_without_relay(gateway) -> None:  # noqa: ANN001
    caller = mint_caller(gateway.world, "ana")

    async def work(client: Any) -> tuple[Any, list[MCPError]]:
        errors = [await refused(client.list_resources()), await refused(client.list_prompts()),
                  await refused(client.read_resource(FEATURES_DOC))]
        return client.server_capabilities, errors

    for transport in ("http-legacy", "http"):
        capabilities, errors = drive(gateway.http, caller, work, transport=transport)
        assert capabilities.resources is None and capabilities.prompts is None, capabilities
        assert capabilities.logging is None and capabilities.completions is None, capabilities
        assert [e.code for e in errors] == [types.METHOD_NOT_FOUND] * 3, [transcript(e) for e in errors]


# ── open per upstream ───────────────────────────────────────────────────────


@pytest.mark.parametrize("transport", ["http-legacy", "http"])
def test_resources_prompts_and_completions_are_relayed(gateway, relaying: HttpGateway, transport: str) -> None:  # noqa: ANN001
    world = gateway.world
    caller = mint_caller(world, "ana")

    async def work(client: Any) -> dict[str, Any]:
        return {
            "resources": [r.uri for r in (await client.list_resources()).resources],
            "templates": [t.uri_template for t in (await client.list_resource_templates()).resource_templates],
            "document": await client.read_resource(FEATURES_DOC),
            "dynamic": await client.read_resource(DYNAMIC_TEXT),
            "probe": await client.read_resource("probe://whoami"),
            "prompts": [p.name for p in (await client.list_prompts()).prompts],
            "args_prompt": await client.get_prompt("everything__args-prompt", {"city": "Lisbon"}),
            "greet": await client.get_prompt("probe-env__greet", {"name": "Ana"}),
            "completion": await client.complete(types.PromptReference(name="everything__completable-prompt"),
                                                {"name": "department", "value": "Eng"}),
            "bare_prompt": await refused(client.get_prompt("args-prompt", {"city": "Lisbon"})),
        }

    got = drive(relaying, caller, work, transport=transport)
    gateway.transcripts.extend(transcript(v) for v in got.values() if not isinstance(v, list))
    assert FEATURES_DOC in got["resources"] and "probe://whoami" in got["resources"], got["resources"]
    assert "demo://resource/dynamic/text/{resourceId}" in got["templates"], got["templates"]
    assert got["document"].contents and got["document"].contents[0].uri == FEATURES_DOC
    assert got["dynamic"].contents[0].uri == DYNAMIC_TEXT
    # The relayed read ran as the account of the caller's probe-env tools, with its credential.
    assert got["probe"].contents[0].text == f"credential-sha256: {sha256(world.sentinels['SECRET_ENV'])}"
    assert {"everything__simple-prompt", "everything__args-prompt", "probe-env__greet"} <= set(got["prompts"]), got["prompts"]
    assert "Lisbon" in json.dumps(got["args_prompt"].model_dump(mode="json"))
    assert "Ana" in json.dumps(got["greet"].model_dump(mode="json"))
    assert "Engineering" in got["completion"].completion.values, got["completion"]
    assert got["bare_prompt"].code == -32602 and got["bare_prompt"].data["code"] == "unknown_prompt"
    assert_attributed(gateway, relaying, caller, {"resources/list", "resources/read", "prompts/get", "completion/complete"})


def test_a_caller_reaches_only_the_upstreams_capgate_shows_them(gateway, relaying: HttpGateway) -> None:  # noqa: ANN001
    """mallory (sales) may use no tool at all; carol (marketing) uses server-everything's tools as two
    accounts, and the policy does not say which one a resource read would run as."""
    world = gateway.world

    async def work(client: Any) -> tuple[list[str], list[str], MCPError]:
        resources = [r.uri for r in (await client.list_resources()).resources]
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        return resources, prompts, await refused(client.read_resource(FEATURES_DOC))

    for name in ("mallory", "carol"):
        resources, prompts, error = drive(relaying, mint_caller(world, name), work)
        gateway.transcripts.append(transcript(error))
        assert resources == [] and prompts == [], (name, resources, prompts)
        assert error.code == -32602 and error.data["code"] == "unknown_resource", transcript(error)
    assert any((json_event(line) or {}).get("event") == "relay_ambiguous" for line in relaying.process.lines)


def test_an_unauthenticated_caller_is_refused(gateway, relaying: HttpGateway) -> None:  # noqa: ANN001
    error = drive(relaying, mint_caller(gateway.world, "forged"), lambda client: refused(client.list_resources()))
    gateway.transcripts.append(transcript(error))
    assert error.code == -32001 and error.data["code"] == "unauthenticated", transcript(error)


def test_subscriptions_and_logs_reach_the_session_that_asked(gateway, relaying: HttpGateway) -> None:  # noqa: ANN001
    """Handshake era: resources/subscribe and logging/setLevel go upstream, and what the upstream
    then says (resources/updated, notifications/message) comes back to that session."""
    caller = mint_caller(gateway.world, "ana")
    heard: dict[str, anyio.Event] = {"updated": anyio.Event(), "message": anyio.Event()}

    async def on_message(message: object) -> None:
        if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == FEATURES_DOC:
            heard["updated"].set()
        if isinstance(message, types.LoggingMessageNotification):
            heard["message"].set()

    async def work(client: Any) -> None:
        await client.subscribe_resource(FEATURES_DOC)
        await client.set_logging_level("debug")
        # server-everything's own switches, called as tools (capgate decides them like any tool).
        for tool in ("everything__toggle-subscriber-updates", "everything__toggle-simulated-logging"):
            assert not (await client.call_tool(tool, {})).is_error
        try:
            with anyio.fail_after(15):
                await heard["updated"].wait()
                await heard["message"].wait()
        finally:
            for tool in ("everything__toggle-subscriber-updates", "everything__toggle-simulated-logging"):
                await client.call_tool(tool, {})
            await client.unsubscribe_resource(FEATURES_DOC)

    drive(relaying, caller, work, on_message=on_message)
    assert_attributed(gateway, relaying, caller, {"resources/subscribe", "logging/setLevel", "resources/unsubscribe"})


def test_a_listen_stream_hears_the_resources_it_names(gateway, relaying: HttpGateway) -> None:  # noqa: ANN001
    """2026-07-28: the resource URIs of `subscriptions/listen` are subscribed upstream for the stream's
    life; one that no upstream the caller reaches serves is left out of what is honoured."""
    caller = mint_caller(gateway.world, "ana")

    async def work(client: Any) -> list[str]:
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS, client.protocol_version
        async with client.listen(resource_subscriptions=[FEATURES_DOC, "demo://nowhere/7"]) as subscription:
            honoured = list(subscription.honored.resource_subscriptions or [])
            assert not (await client.call_tool("everything__toggle-subscriber-updates", {})).is_error
            try:
                with anyio.fail_after(15):
                    async for event in subscription:
                        if isinstance(event, ResourceUpdated) and event.uri == FEATURES_DOC:
                            break
            finally:
                await client.call_tool("everything__toggle-subscriber-updates", {})
        return honoured

    assert drive(relaying, caller, work, transport="http") == [FEATURES_DOC]
    assert_attributed(gateway, relaying, caller, {"resources/subscribe"})


def test_a_method_the_upstreams_revision_lacks_is_its_own_refusal(gateway, relaying: HttpGateway) -> None:  # noqa: ANN001
    """Our stdio upstream speaks 2026-07-28, which has no resources/subscribe: the caller gets -32601
    as from the upstream itself, and the upstream session stays (the next read is answered)."""
    caller = mint_caller(gateway.world, "ana")

    async def work(client: Any) -> tuple[MCPError, Any]:
        return await refused(client.subscribe_resource("probe://whoami")), await client.read_resource("probe://whoami")

    error, read = drive(relaying, caller, work)
    gateway.transcripts.append(transcript(error))
    assert error.code == types.METHOD_NOT_FOUND, transcript(error)
    assert read.contents[0].text.startswith("credential-sha256: ")
