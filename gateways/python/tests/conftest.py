"""Unit tests of the client library and the gateway's parts; the scenario fixtures are reused."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scenarios"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
