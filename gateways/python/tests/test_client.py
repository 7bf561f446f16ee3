"""capgate_client's conversions and error decoding, against real messages and a real gRPC server."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from capgate_client import (
    Allow,
    CapgateClient,
    Credential,
    Deny,
    InvalidArgumentError,
    MalformedResponseError,
    UnavailableError,
)
from capgate_client import convert
from capgate_client._proto import decisions, decisions_grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status


def test_enum_strings_are_the_audit_strings() -> None:
    assert convert.reason_code(decisions.REASON_CODE_NO_GRANT_MATCHES) == "no_grant_matches"
    assert convert.auth_problem(decisions.AUTH_PROBLEM_CREDENTIAL_INVALID) == "credential_invalid"
    assert convert.reason_code(99) == "unknown_99"


def test_an_unset_result_is_malformed() -> None:
    with pytest.raises(MalformedResponseError):
        convert.decide_result(decisions.DecideResponse(decision_id="d"), asked_for_tool=True)
    unspecified = decisions.DecideResponse(decision=decisions.Decision(reason=decisions.Reason(code=1)))
    with pytest.raises(MalformedResponseError):
        convert.decide_result(unspecified, asked_for_tool=True)
    no_transport = decisions.DecideResponse(decision=decisions.Decision(
        outcome=decisions.OUTCOME_ALLOW, reason=decisions.Reason(code=1),
        account=decisions.Account(id="a", secret_ref="env://X"), tool=decisions.Tool(exposed_name="u__t"),
    ))
    with pytest.raises(MalformedResponseError):
        convert.decide_result(no_transport, asked_for_tool=True)


def test_allow_and_deny() -> None:
    allow = convert.decide_result(decisions.DecideResponse(decision_id="d", decision=decisions.Decision(
        outcome=decisions.OUTCOME_ALLOW, reason=decisions.Reason(code=decisions.REASON_CODE_GRANTED, path="/grants/0"),
        account=decisions.Account(id="a", secret_ref="env://X"),
        tool=decisions.Tool(exposed_name="u__t", upstream="u", name="t", transport=decisions.Transport(
            stdio=decisions.StdioTransport(command="cmd", args=["-x"]))),
    )), asked_for_tool=True)
    assert isinstance(allow, Allow) and allow.tool is not None and allow.tool.transport.args == ("-x",)
    # The wire's `Reason.path` is the caller's `pointer`, the name refusals and AuthZEN use.
    assert allow.reason.pointer == "/grants/0"
    deny = convert.decide_result(decisions.DecideResponse(decision_id="d", decision=decisions.Decision(
        outcome=decisions.OUTCOME_DENY, reason=decisions.Reason(code=decisions.REASON_CODE_LIMIT_EXHAUSTED),
    )), asked_for_tool=True)
    assert isinstance(deny, Deny) and deny.reason.code == "limit_exhausted" and deny.resets_at is None


def test_credential_repr_hides_the_value() -> None:
    assert "hunter2" not in repr(Credential.api_key("hunter2"))


class _Refusing(decisions_grpc.DecisionServiceServicer):
    async def Decide(self, request, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        if request.tool == "down":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no active policy")
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="tool", description="longer than 512 bytes"),
        ]))
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason="FIELD_TOO_LONG", domain="capgate", metadata={"field": "tool"}))
        status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="tool is too long", details=[detail, info])
        await context.abort_with_status(rpc_status.to_status(status))


@pytest.mark.anyio
async def test_rich_errors_are_decoded() -> None:
    server = grpc.aio.server()
    decisions_grpc.add_DecisionServiceServicer_to_server(_Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with CapgateClient(f"http://127.0.0.1:{port}", token="t") as client:
            with pytest.raises(InvalidArgumentError) as caught:
                await client.decide(Credential.bearer("x"), tool="long")
            assert caught.value.field_violations[0].field == "tool"
            assert caught.value.error_info is not None and caught.value.error_info.reason == "FIELD_TOO_LONG"
            with pytest.raises(UnavailableError):
                await client.decide(Credential.bearer("x"), tool="down")
    finally:
        await server.stop(None)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
