"""What a reference gateway adds to a tool call: a benchmark, not a test (gateways/bench/README.md).

One MCP client (the official Python SDK, the 2025-11-25 handshake, one session) calls the
`echo` tool of a local upstream (@modelcontextprotocol/server-everything over Streamable HTTP)
N times in a row after a warm-up — directly, then through the Python gateway, then through the
TypeScript gateway, each with `--call-path sdk` (both MCP SDK stacks per call, the baseline) and
`--call-path direct` (tools/call relayed below the SDKs, the default), all asking a real
`capgate serve` (SQLite) with a bearer JWT. capgate's
Decide is timed alone too, from a gRPC client, the same N times with the same credential and
the request a gateway sends (a fresh request id, the call's arguments).

It prints, per path, p50 and p99 of the call, the gateway's overhead over the direct call, how
much of that is Decide, and the CPU time each process spent per call (from /proc: less
sensitive to a loaded machine than wall time). With `--instructions` it also counts the
instructions each gateway process executes per call under valgrind's callgrind (the marginal
cost: two runs of different lengths, the difference divided by the difference in calls).
Every process it starts is stopped on the way out, a failed start included (harness.Process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import yaml
from capgate_client import Allow, CapgateClient, Credential
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scenarios"))

from fixtures.servers import OidcProvider  # noqa: E402
from harness import (  # noqa: E402
    EVERYTHING,
    NODE22,
    GatewayKind,
    Process,
    capgate_bin,
    free_port,
    json_event,
    start_capgate,
    start_http_gateway,
)

TOOL = "everything__echo"
ARGUMENTS = {"message": "overhead"}
GOAL_MS = 1.0


@dataclass
class Timings:
    name: str
    seconds: list[float]
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per call, per process."""

    def percentile(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds) * 1000

    @property
    def p99(self) -> float:
        return self.percentile(0.99)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its reaped children, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and every live descendant (a gateway's stdio upstreams, Node's threads are in-process)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            total += cpu_seconds(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        pending.extend(int(c) for c in children)
    return total


async def timed_calls(call: Callable[[], Awaitable[Any]], warmup: int, calls: int, watch: dict[str, int],
                      name: str) -> Timings:
    for _ in range(warmup):
        await call()
    before = {label: tree_cpu(pid) for label, pid in watch.items()}
    client_before = time.process_time()
    seconds: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        seconds.append(time.perf_counter() - started)
    timings = Timings(name, seconds)
    timings.cpu = {label: (tree_cpu(pid) - before[label]) / calls for label, pid in watch.items()}
    timings.cpu["client"] = (time.process_time() - client_before) / calls
    return timings


async def mcp_calls(url: str, tool: str, token: str | None, warmup: int, calls: int, watch: dict[str, int],
                    name: str) -> Timings:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client:

            async def call() -> None:
                result = await client.call_tool(tool, ARGUMENTS)
                if result.is_error:
                    raise RuntimeError(f"{name}: the call failed: {result}")

            return await timed_calls(call, warmup, calls, watch, name)


async def decide_calls(capgate_url: str, gateway_token: str, token: str, warmup: int, calls: int,
                       watch: dict[str, int], keyed: bool) -> Timings:
    """`Decide` from a gRPC client. `keyed`: the request the gateways send for a tools/call, a fresh
    request id (which capgate claims in its store before deciding, docs/decisions/0027) and the
    call's arguments as compact JSON; the goal's `Decide` is this one. Otherwise the bare request
    (the tool alone), for comparison with the runs before it was measured keyed."""
    arguments = json.dumps(ARGUMENTS, separators=(",", ":"))
    async with CapgateClient(capgate_url, token=gateway_token, timeout=5.0) as capgate:

        async def call() -> None:
            answer = await capgate.decide(Credential.bearer(token), tool=TOOL,
                                          request_id=str(uuid.uuid4()) if keyed else "",
                                          arguments_json=arguments if keyed else None)
            if not isinstance(answer, Allow):
                raise RuntimeError(f"Decide did not allow the call: {answer}")

        name = "Decide alone (gRPC)" if keyed else "Decide alone, bare (no id)"
        return await timed_calls(call, warmup, calls, watch, name)


def callgrind_instructions(out_file: Path) -> int:
    """The `summary:` (total Ir) of a callgrind output file."""
    for line in out_file.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out_file}")


@dataclass
class World:
    directory: Path
    capgate_url: str
    gateway_token_file: Path
    gateway_token: str
    caller_token: str
    upstream_url: str
    env: dict[str, str]
    pids: dict[str, int]


