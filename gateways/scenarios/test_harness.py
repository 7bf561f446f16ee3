"""The runner's own promise: a child that does not start in time is stopped, with what it started."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from harness import PYTHON, Process

# A child that starts a grandchild, says so, and never says it is ready.
SLOW_START = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print(f"grandchild {grandchild.pid}", file=sys.stderr, flush=True)
    time.sleep(300)
""")


def alive(pid: int, grace: float = 5.0) -> bool:
    """Still running after `grace` seconds (a zombie nobody reaped is not running; a SIGKILL
    takes effect when the process is next scheduled, not when kill returns)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def test_a_start_that_times_out_leaves_no_process(tmp_path: Path) -> None:
    process = Process("slow", [PYTHON, "-c", SLOW_START], env={"PATH": os.environ.get("PATH", "")},
                      log=tmp_path / "slow.log")
    grandchild = int(process._wait_for(lambda line: line.removeprefix("grandchild ") if "grandchild" in line else None,
                                       timeout=30))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        process.wait_for(lambda line: "ready" in line, timeout=1)
    assert time.monotonic() - started < 15
    assert not alive(process.proc.pid), "the child outlived its failed start"
    assert not alive(grandchild), "what the child started outlived its failed start"
