"""`python -m capgate_gateway`: the command line both reference gateways share.

    --capgate URL  --gateway-token-file FILE  [--ca-file FILE]
    (--listen HOST:PORT | --stdio)  [--issuer ID]  [--decide-timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import anyio
import uvicorn
from capgate_client import CapgateClient, Credential, PolicyRevision

from capgate_gateway import logs
from capgate_gateway.edge import Edge
from capgate_gateway.gateway import Gateway, StdioCaller
from capgate_gateway.secrets import SecretResolver
from capgate_gateway.upstreams import UpstreamPool
from capgate_gateway.watch import follow_policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="capgate-gateway", description="capgate's reference MCP gateway")
    parser.add_argument("--capgate", default=os.environ.get("CAPGATE_URL"), help="capgate's gRPC endpoint [CAPGATE_URL]")
    parser.add_argument(
        "--gateway-token-file",
        default=os.environ.get("CAPGATE_GATEWAY_TOKEN_FILE"),
        help="the gateway's own token for capgate [CAPGATE_GATEWAY_TOKEN_FILE]",
    )
    parser.add_argument("--ca-file", help="CA bundle for an https capgate")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--listen", metavar="HOST:PORT", help="serve MCP over Streamable HTTP at /mcp")
    mode.add_argument("--stdio", action="store_true", help="serve MCP over stdio")
    parser.add_argument("--issuer", default="", help="issuer hint sent as Credential.issuer")
    parser.add_argument("--decide-timeout", type=float, default=2.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    if not args.capgate:
        parser.error("--capgate (or CAPGATE_URL) is required")
    if args.decide_timeout <= 0:
        parser.error("--decide-timeout must be above 0")
    return args


def _token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        sys.exit(f"capgate-gateway: cannot read --gateway-token-file `{path}`: {error.strerror}")


def _stdio_caller() -> StdioCaller:
    if key := os.environ.get("CAPGATE_CALLER_API_KEY"):
        return StdioCaller(Credential.api_key(key))
    # Unset is forwarded as an empty token: capgate answers credential_missing.
    return StdioCaller(Credential.bearer(os.environ.get("CAPGATE_CALLER_TOKEN", "")))


async def run(args: argparse.Namespace) -> None:
    token = _token(args.gateway_token_file)
    async with CapgateClient(args.capgate, token=token, ca_file=args.ca_file, timeout=args.decide_timeout) as capgate:
        secrets = SecretResolver()
        try:
            async with anyio.create_task_group() as tg:
                upstreams = UpstreamPool(tg)
                gateway = Gateway(
                    capgate,
                    secrets,
                    upstreams,
                    issuer=args.issuer,
                    decide_timeout=args.decide_timeout,
                    stdio_caller=_stdio_caller() if args.stdio else None,
                )

                async def on_change(revision: PolicyRevision) -> None:
                    told = await gateway.tools_changed()
                    logs.event("tools_list_changed_sent", sessions=told, policy_revision=revision.policy_revision)

                tg.start_soon(follow_policy, capgate, on_change)
                try:
                    if args.stdio:
                        await _serve_stdio(gateway)
                    else:
                        await _serve_http(gateway, args.listen)
                finally:
                    await upstreams.aclose()
                    tg.cancel_scope.cancel()
        finally:
            await secrets.aclose()


async def _serve_stdio(gateway: Gateway) -> None:
    from mcp.server.stdio import stdio_server

    logs.event("serving", transport="stdio")
    async with stdio_server() as (read_stream, write_stream):
        await gateway.server.run(read_stream, write_stream, gateway.initialization_options())


class _Uvicorn(uvicorn.Server):
    """Prints the `listening` line once the socket accepts, with the port picked."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logs.emit_raw({"event": "listening", "url": self._url})


async def _serve_http(gateway: Gateway, listen: str) -> None:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{shown_host}:{bound_port}/mcp"
    app = gateway.server.streamable_http_app(streamable_http_path="/mcp", host=host)
    config = uvicorn.Config(Edge(app), log_config=None, access_log=False, lifespan="on", log_level="warning")
    server = _Uvicorn(config, url)
    await server.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    logs.configure()
    args = parse_args(argv)
    try:
        anyio.run(run, args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