def policy(upstream_url: str, discovery: str) -> dict[str, Any]:
    return {
        "version": 1,
        "capabilities": [{"id": "everything.echo"}],
        "upstreams": [{"id": "everything", "transport": {"kind": "mcp-http", "url": upstream_url},
                       "tools": [{"name": "echo", "capability": "everything.echo"}]}],
        "accounts": [{"id": "acct-bench", "secret": {"ref": "env://BENCH_UPSTREAM_SECRET"}}],
        "principals": {"issuers": [{"id": "idp", "kind": "oidc", "discovery": discovery, "audience": "capgate-scenarios",
                                    "attributes": {"dept": "claim:department"}}]},
        "grants": [{"to": {"issuer": "idp", "attributes": {"dept": "bench"}}, "capabilities": ["everything.echo"],
                    "using": "acct-bench"}],
    }


def gateway_under_valgrind(kind: GatewayKind, call_path: str, world: World, out: Path, calls: int) -> int:
    """Instructions the gateway process executes for `calls` calls after the warm-up (callgrind's total)."""
    log = world.directory / f"{kind.name}-{call_path}-callgrind-{calls}.stderr"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no", *kind.command(),
               "--capgate", world.capgate_url, "--gateway-token-file", str(world.gateway_token_file),
               "--listen", "127.0.0.1:0", "--call-path", call_path]
    process = Process(f"{kind.name} gateway (callgrind)", command, env=world.env, cwd=kind.cwd, log=log)
    try:
        url = process.wait_for(lambda line: (json_event(line) or {}).get("url"), timeout=600)
        anyio.run(mcp_calls, url, TOOL, world.caller_token, 20, calls, {}, f"{kind.name} (callgrind)")
    finally:
        process.stop()
    return callgrind_instructions(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    # Thousands, not hundreds: the TypeScript gateway's V8 is still compiling its hot path after 200
    # calls (docs/benchmarks.md), and the goal is about a gateway that has run for a while.
    parser.add_argument("--warmup", type=int, default=3000,
                        help="calls on each path before the measured ones (default: 3000)")
    parser.add_argument("--instructions", action="store_true", help="also count each gateway's instructions per call")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--call-paths", default="sdk,direct",
                        help="the gateways' --call-path values to measure, in this order (default: sdk,direct)")
    parser.add_argument("--gateways", default="python,typescript",
                        help="the gateways to measure, in this order (default: python,typescript)")
    args = parser.parse_args()
    call_paths = [p for p in args.call_paths.split(",") if p]
    if not call_paths or any(p not in ("sdk", "direct") for p in call_paths):
        parser.error("--call-paths lists sdk and/or direct")
    kinds = [GatewayKind(g) for g in args.gateways.split(",") if g]
    if not kinds or any(k.name not in ("python", "typescript") for k in kinds):
        parser.error("--gateways lists python and/or typescript")
    for needed in (NODE22, EVERYTHING, capgate_bin()):
        if not needed.exists():
            sys.exit(f"bench: {needed} is missing (gateways/bench/run.sh installs and builds what it needs)")

    with tempfile.TemporaryDirectory(prefix="capgate-bench-") as tmp:
        directory = Path(tmp)
        processes: list[Process] = []
        oidc = OidcProvider(directory)
        try:
            port = free_port()
            upstream = Process("server-everything", [str(NODE22), str(EVERYTHING), "streamableHttp"],
                               env={"PATH": os.environ.get("PATH", ""), "PORT": str(port)},
                               log=directory / "everything.log")
            processes.append(upstream)
            upstream.wait_for(lambda line: "listening" in line)
            upstream_url = f"http://127.0.0.1:{port}/mcp"
            (directory / "policy.yaml").write_text(yaml.safe_dump(policy(upstream_url, oidc.discovery_url)))
            (directory / "catalog.yaml").write_text(yaml.safe_dump({"version": 1, "tools": [
                {"upstream": "everything", "name": "echo", "description": "Echoes back the input string"}]}))
            gateway_token = "bench-gateway-token-" + os.urandom(8).hex()
            (directory / "gateway.token").write_text(gateway_token)
            (directory / "admin.token").write_text("bench-admin-token-" + os.urandom(8).hex())
            env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
                   "BENCH_UPSTREAM_SECRET": "bench-upstream-secret"}
            capgate = start_capgate(directory, directory / "policy.yaml", directory / "catalog.yaml", env=env,
                                    gateway_token_file=directory / "gateway.token",
                                    admin_token_file=directory / "admin.token", oidc_ca=oidc.ca_file)
            processes.append(capgate.process)
            caller = oidc.mint("bench-caller", {"department": "bench"}, lifetime=3600)
            world = World(directory, capgate.url, directory / "gateway.token", gateway_token, caller, upstream_url, env,
                          {"upstream": upstream.proc.pid, "capgate": capgate.process.proc.pid})

            results: list[Timings] = [
                anyio.run(mcp_calls, upstream_url, "echo", None, args.warmup, args.calls,
                          {"upstream": upstream.proc.pid}, "direct"),
                anyio.run(decide_calls, capgate.url, gateway_token, caller, args.warmup, args.calls,
                          {"capgate": capgate.process.proc.pid}, True),
                anyio.run(decide_calls, capgate.url, gateway_token, caller, args.warmup, args.calls,
                          {"capgate": capgate.process.proc.pid}, False),
            ]
            instructions: dict[str, float] = {}
            # Each gateway with each call path, one after the other in the same run: the SDK path
            # (both MCP SDK stacks per call) is the baseline the direct path is compared with.
            for kind in kinds:
                for call_path in call_paths:
                    gateway = start_http_gateway(kind, capgate.url, world.gateway_token_file, env,
                                                 directory / f"{kind.name}-{call_path}-gateway.stderr",
                                                 ["--call-path", call_path])
                    processes.append(gateway.process)
                    watch = {"gateway": gateway.process.proc.pid, **world.pids}
                    results.append(anyio.run(mcp_calls, gateway.url, TOOL, caller, args.warmup, args.calls, watch,
                                             f"through the {kind.name} gateway, {call_path}"))
                    gateway.process.stop()
                    if args.instructions:
                        short, long = 50, 250
                        counts = [gateway_under_valgrind(kind, call_path, world,
                                                         directory / f"{kind.name}-{call_path}-{n}.callgrind", n)
                                  for n in (short, long)]
                        instructions[f"{kind.name}, {call_path}"] = (counts[1] - counts[0]) / (long - short)
        finally:
            for process in reversed(processes):
                process.stop()
            oidc._server.close()  # noqa: SLF001 - the fixture's own server

    report(results, instructions, args)


