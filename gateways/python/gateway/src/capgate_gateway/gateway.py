"""The gateway itself: MCP's tools/list and tools/call, answered by asking capgate.

THIN by design: every listing is capgate's ListVisible and every call capgate's Decide,
with the caller's own credential; the gateway decides nothing. After an allow it resolves
the account's secret and relays the call to the upstream as that account.
"""

from __future__ import annotations

import json
import logging
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from capgate_client import (
    Allow,
    CapgateClient,
    CapgateError,
    Credential,
    Deny,
    NoteKind,
    NotVisible,
    Unauthenticated,
    UnimplementedError,
    UnknownTool,
)
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capgate_gateway import denials, logs
from capgate_gateway.edge import bearer_token
from capgate_gateway.secrets import CredentialError, SecretResolver, scheme_of
from capgate_gateway.upstreams import UpstreamError, UpstreamPool


@dataclass(frozen=True)
class StdioCaller:
    """Over stdio there is one caller, whose credential the environment gives."""

    credential: Credential


class Gateway:
    def __init__(
        self,
        capgate: CapgateClient,
        secrets: SecretResolver,
        upstreams: UpstreamPool,
        *,
        issuer: str = "",
        decide_timeout: float = 2.0,
        stdio_caller: StdioCaller | None = None,
    ) -> None:
        self.capgate = capgate
        self.secrets = secrets
        self.upstreams = upstreams
        self.issuer = issuer
        self.decide_timeout = decide_timeout
        self.stdio_caller = stdio_caller
        # Handshake-era (≤ 2025-11-25) connections get list_changed on their own stream; the
        # SDK hands handlers a per-request session, so the connection behind it is kept,
        # weakly, to reach every open one. 2026-07-28 clients subscribe instead
        # (`subscriptions/listen`), served from the bus.
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self.bus = InMemorySubscriptionBus()
        self.server = self._build_server()

    # ── the MCP server ───────────────────────────────────────────────────────

    def _build_server(self) -> Server[Any]:
        server: Server[Any] = Server(
            "capgate-gateway",
            version="0.1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
            # Listings are per caller and change with the policy: never cached, never shared.
            cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
            # Without this the SDK would list tools (a ListVisible, audited) before each
            # 2026-07-28 call to validate Mcp-Param headers; our tools declare none.
            get_tool_input_schema=lambda _name: None,
        )
        server.middleware.append(self._track_connection)
        return server

    def initialization_options(self) -> InitializationOptions:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    async def _track_connection(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = getattr(ctx.session, "_connection", None)
            if connection is not None:
                self._connections.add(connection)
        return await call_next(ctx)

    async def tools_changed(self) -> int:
        """Tell every open session its tools may have changed; returns how many were told."""
        told = 0
        for connection in list(self._connections):
            await connection.send_tool_list_changed()
            told += 1
        await self.bus.publish(ToolsListChanged())
        return told

    # ── who calls ────────────────────────────────────────────────────────────

    def _credential(self, ctx: ServerRequestContext[Any, Any]) -> Credential:
        request = ctx.request
        if request is not None and hasattr(request, "headers"):
            # The edge refused requests without a bearer token; "" is still forwarded so
            # capgate answers credential_missing, not the gateway.
            token = bearer_token({k.lower(): v for k, v in request.headers.items()}) or ""
            return Credential.bearer(token, self.issuer)
        if self.stdio_caller is not None:
            cred = self.stdio_caller.credential
            return Credential(cred.kind, cred.value, self.issuer)
        return Credential.bearer("", self.issuer)

    # ── tools/list ───────────────────────────────────────────────────────────

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        request_id = str(uuid.uuid4())
        try:
            answer = await self.capgate.list_visible(
                self._credential(ctx), request_id=request_id, timeout=self.decide_timeout
            )
        except CapgateError as error:
            logs.event("capgate_unavailable", logging.WARNING, rpc="ListVisible", status=error.status)
            raise denials.capgate_unavailable(f"capgate did not answer ({error.status.lower()})") from None
        if isinstance(answer, NotVisible):
            logs.event("list_denied", code="unauthenticated", problem=answer.problem)
            raise denials.unauthenticated(answer)
        tools = [
            types.Tool(name=t.exposed_name, description=t.description or None, input_schema=_schema(t.input_schema_json))
            for t in answer.tools
        ]
        logs.event("listed", tools=len(tools), policy_revision=answer.policy_revision)
        return types.ListToolsResult(tools=tools)

    # ── tools/call ───────────────────────────────────────────────────────────

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        request_id = str(uuid.uuid4())
        try:
            answer = await self.capgate.decide(
                self._credential(ctx), tool=name, request_id=request_id, timeout=self.decide_timeout
            )
        except CapgateError as error:
            logs.event("capgate_unavailable", logging.WARNING, rpc="Decide", tool=name, status=error.status)
            raise denials.capgate_unavailable(f"capgate did not answer ({error.status.lower()})") from None
        match answer:
            case Allow():
                return await self._execute(answer, params.arguments)
            case Deny():
                logs.event("denied", tool=name, code=answer.reason.code, decision_id=answer.decision_id)
                raise denials.deny(answer)
            case Unauthenticated():
                logs.event("denied", tool=name, code="unauthenticated", problem=answer.problem, decision_id=answer.decision_id)
                raise denials.unauthenticated(answer)
            case UnknownTool():
                logs.event("denied", tool=name, code="unknown_tool", decision_id=answer.decision_id)
                raise denials.unknown_tool(answer)

    async def _execute(self, answer: Allow, arguments: dict[str, Any] | None) -> types.CallToolResult:
        route = answer.tool
        if route is None:  # a tool was asked for; convert guarantees it, this keeps it visible
            raise denials.capgate_unavailable("capgate's allow named no tool")
        try:
            credential = await self.secrets.resolve(answer.account.secret_ref)
        except CredentialError as error:
            logs.event(
                "credential_failed", logging.WARNING, tool=route.exposed_name, account=answer.account.id,
                scheme=error.scheme, reason=error.reason, decision_id=answer.decision_id,
            )
            await self._note(answer.decision_id, NoteKind.CREDENTIAL_FAILED, str(error))
            raise denials.credential_failed(answer.decision_id, str(error)) from None
        try:
            result = await self.upstreams.call(route, answer.account.id, credential, arguments)
        except UpstreamError as error:
            logs.event(
                "upstream_failed", logging.WARNING, tool=route.exposed_name, upstream=route.upstream,
                reason=str(error), decision_id=answer.decision_id,
            )
            await self._note(answer.decision_id, NoteKind.UPSTREAM_FAILED, str(error))
            raise denials.upstream_failed(answer.decision_id, str(error)) from None
        logs.event(
            "allowed", tool=route.exposed_name, account=answer.account.id,
            scheme=scheme_of(answer.account.secret_ref), decision_id=answer.decision_id,
        )
        return result

    async def _note(self, decision_id: str, kind: NoteKind, detail: str) -> None:
        try:
            await self.capgate.note_decision(decision_id, kind, detail[:1024], timeout=self.decide_timeout)
        except UnimplementedError:
            logs.event("note_unimplemented", logging.WARNING, decision_id=decision_id, kind=str(kind))
        except CapgateError as error:
            logs.event("note_failed", logging.WARNING, decision_id=decision_id, kind=str(kind), status=error.status)


def _schema(text: str) -> dict[str, Any]:
    if not text:
        return {"type": "object"}
    try:
        schema = json.loads(text)
    except ValueError:
        return {"type": "object"}
    return schema if isinstance(schema, dict) else {"type": "object"}
