"""A Streamable HTTP MCP upstream of ours: `whoami` answers the SHA-256 of the bearer token it got.

Run as `python http_upstream.py`; it binds 127.0.0.1 on a free port and prints
`{"event": "listening", "url": "http://127.0.0.1:PORT/mcp"}` on stdout once it accepts.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("scenario-http-upstream")


@server.tool()
def whoami(ctx: Context) -> str:
    """The SHA-256 of the `Authorization: Bearer` token of this request."""
    request = ctx.request_context.request
    header = request.headers.get("authorization", "") if request is not None else ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "credential: none"
    return "credential-sha256: " + hashlib.sha256(token.encode()).hexdigest()


class _Announcing(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets=None):  # noqa: ANN001, ANN201 - uvicorn's signature
        await super().startup(sockets)
        if self.started:
            print(json.dumps({"event": "listening", "url": self._url}), flush=True)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    _Announcing(config, url).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
