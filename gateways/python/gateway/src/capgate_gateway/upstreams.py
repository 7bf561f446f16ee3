"""Upstream MCP sessions: one per (upstream id, account id), reused across calls and callers.

A stdio upstream is started with the tool's command and args and gets the credential as
`MCP_UPSTREAM_CREDENTIAL` (and otherwise only the SDK's safe default environment, so the
gateway's own secrets never reach it); an HTTP upstream gets `Authorization: Bearer`.
Each session lives in its own task (the SDK's context managers must be entered and left
in one task) and is replaced when it fails or when the account's credential changes.
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

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


class UpstreamPool:
    def __init__(self, task_group: TaskGroup, *, connect_timeout: float = 20.0, call_timeout: float = 60.0) -> None:
        self._tg = task_group
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._locks: dict[tuple[str, str], anyio.Lock] = {}
        self._devnull = open(os.devnull, "w")  # noqa: SIM115 - the children's stderr, for the pool's life

    async def call(self, route: ToolRoute, account_id: str, credential: str, arguments: dict[str, Any] | None) -> Any:
        """The upstream's CallToolResult for `route.name`, as the upstream gave it."""
        key = (route.upstream, account_id)
        session = await self._session(key, route, credential)
        try:
            with anyio.fail_after(self._call_timeout):
                return await session.client.call_tool(route.name, arguments)
        except MCPError as error:
            if error.code in _TRANSPORT_CODES:
                self._discard(key, session)
                raise UpstreamError(f"the upstream `{route.upstream}` failed: {error.message}") from None
            raise
        except TimeoutError:
            self._discard(key, session)
            raise UpstreamError(f"the upstream `{route.upstream}` did not answer in {self._call_timeout:g}s") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, httpx2.HTTPError) as error:
            self._discard(key, session)
            raise UpstreamError(f"the upstream `{route.upstream}` failed ({_cause(error)})") from None

    async def aclose(self) -> None:
        for session in list(self._sessions.values()):
            session.stop.set()
        self._sessions.clear()
        self._devnull.close()

    def _discard(self, key: tuple[str, str], session: _Session) -> None:
        if self._sessions.get(key) is session:
            del self._sessions[key]
        session.stop.set()

    async def _session(self, key: tuple[str, str], route: ToolRoute, credential: str) -> _Session:
        fingerprint = sha256(f"{route.transport!r}\0{credential}".encode()).hexdigest()
        async with self._locks.setdefault(key, anyio.Lock()):
            current = self._sessions.get(key)
            if current is not None and not current.closed.is_set() and current.fingerprint == fingerprint:
                return current
            if current is not None:
                # Another credential (a refreshed token) or another transport: a new session.
                self._discard(key, current)
            try:
                with anyio.fail_after(self._connect_timeout):
                    session = await self._tg.start(self._run, route, credential, fingerprint)
            except TimeoutError:
                raise UpstreamError(f"the upstream `{route.upstream}` did not start in {self._connect_timeout:g}s") from None
            except UpstreamError:
                raise
            except Exception as error:  # noqa: BLE001 - any failure to connect is the upstream's
                raise UpstreamError(f"cannot connect to the upstream `{route.upstream}` ({_cause(error)})") from None
            self._sessions[key] = session
            logs.event("upstream_connected", upstream=route.upstream, account=key[1])
            return session

    async def _run(
        self, route: ToolRoute, credential: str, fingerprint: str, *, task_status: TaskStatus[_Session]
    ) -> None:
        session: _Session | None = None
        try:
            async with AsyncExitStack() as stack:
                transport = self._transport(stack, route.transport, credential)
                client = await stack.enter_async_context(Client(transport, cache=None))
                session = _Session(client, fingerprint)
                task_status.started(session)
                await session.stop.wait()
        except Exception as error:  # noqa: BLE001 - reported to the caller through start()
            if session is None:
                raise
            logs.event("upstream_closed", upstream=route.upstream, error=type(error).__name__)
        finally:
            if session is not None:
                session.closed.set()

    def _transport(self, stack: AsyncExitStack, transport: StdioTransport | HttpTransport, credential: str) -> Any:
        if isinstance(transport, StdioTransport):
            params = StdioServerParameters(
                command=transport.command,
                args=list(transport.args),
                env=get_default_environment() | {"MCP_UPSTREAM_CREDENTIAL": credential},
            )
            return stdio_client(params, errlog=self._devnull)
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {credential}"},
            timeout=httpx2.Timeout(30.0, read=300.0),
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(transport.url, http_client=http)
