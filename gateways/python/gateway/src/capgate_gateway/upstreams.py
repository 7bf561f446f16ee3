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

The direct path (`call_direct`, docs/decisions/0036-a-direct-path-for-tool-calls.md) sends a
tools/call to a handshake-era HTTP upstream as one raw JSON-RPC POST in that session, on a
connection the pool keeps open across calls (the SDK's client closes each SSE response before
its end, so every call of its own opens a new connection). The SDK session still opens, holds
and closes the upstream session; everything else goes through it. That POST is aiohttp's, not
httpx's: its C parser and leaner request path cost a fraction of httpx's per call (measured:
docs/dependencies.md); the SDK's own sessions keep httpx.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os
import re
import urllib.request
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing, suppress
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, TypeVar

import aiohttp
import anyio
import httpx2
import mcp_types
from anyio.abc import TaskGroup, TaskStatus
from capgate_client import HttpTransport, StdioTransport, ToolRoute
from mcp import Client
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from yarl import URL

from capgate_gateway import logs

# The SDK raises these codes itself when the transport fails (the peer went away, or
# did not answer in time); any other JSON-RPC error is the upstream's answer, relayed.
_TRANSPORT_CODES = {mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT}

DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The most the direct path reads of one upstream message (a JSON body, one SSE event); the edge's cap."""
DRAIN_SECONDS = 1.0
"""How long the direct path reads an SSE response on after its answer, for the connection's sake."""

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


class _SessionGone(Exception):
    """The upstream answered HTTP 404 to a request in its session: it no longer holds it."""


class _Answered(MCPError):
    """A JSON-RPC error the upstream itself sent on the direct path, whatever its code."""


