"""A handshake-era (2025-11-25) Streamable HTTP MCP upstream written on the wire, not on an SDK,
so that it can count connections, forget its sessions and say things before it answers.

Run as `python handshake_upstream.py`; it binds 127.0.0.1 on a free port and prints
`{"event": "listening", "url": "http://127.0.0.1:PORT/mcp"}` on stdout once it accepts.

Tools (every answer an SSE stream that ends after the response, as the SDKs' servers write it,
except `echo_json`):
* `echo`: its `text` argument (or its arguments as JSON); `echo_json` the same as application/json;
* `whoami`: the SHA-256 of the bearer token of the request;
* `fail`: a JSON-RPC error of its own (-32042);
* `chatty`: before its answer, `notifications/resources/list_changed`, then a `ping` and a
  `sampling/createMessage` request, each waited for; the answer quotes what the client answered;
* `hang`: opens its stream and never answers.

Besides /mcp: `GET /stats` (which connections carried tools/call, how many handshakes, the
headers of the last call) and `POST /forget` (drop every session: their ids answer 404 since).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from announce import serve  # a sibling module: these scripts run from this folder

VERSION = "2025-11-25"
TOOLS = ["echo", "echo_json", "whoami", "fail", "chatty", "hang"]

sessions: set[str] = set()
stats: dict[str, Any] = {"call_peers": [], "initializes": 0, "last_call_headers": {}}
answers: dict[str, asyncio.Future[dict[str, Any]]] = {}


def _sse(message: dict[str, Any]) -> bytes:
    return f"event: message\ndata: {json.dumps(message)}\n\n".encode()


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def _response(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


async def _ask(method: str, params: dict[str, Any] | None) -> tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]:
    request_id = f"upstream-{uuid.uuid4().hex[:8]}"
    answers[request_id] = asyncio.get_running_loop().create_future()
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message, answers[request_id]


async def _call(request: Request, message: dict[str, Any]) -> Response:
    request_id = message["id"]
    params = message.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments") or {}
    client = request.scope.get("client") or ("", 0)
    stats["call_peers"].append([client[0], client[1]])
    stats["last_call_headers"] = {
        k: v for k, v in request.headers.items() if k in ("mcp-session-id", "mcp-protocol-version", "accept", "content-type")
    }
    text = arguments["text"] if isinstance(arguments.get("text"), str) else json.dumps(arguments, sort_keys=True)
    if name == "echo_json":
        return JSONResponse(_response(request_id, _text(text)))

    async def stream() -> AsyncIterator[bytes]:
        if name == "echo":
            yield _sse(_response(request_id, _text(text)))
        elif name == "whoami":
            _, _, token = request.headers.get("authorization", "").partition(" ")
            yield _sse(_response(request_id, _text("credential-sha256: " + hashlib.sha256(token.encode()).hexdigest())))
        elif name == "fail":
            error = {"code": -32042, "message": "the upstream refuses", "data": {"why": "asked to"}}
            yield _sse({"jsonrpc": "2.0", "id": request_id, "error": error})
        elif name == "chatty":
            yield _sse({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
            heard = []
            for method, asked in (("ping", None), ("sampling/createMessage", {"messages": [], "maxTokens": 1})):
                question, answer = await _ask(method, asked)
                yield _sse(question)
                reply = await asyncio.wait_for(answer, 10)
                heard.append({k: v for k, v in reply.items() if k in ("result", "error")})
            yield _sse(_response(request_id, _text(json.dumps(heard, sort_keys=True))))
        elif name == "hang":
            yield b": open\n\n"
            await asyncio.Event().wait()
        else:
            yield _sse({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"no tool {name}"}})

    return StreamingResponse(stream(), media_type="text/event-stream")


async def mcp(request: Request) -> Response:
    if request.method == "GET":
        return Response(status_code=405)  # no standalone stream: the spec lets a server say so
    session_id = request.headers.get("mcp-session-id")
    if request.method == "DELETE":
        sessions.discard(session_id or "")
        return Response(status_code=200)
    message = json.loads(await request.body())
    method = message.get("method")
    if method == "initialize":
        session_id = uuid.uuid4().hex
        sessions.add(session_id)
        stats["initializes"] += 1
        result = {"protocolVersion": VERSION, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "handshake-upstream", "version": "0"}}
        return JSONResponse(_response(message["id"], result), headers={"mcp-session-id": session_id})
    if session_id not in sessions:
        error = {"code": -32600, "message": "Session not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=404 if session_id else 400)
    if method is None:  # the client's answer to one of our requests
        if (future := answers.pop(str(message.get("id")), None)) is not None and not future.done():
            future.set_result(message)
        return Response(status_code=202)
    if "id" not in message:
        return Response(status_code=202)
    if method == "tools/list":
        tools = [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]
        return JSONResponse(_response(message["id"], {"tools": tools}))
    if method == "tools/call":
        return await _call(request, message)
    if method == "ping":
        return JSONResponse(_response(message["id"], {}))
    return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "Method not found"}})


async def get_stats(request: Request) -> Response:
    return JSONResponse(stats)


async def forget(request: Request) -> Response:
    sessions.clear()
    return JSONResponse({"forgotten": True})


app = Starlette(routes=[
    Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]),
    Route("/stats", get_stats, methods=["GET"]),
    Route("/forget", forget, methods=["POST"]),
])


def main() -> None:
    serve(lambda: app, lifespan="off")


if __name__ == "__main__":
    sys.exit(main())