def report(results: list[Timings], instructions: dict[str, float], args: argparse.Namespace) -> None:
    direct, decide, _bare, *gateways = results
    print(f"\n{args.calls} sequential calls after {args.warmup} warm-up calls; capgate: {capgate_bin()}")
    print(f"{'path':42} {'p50 ms':>8} {'p99 ms':>8} {'×direct':>8}   CPU ms per call")
    for t in results:
        cpu = ", ".join(f"{k} {v * 1000:.2f}" for k, v in t.cpu.items())
        print(f"{t.name:42} {t.p50:8.2f} {t.p99:8.2f} {t.p50 / direct.p50:8.2f}   {cpu}")
    figures: dict[str, Any] = {"calls": args.calls, "warmup": args.warmup,
                               "paths": {t.name: {"p50_ms": t.p50, "p99_ms": t.p99, "cpu_ms": {k: v * 1000 for k, v in t.cpu.items()}}
                                         for t in results}}
    print()
    for t in gateways:
        added = t.p50 - direct.p50
        beyond = added - decide.p50
        name = t.name.removeprefix("through the ")
        verdict = "met" if beyond <= GOAL_MS else "not met"
        print(f"{name}: adds {added:.2f} ms p50 over the direct call; Decide alone is {decide.p50:.2f} ms "
              f"({decide.p50 / added:.0%} of what is added, {decide.p50 / t.p50:.0%} of the call); "
              f"the rest, {beyond:.2f} ms, is the gateway's own (goal ≤ {GOAL_MS:g} ms: {verdict})")
        figures["paths"][t.name].update(added_ms=added, beyond_decide_ms=beyond)
    by_name = {t.name: t for t in gateways}
    for kind in ("python", "typescript"):
        sdk, direct_path = (by_name.get(f"through the {kind} gateway, {p}") for p in ("sdk", "direct"))
        if sdk is not None and direct_path is not None:
            print(f"{kind} gateway, direct ÷ sdk path: p50 {direct_path.p50 / sdk.p50:.2f}, gateway CPU per call "
                  f"{direct_path.cpu['gateway'] / sdk.cpu['gateway']:.2f}")
    for name, count in instructions.items():
        print(f"{name} path: {count:,.0f} instructions per call in the gateway process (callgrind, marginal)")
    figures["instructions_per_call"] = instructions
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
