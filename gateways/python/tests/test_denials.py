"""The deny shape: message, code and data, as gateways/README.md states it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from capgate_client import Deny, NotVisible, Reason, Unauthenticated, UnknownTool
from capgate_gateway import denials

AT = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def test_limit_exhausted_carries_retry_after() -> None:
    answer = Deny("d-1", "sha256:x", 3, AT, Reason("limit_exhausted", "/grants/7", "c", "the ceiling is used up"),
                  resets_at=AT + timedelta(seconds=90, milliseconds=200))
    error = denials.deny(answer, now=AT)
    assert error.code == -32001
    assert error.message == "denied: limit_exhausted: the ceiling is used up"
    assert error.data == {
        "code": "limit_exhausted", "message": "the ceiling is used up", "pointer": "/grants/7",
        "decision_id": "d-1", "retry_after_seconds": 91, "resets_at": "2026-11-30T08:01:30.200000Z",
    }


def test_other_denials_have_no_retry_after() -> None:
    answer = Deny("d-2", "v", 1, AT, Reason("no_grant_matches", "/grants", "c", "no grant"), resets_at=None)
    assert "retry_after_seconds" not in denials.deny(answer).data


def test_unauthenticated_and_unknown_tool() -> None:
    error = denials.unauthenticated(Unauthenticated("d-3", "v", 1, AT, "credential_expired", "expired"))
    assert (error.code, error.data["code"], error.data["problem"]) == (-32001, "unauthenticated", "credential_expired")
    listing = denials.unauthenticated(NotVisible("v", 1, AT, "credential_missing", ""))
    assert "decision_id" not in listing.data and listing.data["message"]
    unknown = denials.unknown_tool(UnknownTool("d-4", "v", 1, AT, "x__y", "no tool `x__y` is exposed"))
    assert (unknown.code, unknown.message) == (-32602, "denied: unknown_tool: no tool `x__y` is exposed")


def test_gateway_side_failures() -> None:
    assert denials.credential_failed("d", "gcp-secrets: no resolver").code == -32002
    assert denials.upstream_failed("d", "down").data == {"code": "upstream_failed", "message": "down", "decision_id": "d"}
    assert denials.capgate_unavailable("x").data == {"code": "capgate_unavailable", "message": "x"}