@dataclass
class _Session:
    client: Client
    fingerprint: str
    session_id: str | None = None
    """The upstream's `Mcp-Session-Id`, as it named it answering the handshake (HTTP only)."""
    closed: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    direct_headers: dict[str, str] | None = None
    """The direct path's request headers in this session, made on its first call (`_headers`)."""


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
        # The direct path's connections, kept alive across calls, sessions and accounts (each
        # request carries its own credential): no cookies kept, no redirect followed, the same
        # timeouts as the SDK sessions' httpx clients (the pool's deadline bounds every call).
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=30.0, sock_read=max(300.0, timeout)),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._ids = itertools.count(1)
        # Each upstream URL parsed once, with the proxy the environment names for it (as httpx reads
        # it), not on every direct call.
        self._urls: dict[str, tuple[URL, str | None]] = {}

    async def call(
        self, route: ToolRoute, account_id: str, credential: str, arguments: dict[str, Any] | None
    ) -> mcp_types.CallToolResult:
        """The upstream's CallToolResult for `route.name`, through the SDK's client."""
        return await self.request(
            route.upstream, route.transport, account_id, credential,
            lambda client: client.call_tool(route.name, arguments),
        )

    async def call_direct(
        self, route: ToolRoute, account_id: str, credential: str, arguments: dict[str, Any] | None
    ) -> dict[str, Any] | mcp_types.CallToolResult:
        """The upstream's result for `route.name`: as it sent it (a JSON object) from a
        handshake-era HTTP upstream, else the SDK client's CallToolResult.

        An upstream that forgot its session (HTTP 404) gets the call once more in a new one.
        """
        if not isinstance(route.transport, HttpTransport):
            return await self.call(route, account_id, credential, arguments)
        url = route.transport.url

        async def send(session: _Session) -> dict[str, Any] | mcp_types.CallToolResult:
            if session.client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                # A 2026-07-28 request carries the SDK's envelope (`_meta`, Mcp-* headers): its client sends it.
                return await session.client.call_tool(route.name, arguments)
            params: dict[str, Any] = {"name": route.name}
            if arguments is not None:
                params["arguments"] = arguments
            return await self._post_call(route.upstream, url, account_id, session, credential, params)

        try:
            return await self._request(route.upstream, route.transport, account_id, credential, send)
        except _SessionGone:
            logs.event("upstream_session_lost", upstream=route.upstream, account=account_id)
            return await self.call(route, account_id, credential, arguments)

    async def request(
        self, upstream: str, transport: Transport, account_id: str, credential: str,
        send: Callable[[Client], Awaitable[T]],
    ) -> T:
        """`send` on the session of (upstream, account), opened first when there is none.

        A JSON-RPC error the upstream answers is raised as the SDK's MCPError, to be relayed;
        anything else is an UpstreamError.
        """
        return await self._request(upstream, transport, account_id, credential, lambda session: send(session.client))

    async def _request(
        self, upstream: str, transport: Transport, account_id: str, credential: str,
        send: Callable[[_Session], Awaitable[T]],
    ) -> T:
        key = (upstream, account_id)
        session: _Session | None = None
        try:
            with anyio.fail_after(self._timeout):
                session = await self._session(key, transport, credential)
                return await send(session)
        except _SessionGone:
            self._discard(key, session)
            raise
        except MCPError as error:
            if error.code in _TRANSPORT_CODES and not isinstance(error, _Answered):
                self._discard(key, session)
                raise UpstreamError(f"the upstream `{upstream}` failed: {error.message}") from None
            raise
        except TimeoutError:
            self._discard(key, session)
            what = "start" if session is None else "answer"
            raise UpstreamError(f"the upstream `{upstream}` did not {what} in {self._timeout:g}s") from None
        except (
            OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, httpx2.HTTPError,
            httpx2.StreamError, aiohttp.ClientError,
        ) as error:
            self._discard(key, session)
            raise UpstreamError(f"the upstream `{upstream}` failed ({_cause(error)})") from None

    async def aclose(self) -> None:
        for session in list(self._sessions.values()):
            session.stop.set()
        self._sessions.clear()
        self._devnull.close()
        await self._http.close()

    # ── the direct path ──────────────────────────────────────────────────────

    async def _post_call(
        self, upstream: str, url: str, account_id: str, session: _Session, credential: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        request_id = f"capgate-{next(self._ids)}"
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        headers = _headers(session, credential)
        async with self._post(url, json.dumps(body).encode(), headers) as response:
            if response.status == 404 and session.session_id is not None:
                raise _SessionGone()
            if response.status != 200:
                raise UpstreamError(f"the upstream `{upstream}` answered HTTP {response.status}")
            media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type == "application/json":
                answer = _json_object(await _read_bounded(response))
            elif media_type == "text/event-stream":
                answer = await self._read_stream(upstream, url, (upstream, account_id), session, headers, response, request_id)
            else:
                answer = None
        return _result(upstream, answer, request_id)

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> Any:
        """A POST on the pool's kept connections, its answer to be read in `async with`."""
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = _target(url)
        return self._http.post(target[0], data=body, headers=headers, proxy=target[1], allow_redirects=False)

    async def _read_stream(
        self, upstream: str, url: str, key: Key, session: _Session, headers: dict[str, str],
        response: aiohttp.ClientResponse, request_id: str,
    ) -> dict[str, Any]:
        """The response to `request_id` from an SSE stream. What else the upstream sends on it is
        delivered (or answered) as its SDK session would; past the response the stream is read
        to its end, so that the connection goes back to the pool."""
        version = session.client.protocol_version
        async with aclosing(_messages(response)) as events:
            async for message in events:
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    break
                await self._on_stream_message(url, key, version, headers, message)
            else:
                raise UpstreamError(f"the upstream `{upstream}` ended its answer without a response")
            # Past the answer, a stream that does not end (or goes wrong) costs its connection, not the call.
            with anyio.move_on_after(DRAIN_SECONDS), suppress(UpstreamError, aiohttp.ClientError):
                async for after in events:
                    await self._on_stream_message(url, key, version, headers, after)
        return message

    async def _on_stream_message(
        self, url: str, key: Key, version: str, headers: dict[str, str], message: dict[str, Any]
    ) -> None:
        method = message.get("method")
        if not isinstance(method, str):
            return  # a response to another request: not ours to read
        params = message.get("params")
        if "id" in message:
            await self._answer(url, headers, message["id"], _client_answer(method, version, params))
            return
        try:
            notification = methods.parse_server_notification(method, version, params)
        except (KeyError, ValidationError):
            return  # unknown at this version, or malformed: the SDK's session drops it too
        if not isinstance(notification, mcp_types.CancelledNotification):
            await self._on_notification(key, notification)

    async def _answer(self, url: str, headers: dict[str, str], request_id: Any, answer: dict[str, Any]) -> None:
        """A server-to-client request's answer, POSTed back as the SDK's client would."""
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, **answer}).encode()
        async with self._post(url, body, headers) as response:
            await _read_bounded(response)

    def _discard(self, key: Key, session: _Session | None) -> None:
        if session is None:
            return
        if self._sessions.get(key) is session:
            del self._sessions[key]
        session.stop.set()

    async def _session(self, key: Key, transport: Transport, credential: str) -> _Session:
        fingerprint = sha256(f"{transport!r}\0{credential}".encode()).hexdigest()
        current = self._sessions.get(key)
        if current is not None and not current.closed.is_set() and current.fingerprint == fingerprint:
            # The common case, checked before the lock: taking an anyio lock yields to the event
            # loop even when it is free (a loop iteration on every call). What the lock guards
            # (opening or replacing a session) is not done here, and a session found live is the
            # one a caller holding the lock would have got.
            return current
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        async with lock:
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

        named: list[str] = []
        try:
            async with AsyncExitStack() as stack:
                connection = self._transport(stack, transport, credential, named)
                client = await stack.enter_async_context(Client(connection, cache=None, message_handler=on_message))
                session = _Session(client, fingerprint, named[0] if named else None)
                task_status.started(session)
                await session.stop.wait()
        except Exception as error:  # noqa: BLE001 - reported to the caller through start()
            if session is None:
                raise
            logs.event("upstream_closed", upstream=key[0], error=type(error).__name__)
        finally:
            if session is not None:
                session.closed.set()

    def _transport(self, stack: AsyncExitStack, transport: Transport, credential: str, named: list[str]) -> Any:
        """The SDK's transport; an HTTP one puts the session id the upstream names in `named`
        (the SDK keeps it to itself)."""
        if isinstance(transport, StdioTransport):
            params = StdioServerParameters(
                command=transport.command,
                args=list(transport.args),
                env=get_default_environment() | {"MCP_UPSTREAM_CREDENTIAL": credential},
            )
            return stdio_client(params, errlog=self._devnull)

        async def remember(response: httpx2.Response) -> None:
            if not named and (session_id := response.headers.get("mcp-session-id")):
                named.append(session_id)

        # The pool's deadline bounds every request; the client's own read timeout only has to
        # outlast it (and bounds a stream the gateway no longer waits on).
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {credential}"},
            timeout=httpx2.Timeout(30.0, read=max(300.0, self._timeout)),
            event_hooks={"response": [remember]},
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(transport.url, http_client=http)


