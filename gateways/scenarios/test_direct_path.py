"""The direct path for tools/call (docs/decisions/0036-a-direct-path-for-tool-calls.md), Python gateway.

Two gateways on one capgate of this module's own: `--call-path direct` (the default) and
`--call-path sdk`, in front of upstreams/handshake_upstream.py, a handshake-era HTTP upstream
that counts the connections its calls came on, forgets its sessions on demand, says things
before it answers and can hang (and of our 2026-07-28 upstreams, which the SDK's client calls
on either path). Callers speak the 2025-11-25 wire over raw HTTP, so that what
each gateway answers (status, Content-Type, JSON-RPC body) is compared as sent.

Python only: the TypeScript gateway joins by being added to KINDS once it has `--call-path`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harness import (
    PYTHON,
    SCENARIOS,
    Capgate,
    GatewayKind,
    HttpGateway,
    Process,
    json_event,
    start_capgate,
    start_http_gateway,
)

KINDS = [GatewayKind("python")]
UPSTREAM_TIMEOUT = 3
ACCEPT = "application/json, text/event-stream"


def policy(upstream_url: str, values: dict[str, str], discovery: str) -> dict[str, Any]:
    tools = ["echo", "echo_json", "whoami", "fail", "chatty", "hang"]

    def upstream(upstream_id: str, url: str, names: list[str], capability: str | None = None) -> dict[str, Any]:
        return {"id": upstream_id, "transport": {"kind": "mcp-http", "url": url},
                "tools": [{"name": n, "capability": capability or _capability(n)} for n in names]}

    # Besides: our 2026-07-28 upstreams, over stdio and HTTP, which the SDK's client calls.
    stdio = {"kind": "mcp-stdio", "command": values["PYTHON"], "args": [values["SCENARIOS"] + "/upstreams/stdio_upstream.py"]}
    others = ("hs.finance", "hs.unresolved", "hs.down", "hs.stdio", "hs.modern")
    return {
        "version": 1,
        "capabilities": [{"id": _capability(n)} for n in tools] + [{"id": c} for c in others],
        "upstreams": [
            upstream("hs", upstream_url, tools),
            upstream("finance", upstream_url, ["echo"], "hs.finance"),
            upstream("unresolved", upstream_url, ["echo"], "hs.unresolved"),
            upstream("down", values["DOWN_URL"], ["echo"], "hs.down"),
            {"id": "probe", "transport": stdio, "tools": [{"name": "echo", "capability": "hs.stdio"}]},
            upstream("web", values["WEB_URL"], ["whoami"], "hs.modern"),
        ],
        "accounts": [{"id": "acct-web", "secret": {"ref": "env://SCENARIO_SECRET_WEB"}},
                     {"id": "acct-unset", "secret": {"ref": "env://SCENARIO_DIRECT_PATH_UNSET"}}],
        "principals": {"issuers": [{"id": "idp", "kind": "oidc", "discovery": discovery, "audience": "capgate-scenarios",
                                    "attributes": {"dept": "claim:department"}}]},
        "grants": [
            {"to": {"issuer": "idp", "attributes": {"dept": "support"}},
             "capabilities": [_capability(n) for n in tools] + ["hs.down", "hs.stdio", "hs.modern"], "using": "acct-web"},
            {"to": {"issuer": "idp", "attributes": {"dept": "support"}}, "capabilities": ["hs.unresolved"],
             "using": "acct-unset"},
            {"to": {"issuer": "idp", "attributes": {"dept": "finance"}}, "capabilities": ["hs.finance"],
             "using": "acct-web"},
        ],
    }


def _capability(tool: str) -> str:
    return "hs." + tool.replace("_", "-")


@dataclass
class Setup:
    world: Any
    upstream: Process
    upstream_url: str
    capgate: Capgate
    gateways: dict[str, HttpGateway]

    def caller(self, name: str = "ana", **claims: Any) -> str:
        token = self.world.oidc.mint(f"{name}-direct", {"department": "support", **claims})
        self.world.minted.append(token)
        return token

    def stats(self) -> dict[str, Any]:
        return httpx2.get(self.upstream_url.replace("/mcp", "/stats")).json()

    def events(self, path: str) -> list[dict[str, Any]]:
        return [e for line in self.gateways[path].process.lines if (e := json_event(line)) and "event" in e]


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: k.name)
def setup(world, request: pytest.FixtureRequest) -> Iterator[Setup]:  # noqa: ANN001
    kind: GatewayKind = request.param
    directory = world.directory / f"direct-path-{kind.name}"
    directory.mkdir()
    upstream = Process("handshake upstream", [PYTHON, str(SCENARIOS / "upstreams" / "handshake_upstream.py")],
                       env=world.gateway_env, log=directory / "upstream.log", watch_stdout=True)
    started: list[Process] = [upstream]
    try:
        url = upstream.wait_for(lambda line: (json_event(line) or {}).get("url"))
        document = policy(url, world.values, world.oidc.discovery_url)
        (directory / "policy.yaml").write_text(yaml.safe_dump(document))
        (directory / "catalog.yaml").write_text(yaml.safe_dump({"version": 1, "tools": [
            {"upstream": u["id"], "name": t["name"], "description": f"{t['name']} of handshake_upstream.py"}
            for u in document["upstreams"] for t in u["tools"]]}))
        capgate = start_capgate(directory, directory / "policy.yaml", directory / "catalog.yaml", env=world.gateway_env,
                                gateway_token_file=world.gateway_token_file, admin_token_file=world.admin_token_file,
                                oidc_ca=world.oidc.ca_file, name="capgate-direct")
        started.append(capgate.process)
        gateways: dict[str, HttpGateway] = {}
        for path in ("direct", "sdk"):
            gateways[path] = start_http_gateway(
                kind, capgate.url, world.gateway_token_file, world.gateway_env, directory / f"gateway-{path}.stderr",
                extra=["--call-path", path, "--upstream-timeout", str(UPSTREAM_TIMEOUT)],
            )
            started.append(gateways[path].process)
        yield Setup(world, upstream, url, capgate, gateways)
        # No secret reaches a log: the account's, the callers'.
        for path, gateway in gateways.items():
            text = gateway.process.text()
            for name, secret in world.secret_values().items():
                assert secret not in text, f"{name} in the {path} gateway's log"
    finally:
        for process in reversed(started):
            process.stop()


# ── a caller on the 2025-11-25 wire ──────────────────────────────────────────


@dataclass
class Answer:
    status: int
    content_type: str
    session_id: str | None
    body: Any


class Raw:
    """One handshake-era MCP session with a gateway, over plain HTTP."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id: str | None = None
        self._ids = 0

    @classmethod
    async def open(cls, http: httpx2.AsyncClient, url: str) -> Raw:
        raw = cls(http, url)
        answer = await raw.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert answer.status == 200 and answer.session_id, answer
        raw.session_id = answer.session_id
        assert (await raw.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status == 202
        return raw

    async def post(self, body: Any, *, headers: dict[str, str] | None = None, content: bytes | None = None) -> Answer:
        sent = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": "2025-11-25"}
        if self.session_id is not None:
            sent["Mcp-Session-Id"] = self.session_id
        sent.update(headers or {})
        data = content if content is not None else json.dumps(body).encode()
        response = await self.http.post(self.url, content=data, headers=sent)
        content_type = response.headers.get("content-type", "").partition(";")[0]
        parsed: Any = response.text
        if content_type == "application/json" and response.content:
            parsed = response.json()
        elif content_type == "text/event-stream":
            messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
            parsed = next(m for m in messages if "result" in m or "error" in m)
        return Answer(response.status_code, content_type, response.headers.get("mcp-session-id"), parsed)

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Answer:
        self._ids += 1
        params: dict[str, Any] = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        return await self.post({"jsonrpc": "2.0", "id": self._ids, "method": "tools/call", "params": params})


def session(setup: Setup, path: str, work: Any, token: str | None = None) -> Any:
    async def run() -> Any:
        with anyio.fail_after(60):
            headers = {"Authorization": f"Bearer {token or setup.caller()}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                return await work(await Raw.open(http, setup.gateways[path].url))

    return anyio.run(run)


def masked(body: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC response without what differs by nature between two runs of one call."""
    body = json.loads(json.dumps(body))
    data = (body.get("error") or {}).get("data")
    if isinstance(data, dict) and "decision_id" in data:
        data["decision_id"] = "<decision>"
    return body


# ── the tests ────────────────────────────────────────────────────────────────

CALLS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "echoed": ("hs__echo", {"text": "über → 𝄞 \"quoted\""}),
    "echoed as JSON": ("hs__echo_json", {"text": "as JSON"}),
    "without arguments": ("hs__echo", None),
    "credential": ("hs__whoami", {}),
    "asked mid-call": ("hs__chatty", {}),
    "upstream error": ("hs__fail", {}),
    "no grant": ("finance__echo", {"text": "x"}),
    "unknown tool": ("nowhere__nothing", {}),
    "unresolved secret": ("unresolved__echo", {"text": "x"}),
    "upstream down": ("down__echo", {"text": "x"}),
    "arguments too large": ("hs__echo", {"text": "x" * (64 * 1024)}),
    "stdio upstream": ("probe__echo", {"text": "over stdio"}),
    "2026-07-28 upstream": ("web__whoami", {}),
}


OUTCOMES = ("allowed", "denied", "credential_failed", "upstream_failed", "capgate_unavailable")
"""The log events that end a call."""


def test_both_paths_answer_every_call_alike(setup: Setup) -> None:
    """Results, relayed upstream errors and every kind of refusal: the same JSON-RPC answer, and the
    same log events, whichever path the call took; only the framing differs (JSON, not SSE)."""
    token = setup.caller()
    forged = setup.world.oidc.mint("ana-direct-forged", {"department": "support"}, foreign_key=True)
    setup.world.minted.append(forged)
    answers: dict[str, dict[str, Answer]] = {}
    logged: dict[str, list[dict[str, Any]]] = {}
    for path in ("direct", "sdk"):
        before = len(setup.events(path))

        async def work(raw: Raw) -> dict[str, Answer]:
            return {label: await raw.call(tool, arguments) for label, (tool, arguments) in CALLS.items()}

        answers[path] = session(setup, path, work, token)
        answers[path]["unauthenticated"] = session(setup, path, lambda raw: raw.call("hs__echo", {"text": "x"}), forged)

        def outcomes(line: str, path: str = path, before: int = before) -> list[dict[str, Any]] | None:
            # One per call, but for the relayed upstream error, which neither path logs; the
            # last ones may still be on their way from the gateway's stderr.
            events = [e for e in setup.events(path)[before:] if e["event"] in OUTCOMES]
            return events if len(events) == len(CALLS) else None

        events = setup.gateways[path].process.wait_for(outcomes, timeout=10)
        logged[path] = [{k: v for k, v in e.items() if k not in ("ts", "decision_id")} for e in events]

    for label, direct in answers["direct"].items():
        sdk = answers["sdk"][label]
        assert direct.status == sdk.status == 200, (label, direct, sdk)
        assert (direct.content_type, sdk.content_type) == ("application/json", "text/event-stream"), label
        assert direct.session_id and sdk.session_id, label
        assert masked(direct.body) == masked(sdk.body), label
    assert logged["direct"] == logged["sdk"], logged

    got = {label: a.body for label, a in answers["direct"].items()}
    assert got["echoed"]["result"]["content"][0]["text"] == "über → 𝄞 \"quoted\""
    assert got["without arguments"]["result"]["content"][0]["text"] == "{}"
    secret = hashlib.sha256(setup.world.sentinels["SECRET_WEB"].encode()).hexdigest()
    assert got["credential"]["result"]["content"][0]["text"] == f"credential-sha256: {secret}"
    assert got["2026-07-28 upstream"]["result"]["content"][0]["text"] == f"credential-sha256: {secret}"
    assert got["stdio upstream"]["result"]["content"][0]["text"] == "over stdio"
    # What the upstream asked mid-call was answered as the SDK's client answers it.
    assert json.loads(got["asked mid-call"]["result"]["content"][0]["text"]) == [
        {"result": {}}, {"error": {"code": -32600, "message": "Sampling not supported"}}]
    assert got["upstream error"]["error"] == {"code": -32042, "message": "the upstream refuses", "data": {"why": "asked to"}}
    codes = {label: (body["error"]["code"], body["error"]["data"]["code"])
             for label, body in got.items() if "error" in body and label != "upstream error"}
    assert codes == {
        "no grant": (-32001, "no_grant_matches"),
        "unknown tool": (-32602, "unknown_tool"),
        "unresolved secret": (-32002, "credential_failed"),
        "upstream down": (-32003, "upstream_failed"),
        "arguments too large": (-32602, "arguments_too_large"),
        "unauthenticated": (-32001, "unauthenticated"),
    }
    assert setup.stats()["last_call_headers"]["mcp-protocol-version"] == "2025-11-25"


def test_calls_reuse_a_kept_upstream_connection(setup: Setup) -> None:
    """The SDK's client opens a new connection for every call (it closes each SSE answer early);
    the direct path sends 20 calls on at most 2."""

    async def work(raw: Raw) -> list[Answer]:
        await raw.call("hs__echo", {"text": "warm"})  # opens the upstream session
        return [await raw.call("hs__echo", {"text": f"call {i}"}) for i in range(20)]

    before = len(setup.stats()["call_peers"])
    answers = session(setup, "direct", work)
    assert [a.body["result"]["content"][0]["text"] for a in answers] == [f"call {i}" for i in range(20)]
    peers = {tuple(p) for p in setup.stats()["call_peers"][before + 1:]}
    assert len(peers) <= 2, f"20 calls came on {len(peers)} connections"


def test_an_upstream_that_forgot_its_session_gets_the_call_in_a_new_one(setup: Setup) -> None:
    async def work(raw: Raw) -> tuple[Answer, Answer]:
        first = await raw.call("hs__echo", {"text": "before"})
        assert httpx2.post(setup.upstream_url.replace("/mcp", "/forget")).status_code == 200
        return first, await raw.call("hs__echo", {"text": "after"})

    handshakes = setup.stats()["initializes"]
    first, second = session(setup, "direct", work)
    assert first.body["result"]["content"][0]["text"] == "before", first
    assert second.content_type == "application/json", second
    assert "result" in second.body and second.body["result"]["content"][0]["text"] == "after", second
    assert setup.stats()["initializes"] >= handshakes + 1
    lost = setup.gateways["direct"].process.wait_for(
        lambda line: (e := json_event(line)) and e.get("event") == "upstream_session_lost" and e.get("upstream") == "hs",
        timeout=10,
    )
    assert lost


def test_what_an_upstream_says_before_its_answer_reaches_the_callers(setup: Setup) -> None:
    """`chatty` sends notifications/resources/list_changed on its answer's stream: the gateway passes
    it on to its sessions (here an SDK client's), as it does what an SDK session hears."""
    heard = anyio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ResourceListChangedNotification):
            heard.set()

    async def run() -> Answer:
        with anyio.fail_after(60):
            headers = {"Authorization": f"Bearer {setup.caller()}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                url = setup.gateways["direct"].url
                async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None,
                                  message_handler=on_message) as listener:
                    await listener.list_tools()  # the listener's GET stream is open by now
                    answer = await (await Raw.open(http, url)).call("hs__chatty", {})
                    with anyio.fail_after(10):
                        await heard.wait()
                    return answer

    answer = anyio.run(run)
    assert answer.content_type == "application/json", answer
    assert json.loads(answer.body["result"]["content"][0]["text"])[0] == {"result": {}}


def test_an_upstream_that_never_answers_fails_within_the_deadline(setup: Setup) -> None:
    async def work(raw: Raw) -> tuple[float, Answer, Answer]:
        started = time.monotonic()
        hung = await raw.call("hs__hang", {})
        return time.monotonic() - started, hung, await raw.call("hs__echo", {"text": "still here"})

    elapsed, hung, after = session(setup, "direct", work)
    assert hung.body["error"]["code"] == -32003 and hung.body["error"]["data"]["code"] == "upstream_failed", hung
    assert f"did not answer in {UPSTREAM_TIMEOUT}s" in hung.body["error"]["message"], hung
    assert UPSTREAM_TIMEOUT - 0.5 <= elapsed < UPSTREAM_TIMEOUT + 5, elapsed
    assert after.body["result"]["content"][0]["text"] == "still here", after


NOT_DIRECT: list[tuple[str, Any, dict[str, str]]] = [
    ("a batch", [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo"}}], {}),
    ("a boolean id", {"jsonrpc": "2.0", "id": True, "method": "tools/call", "params": {"name": "hs__echo"}}, {}),
    ("a null id", {"jsonrpc": "2.0", "id": None, "method": "tools/call", "params": {"name": "hs__echo"}}, {}),
    ("no id", {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "hs__echo"}}, {}),
    ("a fractional id", {"jsonrpc": "2.0", "id": 1.5, "method": "tools/call", "params": {"name": "hs__echo"}}, {}),
    ("params a list", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["hs__echo"]}, {}),
    ("a name not a string", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 7}}, {}),
    ("arguments a list", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo", "arguments": [1]}}, {}),
    ("a bad progress token", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "hs__echo", "_meta": {"progressToken": [1]}}}, {}),
    ("JSON-RPC 1.0", {"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo"}}, {}),
    ("an unknown session", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo"}},
     {"Mcp-Session-Id": "no-such-session"}),
    ("an Accept without SSE", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo"}},
     {"Accept": "application/json"}),
    ("text/plain", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hs__echo"}},
     {"Content-Type": "text/plain"}),
]


