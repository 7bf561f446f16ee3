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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp_types as types
from capgate_client import (
    Allow,
    CapgateClient,
    CapgateError,
    Credential,
    Deny,
    NoteKind,
    NotVisible,
    ToolRoute,
    Unauthenticated,
    UnimplementedError,
    UnknownTool,
    VisibleTool,
)
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capgate_gateway import denials, logs
from capgate_gateway.edge import bearer_token
from capgate_gateway.relay import (
    Fanout,
    Reach,
    Relay,
    RelayedUpstream,
    list_resource_templates,
    list_resources,
    prompt_route,
)
from capgate_gateway.secrets import CredentialError, SecretResolver, scheme_of
from capgate_gateway.upstreams import UpstreamError, UpstreamPool


T = TypeVar("T")
SendCall = Callable[[ToolRoute, str, str, dict[str, Any] | None], Awaitable[T]]
"""How an allowed call reaches its upstream: (route, account id, credential, arguments) → the result."""


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
        relayed: tuple[RelayedUpstream, ...] = (),
        fanout: Fanout | None = None,
    ) -> None:
        self.capgate = capgate
        self.secrets = secrets
        self.upstreams = upstreams
        self.issuer = issuer
        self.decide_timeout = decide_timeout
        self.stdio_caller = stdio_caller
        # Who hears list changes and what upstreams say: handshake connections and the
        # 2026-07-28 subscriptions/listen streams (the same object the pool delivers to).
        self.fanout = fanout or Fanout()
        self.bus = self.fanout.bus
        self.relay = Relay(relayed, capgate, secrets, upstreams, self.fanout, decide_timeout=decide_timeout)
        self._listener = ListenHandler(self.bus)
        # Handshake-era Streamable HTTP sessions by id, for the direct path (direct.py).
        self.sessions: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self.server = self._build_server()

    # ── the MCP server ───────────────────────────────────────────────────────

    def _build_server(self) -> Server[Any]:
        server: Server[Any] = Server(
            "capgate-gateway",
            version="0.1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
            # Listings are per caller and change with the policy: never cached, never shared.
            cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
            # Without this the SDK would list tools (a ListVisible, audited) before each
            # 2026-07-28 call to validate Mcp-Param headers; our tools declare none.
            get_tool_input_schema=lambda _name: None,
        )
        # Closed by default: a feature no relayed upstream opens has no handler, so the SDK
        # answers -32601 and does not advertise it.
        handlers: dict[str, list[tuple[str, type[Any], Any]]] = {
            "resources": [
                ("resources/list", types.PaginatedRequestParams, self._list_resources),
                ("resources/templates/list", types.PaginatedRequestParams, self._list_resource_templates),
                ("resources/read", types.ReadResourceRequestParams, self._read_resource),
                ("resources/subscribe", types.SubscribeRequestParams, self._subscribe),
                ("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe),
            ],
            "prompts": [
                ("prompts/list", types.PaginatedRequestParams, self._list_prompts),
                ("prompts/get", types.GetPromptRequestParams, self._get_prompt),
            ],
            "completions": [("completion/complete", types.CompleteRequestParams, self._complete)],
            "logging": [("logging/setLevel", types.SetLevelRequestParams, self._set_logging_level)],
        }
        for feature in self.relay.features:
            for method, params_type, handler in handlers[feature]:
                server.add_request_handler(method, params_type, handler)
        server.middleware.append(self._track_connection)
        return server

    def initialization_options(self) -> InitializationOptions:
        features = self.relay.features
        return self.server.create_initialization_options(NotificationOptions(
            tools_changed=True, resources_changed="resources" in features, prompts_changed="prompts" in features,
        ))

    async def _track_connection(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = _connection(ctx)
            if connection is not None:
                self.fanout.connections.add(connection)
                if connection.session_id is not None:
                    self.sessions[connection.session_id] = connection
        return await call_next(ctx)

    async def tools_changed(self) -> int:
        """Tell every open session its tools may have changed; returns how many were told."""
        told = 0
        for connection in list(self.fanout.connections):
            await connection.send_tool_list_changed()
            told += 1
        await self.bus.publish(ToolsListChanged())
        return told

    # ── who calls ────────────────────────────────────────────────────────────

    def _credential(self, ctx: ServerRequestContext[Any, Any]) -> Credential:
        request = ctx.request
        if request is not None and hasattr(request, "headers"):
            return self.http_credential({k.lower(): v for k, v in request.headers.items()})
        if self.stdio_caller is not None:
            cred = self.stdio_caller.credential
            return Credential(cred.kind, cred.value, self.issuer)
        return Credential.bearer("", self.issuer)

    def http_credential(self, headers: dict[str, str]) -> Credential:
        """The caller of an HTTP request (`headers` lowercased), through the SDK or the direct path."""
        # The edge refused requests without a bearer token; "" is still forwarded so
        # capgate answers credential_missing, not the gateway.
        return Credential.bearer(bearer_token(headers) or "", self.issuer)

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
        tools = [listed_tool(t) for t in answer.tools]
        logs.event("listed", tools=len(tools), policy_revision=answer.policy_revision)
        return types.ListToolsResult(tools=tools)

    # ── tools/call ───────────────────────────────────────────────────────────

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self.call_tool(self._credential(ctx), params.name, params.arguments, self.upstreams.call)

    async def call_tool(
        self, credential: Credential, name: str, arguments: dict[str, Any] | None, send: SendCall[T]
    ) -> T:
        """One tools/call, decided by capgate and sent by `send` (the SDK's client, or the direct
        path's); a refusal is raised as the MCPError the caller is answered with, whatever the framing."""
        request_id = str(uuid.uuid4())
        try:
            arguments_text = arguments_json(arguments)
        except MCPError as error:
            logs.event("denied", tool=name, code=error.data["code"])
            raise
        try:
            answer = await self.capgate.decide(
                credential, tool=name, request_id=request_id, arguments_json=arguments_text,
                timeout=self.decide_timeout,
            )
        except CapgateError as error:
            logs.event("capgate_unavailable", logging.WARNING, rpc="Decide", tool=name, status=error.status)
            raise denials.capgate_unavailable(f"capgate did not answer ({error.status.lower()})") from None
        match answer:
            case Allow():
                return await self._execute(answer, arguments, send)
            case Deny():
                logs.event("denied", tool=name, code=answer.reason.code, decision_id=answer.decision_id)
                raise denials.deny(answer)
            case Unauthenticated():
                logs.event("denied", tool=name, code="unauthenticated", problem=answer.problem, decision_id=answer.decision_id)
                raise denials.unauthenticated(answer)
            case UnknownTool():
                logs.event("denied", tool=name, code="unknown_tool", decision_id=answer.decision_id)
                raise denials.unknown_tool(answer)

    async def _execute(self, answer: Allow, arguments: dict[str, Any] | None, send: SendCall[T]) -> T:
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
            result = await send(route, answer.account.id, credential, arguments)
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

    # ── what is not a tool (relay.py) ────────────────────────────────────────

    async def _list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        resources = await self._gathered(ctx, "resources/list", list_resources, lambda p: p.resources)
        return types.ListResourcesResult(resources=resources)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = await self._gathered(
            ctx, "resources/templates/list", list_resource_templates, lambda p: p.resource_templates
        )
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _gathered(self, ctx: ServerRequestContext[Any, Any], method: str, fetch: Any, items: Any) -> list[Any]:
        """A resource listing of every upstream the caller reaches, in one answer."""
        reaches = await self.relay.reach(self._credential(ctx), "resources", method)
        return await self.relay.gather(reaches, method, fetch, items)

    async def _resource(self, ctx: ServerRequestContext[Any, Any], method: str, uri: str) -> Reach:
        reaches = await self.relay.reach(self._credential(ctx), "resources", method)
        reach = await self.relay.route_resource(reaches, uri)
        if reach is None:
            logs.event("relay_refused", method=method, code="unknown_resource", target=uri,
                       listing_id=reaches[0].listing_id if reaches else None)
            raise denials.unknown_target("resource", uri, reaches[0].listing_id if reaches else "")
        return reach

    async def _read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        reach = await self._resource(ctx, "resources/read", params.uri)
        return await self.relay.send(reach, "resources/read", params.uri, lambda c: c.read_resource(params.uri))

    async def _subscribe(self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        reach = await self._resource(ctx, "resources/subscribe", params.uri)
        result = await self.relay.send(
            reach, "resources/subscribe", params.uri, lambda c: c.session.subscribe_resource(params.uri)
        )
        if (connection := _connection(ctx)) is not None:
            self.fanout.subscribe(reach.key, params.uri, connection)
        return result

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        reach = await self._resource(ctx, "resources/unsubscribe", params.uri)
        connection = _connection(ctx)
        if connection is not None and not self.fanout.unsubscribe(reach.key, params.uri, connection):
            # Another session of this upstream and account still listens: the upstream keeps it.
            logs.event("relayed", method="resources/unsubscribe", upstream=reach.upstream.id, account=reach.account.id,
                       listing_id=reach.listing_id, target=params.uri, kept_for_others=True)
            return types.EmptyResult()
        return await self.relay.send(
            reach, "resources/unsubscribe", params.uri, lambda c: c.session.unsubscribe_resource(params.uri)
        )

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        reaches = await self.relay.reach(self._credential(ctx), "prompts", "prompts/list")
        prompts: list[types.Prompt] = []
        for reach in reaches:
            listed = await self.relay.gather(
                [reach], "prompts/list", lambda c, cursor: c.list_prompts(cursor=cursor), lambda p: p.prompts
            )
            prompts.extend(p.model_copy(update={"name": f"{reach.upstream.id}__{p.name}"}) for p in listed)
        return types.ListPromptsResult(prompts=prompts)

    async def _prompt(self, ctx: ServerRequestContext[Any, Any], feature: str, method: str, name: str) -> tuple[Reach, str]:
        reaches = await self.relay.reach(self._credential(ctx), feature, method)
        route = prompt_route(reaches, name)
        if route is None:
            listing_id = reaches[0].listing_id if reaches else ""
            logs.event("relay_refused", method=method, code="unknown_prompt", target=name, listing_id=listing_id or None)
            raise denials.unknown_target("prompt", name, listing_id)
        return route

    async def _get_prompt(self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        reach, inner = await self._prompt(ctx, "prompts", "prompts/get", params.name)
        return await self.relay.send(reach, "prompts/get", params.name, lambda c: c.get_prompt(inner, params.arguments))

    async def _complete(self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams) -> types.CompleteResult:
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context else None
        if isinstance(params.ref, types.PromptReference):
            reach, inner = await self._prompt(ctx, "completions", "completion/complete", params.ref.name)
            ref: types.PromptReference | types.ResourceTemplateReference = params.ref.model_copy(update={"name": inner})
            target = params.ref.name
        else:
            reaches = await self.relay.reach(self._credential(ctx), "completions", "completion/complete")
            found = await self.relay.route_resource(reaches, params.ref.uri)
            if found is None:
                raise denials.unknown_target("resource", params.ref.uri, reaches[0].listing_id if reaches else "")
            reach, ref, target = found, params.ref, params.ref.uri
        return await self.relay.send(reach, "completion/complete", target, lambda c: c.complete(ref, argument, context))

    async def _listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """2026-07-28 `subscriptions/listen`: each resource URI of the filter that an upstream the
        caller reaches serves is subscribed upstream for the stream's life (its updates reach the
        stream through the bus); the others are left out of the filter, so the acknowledgement says
        what was honoured. Nothing is honoured when the caller cannot be identified: fail closed."""
        uris = list(params.notifications.resource_subscriptions or ())
        if not uris or "resources" not in self.relay.features:
            return await self._listener(ctx, params)
        try:
            reaches = await self.relay.reach(self._credential(ctx), "resources", "subscriptions/listen")
        except MCPError:
            reaches = []  # logged by reach
        holder = _StreamHolder()
        held: list[tuple[Reach, str]] = []
        for uri in uris:
            reach = await self.relay.route_resource(reaches, uri)
            if reach is None:
                continue
            try:
                await self.relay.send(reach, "resources/subscribe", uri, lambda c, u=uri: c.session.subscribe_resource(u))
            except MCPError:
                continue  # logged by send
            self.fanout.subscribe(reach.key, uri, holder)
            held.append((reach, uri))
        honoured = params.notifications.model_copy(update={"resource_subscriptions": [u for _, u in held] or None})
        try:
            return await self._listener(ctx, params.model_copy(update={"notifications": honoured}))
        finally:
            with anyio.CancelScope(shield=True):
                for reach, uri in held:
                    if not self.fanout.unsubscribe(reach.key, uri, holder):
                        continue
                    try:
                        await self.relay.send(reach, "resources/unsubscribe", uri,
                                              lambda c, u=uri: c.session.unsubscribe_resource(u))
                    except MCPError:
                        pass  # logged by send

    async def _set_logging_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        reaches = await self.relay.reach(self._credential(ctx), "logging", "logging/setLevel")
        connection = _connection(ctx)
        for reach in reaches:
            try:
                await self.relay.send(reach, "logging/setLevel", params.level,
                                      lambda c: c.session.set_logging_level(params.level))
            except MCPError:
                continue  # logged by send; the other upstreams still log
            if connection is not None:
                self.fanout.listen_logs(reach.key, connection)
        return types.EmptyResult()

    async def _note(self, decision_id: str, kind: NoteKind, detail: str) -> None:
        try:
            await self.capgate.note_decision(decision_id, kind, detail[:1024], timeout=self.decide_timeout)
        except UnimplementedError:
            logs.event("note_unimplemented", logging.WARNING, decision_id=decision_id, kind=str(kind))
        except CapgateError as error:
            logs.event("note_failed", logging.WARNING, decision_id=decision_id, kind=str(kind), status=error.status)


class _StreamHolder:
    """A listen stream's place among a resource's subscribers: it hears through the bus, not here."""

    async def send_resource_updated(self, uri: str) -> None:
        return None


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The connection behind a handler's per-request session (the SDK has no public way to it)."""
    return getattr(ctx.session, "_connection", None)


CONDITIONAL_MARK = "Calls may be refused depending on their arguments or time."
"""Appended to the description of a tool every grant of which carries conditions (gateways/README.md)."""


def listed_tool(tool: VisibleTool) -> types.Tool:
    """A visible tool as MCP lists it; a conditional one says so in its description."""
    description = tool.description or None
    if tool.conditional:
        description = f"{description} ({CONDITIONAL_MARK})" if description else CONDITIONAL_MARK
    return types.Tool(name=tool.exposed_name, description=description, input_schema=_schema(tool.input_schema_json))


def arguments_json(arguments: dict[str, Any] | None) -> str:
    """The call's arguments as capgate's `arguments_json`: the object received, as compact JSON
    (UTF-8, keys in the order they came); absent arguments are `{}`, as MCP reads them.

    Raises the refusal (MCPError -32602) for arguments capgate would not read: more than
    `denials.MAX_ARGUMENTS_BYTES`, a NaN or infinite number, or a lone surrogate (Python's JSON
    parser takes `NaN` and `"\\ud800"`; JSON text in UTF-8 has neither)."""
    try:
        text = json.dumps(
            {} if arguments is None else arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise denials.arguments_invalid("the call's arguments hold a lone surrogate, which UTF-8 cannot carry") from None
    except ValueError:
        raise denials.arguments_invalid("the call's arguments hold a NaN or infinite number, which JSON has not") from None
    if size > denials.MAX_ARGUMENTS_BYTES:
        raise denials.arguments_too_large(size)
    return text


def _schema(text: str) -> dict[str, Any]:
    if not text:
        return {"type": "object"}
    try:
        schema = json.loads(text)
    except ValueError:
        return {"type": "object"}
    return schema if isinstance(schema, dict) else {"type": "object"}