def _headers(session: _Session, credential: str) -> dict[str, str]:
    """A direct request's headers, as the SDK's client sends them in that session: made once
    per session, whose protocol version, session id and credential (its fingerprint's) do not change."""
    if session.direct_headers is not None:
        return session.direct_headers
    headers = {
        "Authorization": f"Bearer {credential}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": session.client.protocol_version,
    }
    if session.session_id is not None:
        headers["Mcp-Session-Id"] = session.session_id
    session.direct_headers = headers
    return headers


def _target(url: str) -> tuple[URL, str | None]:
    """An upstream URL, parsed, and the proxy the environment names for it (`HTTP_PROXY`,
    `HTTPS_PROXY`, `NO_PROXY`, …: what httpx honours), or None."""
    parsed = URL(url)
    if parsed.host is None or urllib.request.proxy_bypass(parsed.host):
        return parsed, None
    return parsed, urllib.request.getproxies().get(parsed.scheme)


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, up to MAX_MESSAGE_BYTES (above it, the upstream failed)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            raise UpstreamError(f"an upstream answer is over {MAX_MESSAGE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_object(text: bytes | str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


async def _messages(response: aiohttp.ClientResponse) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON-RPC messages of an SSE response (events without data, e.g. priming, are skipped)."""
    events = EventStream(MAX_MESSAGE_BYTES)
    async for chunk in response.content.iter_any():
        for data in events.feed(chunk):
            yield _event_message(data)
    for data in events.end():
        yield _event_message(data)


def _event_message(data: str) -> dict[str, Any]:
    message = _json_object(data)
    if message is None:
        raise UpstreamError("an upstream sent an SSE event that is not a JSON-RPC message")
    return message


_LINE_END = re.compile(r"\r\n|\r|\n")


class EventStream:
    """Server-sent events, read as the SDK's client reads them (httpx's parser, the WHATWG rules):
    UTF-8 text (an invalid byte is U+FFFD), lines ended by CRLF, LF or CR, `:` comments, `data`
    lines joined by LF, an event dispatched at a blank line and dropped at the stream's end
    without one. `feed` returns the data of each `message` event (unnamed, or named `message`)
    that has some; an event over `limit` bytes, its unended line included, is an UpstreamError,
    raised once the events before it have been returned."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""
        self._after_cr = False
        self._name = ""
        self._data: list[str] = []
        self._size = 0
        self._over = False

    def feed(self, chunk: bytes) -> list[str]:
        self._fail_if_over()
        text = self._decoder.decode(chunk)
        if self._after_cr and text:
            # A CR ended the last chunk's line: an LF opening this one belongs to it.
            text = text[1:] if text[0] == "\n" else text
            self._after_cr = False
        if text.endswith("\r"):
            self._after_cr = True
        lines = _LINE_END.split(self._pending + text)
        self._pending = lines.pop()
        found: list[str] = []
        for line in lines:
            if not line:
                self._dispatch(found)
                continue
            if line[0] == ":":
                continue
            self._size += len(line.encode())
            if self._size > self._limit:
                self._over = True
                return found
            field, _, value = line.partition(":")
            value = value[1:] if value[:1] == " " else value
            if field == "event":
                self._name = value
            elif field == "data":
                self._data.append(value)
        if self._pending and self._size + len(self._pending.encode()) > self._limit:
            self._over = True
        return found

    def end(self) -> list[str]:
        """At the stream's end: what a last CR dispatches (httpx's parser reads a CR that ends the
        stream as a line end followed by a blank line); an event without its blank line is dropped."""
        self._fail_if_over()
        found: list[str] = []
        if self._after_cr:
            self._dispatch(found)
        return found

    def _dispatch(self, found: list[str]) -> None:
        if self._data and self._name in ("", "message") and (data := "\n".join(self._data)):
            found.append(data)
        self._name, self._data, self._size = "", [], 0

    def _fail_if_over(self) -> None:
        if self._over:
            raise UpstreamError(f"an upstream sent an SSE event over {self._limit} bytes")


