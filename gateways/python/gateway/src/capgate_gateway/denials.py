"""The JSON-RPC errors a gateway answers with instead of a tool result (gateways/README.md).

Every refusal has the same shape: `message` = "denied: <code>: <human message>" and
`data` = {code, problem?, message, pointer?, decision_id?, retry_after_seconds?, resets_at?}.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from capgate_client import Deny, NotVisible, Unauthenticated, UnknownTool
from mcp.shared.exceptions import MCPError

DENIED = -32001
"""A decision (or no decision: unauthenticated, capgate unavailable) refused the call."""
UNKNOWN_TOOL = -32602
"""The tool name matched nothing: the JSON-RPC "invalid params" code, as MCP's own tools/call uses."""
CREDENTIAL_FAILED = -32002
"""Allowed, but the account's secret could not be resolved; nothing was executed."""
UPSTREAM_FAILED = -32003
"""Allowed, but the upstream could not be reached or failed at the transport level."""
INVALID_PARAMS = -32602
"""The call's own params cannot be asked about (arguments over what capgate reads)."""

MAX_ARGUMENTS_BYTES = 64 * 1024
"""The most capgate reads of a call's arguments (`DecideRequest.arguments_json`), as UTF-8 JSON."""


def _error(json_rpc_code: int, code: str, message: str, **data: Any) -> MCPError:
    body = {"code": code, "message": message, **{k: v for k, v in data.items() if v not in (None, "")}}
    return MCPError(json_rpc_code, f"denied: {code}: {message}", body)


def rfc3339(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def deny(answer: Deny, now: datetime | None = None) -> MCPError:
    extra: dict[str, Any] = {}
    if answer.reason.code == "limit_exhausted" and answer.resets_at is not None:
        now = now or datetime.now(UTC)
        extra["retry_after_seconds"] = max(0, math.ceil((answer.resets_at - now).total_seconds()))
        extra["resets_at"] = rfc3339(answer.resets_at)
    message = answer.reason.message or f"the call is not allowed ({answer.reason.code})"
    return _error(
        DENIED, answer.reason.code, message, pointer=answer.reason.pointer, decision_id=answer.decision_id, **extra
    )


def unauthenticated(answer: Unauthenticated | NotVisible) -> MCPError:
    message = answer.message or f"the caller is not authenticated ({answer.problem})"
    decision_id = answer.decision_id if isinstance(answer, Unauthenticated) else None
    return _error(DENIED, "unauthenticated", message, problem=answer.problem, decision_id=decision_id)


def unknown_tool(answer: UnknownTool) -> MCPError:
    message = answer.message or f"no tool `{answer.name}` is exposed"
    return _error(UNKNOWN_TOOL, "unknown_tool", message, decision_id=answer.decision_id)


def unknown_target(kind: str, name: str, listing_id: str = "") -> MCPError:
    """A resource or prompt that no upstream the caller reaches serves (or that is not relayed)."""
    return _error(UNKNOWN_TOOL, f"unknown_{kind}", f"no {kind} `{name}` is relayed to this caller", decision_id=listing_id)


def arguments_too_large(size: int) -> MCPError:
    """The call's arguments are more than capgate reads: refused here, before any Decide, so no
    decision is made and none is audited."""
    message = f"the call's arguments are {size} bytes as JSON, more than the {MAX_ARGUMENTS_BYTES} capgate decides on"
    return _error(INVALID_PARAMS, "arguments_too_large", message)


def arguments_invalid(reason: str) -> MCPError:
    """The call's arguments are not JSON capgate can read; refused before any Decide."""
    return _error(INVALID_PARAMS, "arguments_invalid", reason)


def capgate_unavailable(reason: str) -> MCPError:
    return _error(DENIED, "capgate_unavailable", reason)


def credential_failed(decision_id: str, reason: str) -> MCPError:
    return _error(CREDENTIAL_FAILED, "credential_failed", reason, decision_id=decision_id)


def upstream_failed(decision_id: str, reason: str) -> MCPError:
    return _error(UPSTREAM_FAILED, "upstream_failed", reason, decision_id=decision_id)
