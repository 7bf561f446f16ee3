"""JSON lines on stderr: the gateway's only log format.

Every library logger (the MCP SDK, uvicorn, grpc) goes through the same formatter, so
stderr holds nothing but JSON objects. INVARIANT: no secret, token, API key or
resolved credential is ever passed to a log call; callers log references and hashes.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_LOGGER = logging.getLogger("capgate_gateway")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(line, default=str)


def configure(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    _LOGGER.setLevel(level)


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """One log line `{"event": name, ...fields}`."""
    _LOGGER.log(level, name, extra={"fields": {"event": name, **fields}})


def emit_raw(line: dict[str, Any]) -> None:
    """A line that must appear whatever the log level (e.g. `listening`)."""
    print(json.dumps(line), file=sys.stderr, flush=True)
