"""Conditions, as the gateway handles them: the real client and the gateway's own handlers against an
in-process gRPC DecisionService that records what it is asked and answers condition denials.

Every call's arguments go to capgate as `arguments_json` (`{}` when absent), arguments over what
capgate reads are refused before any Decide, condition denials keep their pointer, and a
conditional tool says so when listed. The scenario suite does the same against `capgate serve`.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import grpc.aio
import mcp_types as types
import pytest
from capgate_client import REASON_CODES, CapgateClient, Credential, Deny, VisibleTool, convert
from capgate_client._proto import decisions, decisions_grpc
from capgate_gateway import denials
from capgate_gateway.gateway import CONDITIONAL_MARK, Gateway, StdioCaller, arguments_json, listed_tool
from mcp.shared.exceptions import MCPError


def test_the_reason_codes_are_the_protos() -> None:
    proto = [n.removeprefix("REASON_CODE_").lower() for n in decisions.ReasonCode.keys() if n != "REASON_CODE_UNSPECIFIED"]
    assert list(REASON_CODES) == proto
    assert convert.reason_code(decisions.REASON_CODE_CONDITION_FAILED) == "condition_failed"
    assert convert.reason_code(decisions.REASON_CODE_ARGUMENTS_MISSING) == "arguments_missing"


class _Recording(decisions_grpc.DecisionServiceServicer):
    """Denies every Decide for the condition its tool names (`code:pointer`), keeping the request."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def Decide(self, request, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        self.requests.append(request)
        code, pointer = request.tool.split(":", 1)
        return decisions.DecideResponse(decision_id="0193-d", policy_version="sha256:ab", decision=decisions.Decision(
            outcome=decisions.OUTCOME_DENY,
            reason=decisions.Reason(code=int(code), path=pointer, subject="amount", message=f"the condition at {pointer} fails"),
        ))

    async def ListVisible(self, request, context):  # noqa: ANN001, ANN201, N802
        tool = decisions.VisibleTool
        return decisions.ListVisibleResponse(policy_version="sha256:ab", visible=decisions.Visible(
            capabilities=[decisions.VisibleCapability(capability="billing.refund.create", conditional=True)],
            tools=[
                tool(exposed_name="payments__refund", description="Issue a refund", conditional=True),
                tool(exposed_name="payments__bare", conditional=True),
                tool(exposed_name="payments__lookup", description="Find a payment"),
            ],
        ))


@pytest.fixture
async def capgate() -> Any:
    servicer = _Recording()
    server = grpc.aio.server()
    decisions_grpc.add_DecisionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = CapgateClient(f"http://127.0.0.1:{port}", token="t")
    try:
        yield SimpleNamespace(client=client, requests=servicer.requests)
    finally:
        await client.close()
        await server.stop(None)


def _gateway(client: CapgateClient) -> Gateway:
    # No secret and no upstream is reached: every Decide is denied (the handler names the pool's `call`).
    pool = SimpleNamespace(call=None)
    return Gateway(client, None, pool, stdio_caller=StdioCaller(Credential.bearer("caller")))  # type: ignore[arg-type]


async def _call(gateway: Gateway, tool: str, arguments: dict[str, Any] | None) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await gateway._call_tool(SimpleNamespace(request=None), types.CallToolRequestParams(name=tool, arguments=arguments))  # type: ignore[arg-type]
    return caught.value


CONDITION = f"{decisions.REASON_CODE_CONDITION_FAILED}:/grants/0/when/0"


@pytest.mark.anyio
async def test_the_client_sends_arguments_json_only_when_given(capgate: Any) -> None:
    answer = await capgate.client.decide(Credential.bearer("x"), tool=CONDITION, arguments_json='{"amount":150}')
    assert isinstance(answer, Deny) and answer.reason.code == "condition_failed"
    assert answer.reason.pointer == "/grants/0/when/0"
    await capgate.client.decide(Credential.bearer("x"), tool=CONDITION)
    sent, unset = capgate.requests
    assert sent.HasField("arguments_json") and sent.arguments_json == '{"amount":150}'
    assert not unset.HasField("arguments_json")


