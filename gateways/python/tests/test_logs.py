"""`logs.event` writes its line itself (not through a LogRecord): the same JSON line the formatter
writes for a library's log record, at once, and only at the levels the gateway's logger lets through."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
from capgate_gateway import logs


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    logs.configure()
    yield captured
    root.handlers[:] = handlers
    root.setLevel(level)
    monkeypatch.setattr(logs, "_HANDLER", None)


def test_an_event_is_the_formatters_line_written_at_once(stderr: io.StringIO) -> None:
    logs.event("allowed", tool="hs__echo", account="acct", decision_id="0193-d", missing=None, odd={1, 2} and 3)
    logs.event("upstream_failed", logging.WARNING, reason="down")
    logs.event("too detailed", logging.DEBUG, reason="filtered out")
    written = [json.loads(line) for line in stderr.getvalue().splitlines()]

    fields = {"event": "allowed", "tool": "hs__echo", "account": "acct", "decision_id": "0193-d", "missing": None, "odd": 3}
    record = logging.getLogger("capgate_gateway").makeRecord(
        "capgate_gateway", logging.INFO, __file__, 0, "allowed", (), None, extra={"fields": fields})
    formatted = json.loads(logs._JsonFormatter().format(record))  # noqa: SLF001 - the library records' format
    assert len(written) == 2
    assert list(written[0]) == list(formatted) == ["ts", "level", "logger", *fields]
    assert {k: v for k, v in written[0].items() if k != "ts"} == {k: v for k, v in formatted.items() if k != "ts"}
    assert written[0]["ts"].endswith("Z") and len(written[0]["ts"]) == len(formatted["ts"])
    assert written[1] == {"ts": written[1]["ts"], "level": "warning", "logger": "capgate_gateway",
                          "event": "upstream_failed", "reason": "down"}
