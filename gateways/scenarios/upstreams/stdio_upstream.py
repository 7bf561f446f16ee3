"""A stdio MCP upstream of ours: it tells which credential it was started with, without echoing it.

`whoami` answers the SHA-256 (hex) of `MCP_UPSTREAM_CREDENTIAL`, so a scenario can check
that the gateway passed the allowed account's secret and that the secret itself never
travels back. `echo` returns its argument, to check arguments are relayed unchanged; `refund`
says what it was asked, for the conditions capgate puts on its arguments. The
resource `probe://whoami` and the prompt `greet` are what a gateway relays besides tools
(`--relay`); this server speaks 2026-07-28, where server-everything speaks the handshake.
"""

from __future__ import annotations

import hashlib
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("scenario-stdio-upstream")


@server.tool()
def whoami() -> str:
    """The SHA-256 of the credential this process received (`MCP_UPSTREAM_CREDENTIAL`)."""
    credential = os.environ.get("MCP_UPSTREAM_CREDENTIAL")
    if credential is None:
        return "credential: none"
    return "credential-sha256: " + hashlib.sha256(credential.encode()).hexdigest()


@server.resource("probe://whoami", description="What `whoami` answers, as a resource")
def whoami_resource() -> str:
    return whoami()


@server.prompt(description="A greeting for `name`")
def greet(name: str) -> str:
    return f"Say hello to {name}."


@server.tool()
def echo(text: str) -> str:
    """Returns `text` as given."""
    return text


@server.tool()
def refund(amount: float = 0, currency: str = "") -> str:
    """Says what it was asked to refund (the scenarios grant it on conditions on both arguments)."""
    return f"refunded {amount:g} {currency}"


if __name__ == "__main__":
    server.run("stdio")
