"""Behaviours that are not one request → one answer: the HTTP edge, a policy publish mid-session,
capgate down or hanging, and the support for capgate's newer RPCs."""

from __future__ import annotations

import socket
import sqlite3
import time

import anyio
import httpx2
import mcp_types as types
import pytest
import yaml
from capgate_client import CapgateClient, NotFoundError, NoteKind, UnimplementedError
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from harness import Caller, free_port, mcp_client, start_capgate, start_http_gateway
from scenario import SUITE, mint_caller, transcript

# ── the HTTP edge ────────────────────────────────────────────────────────────


def test_no_authorization_header_is_401(gateway) -> None:  # noqa: ANN001
    response = httpx2.post(gateway.http.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                           headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 401
    assert response.headers.get("www-authenticate", "").lower().startswith("bearer")


def test_mcp_method_header_must_agree_with_the_body(gateway) -> None:  # noqa: ANN001
    caller = mint_caller(gateway.world, "ana")
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "probe-env__whoami", "arguments": {}}}
    headers = {**caller.http_headers(), "Accept": "application/json, text/event-stream",
               "Mcp-Method": "tools/list", "Mcp-Name": "probe-env__whoami"}
    response = httpx2.post(gateway.http.url, json=body, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == -32600, error
    headers["Mcp-Method"], headers["Mcp-Name"] = "tools/call", "probe-env__echo"
    response = httpx2.post(gateway.http.url, json=body, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == -32600, response.text


# ── a policy publish mid-session ─────────────────────────────────────────────


def _supports_watch(capgate_url: str, admin_token: str) -> bool:
    async def probe() -> bool:
        async with CapgateClient(capgate_url, token=admin_token) as client:
            try:
                with anyio.fail_after(5):
                    async for _ in client.watch_policy():
                        return True
            except UnimplementedError:
                return False
        return True

    return anyio.run(probe)


@pytest.mark.parametrize("transport", ["http", "http-legacy", "stdio"])
def test_publish_mid_session_notifies_and_relists(gateway, transport: str) -> None:  # noqa: ANN001
    world = gateway.world
    admin_token = world.sentinels["ADMIN_TOKEN"]
    assert _supports_watch(world.capgate.url, admin_token), (
        "this capgate build answers WatchPolicy UNIMPLEMENTED: the suite needs one that implements it"
    )
    caller = mint_caller(world, "ana")
    appears = SUITE["publish"]["appears"]
    changed = yaml.safe_load(world.policy_text)
    changed["grants"].extend(SUITE["publish"]["add_grants"])

    async def drive() -> tuple[list[str], list[str], float]:
        heard = anyio.Event()

        async def on_message(message: object) -> None:
            if isinstance(message, types.ServerNotification) and message.method == "notifications/tools/list_changed":
                heard.set()

        async with CapgateClient(world.capgate.url, token=admin_token) as admin:
            async with mcp_client(
                transport, gateway=gateway.http, kind=gateway.kind, caller=caller, capgate_url=world.capgate.url,
                token_file=world.gateway_token_file, env=world.gateway_env, errlog=gateway.stdio_log("publish"),
                message_handler=on_message,
            ) as client:
                before = [t.name for t in (await client.list_tools()).tools]
                modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
                try:
                    if modern:
                        async with client.listen(tools_list_changed=True) as subscription:
                            started = time.monotonic()
                            await admin.publish_policy(yaml.safe_dump(changed), catalog=world.catalog_text)
                            with anyio.fail_after(5):
                                async for _event in subscription:
                                    break
                    else:
                        # The handshake era's standalone stream needs a moment to open after
                        # initialize; the first listing above has gone through it.
                        started = time.monotonic()
                        await admin.publish_policy(yaml.safe_dump(changed), catalog=world.catalog_text)
                        with anyio.fail_after(5):
                            await heard.wait()
                    elapsed = time.monotonic() - started
                    after = [t.name for t in (await client.list_tools()).tools]
                finally:
                    await admin.publish_policy(world.policy_text, catalog=world.catalog_text)
                return before, after, elapsed

    before, after, elapsed = anyio.run(drive)
    assert appears not in before
    assert appears in after
    # The promise: sessions hear of a change within a second of the publish answering.
    print(f"{gateway.kind.name}/{transport}: list_changed {elapsed * 1000:.0f} ms after the publish")
    assert elapsed < 1.0, f"list_changed arrived {elapsed:.2f} s after the publish"


# ── fail closed ──────────────────────────────────────────────────────────────


def _call(gateway_http, caller: Caller, tool: str) -> object:  # noqa: ANN001
    async def drive() -> object:
        with anyio.fail_after(30):
            async with mcp_client("http", gateway=gateway_http, caller=caller) as client:
                try:
                    return await client.call_tool(tool, {})
                except MCPError as error:
                    return error

    return anyio.run(drive)


def test_capgate_down_fails_closed(gateway, tmp_path) -> None:  # noqa: ANN001
    """A gateway whose capgate stops refuses every call with capgate_unavailable and runs nothing."""
    world = gateway.world
    capgate = start_capgate(
        tmp_path, world.directory / "policy.yaml", world.directory / "catalog.yaml",
        env={**world.gateway_env, "SCENARIO_CALLER_API_KEY": world.sentinels["CALLER_API_KEY"]},
        gateway_token_file=world.gateway_token_file, admin_token_file=world.admin_token_file,
        oidc_ca=world.oidc.ca_file, name="capgate-doomed",
    )
    http = start_http_gateway(gateway.kind, capgate.url, world.gateway_token_file, world.gateway_env,
                              tmp_path / "gateway.stderr")
    try:
        caller = mint_caller(world, "ana")
        first = _call(http, caller, "probe-env__echo")
        assert not isinstance(first, MCPError), transcript(first)
        capgate.process.stop()
        answer = _call(http, caller, "probe-env__echo")
        gateway.transcripts.append(transcript(answer))
        assert isinstance(answer, MCPError) and answer.code == -32001, transcript(answer)
        assert answer.data["code"] == "capgate_unavailable", transcript(answer)
    finally:
        http.process.stop()
        capgate.process.stop()
    # Both logs go to the sentinel check with the others.
    gateway.stdio_logs.extend([tmp_path / "gateway.stderr", capgate.process.log])


def test_a_store_that_does_not_answer_denies_capped_calls_usage_unknown(gateway, tmp_path) -> None:  # noqa: ANN001
    """capgate's store stops answering (another process holds SQLite's write lock): a capped call
    is denied usage_unknown, with its pointer; an uncapped one still runs; both records reach the
    audit trail through capgate's spool once the store answers again."""
    world = gateway.world
    capgate = start_capgate(
        tmp_path, world.directory / "policy.yaml", world.directory / "catalog.yaml",
        env={**world.gateway_env, "SCENARIO_CALLER_API_KEY": world.sentinels["CALLER_API_KEY"]},
        gateway_token_file=world.gateway_token_file, admin_token_file=world.admin_token_file,
        oidc_ca=world.oidc.ca_file, name="capgate-stuck", extra=["--audit-spool", str(tmp_path / "spool")],
    )
    http = start_http_gateway(gateway.kind, capgate.url, world.gateway_token_file, world.gateway_env,
                              tmp_path / "gateway.stderr")
    lock = sqlite3.connect(tmp_path / "capgate-stuck.db", isolation_level=None, timeout=10)
    try:
        caller = mint_caller(world, "ana")
        lock.execute("BEGIN EXCLUSIVE")
        capped = _call(http, caller, "probe-metered__whoami")
        uncapped = _call(http, caller, "probe-env__whoami")
        lock.execute("ROLLBACK")
        gateway.transcripts.extend([transcript(capped), transcript(uncapped)])
        assert isinstance(capped, MCPError) and capped.code == -32001, transcript(capped)
        assert capped.data["code"] == "usage_unknown", transcript(capped)
        assert capped.data["pointer"] == "/grants/7", transcript(capped)
        assert "retry_after_seconds" not in capped.data, transcript(capped)
        assert not isinstance(uncapped, MCPError), transcript(uncapped)
        # Both answers waited for their records; the spool hands them to the store.
        wanted = {capped.data["decision_id"]}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            recorded = {row["decision_id"]: row for row in capgate.audit()}
            if wanted <= recorded.keys():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the usage_unknown record never reached the store: {sorted(recorded)}")
        assert recorded[capped.data["decision_id"]]["code"] == "usage_unknown"
    finally:
        lock.close()
        http.process.stop()
        capgate.process.stop()
    gateway.stdio_logs.extend([tmp_path / "gateway.stderr", capgate.process.log])


def test_capgate_over_tls_is_verified_with_the_ca_file(gateway, tmp_path) -> None:  # noqa: ANN001
    """capgate serving TLS: with `--ca-file` the gateway verifies it and the call runs; without
    it the gateway cannot verify capgate and refuses the call (capgate_unavailable), fail closed."""
    world = gateway.world
    # The run's own CA signed a 127.0.0.1 certificate for the OIDC fixture; capgate serves it too.
    tls = ["--tls-cert", str(world.directory / "oidc.crt"), "--tls-key", str(world.directory / "oidc.key")]
    capgate = start_capgate(
        tmp_path, world.directory / "policy.yaml", world.directory / "catalog.yaml",
        env={**world.gateway_env, "SCENARIO_CALLER_API_KEY": world.sentinels["CALLER_API_KEY"]},
        gateway_token_file=world.gateway_token_file, admin_token_file=world.admin_token_file,
        oidc_ca=world.oidc.ca_file, name="capgate-tls", extra=tls,
    )
    url = capgate.url.replace("http://", "https://", 1)
    trusting = start_http_gateway(gateway.kind, url, world.gateway_token_file, world.gateway_env,
                                  tmp_path / "trusting.stderr", extra=["--ca-file", str(world.oidc.ca_file)])
    blind = start_http_gateway(gateway.kind, url, world.gateway_token_file, world.gateway_env,
                               tmp_path / "blind.stderr")
    try:
        caller = mint_caller(world, "ana")
        answer = _call(trusting, caller, "probe-env__whoami")
        refused = _call(blind, caller, "probe-env__whoami")
    finally:
        trusting.process.stop()
        blind.process.stop()
        capgate.process.stop()
    gateway.stdio_logs.extend([tmp_path / "trusting.stderr", tmp_path / "blind.stderr", capgate.process.log])
    assert not isinstance(answer, MCPError), transcript(answer)
    gateway.transcripts.append(transcript(refused))
    assert isinstance(refused, MCPError) and refused.data["code"] == "capgate_unavailable", transcript(refused)


def test_capgate_hanging_hits_the_decide_timeout(gateway, tmp_path) -> None:  # noqa: ANN001
    """A capgate that accepts and never answers: refused after --decide-timeout, not later."""
    world = gateway.world
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        url = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
        http = start_http_gateway(gateway.kind, url, world.gateway_token_file, world.gateway_env,
                                  tmp_path / "gateway.stderr", extra=["--decide-timeout", "0.5"])
        try:
            started = time.monotonic()
            answer = _call(http, mint_caller(world, "ana"), "probe-env__echo")
            elapsed = time.monotonic() - started
        finally:
            http.process.stop()
    gateway.stdio_logs.append(tmp_path / "gateway.stderr")
    assert isinstance(answer, MCPError) and answer.data["code"] == "capgate_unavailable", transcript(answer)
    assert elapsed < 10, elapsed


def test_capgate_unreachable_fails_closed(gateway, tmp_path) -> None:  # noqa: ANN001
    world = gateway.world
    http = start_http_gateway(gateway.kind, f"http://127.0.0.1:{free_port()}", world.gateway_token_file,
                              world.gateway_env, tmp_path / "gateway.stderr")
    try:
        answer = _call(http, mint_caller(world, "ana"), "probe-env__whoami")
    finally:
        http.process.stop()
    gateway.stdio_logs.append(tmp_path / "gateway.stderr")
    assert isinstance(answer, MCPError) and answer.code == -32001 and answer.data["code"] == "capgate_unavailable"


def test_an_upstream_that_never_answers_hits_the_upstream_timeout(gateway, tmp_path) -> None:  # noqa: ANN001
    """An HTTP upstream that accepts and never answers: upstream_failed after --upstream-timeout,
    noted on the decision, and the gateway still answers the next call."""
    world = gateway.world
    http = start_http_gateway(gateway.kind, world.capgate.url, world.gateway_token_file, world.gateway_env,
                              tmp_path / "gateway.stderr", extra=["--upstream-timeout", "2"])
    try:
        caller = mint_caller(world, "ana")
        started = time.monotonic()
        answer = _call(http, caller, "hang__whoami")
        elapsed = time.monotonic() - started
        after = _call(http, caller, "web__whoami")  # an HTTP upstream that answers at once
    finally:
        http.process.stop()
    gateway.stdio_logs.append(tmp_path / "gateway.stderr")
    gateway.transcripts.append(transcript(answer))
    assert isinstance(answer, MCPError) and answer.code == -32003, transcript(answer)
    assert answer.data["code"] == "upstream_failed" and "2s" in answer.data["message"], transcript(answer)
    # The deadline is the gateway's: 2 s, plus capgate's Decide and the client's own round trip.
    assert elapsed < 10, f"the call took {elapsed:.1f}s with --upstream-timeout 2"
    assert not isinstance(after, MCPError), transcript(after)
    row = next(r for r in world.capgate.audit() if r["decision_id"] == answer.data["decision_id"])
    assert any(n["kind"] == "upstream_failed" for n in row.get("notes") or []), row


# ── the OAuth token is cached ────────────────────────────────────────────────


def test_oauth_token_is_minted_once(gateway) -> None:  # noqa: ANN001
    world = gateway.world
    caller = mint_caller(world, "ana")
    before = len(world.tokens.grants)

    async def drive() -> list[object]:
        async with mcp_client("http", gateway=gateway.http, caller=caller) as client:
            return [await client.call_tool("probe-oauth__whoami", {}) for _ in range(3)]

    results = anyio.run(drive)
    gateway.transcripts.extend(transcript(r) for r in results)
    assert all(not r.is_error for r in results)
    assert len(world.tokens.grants) - before <= 1, world.tokens.grants


# ── capgate's newer RPCs ─────────────────────────────────────────────────────


def test_capgate_implements_note_decision(gateway) -> None:  # noqa: ANN001
    """The credential_failed / upstream_failed notes need NoteDecision; say so when it is missing."""
    world = gateway.world

    async def probe() -> str:
        async with CapgateClient(world.capgate.url, token=world.sentinels["GATEWAY_TOKEN"]) as client:
            try:
                await client.note_decision("00000000-0000-7000-8000-000000000000", NoteKind.CREDENTIAL_FAILED, "probe")
            except UnimplementedError:
                return "unimplemented"
            except NotFoundError:
                return "not_found"
            return "noted"

    outcome = anyio.run(probe)
    assert outcome != "unimplemented", "this capgate build answers NoteDecision UNIMPLEMENTED: the suite needs it"
    assert outcome == "not_found", f"a note on an unknown decision was {outcome}"