def _result(upstream: str, answer: dict[str, Any] | None, request_id: str) -> dict[str, Any]:
    """The result of a JSON-RPC response to `request_id`; its error is raised to be relayed."""
    if answer is not None and answer.get("jsonrpc") == "2.0" and answer.get("id") == request_id:
        result, error = answer.get("result"), answer.get("error")
        if isinstance(result, dict) and error is None:
            return result
        if result is None and isinstance(error, dict):
            code, message = error.get("code"), error.get("message")
            if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
                raise _Answered(code, message, error.get("data"))
    raise UpstreamError(f"the upstream `{upstream}` did not answer with a JSON-RPC response")


_DECLINED = {
    "sampling/createMessage": "Sampling not supported",
    "elicitation/create": "Elicitation not supported",
    "roots/list": "List roots not supported",
}
"""What the SDK's client answers to the requests it has no callback for (the pool's clients have none)."""


def _client_answer(method: str, version: str, params: Any) -> dict[str, Any]:
    """The answer (`result` or `error`) the SDK's client gives a server-to-client request."""
    not_found = {"error": {"code": mcp_types.METHOD_NOT_FOUND, "message": "Method not found", "data": method}}
    try:
        methods.parse_server_request(method, version, params)
    except KeyError:
        return not_found
    except ValidationError:
        return {"error": {"code": mcp_types.INVALID_PARAMS, "message": "Invalid request parameters", "data": ""}}
    if method == "ping":
        return {"result": {}}
    if method in _DECLINED:
        return {"error": {"code": mcp_types.INVALID_REQUEST, "message": _DECLINED[method]}}
    return not_found
