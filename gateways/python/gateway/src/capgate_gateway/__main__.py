"""`python -m capgate_gateway`: the command line both reference gateways share.

    --capgate URL  --gateway-token-file FILE  [--ca-file FILE]
    (--listen HOST:PORT | --stdio)  [--issuer ID]  [--decide-timeout SECONDS]
    [--upstream-timeout SECONDS]  [--relay FILE]  [--allowed-host HOST]…  [--allowed-origin ORIGIN]…
    [--call-path direct|sdk]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from capgate_client import CapgateClient, Credential, PolicyRevision
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning

from capgate_gateway import logs
from capgate_gateway.direct import DirectPath
from capgate_gateway.edge import Edge, HostCheck
from capgate_gateway.gateway import Gateway, StdioCaller
from capgate_gateway.http1 import OneWriteProtocol
from capgate_gateway.relay import Fanout, RelayConfigError, RelayedUpstream, load_config
from capgate_gateway.secrets import SecretResolver
from capgate_gateway.upstreams import DEFAULT_TIMEOUT_SECONDS, UpstreamPool
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
    parser.add_argument(
        "--upstream-timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
        help="deadline of every request to an upstream, opening its session included",
    )
    parser.add_argument("--relay", metavar="FILE", help="the upstreams whose resources, prompts, … are relayed (JSON)")
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="HOST",
        help="a Host this gateway answers to (repeatable; default for a loopback --listen: localhost, 127.0.0.1, ::1)",
    )
    parser.add_argument(
        "--allowed-origin", action="append", default=[], metavar="ORIGIN",
        help="an Origin accepted besides those of the allowed hosts (repeatable)",
    )
    parser.add_argument(
        "--call-path", choices=("direct", "sdk"), default="direct",
        help="how --listen relays a tools/call of a handshake-era session: below the MCP SDK, on kept "
             "upstream connections (direct, the default), or through the SDK's server and client (sdk)",
    )
    args = parser.parse_args(argv)
    if not args.capgate:
        parser.error("--capgate (or CAPGATE_URL) is required")
    if args.decide_timeout <= 0:
        parser.error("--decide-timeout must be above 0")
    if args.upstream_timeout <= 0:
        parser.error("--upstream-timeout must be above 0")
    try:
        args.relayed = load_config(Path(args.relay)) if args.relay else ()
    except RelayConfigError as error:
        parser.error(f"--relay: {error}")
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
        fanout = Fanout()
        relayed: tuple[RelayedUpstream, ...] = args.relayed
        try:
            async with anyio.create_task_group() as tg:
                upstreams = UpstreamPool(tg, timeout=args.upstream_timeout, on_notification=fanout.deliver)
                gateway = Gateway(
                    capgate,
                    secrets,
                    upstreams,
                    issuer=args.issuer,
                    decide_timeout=args.decide_timeout,
                    stdio_caller=_stdio_caller() if args.stdio else None,
                    relayed=relayed,
                    fanout=fanout,
                )

                async def on_change(revision: PolicyRevision) -> None:
                    told = await gateway.tools_changed()
                    logs.event("tools_list_changed_sent", sessions=told, policy_revision=revision.policy_revision)

                tg.start_soon(follow_policy, capgate, on_change)
                try:
                    if args.stdio:
                        await _serve_stdio(gateway)
                    else:
                        await _serve_http(gateway, args.listen, args.allowed_host, args.allowed_origin, args.call_path)
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


async def _serve_http(gateway: Gateway, listen: str, hosts: list[str], origins: list[str], call_path: str) -> None:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    sock = listening_socket(host, int(port))
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if sock.family == socket.AF_INET6 else host
    url = f"http://{shown_host}:{bound_port}/mcp"
    # The edge checks Host and Origin itself, with the same rules as the TypeScript gateway;
    # the SDK's own check (loopback binds only) is turned off so that there is one rule.
    app = gateway.server.streamable_http_app(
        streamable_http_path="/mcp", host=host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    direct = DirectPath(gateway) if call_path == "direct" else None
    edge = Edge(app, HostCheck.for_bind(host, hosts, origins), direct)
    server = _Uvicorn(http_config(edge), url)
    await server.serve(sockets=[sock])


def http_config(app: Any) -> uvicorn.Config:
    """How uvicorn serves the edge: httptools' HTTP/1.1 parser (llhttp, in C), named rather than left
    to uvicorn's `auto` (which falls back to h11, in Python, when httptools is missing), in a protocol
    that writes a response of known length in one piece (http1.py); no access log; the gateway's
    lifespan."""
    return uvicorn.Config(
        app, http=OneWriteProtocol, log_config=None, access_log=False, lifespan="on", log_level="warning"
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """The listener, bound. Every accepted connection must have TCP_NODELAY: an answer written in
    two parts (headers, body) would otherwise wait for the caller's delayed ACK, ~40 ms per call on
    a kept connection. asyncio sets it on each accepted connection when the listener names
    IPPROTO_TCP (it checks the socket's proto), so it is named."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def main(argv: list[str] | None = None) -> None:
    logs.configure()
    # Relaying 2025-era features (logging, resources/subscribe) to the upstreams that speak
    # them is the point; the SDK's warnings that 2026-07-28 deprecates them are not for stderr.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    args = parse_args(argv)
    try:
        anyio.run(run, args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
