"""The direct path's POST to an upstream (UpstreamPool._post_call, on aiohttp) and its SSE reader.

The reader against the rules the SDK's own (httpx's) parser follows; the POST against an
in-process HTTP upstream answering JSON, SSE (a notification first), 404, 500 and over-bound bodies.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from aiohttp import web
from capgate_gateway import upstreams
from capgate_gateway.upstreams import EventStream, UpstreamError, UpstreamPool, _Session, _SessionGone

# ── the SSE reader ───────────────────────────────────────────────────────────


def _read(chunks: list[bytes], limit: int = 1000) -> list[str]:
    events = EventStream(limit)
    return [data for chunk in chunks for data in events.feed(chunk)] + events.end()


def test_events_end_at_a_blank_line_whatever_the_line_ends() -> None:
    assert _read([b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n"]) == ["a", "b", "c", "d"]


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    assert _read([b"data: a\r", b"\ndata: b\r", b"\n", b"\r", b"\ndata: c\r", b"\r"]) == ["a\nb", "c"]
    # As httpx's parser reads it, a CR that ends the stream ends the event too.
    assert _read([b"data: a\r\ndata: b\r"]) == ["a\nb"]
    assert _read([b"data: a\ndata: b\n"]) == []


def test_utf8_split_between_chunks() -> None:
    encoded = "data: über 𝄞\n\n".encode()
    assert _read([encoded[:8], encoded[8:12], encoded[12:]]) == ["über 𝄞"]


def test_data_lines_join_and_what_is_not_a_message_is_skipped() -> None:
    stream = (b": a comment\nid: 1\nretry: 10\ndata: one\ndata:two\n\n"
              b"event: other\ndata: skipped\n\n"
              b"event: message\ndata: named\n\n"
              b"event: priming\n\n"
              b"data:\n\n"
              b"data: unended")
    assert _read([stream]) == ["one\ntwo", "named"]


def test_an_event_over_the_bound_fails_the_upstream() -> None:
    with pytest.raises(UpstreamError, match="over 20 bytes"):
        _read([b"data: 0123456789\n", b"data: 0123456789\n\n"], limit=20)
    with pytest.raises(UpstreamError, match="over 20 bytes"):  # a line that never ends counts too
        _read([b"data: 0123456789", b"0123456789"], limit=20)
    assert _read([b"data: 0123456789\n\n"] * 3, limit=20) == ["0123456789"] * 3  # per event, not per stream
    events = EventStream(20)  # what came before the event over the bound is read first
    assert events.feed(b"data: 1\n\ndata: 0123456789\ndata: 0123456789\n\n") == ["1"]
    with pytest.raises(UpstreamError, match="over 20 bytes"):
        events.end()


# ── the POST ─────────────────────────────────────────────────────────────────


def _answer(request: dict[str, Any], text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": text}]}}


async def _json(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response(_answer(body, request.headers["Authorization"] + " " + request.headers["Mcp-Session-Id"]))


async def _sse(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    notification = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    await response.write(f"event: message\ndata: {json.dumps(notification)}\n\n".encode())
    await response.write(f"data: {json.dumps(_answer(body, 'streamed'))}\r\n\r\n".encode())
    await response.write_eof()
    return response


async def _big(request: web.Request) -> web.Response:
    return web.json_response({"padding": "x" * 300})


async def _gone(request: web.Request) -> web.Response:
    return web.Response(status=404)


async def _broken(request: web.Request) -> web.Response:
    return web.Response(status=500, text="no")


async def _posts() -> dict[str, Any]:
    app = web.Application()
    app.add_routes([web.post(f"/{name}", handler) for name, handler in
                    (("json", _json), ("sse", _sse), ("big", _big), ("gone", _gone), ("broken", _broken))])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port picked
    heard: list[Any] = []

    async def on_notification(key: Any, notification: Any) -> None:
        heard.append((key, type(notification).__name__))

    session = _Session(SimpleNamespace(protocol_version="2025-11-25"), "fingerprint", "session-1")
    got: dict[str, Any] = {}
    try:
        async with anyio.create_task_group() as tg:
            pool = UpstreamPool(tg, timeout=5, on_notification=on_notification)
            try:
                for name in ("json", "sse", "big", "gone", "broken"):
                    url = f"http://127.0.0.1:{port}/{name}"
                    try:
                        got[name] = await pool._post_call("up", url, "acct", session, "token-1", {"name": "t"})  # noqa: SLF001
                    except (UpstreamError, _SessionGone) as error:
                        got[name] = error
            finally:
                await pool.aclose()
    finally:
        await runner.cleanup()
    got["heard"] = heard
    return got


def test_the_post_reads_json_and_sse_answers_and_fails_on_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstreams, "MAX_MESSAGE_BYTES", 200)
    got = anyio.run(_posts)
    assert got["json"] == {"content": [{"type": "text", "text": "Bearer token-1 session-1"}]}
    assert got["sse"] == {"content": [{"type": "text", "text": "streamed"}]}
    assert got["heard"] == [(("up", "acct"), "ToolListChangedNotification")]
    assert isinstance(got["big"], UpstreamError) and "over 200 bytes" in str(got["big"])
    assert isinstance(got["gone"], _SessionGone)
    assert isinstance(got["broken"], UpstreamError) and "answered HTTP 500" in str(got["broken"])


# ── which session a call gets ────────────────────────────────────────────────


class _Opener:
    """Stands in for the pool's task group: each session it is asked to open is a new one."""

    def __init__(self) -> None:
        self.opened: list[_Session] = []

    async def start(self, _run: Any, key: Any, transport: Any, credential: str, fingerprint: str) -> _Session:
        session = _Session(SimpleNamespace(protocol_version="2025-11-25"), fingerprint)
        self.opened.append(session)
        return session


async def _sessions() -> tuple[list[_Session], list[_Session]]:
    async with anyio.create_task_group() as tg:
        pool = UpstreamPool(tg)
        opener = pool._tg = _Opener()  # noqa: SLF001
        transport = upstreams.HttpTransport("http://127.0.0.1:1/mcp")
        key = ("up", "acct")
        try:
            got = [await pool._session(key, transport, "token-1") for _ in range(2)]  # noqa: SLF001
            got.append(await pool._session(key, transport, "token-2"))  # noqa: SLF001 - a refreshed credential
            got[-1].closed.set()  # the upstream went away
            got.append(await pool._session(key, transport, "token-2"))  # noqa: SLF001
        finally:
            await pool.aclose()
    return got, opener.opened


def test_a_live_session_is_reused_and_replaced_on_a_new_credential_or_once_closed() -> None:
    got, opened = anyio.run(_sessions)
    assert got[0] is got[1], "a live session of the same credential is the one reused"
    assert got[2] is not got[0] and got[0].stop.is_set(), "another credential opens a new session, the old one stopped"
    assert got[3] is not got[2], "a closed session is replaced"
    assert opened == [got[0], got[2], got[3]]
