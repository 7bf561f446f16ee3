"""Protobuf messages in and out: the only module that reads or builds capgate's messages.

Every oneof and enum is checked: an unset or unknown one raises MalformedResponseError,
so a gateway that acts on the result cannot mistake a broken answer for an allow.
"""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from capgate_client import results as r
from capgate_client._proto import common, decisions, policies
from capgate_client.errors import MalformedResponseError


def enum_string(enum: object, prefix: str, value: int) -> str:
    """`REASON_CODE_NO_GRANT_MATCHES` → `"no_grant_matches"`; an unknown number → `"unknown_<n>"`."""
    try:
        name = enum.Name(value)  # type: ignore[attr-defined]
    except ValueError:
        return f"unknown_{value}"
    return name.removeprefix(prefix).lower()


def reason_code(value: int) -> str:
    return enum_string(decisions.ReasonCode, "REASON_CODE_", value)


def auth_problem(value: int) -> str:
    return enum_string(decisions.AuthProblem, "AUTH_PROBLEM_", value)


def timestamp(message: object, name: str) -> datetime | None:
    if not message.HasField(name):  # type: ignore[attr-defined]
        return None
    value: Timestamp = getattr(message, name)
    return value.ToDatetime(tzinfo=UTC)


def credential(value: r.Credential) -> decisions.Credential:
    message = decisions.Credential(issuer=value.issuer)
    match value.kind:
        case "bearer_token":
            message.bearer_token = value.value
        case "api_key":
            message.api_key = value.value
        case "client_certificate":
            message.client_certificate = value.value
    return message


def decide_request(
    cred: r.Credential, tool: str | None, capability: str | None, request_id: str, arguments_json: str | None = None
) -> decisions.DecideRequest:
    if (tool is None) == (capability is None):
        raise ValueError("decide needs exactly one of `tool` and `capability`")
    request = decisions.DecideRequest(credential=credential(cred), request_id=request_id)
    if arguments_json is not None:
        request.arguments_json = arguments_json
    if tool is not None:
        request.tool = tool
    else:
        request.capability = capability  # type: ignore[assignment]
    return request


def _reason(message: decisions.Reason) -> r.Reason:
    return r.Reason(reason_code(message.code), pointer=message.path, subject=message.subject, message=message.message)


def _tool(message: decisions.Tool) -> r.ToolRoute:
    kind = message.transport.WhichOneof("kind")
    transport: r.StdioTransport | r.HttpTransport
    if kind == "stdio":
        transport = r.StdioTransport(message.transport.stdio.command, tuple(message.transport.stdio.args))
    elif kind == "http":
        transport = r.HttpTransport(message.transport.http.url)
    else:
        raise MalformedResponseError(f"the tool `{message.exposed_name}` has no transport")
    return r.ToolRoute(message.exposed_name, message.upstream, message.name, message.capability, transport)


def _limits(message: decisions.Limits) -> r.Limits:
    return r.Limits(message.calls, message.per, message.window_ms, message.remaining, timestamp(message, "resets_at"))


def decide_result(message: decisions.DecideResponse, asked_for_tool: bool) -> r.DecideResult:
    common_fields = dict(
        decision_id=message.decision_id,
        policy_version=message.policy_version,
        policy_revision=message.policy_revision,
        at=timestamp(message, "at"),
    )
    which = message.WhichOneof("result")
    if which == "unauthenticated":
        return r.Unauthenticated(
            **common_fields, problem=auth_problem(message.unauthenticated.problem), message=message.unauthenticated.message
        )
    if which == "unknown_tool":
        return r.UnknownTool(**common_fields, name=message.unknown_tool.name, message=message.unknown_tool.message)
    if which != "decision":
        raise MalformedResponseError("the decide answer has no result")
    decision = message.decision
    if not decision.HasField("reason"):
        raise MalformedResponseError("the decision has no reason")
    if decision.outcome == decisions.OUTCOME_DENY:
        return r.Deny(**common_fields, reason=_reason(decision.reason), resets_at=timestamp(decision, "resets_at"))
    if decision.outcome != decisions.OUTCOME_ALLOW:
        raise MalformedResponseError(f"the decision's outcome {decision.outcome} is neither allow nor deny")
    if not decision.HasField("account") or not decision.account.id:
        raise MalformedResponseError("the allow names no account")
    if asked_for_tool and not decision.HasField("tool"):
        raise MalformedResponseError("the allow names no tool")
    return r.Allow(
        **common_fields,
        reason=_reason(decision.reason),
        account=r.Account(decision.account.id, decision.account.secret_ref),
        tool=_tool(decision.tool) if decision.HasField("tool") else None,
        limits=_limits(decision.limits) if decision.HasField("limits") else None,
    )


def list_visible_request(cred: r.Credential, request_id: str) -> decisions.ListVisibleRequest:
    return decisions.ListVisibleRequest(credential=credential(cred), request_id=request_id)


def list_visible_result(message: decisions.ListVisibleResponse) -> r.ListVisibleResult:
    at = timestamp(message, "at")
    which = message.WhichOneof("result")
    if which == "unauthenticated":
        return r.NotVisible(
            message.policy_version,
            message.policy_revision,
            at,
            auth_problem(message.unauthenticated.problem),
            message.unauthenticated.message,
        )
    if which != "visible":
        raise MalformedResponseError("the listing has no result")
    capabilities = tuple(
        r.VisibleCapability(
            c.capability,
            r.Account(c.account.id, c.account.secret_ref) if c.HasField("account") else None,
            pointer=c.path,
            decision_id=c.decision_id,
            conditional=c.conditional,
        )
        for c in message.visible.capabilities
    )
    tools = tuple(
        r.VisibleTool(
            t.exposed_name, t.upstream, t.name, t.capability, t.description, t.input_schema_json, conditional=t.conditional
        )
        for t in message.visible.tools
    )
    return r.Visible(message.policy_version, message.policy_revision, at, capabilities, tools)


def policy_revision(message: decisions.PolicyRevision) -> r.PolicyRevision:
    return r.PolicyRevision(message.policy_revision, message.policy_version, timestamp(message, "installed_at"))


NOTE_KINDS = {
    r.NoteKind.CREDENTIAL_FAILED: decisions.NOTE_KIND_CREDENTIAL_FAILED,
    r.NoteKind.UPSTREAM_FAILED: decisions.NOTE_KIND_UPSTREAM_FAILED,
}


def _diagnostic(message: common.Diagnostic) -> r.Diagnostic:
    return r.Diagnostic(message.severity, message.code, message.message, pointer=message.path)


def publish_result(message: policies.PublishPolicyResponse) -> r.PublishResult:
    return r.PublishResult(
        message.accepted,
        message.revision,
        message.version,
        message.unchanged,
        tuple(_diagnostic(d) for d in message.diagnostics),
    )


def policy_version(message: common.PolicyVersion) -> r.PolicyVersion:
    return r.PolicyVersion(
        message.revision, message.version, message.author, message.comment, timestamp(message, "created_at"), message.active
    )


def active_policy(message: policies.GetActivePolicyResponse) -> r.ActivePolicy:
    return r.ActivePolicy(
        policy_version(message.version), message.artifact, message.catalog if message.HasField("catalog") else None
    )
