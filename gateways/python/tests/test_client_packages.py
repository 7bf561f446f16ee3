"""The two client libraries install as a stranger installs them, and answer a real capgate (issue 29).

* `pip install gateways/python/client` into a fresh venv, from a copy of the client and proto/ in
  which nothing was ever generated: the build hook must make `capgate_client._gen` itself.
* `npm pack` of the TypeScript client, from a copy without `src/gen/` or `dist/` (the `prepack`
  script must build them), then `npm install` of the tarball into an empty folder.

Each installed client then asks a `capgate serve` for a call no grant allows, and must print the
pointer of the refusal under the name `pointer`. Network: the Python package index and the npm
registry (build requirements and dependencies, cached after the first run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Capgate, start_capgate

GATEWAYS = Path(__file__).resolve().parents[2]
REPO = GATEWAYS.parent
KEY = "packages-test-key-0123456789"
GATEWAY_TOKEN = "packages-test-gateway-token"

POLICY = """version: 1
capabilities:
  - id: notes.read
  - id: notes.write
upstreams:
  - id: notes
    transport: { kind: mcp-stdio, command: notes-mcp }
    tools:
      - { name: read, capability: notes.read }
      - { name: write, capability: notes.write }
accounts:
  - id: reader
    secret: { ref: "env://READER_TOKEN" }
principals:
  issuers:
    - id: keys
      kind: static-key
      subject: batch
      secret: { ref: "env://PACKAGES_TEST_KEY" }
grants:
  - to: { issuer: keys }
    capabilities: [notes.read]
    using: reader
"""
CATALOG = """version: 1
tools:
  - { upstream: notes, name: read }
  - { upstream: notes, name: write }
"""


@pytest.fixture(scope="module")
def capgate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capgate]:
    directory = tmp_path_factory.mktemp("packages")
    (directory / "policy.yaml").write_text(POLICY)
    (directory / "catalog.yaml").write_text(CATALOG)
    (directory / "gateway.token").write_text(GATEWAY_TOKEN + "\n")
    (directory / "admin.token").write_text("packages-test-admin-token\n")
    server = start_capgate(
        directory, directory / "policy.yaml", directory / "catalog.yaml",
        env={"PATH": "/usr/bin:/bin", "PACKAGES_TEST_KEY": KEY},
        gateway_token_file=directory / "gateway.token", admin_token_file=directory / "admin.token", oidc_ca=None,
    )
    yield server
    server.process.stop()


def run(args: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def pristine_copy(target: Path, *folders: str, ignore: tuple[str, ...]) -> None:
    """proto/ and `folders` of the repository, at the same relative places, without `ignore`."""
    shutil.copytree(REPO / "proto", target / "proto")
    for folder in folders:
        shutil.copytree(REPO / folder, target / folder, ignore=shutil.ignore_patterns(*ignore))


PYTHON_ASKS = """
import asyncio, sys
from capgate_client import CapgateClient, Credential, Deny

async def main():
    async with CapgateClient(sys.argv[1], token=sys.argv[2]) as capgate:
        answer = await capgate.decide(Credential.api_key(sys.argv[3]), tool="notes__write")
        assert isinstance(answer, Deny), answer
        print(answer.reason.code, answer.reason.pointer)

asyncio.run(main())
"""


def test_pip_installs_the_python_client_with_nothing_generated(tmp_path: Path, capgate: Capgate) -> None:
    pristine_copy(tmp_path / "repo", "gateways/python/client", ignore=("_gen", "__pycache__"))
    client = tmp_path / "repo" / "gateways" / "python" / "client"
    assert not list(client.rglob("*_pb2.py")), "the copy must hold no generated module"
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(client)], tmp_path)
    assert not list(client.rglob("*_pb2.py")), "a wheel build leaves the source tree as it was"

    (tmp_path / "ask.py").write_text(PYTHON_ASKS)
    out = run([str(python), "ask.py", capgate.url, GATEWAY_TOKEN, KEY], tmp_path, timeout=60)
    assert out.split() == ["no_grant_matches", "/grants"]


NODE_ASKS = """
import { createCapgateClient } from "@capgate/client";
const [url, gatewayToken, apiKey] = process.argv.slice(2);
const client = createCapgateClient({ url, gatewayToken });
const answer = await client.decide({ caller: { credential: { apiKey } }, tool: "notes__write" });
if (answer.result.kind !== "deny") throw new Error(JSON.stringify(answer));
console.log(answer.result.reason.code, answer.result.reason.pointer);
client.close();
"""


def test_npm_installs_the_packed_typescript_client_with_nothing_generated(tmp_path: Path, capgate: Capgate) -> None:
    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm and node, "npm and node are on the PATH (scripts/test.sh installs them)"
    workspace = GATEWAYS / "typescript"
    tools = workspace / "node_modules"
    assert (tools / ".bin" / "buf").exists(), f"{tools} lacks the build tools: run `npm ci` in {workspace} first"

    # The workspace's manifest and the client, without what a build makes; the build tools (buf,
    # protoc-gen-es, tsc) are the workspace's, from its lockfile.
    pristine_copy(tmp_path / "repo", "gateways/typescript/client", ignore=("dist", "gen", "node_modules"))
    copy = tmp_path / "repo" / "gateways" / "typescript"
    for name in ("package.json", "package-lock.json", "tsconfig.base.json"):
        shutil.copy(workspace / name, copy / name)
    (copy / "node_modules").symlink_to(tools)
    run([npm, "pack", "--silent", "--pack-destination", str(tmp_path)], copy / "client")
    (tarball,) = tmp_path.glob("capgate-client-*.tgz")
    listed = run(["tar", "tzf", str(tarball)], tmp_path).split()
    assert "package/dist/gen/capgate/v1/decisions_pb.js" in listed and "package/dist/index.d.ts" in listed
    assert not [name for name in listed if ".test." in name], "the tests are not shipped"

    consumer = tmp_path / "consumer"
    consumer.mkdir()
    (consumer / "package.json").write_text(json.dumps({"name": "consumer", "private": True, "type": "module"}))
    run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", str(tarball)], consumer)
    (consumer / "ask.mjs").write_text(NODE_ASKS)
    out = run([node, "ask.mjs", capgate.url, GATEWAY_TOKEN, KEY], consumer, timeout=60)
    assert out.split() == ["no_grant_matches", "/grants"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
