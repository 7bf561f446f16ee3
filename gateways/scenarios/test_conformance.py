"""The official MCP conformance suite against each gateway fronting a public server.

`@modelcontextprotocol/conformance` (Node 22, from gateways/conformance/package-lock.json) runs
its server scenarios against `@modelcontextprotocol/server-everything` as a gateway's upstream:
its tools through capgate's policy, its resources, prompts, completions and logging through the
gateway's `--relay`. The suite's client sends no credential, so a proxy adds the caller's bearer
token (fixtures/bearer_proxy.py) and passes `Host` and `Origin` through untouched.

gateways/conformance/expected-failures.yaml says which scenarios fail and why; the suite itself
fails the run on any other failure and on a listed scenario that passes. The same suite runs
against server-everything directly with the entries whose cause is `upstream`, so that "server-
everything fails it on its own" is checked, not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from harness import (
    CONFORMANCE,
    EVERYTHING,
    NODE22,
    PYTHON,
    SCENARIOS,
    Capgate,
    Process,
    free_port,
    json_event,
    start_capgate,
    start_http_gateway,
)

NODE = NODE22
SUITE = CONFORMANCE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
BASELINE = CONFORMANCE / "expected-failures.yaml"
SUITE_TIMEOUT = 300
# It prints the upstream process's environment, where the account's credential is: no caller gets it.
UNMAPPED = {"get-env"}


def _installed() -> None:
    missing = [p for p in (NODE, SUITE, EVERYTHING) if not p.exists()]
    if missing:
        pytest.fail(f"the conformance suite is not installed ({missing[0]} is missing): "
                    "run `npm ci` in gateways/conformance, as gateways/run-tests.sh does")


@dataclass(frozen=True)
class Baseline:
    through_gateway: list[str]
    upstream_alone: list[str]

    @classmethod
    def load(cls) -> Baseline:
        document = yaml.safe_load(BASELINE.read_text(encoding="utf-8"))
        for entry in document["gateway"]:
            assert entry["why"].strip() and entry["cause"] and set(entry["cause"]) <= {"upstream", "policy"}, entry
        upstream = [e["scenario"] for e in document["gateway"] if "upstream" in e["cause"]]
        return cls(
            through_gateway=[e["scenario"] for e in document["gateway"]],
            upstream_alone=upstream + [e["scenario"] for e in document["upstream_only"]],
        )

    @staticmethod
    def write(path: Path, scenarios: list[str]) -> Path:
        """The suite's own baseline format."""
        path.write_text(yaml.safe_dump({"server": scenarios}), encoding="utf-8")
        return path


@dataclass
class Outcome:
    returncode: int
    passed: list[str]
    failed: list[str]
    output: str

    def summary(self) -> str:
        return f"{len(self.passed)} scenarios passed, {len(self.failed)} failed: {sorted(self.failed)}"


def run_suite(url: str, baseline: Path, out: Path) -> Outcome:
    """The suite's server scenarios against `url`; which passed and failed, read from its results."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(NODE), str(SUITE), "server", "--url", url, "--expected-failures", str(baseline), "-o", str(out)],
        capture_output=True, text=True, timeout=SUITE_TIMEOUT, stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")},
    )
    passed: list[str] = []
    failed: list[str] = []
    for checks in sorted(out.glob("server-*/checks.json")):
        scenario = checks.parent.name.removeprefix("server-").rsplit("-", 6)[0]
        statuses = {c["status"] for c in json.loads(checks.read_text())}
        (failed if "FAILURE" in statuses else passed).append(scenario)
    print(f"conformance against {url}: {len(passed)} passed, {len(failed)} failed "
          f"in {time.monotonic() - started:.1f}s")
    return Outcome(proc.returncode, passed, failed, proc.stdout[-6000:] + proc.stderr[-3000:])


# ── server-everything as an upstream ────────────────────────────────────────


def everything_stdio() -> dict[str, Any]:
    return {"kind": "mcp-stdio", "command": str(NODE), "args": [str(EVERYTHING), "stdio"]}


@pytest.fixture(scope="module")
def everything_tools() -> list[dict[str, Any]]:
    """server-everything's tools as its own listing gives them: the catalog an operator would write."""
    _installed()

    async def listing() -> list[dict[str, Any]]:
        params = StdioServerParameters(command=str(NODE), args=[str(EVERYTHING), "stdio"])
        with open(os.devnull, "w") as quiet:
            async with Client(stdio_client(params, errlog=quiet), cache=None) as client:
                tools = (await client.list_tools()).tools
        return [{"name": t.name, "description": t.description or "", "inputSchema": t.input_schema} for t in tools]

    return anyio.run(listing)


@dataclass
class Fronted:
    capgate: Capgate
    relay_file: Path
    caller_token: Path
    subject: str


