"""What is not a tool: resources, prompts, completions and logging, relayed from the upstreams
the operator opened (`--relay FILE`) to the callers capgate lets use them.

The rule (docs/decisions/0026-what-the-gateways-relay.md): closed by default — without
`--relay`, or for an upstream or feature the file does not name, the gateway serves none of
it (MCP's -32601, and the capability is not advertised). For an opened upstream, a caller
reaches it when capgate's ListVisible shows the caller at least one of its tools, and the
relayed request runs as the account those tools run as (refused when they run as several:
capgate's policy does not say which). Every relayed request asks ListVisible first, so
capgate authenticates the caller and writes a listing record; the gateway's log line for the
request carries that record's id (`listing_id`), which names the caller in capgate's audit.

Prompts are named like tools, `<upstream>__<prompt>`. Resource URIs are not renamed: a URI
goes to the only upstream the caller reaches, else to the upstream whose listing holds it
(or whose template's fixed prefix it starts with, the longest), else it is refused.
"""

from __future__ import annotations

import json
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mcp_types as types
from capgate_client import Account, CapgateClient, CapgateError, Credential, HttpTransport, NotVisible, StdioTransport
from mcp import Client
from mcp.server.subscriptions import InMemorySubscriptionBus, PromptsListChanged, ResourcesListChanged, ResourceUpdated
from mcp.shared.exceptions import MCPError

from capgate_gateway import denials, logs
from capgate_gateway.secrets import CredentialError, SecretResolver
from capgate_gateway.upstreams import Key, UpstreamError, UpstreamPool

FEATURES = ("resources", "prompts", "completions", "logging")
MAX_PAGES = 100
"""Listings are gathered whole from each upstream (and answered as one page): at most this many pages each."""

T = TypeVar("T")


class RelayConfigError(Exception):
    """The `--relay` file cannot be used; `str()` says where and why."""


@dataclass(frozen=True)
class RelayedUpstream:
    id: str
    transport: StdioTransport | HttpTransport
    features: frozenset[str]


