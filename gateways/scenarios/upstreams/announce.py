"""How the scenario suite's HTTP upstreams start: bind 127.0.0.1 on a free port, then print
`{"event": "listening", "url": "http://127.0.0.1:PORT/mcp"}` on stdout once uvicorn accepts
(the harness waits for that line). Imported by the upstream scripts, which run from this folder."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import uvicorn


class _Announcing(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets=None):  # noqa: ANN001, ANN201 - uvicorn's signature
        await super().startup(sockets)
        if self.started:
            print(json.dumps({"event": "listening", "url": self._url}), flush=True)


def serve(app_for: Callable[[], Any], *, lifespan: str) -> None:
    """Serve the app `app_for()` builds (after the port is known) until stopped."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    config = uvicorn.Config(app_for(), log_level="warning", access_log=False, lifespan=lifespan)
    _Announcing(config, url).run(sockets=[sock])
