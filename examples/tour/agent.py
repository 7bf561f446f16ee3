"""The tour's agent: an MCP client on the official SDK, talking to the reference gateway.

It starts the Python gateway over stdio, as the caller whose API key is in
CAPGATE_CALLER_API_KEY (the gateway forwards it to capgate, which says who that is), lists the
tools that caller may see, and calls one of them:

    gateways/python/.venv/bin/python examples/tour/agent.py [TOOL [JSON-ARGUMENTS]]

The gateway inherits this process's environment: on a laptop that is where the accounts'
secrets are. Its JSON log lines go to gateway.log.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

CAPGATE_URL = os.environ.get("CAPGATE_URL", "http://127.0.0.1:50051")


async def main(tool: str | None, arguments: dict) -> int:
    gateway = StdioServerParameters(
        command=sys.executable,
        args=["-m", "capgate_gateway", "--capgate", CAPGATE_URL, "--stdio"],
        env=dict(os.environ),
    )
    with open("gateway.log", "a") as log:
        async with Client(stdio_client(gateway, errlog=log)) as client:
            try:
                listing = await client.list_tools()
                print("tools:", ", ".join(t.name for t in listing.tools) or "(none)")
                if tool is None:
                    return 0
                result = await client.call_tool(tool, arguments)
            except MCPError as error:  # a refusal: capgate's code, words, pointer and decision id
                print(f"error {error.code}: {error.message}")
                for key, value in (error.data or {}).items():
                    print(f"  {key:<12} {value}")
                return 1
            text = "".join(getattr(part, "text", "") for part in result.content)
            print(f"{tool} →", text)
            return 1 if result.is_error else 0


if __name__ == "__main__":
    tool = sys.argv[1] if len(sys.argv) > 1 else None
    arguments = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    sys.exit(asyncio.run(main(tool, arguments)))
