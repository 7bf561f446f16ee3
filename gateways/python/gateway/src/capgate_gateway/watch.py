"""Following capgate's policy for the gateway's whole life (DecisionService.WatchPolicy).

The first revision seen is where things stand; each later one (also the first after a
reconnect, when it differs) makes every open MCP session hear
`notifications/tools/list_changed`. The stream is re-opened with backoff when it ends or
fails; an UNIMPLEMENTED capgate is logged once and retried every few seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
from capgate_client import CapgateClient, CapgateError, PolicyRevision, UnimplementedError

from capgate_gateway import logs

UNIMPLEMENTED_RETRY_SECONDS = 3.0
MAX_BACKOFF_SECONDS = 10.0


async def follow_policy(capgate: CapgateClient, on_change: Callable[[PolicyRevision], Awaitable[None]]) -> None:
    last: int | None = None
    backoff = 0.25
    said_unimplemented = False
    while True:
        try:
            async for revision in capgate.watch_policy():
                backoff = 0.25
                if last is not None and revision.policy_revision != last:
                    logs.event("policy_changed", policy_revision=revision.policy_revision, previous=last)
                    await on_change(revision)
                elif last is None:
                    logs.event("policy_watched", policy_revision=revision.policy_revision)
                last = revision.policy_revision
            logs.event("policy_watch_ended")
        except UnimplementedError:
            if not said_unimplemented:
                logs.event("policy_watch_unimplemented", logging.WARNING, retry_seconds=UNIMPLEMENTED_RETRY_SECONDS)
                said_unimplemented = True
            await anyio.sleep(UNIMPLEMENTED_RETRY_SECONDS)
            continue
        except CapgateError as error:
            logs.event("policy_watch_failed", logging.WARNING, status=error.status, retry_seconds=backoff)
        await anyio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
