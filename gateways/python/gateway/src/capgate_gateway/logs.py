"""JSON lines on stderr: the gateway's only log format.

Every library logger (the MCP SDK, uvicorn, grpc) goes through the same formatter, so
stderr holds nothing but JSON objects. INVARIANT: no secret, token, API key or
resolved credential is ever passed to a log call; callers log references and hashes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

_LOGGER = logging.getLogger("capgate_gateway")
_HANDLER: logging.StreamHandler[Any] | None = None
"""The stderr handler `configure` installed: `event` writes its lines to its stream."""


def _head(created: float, level: str, logger: str) -> dict[str, Any]:
    """What every line begins with: its time (UTC, milliseconds), level and logger."""
    ts = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"ts": ts, "level": level.lower(), "logger": logger}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = _head(record.created, record.levelname, record.name)
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(line, default=str)


def configure(level: int = logging.INFO) -> None:
    global _HANDLER  # noqa: PLW0603 - one handler for the process
    _HANDLER = handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    _LOGGER.setLevel(level)


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """One log line `{"event": name, ...fields}`: the line the formatter would write, written to
    the handler's stream at once (flushed, under the handler's lock), without a LogRecord and the
    logging machinery around it — every tools/call logs one, and that was a tenth of the
    gateway's own Python per call."""
    handler = _HANDLER
    if handler is None:
        _LOGGER.log(level, name, extra={"fields": {"event": name, **fields}})
        return
    if not _LOGGER.isEnabledFor(level):
        return
    line = {**_head(time.time(), logging.getLevelName(level), _LOGGER.name), "event": name, **fields}
    text = json.dumps(line, default=str) + "\n"
    with handler.lock:  # type: ignore[union-attr] - a StreamHandler has one
        try:
            handler.stream.write(text)
            handler.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone: logging would not raise into the call either


def emit_raw(line: dict[str, Any]) -> None:
    """A line that must appear whatever the log level (e.g. `listening`)."""
    print(json.dumps(line), file=sys.stderr, flush=True)