def test_what_is_not_a_direct_call_is_answered_by_the_sdk_as_before(setup: Setup) -> None:
    """Each of these reaches the SDK as it came: the direct gateway answers it as the SDK gateway does."""

    async def work(raw: Raw) -> list[Answer]:
        answers = [await raw.post(body, headers=headers) for _, body, headers in NOT_DIRECT]
        answers.append(await raw.post(None, content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {'))
        answers.append(await raw.post(None, content=b"[" * 100_000))
        return answers

    token = setup.caller()
    direct, sdk = session(setup, "direct", work, token), session(setup, "sdk", work, token)
    names = [n for n, _, _ in NOT_DIRECT] + ["broken JSON", "deep nesting"]
    for name, d, s in zip(names, direct, sdk, strict=True):
        assert d.status != 500, (name, d)
        assert (d.status, d.content_type) == (s.status, s.content_type), (name, d, s)
        if isinstance(d.body, dict) and "error" in d.body:
            assert d.body["error"]["code"] == s.body["error"]["code"], (name, d, s)
    assert dict(zip(names, (d.status for d in direct), strict=True))["an unknown session"] == 404


def test_a_2026_client_is_served_by_the_sdk(setup: Setup) -> None:
    """A 2026-07-28 call has no session: the SDK serves it, on the SDK's client upstream."""

    async def run() -> types.CallToolResult:
        with anyio.fail_after(60):
            headers = {"Authorization": f"Bearer {setup.caller()}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                url = setup.gateways["direct"].url
                async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
                    assert client.protocol_version == "2026-07-28", client.protocol_version
                    return await client.call_tool("hs__echo", {"text": "modern"})

    result = anyio.run(run)
    assert [c.text for c in result.content if isinstance(c, types.TextContent)] == ["modern"]
