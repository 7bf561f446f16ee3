"""An MCP upstream that shows what reached it: `headers` answers the HTTP headers of its request.

@modelcontextprotocol/server-everything cannot tell which headers a proxy forwarded, so the
account header (`x-capgate-account`, set by capgate's allow) is read back through this one,
written with the official Python SDK and served over streamable HTTP like any upstream. It
speaks MCP 2026-07-28 too, and so checks `Mcp-Method`/`Mcp-Name` against the body, which the
forward-auth proxies rely on (docs/gateways/nginx.md). Its other tools are there to be granted
differently: `limited` answers as `headers` does, under a ceiling; `erase` is granted to nobody.

Run as `python echo_upstream.py`: it listens on a free loopback port and uvicorn says which
(`Uvicorn running on http://127.0.0.1:PORT`, on stderr); the MCP endpoint is `/mcp`.
"""

from __future__ import annotations

import json

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("capgate-peers-echo")


def _seen(ctx: Context) -> str:
    request = ctx.request_context.request
    seen = {} if request is None else {name.lower(): value for name, value in request.headers.items()}
    return json.dumps(seen, sort_keys=True)


@server.tool()
def headers(ctx: Context) -> str:
    """Every header of this HTTP request, as a JSON object (lowercase names)."""
    return _seen(ctx)


@server.tool()
def limited(ctx: Context) -> str:
    """As `headers`; the suite's policy grants it under a ceiling."""
    return _seen(ctx)


@server.tool()
def erase() -> str:
    """A tool no grant names: a call that reaches it got past capgate."""
    return "erased"


if __name__ == "__main__":
    uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=0,
                log_level="info", access_log=False)