@pytest.mark.anyio
async def test_every_call_sends_its_arguments_and_empty_ones_as_an_object(capgate: Any) -> None:
    gateway = _gateway(capgate.client)
    arguments = {"amount": 150, "currency": "EUR", "note": "über → 𝄞", "nested": {"a": [1, 2.5, None, True]}}
    await _call(gateway, CONDITION, arguments)
    await _call(gateway, CONDITION, None)
    await _call(gateway, CONDITION, {})
    sent = [r.arguments_json if r.HasField("arguments_json") else None for r in capgate.requests]
    assert sent == [json.dumps(arguments, ensure_ascii=False, separators=(",", ":")), "{}", "{}"]
    assert json.loads(sent[0]) == arguments


@pytest.mark.anyio
async def test_a_conditions_denial_names_the_reason_and_its_pointer(capgate: Any) -> None:
    gateway = _gateway(capgate.client)
    for number, code, pointer in [
        (decisions.REASON_CODE_CONDITION_FAILED, "condition_failed", "/grants/0/when/0"),
        (decisions.REASON_CODE_ARGUMENTS_MISSING, "arguments_missing", "/grants/0/when/1"),
    ]:
        error = await _call(gateway, f"{number}:{pointer}", {"amount": 1})
        assert error.code == -32001
        assert error.message == f"denied: {code}: the condition at {pointer} fails"
        assert error.data == {
            "code": code, "message": f"the condition at {pointer} fails", "pointer": pointer, "decision_id": "0193-d",
        }


@pytest.mark.anyio
async def test_arguments_over_64_kib_are_refused_and_capgate_is_not_asked(capgate: Any) -> None:
    gateway = _gateway(capgate.client)
    # {"text":"…"} is 11 bytes around the text; "é" is 2 bytes of UTF-8.
    at_the_bound = {"text": "é" * ((denials.MAX_ARGUMENTS_BYTES - 12) // 2) + "x"}
    assert len(arguments_json(at_the_bound).encode()) == denials.MAX_ARGUMENTS_BYTES == 65536
    await _call(gateway, CONDITION, at_the_bound)
    assert len(capgate.requests) == 1, "arguments of exactly 64 KiB are asked about"
    error = await _call(gateway, CONDITION, {"text": at_the_bound["text"] + "x"})
    assert len(capgate.requests) == 1, "capgate was asked about arguments over the bound"
    assert error.code == -32602
    assert error.message.startswith("denied: arguments_too_large: the call's arguments are 65537 bytes")
    assert set(error.data) == {"code", "message"} and error.data["code"] == "arguments_too_large"
    # A NaN (which Python's JSON parser takes) is no JSON capgate reads: refused too.
    nan = await _call(gateway, CONDITION, {"amount": float("nan")})
    assert (nan.code, nan.data["code"]) == (-32602, "arguments_invalid")
    surrogate = await _call(gateway, CONDITION, json.loads('{"text": "\\ud800"}'))
    assert (surrogate.code, surrogate.data["code"]) == (-32602, "arguments_invalid")
    assert len(capgate.requests) == 1


@pytest.mark.anyio
async def test_a_conditional_tool_says_so_when_listed(capgate: Any) -> None:
    listing = await capgate.client.list_visible(Credential.bearer("x"))
    assert [t.conditional for t in listing.tools] == [True, True, False]
    assert listing.capabilities[0].conditional is True
    result = await _gateway(capgate.client)._list_tools(SimpleNamespace(request=None), None)  # type: ignore[arg-type]
    assert [t.description for t in result.tools] == [
        f"Issue a refund ({CONDITIONAL_MARK})", CONDITIONAL_MARK, "Find a payment",
    ]
    assert CONDITIONAL_MARK == "Calls may be refused depending on their arguments or time."
    assert listed_tool(VisibleTool("a__b", "a", "b", "c", "", "")).description is None
