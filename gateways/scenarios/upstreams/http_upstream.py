"""A Streamable HTTP MCP upstream of ours: `whoami` answers the SHA-256 of the bearer token it got.

Run as `python http_upstream.py`; it binds 127.0.0.1 on a free port and prints
`{"event": "listening", "url": "http://127.0.0.1:PORT/mcp"}` on stdout once it accepts.
"""

from __future__ import annotations

import hashlib
import sys

from mcp.server.mcpserver import Context, MCPServer

from announce import serve  # a sibling module: these scripts run from this folder

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


def main() -> None:
    serve(lambda: server.streamable_http_app(host="127.0.0.1"), lifespan="on")


if __name__ == "__main__":
    sys.exit(main())