@pytest.fixture(scope="module")
def fronted(world, everything_tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronted]:  # noqa: ANN001
    """A capgate whose policy maps server-everything's tools for support staff, and the relay file."""
    directory = tmp_path_factory.mktemp("conformance")
    mapped = [t for t in everything_tools if t["name"] not in UNMAPPED]
    policy = {
        "version": 1,
        "capabilities": [{"id": "everything.use"}],
        "upstreams": [{"id": "everything", "transport": everything_stdio(),
                       "tools": [{"name": t["name"], "capability": "everything.use"} for t in mapped]}],
        "accounts": [{"id": "acct-everything", "secret": {"ref": "env://SCENARIO_SECRET_ENV"}}],
        "principals": {"issuers": [{"id": "idp", "kind": "oidc", "discovery": world.oidc.discovery_url,
                                    "audience": "capgate-scenarios", "attributes": {"dept": "claim:department"}}]},
        "grants": [{"to": {"issuer": "idp", "attributes": {"dept": "support"}},
                    "capabilities": ["everything.use"], "using": "acct-everything"}],
    }
    catalog = {"version": 1, "tools": [{"upstream": "everything", **t} for t in mapped]}
    (directory / "policy.yaml").write_text(yaml.safe_dump(policy))
    (directory / "catalog.yaml").write_text(yaml.safe_dump(catalog))
    relay_file = directory / "relay.json"
    relay_file.write_text(json.dumps({"upstreams": [
        {"id": "everything", "transport": everything_stdio(),
         "relay": ["resources", "prompts", "completions", "logging"]},
    ]}))
    subject = "conformance-ana"
    caller_token = directory / "caller.token"
    token = world.oidc.mint(subject, {"department": "support"})
    world.minted.append(token)  # the sentinel check looks for it too
    caller_token.write_text(token)
    capgate = start_capgate(
        directory, directory / "policy.yaml", directory / "catalog.yaml", env=world.gateway_env,
        gateway_token_file=world.gateway_token_file, admin_token_file=world.admin_token_file,
        oidc_ca=world.oidc.ca_file, name="capgate-conformance",
    )
    yield Fronted(capgate, relay_file, caller_token, subject)
    capgate.process.stop()


def test_server_everything_alone_fails_what_the_baseline_says(tmp_path: Path) -> None:
    """Every `upstream` cause in the baseline is server-everything's own failure, on this version."""
    _installed()
    port = free_port()
    server = Process("server-everything", [str(NODE), str(EVERYTHING), "streamableHttp"],
                     env={"PATH": os.environ.get("PATH", ""), "PORT": str(port)}, log=tmp_path / "everything.log")
    try:
        server.wait_for(lambda line: "listening" in line)
        baseline = Baseline.write(tmp_path / "baseline.yml", Baseline.load().upstream_alone)
        outcome = run_suite(f"http://127.0.0.1:{port}/mcp", baseline, tmp_path / "results")
    finally:
        server.stop()
    assert outcome.returncode == 0, f"{outcome.summary()}\n{outcome.output}"


def test_conformance_through_the_gateway(gateway, fronted: Fronted, tmp_path: Path) -> None:  # noqa: ANN001
    """The suite passes through the gateway but for the baseline, and every relayed request is attributed."""
    world = gateway.world
    log = tmp_path / "gateway.stderr"
    gateway.stdio_logs.append(log)
    http = start_http_gateway(
        gateway.kind, fronted.capgate.url, world.gateway_token_file, world.gateway_env, log,
        extra=["--relay", str(fronted.relay_file)],
    )
    origin = http.url.removesuffix("/mcp")
    proxy = Process("bearer proxy", [PYTHON, str(SCENARIOS / "fixtures" / "bearer_proxy.py"), "--target", origin,
                                     "--token-file", str(fronted.caller_token)],
                    env={"PATH": os.environ.get("PATH", "")}, log=tmp_path / "proxy.stderr", watch_stdout=True)
    try:
        url = proxy.wait_for(lambda line: (json_event(line) or {}).get("url"))
        baseline = Baseline.write(tmp_path / "baseline.yml", Baseline.load().through_gateway)
        outcome = run_suite(url, baseline, tmp_path / "results")
    finally:
        proxy.stop()
        http.process.stop()
    print(f"{gateway.kind.name}: {outcome.summary()}")
    assert outcome.returncode == 0, f"{outcome.summary()}\n{outcome.output}"

    # Attribution: every relayed request's log line names capgate's listing record, and that
    # record names the caller.
    relayed = [e for line in http.process.lines if (e := json_event(line)) and e.get("event") == "relayed"]
    methods = {e["method"] for e in relayed}
    assert {"resources/list", "resources/subscribe", "prompts/list", "logging/setLevel"} <= methods, methods
    records = {r["decision_id"]: r for r in fronted.capgate.audit()}
    for event in relayed:
        record = records.get(event.get("listing_id", ""))
        assert record is not None, f"no audit record for {event}"
        assert record["kind"] == "list" and record["subject"] == fronted.subject, (event, record)
