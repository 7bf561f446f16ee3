"""Upstream MCP sessions: one per (upstream id, account id), reused across calls and callers.

A stdio upstream is started with the tool's command and args and gets the credential as
`MCP_UPSTREAM_CREDENTIAL` (and otherwise only the SDK's safe default environment, so the
gateway's own secrets never reach it); an HTTP upstream gets `Authorization: Bearer`.
Each session lives in its own task (the SDK's context managers must be entered and left
in one task) and is replaced when it fails or when the account's credential changes.

Every request to an upstream — opening its session included — has one deadline,
`--upstream-timeout`: an upstream that never answers is `upstream_failed` then, not later.
What an upstream says on its own (its notifications) goes to `on_notification` with the
session's key, so that the gateway can pass it on to the callers it concerns.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskGroup, TaskStatus
from capgate_client import HttpTransport, StdioTransport, ToolRoute
from mcp import Client
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from capgate_gateway import logs

# The SDK raises these codes itself when the transport fails (the peer went away, or
# did not answer in time); any other JSON-RPC error is the upstream's answer, relayed.
_TRANSPORT_CODES = {mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT}

DEFAULT_TIMEOUT_SECONDS = 60.0

T = TypeVar("T")
Key = tuple[str, str]
"""(upstream id, account id): one session each."""
Transport = StdioTransport | HttpTransport
OnNotification = Callable[[Key, Any], Awaitable[None]]


def _cause(error: BaseException) -> str:
    """The innermost failure's type, through the SDK's task-group exception groups.

    Only the type: a message could quote a URL with credentials in it.
    """
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return type(error).__name__


class UpstreamError(Exception):
    """The upstream could not be reached or failed at the transport level; safe to show."""


@dataclass
class _Session:
    client: Client
    fingerprint: str
    closed: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)


async def _ignore(_key: Key, _notification: Any) -> None:
    return None


class UpstreamPool:
    def __init__(
        self, task_group: TaskGroup, *, timeout: float = DEFAULT_TIMEOUT_SECONDS, on_notification: OnNotification = _ignore
    ) -> None:
        self._tg = task_group
        self._timeout = timeout
        self._on_notification = on_notification
        self._sessions: dict[Key, _Session] = {}
        self._locks: dict[Key, anyio.Lock] = {}
        self._devnull = open(os.devnull, "w")  # noqa: SIM115 - the children's stderr, for the pool's life

    async def call(self, route: ToolRoute, account_id: str, credential: str, arguments: dict[str, Any] | None) -> Any:
        """The upstream's CallToolResult for `route.name`, as the upstream gave it."""
        return await self.request(
            route.upstream, route.transport, account_id, credential,
            lambda client: client.call_tool(route.name, arguments),
        )

    async def request(
        self, upstream: str, transport: Transport, account_id: str, credential: str,
        send: Callable[[Client], Awaitable[T]],
    ) -> T:
        """`send` on the session of (upstream, account), opened first when there is none.

        A JSON-RPC error the upstream answers is raised as the SDK's MCPError, to be relayed;
        anything else is an UpstreamError.
        """
        key = (upstream, account_id)
        session: _Session | None = None
        try:
            with anyio.fail_after(self._timeout):
                session = await self._session(key, transport, credential)
                return await send(session.client)
        except MCPError as error:
            if error.code in _TRANSPORT_CODES:
                self._discard(key, session)
                raise UpstreamError(f"the upstream `{upstream}` failed: {error.message}") from None
            raise
        except TimeoutError:
            self._discard(key, session)
            what = "start" if session is None else "answer"
            raise UpstreamError(f"the upstream `{upstream}` did not {what} in {self._timeout:g}s") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, httpx2.HTTPError) as error:
            self._discard(key, session)
            raise UpstreamError(f"the upstream `{upstream}` failed ({_cause(error)})") from None

    async def aclose(self) -> None:
        for session in list(self._sessions.values()):
            session.stop.set()
        self._sessions.clear()
        self._devnull.close()

    def _discard(self, key: Key, session: _Session | None) -> None:
        if session is None:
            return
        if self._sessions.get(key) is session:
            del self._sessions[key]
        session.stop.set()

    async def _session(self, key: Key, transport: Transport, credential: str) -> _Session:
        fingerprint = sha256(f"{transport!r}\0{credential}".encode()).hexdigest()
        async with self._locks.setdefault(key, anyio.Lock()):
            current = self._sessions.get(key)
            if current is not None and not current.closed.is_set() and current.fingerprint == fingerprint:
                return current
            if current is not None:
                # Another credential (a refreshed token) or another transport: a new session.
                self._discard(key, current)
            try:
                session = await self._tg.start(self._run, key, transport, credential, fingerprint)
            except UpstreamError:
                raise
            except Exception as error:  # noqa: BLE001 - any failure to connect is the upstream's
                raise UpstreamError(f"cannot connect to the upstream `{key[0]}` ({_cause(error)})") from None
            self._sessions[key] = session
            logs.event("upstream_connected", upstream=key[0], account=key[1])
            return session

    async def _run(
        self, key: Key, transport: Transport, credential: str, fingerprint: str, *, task_status: TaskStatus[_Session]
    ) -> None:
        session: _Session | None = None

        async def on_message(message: Any) -> None:
            if not isinstance(message, Exception):
                await self._on_notification(key, message)

        try:
            async with AsyncExitStack() as stack:
                connection = self._transport(stack, transport, credential)
                client = await stack.enter_async_context(Client(connection, cache=None, message_handler=on_message))
                session = _Session(client, fingerprint)
                task_status.started(session)
                await session.stop.wait()
        except Exception as error:  # noqa: BLE001 - reported to the caller through start()
            if session is None:
                raise
            logs.event("upstream_closed", upstream=key[0], error=type(error).__name__)
        finally:
            if session is not None:
                session.closed.set()

    def _transport(self, stack: AsyncExitStack, transport: Transport, credential: str) -> Any:
        if isinstance(transport, StdioTransport):
            params = StdioServerParameters(
                command=transport.command,
                args=list(transport.args),
                env=get_default_environment() | {"MCP_UPSTREAM_CREDENTIAL": credential},
            )
            return stdio_client(params, errlog=self._devnull)
        # The pool's deadline bounds every request; the client's own read timeout only has to
        # outlast it (and bounds a stream the gateway no longer waits on).
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {credential}"},
            timeout=httpx2.Timeout(30.0, read=max(300.0, self._timeout)),
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(transport.url, http_client=http)
