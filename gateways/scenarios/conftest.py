"""The suite's world: sentinels, fixtures, upstreams, one capgate, and each gateway.

`gateway` is parametrized `python` / `typescript`. Both must run: a TypeScript gateway
that is not built (gateways/typescript/gateway/dist/cli.js missing) fails its cases
rather than skipping them, so the suite cannot pass on one gateway alone.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.servers import OidcProvider, TokenEndpoint, Vault  # noqa: E402
from harness import (  # noqa: E402
    EVERYTHING,
    NODE22,
    PYTHON,
    SCENARIOS,
    TS_CLI,
    Capgate,
    GatewayKind,
    HttpGateway,
    Process,
    FreshDatabase,
    capgate_bin,
    free_port,
    json_event,
    new_secret,
    render,
    start_capgate,
    start_http_gateway,
)

SENTINEL_NAMES = [
    "SECRET_ENV", "SECRET_FILE", "SECRET_VAULT", "SECRET_WEB", "VAULT_TOKEN",
    "OAUTH_CLIENT_SECRET", "OAUTH_ACCESS_TOKEN", "CALLER_API_KEY", "GATEWAY_TOKEN", "ADMIN_TOKEN",
]


@dataclass
class World:
    directory: Path
    sentinels: dict[str, str]
    values: dict[str, str]
    oidc: OidcProvider
    vault: Vault
    tokens: TokenEndpoint
    web: Process
    capgate: Capgate
    policy_text: str
    catalog_text: str
    gateway_token_file: Path
    admin_token_file: Path
    gateway_env: dict[str, str]
    minted: list[str] = field(default_factory=list)
    """Every caller token handed to a gateway: sentinels too."""

    def secret_values(self) -> dict[str, str]:
        return {**self.sentinels, **{f"caller-token-{i}": t for i, t in enumerate(self.minted)}}


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    binary = capgate_bin()
    if not binary.exists():
        pytest.fail(f"no capgate binary at {binary} (set CAPGATE_BIN)")
    directory = tmp_path_factory.mktemp("scenarios")
    server_url = os.environ.get("DATABASE_URL")
    database = FreshDatabase.create(server_url) if server_url else None
    sentinels = {name: new_secret(name.lower()) for name in SENTINEL_NAMES}
    secret_file = directory / "account-secret.txt"
    secret_file.write_text(sentinels["SECRET_FILE"] + "\n")
    gateway_token_file = directory / "gateway.token"
    gateway_token_file.write_text(sentinels["GATEWAY_TOKEN"] + "\n")
    admin_token_file = directory / "admin.token"
    admin_token_file.write_text(sentinels["ADMIN_TOKEN"] + "\n")

    oidc = OidcProvider(directory)
    vault = Vault(sentinels["VAULT_TOKEN"], {"secret": {"scenario/probe": {"token": sentinels["SECRET_VAULT"]}}})
    tokens = TokenEndpoint("scenario-client", sentinels["OAUTH_CLIENT_SECRET"], sentinels["OAUTH_ACCESS_TOKEN"])
    base_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    web = Process("http upstream", [PYTHON, str(SCENARIOS / "upstreams" / "http_upstream.py")], env=base_env,
                  log=directory / "http-upstream.log", watch_stdout=True)
    web_url = web.wait_for(lambda line: (json_event(line) or {}).get("url"))
    # An upstream that accepts connections and never answers (the kernel completes the handshake).
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(64)

    values = {
        **sentinels,
        "PYTHON": PYTHON,
        "SCENARIOS": str(SCENARIOS),
        "FILE_SECRET": str(secret_file),
        "TOKEN_URL": tokens.url,
        "WEB_URL": web_url,
        "DOWN_URL": f"http://127.0.0.1:{free_port()}/mcp",
        "HANG_URL": f"http://127.0.0.1:{black_hole.getsockname()[1]}/mcp",
        "NODE22": str(NODE22),
        "EVERYTHING": str(EVERYTHING),
        "OIDC_DISCOVERY": oidc.discovery_url,
    }
    policy_text = render((SCENARIOS / "policy.yaml").read_text(), values)
    catalog_text = (SCENARIOS / "catalog.yaml").read_text()
    (directory / "policy.yaml").write_text(policy_text)
    (directory / "catalog.yaml").write_text(catalog_text)
    capgate_env = {**base_env, "SCENARIO_CALLER_API_KEY": sentinels["CALLER_API_KEY"]}
    capgate = start_capgate(
        directory, directory / "policy.yaml", directory / "catalog.yaml", env=capgate_env,
        gateway_token_file=gateway_token_file, admin_token_file=admin_token_file, oidc_ca=oidc.ca_file,
        database_url=database.url if database else None,
    )
    gateway_env = {
        **base_env,
        "SCENARIO_SECRET_ENV": sentinels["SECRET_ENV"],
        "SCENARIO_SECRET_WEB": sentinels["SECRET_WEB"],
        "SCENARIO_OAUTH_CLIENT_SECRET": sentinels["OAUTH_CLIENT_SECRET"],
        "VAULT_ADDR": vault.url,
        "VAULT_TOKEN": sentinels["VAULT_TOKEN"],
    }
    world = World(directory, sentinels, values, oidc, vault, tokens, web, capgate, policy_text, catalog_text,
                  gateway_token_file, admin_token_file, gateway_env)
    yield world
    capgate.process.stop()
    web.stop()
    black_hole.close()
    for server in (oidc, vault, tokens):
        server.close()
    if database:
        database.drop()


GATEWAY_KINDS = ["python", "typescript"]


@pytest.fixture(scope="session", params=GATEWAY_KINDS)
def gateway_kind(request: pytest.FixtureRequest) -> GatewayKind:
    if request.param == "typescript" and not TS_CLI.exists():
        pytest.fail(
            f"the TypeScript gateway is not built ({TS_CLI} is missing): "
            "run gateways/typescript/run-tests.sh, as gateways/run-tests.sh does"
        )
    return GatewayKind(request.param)


@dataclass
class GatewayUnderTest:
    kind: GatewayKind
    http: HttpGateway
    world: World
    transcripts: list[str] = field(default_factory=list)
    """Every MCP answer a client got (results and errors), for the sentinel check."""
    stdio_logs: list[Path] = field(default_factory=list)
    """Log files of stdio runs and of short-lived processes, for the sentinel check too."""

    def stdio_log(self, name: str) -> Path:
        path = self.world.directory / f"{self.kind.name}-stdio-{len(self.stdio_logs)}-{name}.stderr"
        self.stdio_logs.append(path)
        return path


@pytest.fixture(scope="session")
def gateway(world: World, gateway_kind: GatewayKind) -> Iterator[GatewayUnderTest]:
    http = start_http_gateway(
        gateway_kind, world.capgate.url, world.gateway_token_file, world.gateway_env,
        world.directory / f"{gateway_kind.name}-gateway.stderr",
    )
    yield GatewayUnderTest(gateway_kind, http, world)
    http.process.stop()
