"""Every case of cases.yaml, for every gateway and each of the case's transports."""

from __future__ import annotations

import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from harness import mcp_client
from scenario import Case, call_arguments, cases, check_audit, check_result, expand, mint_caller, transcript

PARAMS = [pytest.param(case, transport, id=f"{case.name}-{transport}") for case in cases() for transport in case.transports]

# What capgate answers for a static key that matches no issuer's key (the key itself
# names no issuer, so no issuer can be said to be unknown).
CAPGATE_FACTS = {"api_key_problem": "credential_invalid"}


@pytest.mark.parametrize(("case", "transport"), PARAMS)
def test_case(gateway, case: Case, transport: str) -> None:  # noqa: ANN001 - a fixture
    world = gateway.world
    spec = case.spec
    caller = mint_caller(world, spec["caller"])
    values = {**world.values, **CAPGATE_FACTS}
    started_ms = int(time.time() * 1000) - 1

    async def drive() -> object:
        with anyio.fail_after(60):
            async with mcp_client(
                transport, gateway=gateway.http, kind=gateway.kind, caller=caller, capgate_url=world.capgate.url,
                token_file=world.gateway_token_file, env=world.gateway_env, errlog=gateway.stdio_log(case.name),
            ) as client:
                for before in spec.get("calls_before", []):
                    result = await client.call_tool(before["tool"], before.get("arguments"))
                    gateway.transcripts.append(transcript(result))
                    assert not result.is_error, transcript(result)
                try:
                    if spec.get("list"):
                        return await client.list_tools()
                    return await client.call_tool(spec["call"]["tool"], call_arguments(spec["call"]))
                except MCPError as error:
                    return error

    answer = anyio.run(drive)
    gateway.transcripts.append(transcript(answer))
    check_result(expand(spec["expect"], values), answer)
    rows = [r for r in world.capgate.audit() if int(r.get("at_ms", r.get("at", 0))) >= started_ms]
    check_audit(expand(spec["audit"], values), rows, caller, answer)
