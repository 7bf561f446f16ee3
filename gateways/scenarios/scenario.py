"""Reading cases.yaml and checking one case's answer and audit rows against it."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from harness import SCENARIOS, Caller, load_yaml, render

SUITE = load_yaml(SCENARIOS / "cases.yaml")
ALL_TRANSPORTS = ["http", "http-legacy", "stdio"]


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]

    @property
    def transports(self) -> list[str]:
        return self.spec.get("transports", ALL_TRANSPORTS)


def cases() -> list[Case]:
    return [Case(c["name"], c) for c in SUITE["cases"]]


def mint_caller(world: Any, name: str) -> Caller:
    """The case's caller, with a fresh subject so its audit rows are its own."""
    spec = SUITE["callers"][name]
    if spec["kind"] == "none":
        return Caller("none")
    if spec["kind"] == "api_key":
        value = world.sentinels[spec["sentinel"]] if "sentinel" in spec else spec["literal"]
        world.minted.append(value)
        return Caller("api_key", value, "batch-runner")
    subject = f"{spec['subject']}-{secrets.token_hex(4)}"
    token = world.oidc.mint(
        subject, spec.get("claims"), issuer=spec.get("issuer"),
        foreign_key=spec.get("foreign_key", False), expired=spec.get("expired", False),
    )
    world.minted.append(token)
    return Caller("jwt", token, subject)


def expand(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return render(value, values)
    if isinstance(value, list):
        return [expand(v, values) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, values) for k, v in value.items()}
    return value


def transcript(answer: Any) -> str:
    if isinstance(answer, MCPError):
        return json.dumps({"code": answer.code, "message": answer.message, "data": answer.data}, default=str)
    if hasattr(answer, "model_dump_json"):
        return answer.model_dump_json()
    return repr(answer)


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def check_result(expect: dict[str, Any], answer: Any) -> None:
    if "error" in expect:
        want = expect["error"]
        assert isinstance(answer, MCPError), f"expected a JSON-RPC error {want}, got a result: {transcript(answer)}"
        assert answer.code == want["code"], f"error code {answer.code}, expected {want['code']}: {transcript(answer)}"
        data = answer.data or {}
        for key, value in want.get("data", {}).items():
            assert data.get(key) == value, f"data.{key} = {data.get(key)!r}, expected {value!r}: {transcript(answer)}"
        assert isinstance(data.get("message"), str) and data["message"], f"data.message missing: {transcript(answer)}"
        assert answer.message.startswith(f"denied: {data['code']}: "), f"message shape: {answer.message!r}"
        if "message_prefix" in want:
            assert answer.message.startswith(want["message_prefix"]), answer.message
        if "message_contains" in want:
            assert want["message_contains"] in answer.message, answer.message
        # Refusals made before any decision (or without one) carry no decision_id.
        undecided = ("unauthenticated", "capgate_unavailable", "arguments_too_large")
        if data.get("code") not in undecided or "decision_id" in data:
            assert data.get("decision_id"), f"no decision_id: {transcript(answer)}"
        if want.get("retry_after"):
            assert isinstance(data.get("retry_after_seconds"), int) and data["retry_after_seconds"] > 0, transcript(answer)
            resets_at = datetime.fromisoformat(data["resets_at"].replace("Z", "+00:00"))
            assert resets_at > datetime.now(UTC), transcript(answer)
        return
    assert not isinstance(answer, MCPError), f"expected a result, got error {transcript(answer)}"
    if isinstance(answer, types.ListToolsResult):
        names = [t.name for t in answer.tools]
        for name in expect.get("tools_include", []):
            assert name in names, f"{name} not listed: {names}"
        for name in expect.get("tools_exclude", []):
            assert name not in names, f"{name} listed: {names}"
        if "tools_equal" in expect:
            assert names == expect["tools_equal"], names
        for key in ("schema", "default_schema"):
            if key in expect:
                tool = next(t for t in answer.tools if t.name == expect[key]["tool"])
                assert tool.input_schema == expect[key]["equals"], tool.input_schema
        for name, description in expect.get("descriptions", {}).items():
            tool = next(t for t in answer.tools if t.name == name)
            assert tool.description == description, f"{name}: {tool.description!r} != {description!r}"
        return
    assert not answer.is_error, f"the upstream reported an error: {transcript(answer)}"
    text = text_of(answer)
    if "text" in expect:
        assert text == expect["text"], f"{text!r} != {expect['text']!r}"
    if "text_contains" in expect:
        assert expect["text_contains"] in text, text
    if "text_length" in expect:
        assert len(text) == expect["text_length"], f"{len(text)} characters, expected {expect['text_length']}"


def call_arguments(call: dict[str, Any]) -> dict[str, Any] | None:
    """A case's `call.arguments`, or for `arguments_bytes: N` {"text": "xx…"}, N bytes as compact JSON."""
    if "arguments_bytes" in call:
        filler = call["arguments_bytes"] - len('{"text":""}')
        return {"text": "x" * filler}
    return call.get("arguments")


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of `value` as capgate digests a call's arguments: members sorted by name, no
    whitespace, non-ASCII as UTF-8."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_audit(expect: dict[str, Any], rows: list[dict[str, Any]], caller: Caller, answer: Any) -> None:
    kind = expect.get("kind", "decide")
    candidates = [r for r in rows if r.get("kind") == kind]
    if expect.get("none"):
        # Refused by the gateway itself: capgate was not asked, so nothing names this caller.
        mine = [r for r in candidates if caller.subject and r.get("subject") == caller.subject]
        assert not mine, f"capgate recorded a refused call: {mine}"
        return
    decision_id = (answer.data or {}).get("decision_id") if isinstance(answer, MCPError) else None
    if decision_id:
        candidates = [r for r in candidates if r.get("decision_id") == decision_id]
        assert candidates, f"no audit row with the answer's decision_id {decision_id}"
    elif caller.subject and caller.kind == "jwt" and expect.get("outcome") != "unauthenticated":
        # An unauthenticated row has no subject: nobody was identified.
        candidates = [r for r in candidates if r.get("subject") == caller.subject]
    if "tool" in expect:
        candidates = [r for r in candidates if r.get("tool") == expect["tool"]]
    assert candidates, f"no {kind} audit row for this case among {len(rows)} new rows: {rows[-5:]}"
    row = candidates[-1]
    for key, value in expect.items():
        if key in ("kind", "note"):
            continue
        if isinstance(value, dict) and set(value) == {"of"}:
            value = canonical_digest(value["of"])
        assert row.get(key) == value, f"audit {key} = {row.get(key)!r}, expected {value!r}: {row}"
    assert row.get("gateway") == "scenario-gw", row
    if "note" in expect:
        # NoteDecision's record: the gateway that was given the decision noted what happened.
        notes = row.get("notes") or []
        assert any(n.get("kind") == expect["note"] and n.get("gateway") == "scenario-gw" and n.get("detail")
                   for n in notes), f"no {expect['note']} note on the audit row: {row}"
