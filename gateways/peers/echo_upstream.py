"""An MCP upstream that shows what reached it: `headers` answers the HTTP headers of its request.

@modelcontextprotocol/server-everything cannot tell which headers Envoy forwarded, so the
account header (`x-capgate-account`, set by capgate's allow) is read back through this one,
written with the official Python SDK and served over streamable HTTP like any upstream.

Run as `python echo_upstream.py`: it listens on a free loopback port and uvicorn says which
(`Uvicorn running on http://127.0.0.1:PORT`, on stderr); the MCP endpoint is `/mcp`.
"""

from __future__ import annotations

import json

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("capgate-peers-echo")


@server.tool()
def headers(ctx: Context) -> str:
    """Every header of this HTTP request, as a JSON object (lowercase names)."""
    request = ctx.request_context.request
    seen = {} if request is None else {name.lower(): value for name, value in request.headers.items()}
    return json.dumps(seen, sort_keys=True)


if __name__ == "__main__":
    uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=0,
                log_level="info", access_log=False)