def load_config(path: Path) -> tuple[RelayedUpstream, ...]:
    """The `--relay` file: `{"upstreams": [{"id", "transport", "relay": [features]}]}`, where
    `transport` is written as in the policy (`{"kind": "mcp-stdio", "command", "args"}` or
    `{"kind": "mcp-http", "url"}`)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RelayConfigError(f"cannot read `{path}`: {error.strerror}") from None
    except ValueError as error:
        raise RelayConfigError(f"`{path}` is not JSON: {error}") from None
    _only(document, {"upstreams"}, "the file")
    entries = document.get("upstreams")
    if not isinstance(entries, list):
        raise RelayConfigError("`upstreams` must be a list")
    upstreams: list[RelayedUpstream] = []
    for index, entry in enumerate(entries):
        where = f"upstreams[{index}]"
        _only(entry, {"id", "transport", "relay"}, where)
        upstream_id = entry.get("id")
        if not isinstance(upstream_id, str) or not upstream_id or "_" in upstream_id:
            raise RelayConfigError(f"{where}.id must be an upstream id (no `_`)")
        if any(u.id == upstream_id for u in upstreams):
            raise RelayConfigError(f"{where}.id `{upstream_id}` is named twice")
        features = entry.get("relay")
        if not isinstance(features, list) or not all(f in FEATURES for f in features):
            raise RelayConfigError(f"{where}.relay must list some of {', '.join(FEATURES)}")
        upstreams.append(RelayedUpstream(upstream_id, _transport(entry.get("transport"), where), frozenset(features)))
    return tuple(upstreams)


def _only(value: Any, keys: set[str], where: str) -> None:
    if not isinstance(value, dict):
        raise RelayConfigError(f"{where} must be an object")
    if unknown := sorted(set(value) - keys):
        raise RelayConfigError(f"{where} has unknown field `{unknown[0]}`")


def _transport(value: Any, where: str) -> StdioTransport | HttpTransport:
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind == "mcp-stdio":
        _only(value, {"kind", "command", "args"}, f"{where}.transport")
        command, args = value.get("command"), value.get("args", [])
        if not isinstance(command, str) or not command or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RelayConfigError(f"{where}.transport needs `command` (a string) and `args` (strings)")
        return StdioTransport(command, tuple(args))
    if kind == "mcp-http":
        _only(value, {"kind", "url"}, f"{where}.transport")
        if not isinstance(value.get("url"), str) or not value["url"].startswith(("http://", "https://")):
            raise RelayConfigError(f"{where}.transport.url must be an http(s) URL")
        return HttpTransport(value["url"])
    raise RelayConfigError(f"{where}.transport.kind must be `mcp-stdio` or `mcp-http`")


# ── who hears what an upstream says ─────────────────────────────────────────


@dataclass
class Fanout:
    """The gateway's open sessions, and which of them asked for what an upstream may say.

    Handshake-era (≤ 2025-11-25) connections are kept weakly (the SDK hands handlers a
    per-request session; the connection behind it is what outlives the request);
    2026-07-28 clients hear through `subscriptions/listen` streams fed by `bus`.
    """

    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)
    connections: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    _subscribers: dict[tuple[Key, str], weakref.WeakSet[Any]] = field(default_factory=dict)
    _log_listeners: dict[Key, weakref.WeakSet[Any]] = field(default_factory=dict)

    def subscribe(self, key: Key, uri: str, connection: Any) -> None:
        self._subscribers.setdefault((key, uri), weakref.WeakSet()).add(connection)

    def unsubscribe(self, key: Key, uri: str, connection: Any) -> bool:
        """Forget `connection`'s subscription; True when nobody is left subscribed to `uri`."""
        subscribers = self._subscribers.get((key, uri))
        if subscribers is not None:
            subscribers.discard(connection)
            if subscribers:
                return False
            del self._subscribers[(key, uri)]
        return True

    def listen_logs(self, key: Key, connection: Any) -> None:
        self._log_listeners.setdefault(key, weakref.WeakSet()).add(connection)

    async def deliver(self, key: Key, notification: Any) -> None:
        """What the session of `key` said on its own, to the sessions it concerns."""
        match notification:
            case types.ResourceUpdatedNotification(params=params):
                for connection in list(self._subscribers.get((key, params.uri), ())):
                    await connection.send_resource_updated(params.uri)
                await self.bus.publish(ResourceUpdated(uri=params.uri))
            case types.ResourceListChangedNotification():
                for connection in list(self.connections):
                    await connection.send_resource_list_changed()
                await self.bus.publish(ResourcesListChanged())
            case types.PromptListChangedNotification():
                for connection in list(self.connections):
                    await connection.send_prompt_list_changed()
                await self.bus.publish(PromptsListChanged())
            case types.LoggingMessageNotification(params=params):
                data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
                for connection in list(self._log_listeners.get(key, ())):
                    await connection.notify("notifications/message", data)


# ── the relay ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Reach:
    """An opened upstream this caller may use, as which account, per which listing record."""

    upstream: RelayedUpstream
    account: Account
    listing_id: str

    @property
    def key(self) -> Key:
        return (self.upstream.id, self.account.id)


