"""The sentinel check: no secret of this run appears where it must not.

Unique sentinels (each account's secret, the Vault token, the OAuth client secret and
minted access token, every caller token and API key, the gateway and admin tokens) are
searched for in the gateway's stderr (HTTP and every stdio run), every MCP answer the
clients got, capgate's log and its audit output. Runs after the other scenarios of the
same gateway (pytest keeps file order within a gateway's group).
"""

from __future__ import annotations

from pathlib import Path

from harness import sha256


def leaks(haystacks: dict[str, str], secrets: dict[str, str]) -> list[str]:
    return [f"{name} in {where}" for where, text in haystacks.items() for name, value in secrets.items() if value in text]


def test_the_check_can_fail() -> None:
    secrets = {"X": "sentinel-x-123"}
    assert leaks({"stderr": "… sentinel-x-123 …"}, secrets) == ["X in stderr"]
    assert leaks({"stderr": sha256("sentinel-x-123")}, secrets) == []


def test_no_sentinel_leaks(gateway) -> None:  # noqa: ANN001
    world = gateway.world
    haystacks = {
        "gateway stderr": gateway.http.process.text(),
        "MCP answers": "\n".join(gateway.transcripts),
        "capgate log": world.capgate.process.text(),
        "capgate audit": world.capgate.audit_text(),
    }
    for path in gateway.stdio_logs:
        if Path(path).exists():
            haystacks[f"stderr {Path(path).name}"] = Path(path).read_text(errors="replace")
    # The check must have had something to look at: answers, logs and audit rows.
    assert len(gateway.transcripts) >= 10, "too few MCP answers were recorded"
    assert haystacks["gateway stderr"] and haystacks["capgate audit"]
    assert len(world.minted) >= 5
    secrets = {k: v for k, v in world.secret_values().items() if len(v) >= 16}
    assert not leaks(haystacks, secrets)
