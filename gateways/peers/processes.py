"""Children of the suite (capgate, Envoy, the upstreams), each waited for on a line it prints.

INVARIANT: a child never outlives the suite. Each leads a process group of its own, `stop`
kills the whole group (what Node or uvicorn started with it too), and a child that does not
say it is ready in time, or dies first, is stopped before the error is raised.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A debug capgate on a busy 2-core box is the slowest to start.
READY_TIMEOUT = float(os.environ.get("CAPGATE_PEERS_START_TIMEOUT") or 60.0)


def free_port() -> int:
    """A loopback port nobody listens on now (for the one child that cannot take port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Child:
    """A process whose output (stdout and stderr, interleaved) is kept in a log file and in memory."""

    def __init__(self, name: str, args: list[str], *, log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.log = log
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self._sink = log.open("w", encoding="utf-8")
        self.popen = subprocess.Popen(
            args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, encoding="utf-8", errors="replace", start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name} output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._changed:
                self._lines.append(line.rstrip("\n"))
                self._sink.write(line)
                self._sink.flush()
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = READY_TIMEOUT) -> re.Match[str]:
        """The first output line that matches `pattern`, for a child getting ready: one that
        does not say it in time, or exits first, is stopped before the error is raised."""
        regex = re.compile(pattern)
        try:
            return self.wait_for_line(regex.search, timeout)
        except RuntimeError:
            self.stop()
            raise

    def wait_for_line(self, predicate: Callable[[str], Any], timeout: float) -> Any:
        """The first truthy `predicate(line)` over the output so far and to come, within `timeout`."""
        deadline = time.monotonic() + timeout
        checked = 0
        with self._changed:
            while True:
                for line in self._lines[checked:]:
                    if found := predicate(line):
                        return found
                checked = len(self._lines)
                reader_done = not self._reader.is_alive()
                left = deadline - time.monotonic()
                if reader_done or left <= 0:
                    break
                self._changed.wait(min(left, 0.5))
            tail = "\n".join(self._lines[-30:])
        why = f"exited ({self.popen.poll()})" if reader_done else f"printed no line we wait for in {timeout}s"
        raise RuntimeError(f"{self.name} {why}; its last lines ({self.log}):\n{tail}")

    def output(self) -> str:
        with self._changed:
            return "\n".join(self._lines)

    def stop(self) -> None:
        """SIGTERM to the group, up to 10 s to go, then SIGKILL to whatever is left of it."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait(5)
        self._reader.join(5)
        self._sink.close()