class Relay:
    def __init__(
        self,
        upstreams: tuple[RelayedUpstream, ...],
        capgate: CapgateClient,
        secrets: SecretResolver,
        pool: UpstreamPool,
        fanout: Fanout,
        *,
        decide_timeout: float,
    ) -> None:
        self.upstreams = upstreams
        self.capgate = capgate
        self.secrets = secrets
        self.pool = pool
        self.fanout = fanout
        self.decide_timeout = decide_timeout
        self.features = frozenset(f for u in upstreams for f in u.features)

    async def reach(self, credential: Credential, feature: str, method: str) -> list[Reach]:
        """The opened upstreams (for `feature`) this caller may use, in the file's order."""
        try:
            answer = await self.capgate.list_visible(credential, request_id=str(uuid.uuid4()), timeout=self.decide_timeout)
        except CapgateError as error:
            logs.event("capgate_unavailable", logging.WARNING, rpc="ListVisible", method=method, status=error.status)
            raise denials.capgate_unavailable(f"capgate did not answer ({error.status.lower()})") from None
        if isinstance(answer, NotVisible):
            logs.event("relay_refused", method=method, code="unauthenticated", problem=answer.problem)
            raise denials.unauthenticated(answer)
        accounts = {c.capability: c.account for c in answer.capabilities if c.account is not None}
        listing_id = answer.capabilities[0].decision_id if answer.capabilities else ""
        reaches: list[Reach] = []
        for upstream in self.upstreams:
            if feature not in upstream.features:
                continue
            used = {a.id: a for t in answer.tools if t.upstream == upstream.id and (a := accounts.get(t.capability))}
            if len(used) == 1:
                reaches.append(Reach(upstream, next(iter(used.values())), listing_id))
            elif len(used) > 1:
                logs.event("relay_ambiguous", logging.WARNING, method=method, upstream=upstream.id,
                           accounts=sorted(used), listing_id=listing_id)
        return reaches

    async def send(self, reach: Reach, method: str, target: str, send: Callable[[Client], Awaitable[T]]) -> T:
        """One relayed request, logged with who asked (the listing record) and what came of it."""
        fields = {"method": method, "upstream": reach.upstream.id, "account": reach.account.id,
                  "listing_id": reach.listing_id, "target": target}
        try:
            credential = await self.secrets.resolve(reach.account.secret_ref)
        except CredentialError as error:
            logs.event("relay_failed", logging.WARNING, **fields, code="credential_failed", scheme=error.scheme)
            raise denials.credential_failed(reach.listing_id, str(error)) from None
        try:
            result = await self.pool.request(reach.upstream.id, reach.upstream.transport, reach.account.id, credential, send)
        except UpstreamError as error:
            logs.event("relay_failed", logging.WARNING, **fields, code="upstream_failed", reason=str(error))
            raise denials.upstream_failed(reach.listing_id, str(error)) from None
        except MCPError as error:
            logs.event("relayed", **fields, upstream_error=error.code)
            raise
        logs.event("relayed", **fields)
        return result

    async def gather(self, reaches: list[Reach], method: str, fetch: Callable[[Client, str | None], Awaitable[Any]],
                     items: Callable[[Any], list[T]]) -> list[T]:
        """Every page of a listing from each upstream; one that fails is left out (and logged)."""
        gathered: list[T] = []
        for reach in reaches:

            async def pages(client: Client) -> list[T]:
                found: list[T] = []
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await fetch(client, cursor)
                    found.extend(items(page))
                    cursor = page.next_cursor
                    if not cursor:
                        break
                return found

            try:
                gathered.extend(await self.send(reach, method, "", pages))
            except MCPError:
                continue  # logged by send; the other upstreams still answer
        return gathered

    async def route_resource(self, reaches: list[Reach], uri: str) -> Reach | None:
        """The upstream a resource URI belongs to, among those the caller reaches."""
        if len(reaches) <= 1:
            return reaches[0] if reaches else None
        best: tuple[int, Reach] | None = None
        for reach in reaches:
            resources = await self.gather([reach], "resources/list", list_resources, lambda p: p.resources)
            if any(r.uri == uri for r in resources):
                return reach
            templates = await self.gather([reach], "resources/templates/list", list_resource_templates,
                                          lambda p: p.resource_templates)
            for template in templates:
                prefix = template.uri_template.split("{", 1)[0]
                if prefix and uri.startswith(prefix) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), reach)
        return best[1] if best else None


async def list_resources(client: Client, cursor: str | None) -> types.ListResourcesResult:
    return await client.list_resources(cursor=cursor)


async def list_resource_templates(client: Client, cursor: str | None) -> types.ListResourceTemplatesResult:
    return await client.list_resource_templates(cursor=cursor)


def prompt_route(reaches: list[Reach], name: str) -> tuple[Reach, str] | None:
    """`<upstream>__<prompt>` → the upstream (if the caller reaches it) and its own prompt name."""
    upstream, sep, inner = name.partition("__")
    if not sep or not inner:
        return None
    reach = next((r for r in reaches if r.upstream.id == upstream), None)
    return (reach, inner) if reach else None
