"""CapgateClient: capgate's DecisionService and PolicyService over grpc.aio.

One channel per client; the gateway token goes in `authorization: Bearer` metadata on
every call; every unary call has a deadline (the client's default, or the call's own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import grpc
import grpc.aio

from capgate_client import convert
from capgate_client import results as r
from capgate_client._proto import decisions, decisions_grpc, policies, policies_grpc
from capgate_client.errors import decode_rpc_error


def _target(url: str) -> tuple[str, bool]:
    """`http://host:port` → (`host:port`, plaintext); `https://…` → (…, TLS)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"capgate's address must be http://HOST:PORT or https://HOST:PORT, not `{url}`")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", parts.scheme == "https"


class CapgateClient:
    """A typed client; use `async with CapgateClient(url, token=…) as capgate:`."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | Path | None = None,
        timeout: float = 2.0,
    ) -> None:
        target, tls = _target(url)
        if tls:
            roots = Path(ca_file).read_bytes() if ca_file is not None else None
            self._channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))
        else:
            if ca_file is not None:
                raise ValueError("a CA file needs an https:// capgate address")
            self._channel = grpc.aio.insecure_channel(target)
        # Built once as grpc's own type: a tuple would be converted to it again on every call.
        self._metadata = grpc.aio.Metadata(("authorization", f"Bearer {token}")) if token else grpc.aio.Metadata()
        self._timeout = timeout
        self._decisions = decisions_grpc.DecisionServiceStub(self._channel)
        self._policies = policies_grpc.PolicyServiceStub(self._channel)

    async def __aenter__(self) -> CapgateClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(self, method, request, timeout: float | None):  # noqa: ANN001, ANN202 - a stub's callable
        try:
            return await method(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as error:
            raise decode_rpc_error(error) from None

    # ── DecisionService ──────────────────────────────────────────────────────

    async def decide(
        self,
        credential: r.Credential,
        *,
        tool: str | None = None,
        capability: str | None = None,
        request_id: str = "",
        arguments_json: str | None = None,
        timeout: float | None = None,
    ) -> r.DecideResult:
        """May this caller call `tool` (or `capability`) now? A deny is a result, not an error.

        `arguments_json` is the call's arguments object as JSON text (at most 64 KiB, which capgate
        refuses INVALID_ARGUMENT beyond), what a grant's conditions read; `None` sends nothing, and
        a grant whose conditions read an argument then denies with `arguments_missing`."""
        request = convert.decide_request(credential, tool, capability, request_id, arguments_json)
        response = await self._unary(self._decisions.Decide, request, timeout)
        return convert.decide_result(response, asked_for_tool=tool is not None)

    async def list_visible(
        self, credential: r.Credential, *, request_id: str = "", timeout: float | None = None
    ) -> r.ListVisibleResult:
        """Which tools may this caller see?"""
        request = convert.list_visible_request(credential, request_id)
        return convert.list_visible_result(await self._unary(self._decisions.ListVisible, request, timeout))

    async def note_decision(
        self, decision_id: str, kind: r.NoteKind, detail: str, *, timeout: float | None = None
    ) -> None:
        """Append what happened after an allow to its audit trail. Never put a secret in `detail`."""
        request = decisions.NoteDecisionRequest(decision_id=decision_id, kind=convert.NOTE_KINDS[kind], detail=detail)
        await self._unary(self._decisions.NoteDecision, request, timeout)

    async def watch_policy(self) -> AsyncIterator[r.PolicyRevision]:
        """The active policy version now, then one per change, until the server ends the stream.

        No deadline: the stream is meant to stay open. Errors are raised typed, as for
        the unary calls; the caller reconnects.
        """
        call = self._decisions.WatchPolicy(decisions.WatchPolicyRequest(), metadata=self._metadata)
        try:
            async for message in call:
                yield convert.policy_revision(message)
        except grpc.RpcError as error:
            raise decode_rpc_error(error) from None
        finally:
            call.cancel()

    # ── PolicyService (admin token) ──────────────────────────────────────────

    async def publish_policy(
        self,
        artifact: str,
        *,
        catalog: str | None = None,
        expected_active_revision: int | None = None,
        dry_run: bool = False,
        comment: str = "",
        timeout: float | None = None,
    ) -> r.PublishResult:
        request = policies.PublishPolicyRequest(artifact=artifact, dry_run=dry_run, comment=comment)
        if catalog is not None:
            request.catalog = catalog
        if expected_active_revision is not None:
            request.expected_active_revision = expected_active_revision
        return convert.publish_result(await self._unary(self._policies.PublishPolicy, request, timeout or 30.0))

    async def get_active_policy(self, *, timeout: float | None = None) -> r.ActivePolicy:
        request = policies.GetActivePolicyRequest()
        return convert.active_policy(await self._unary(self._policies.GetActivePolicy, request, timeout))

    async def list_policy_versions(self, *, limit: int = 0, timeout: float | None = None) -> tuple[r.PolicyVersion, ...]:
        request = policies.ListPolicyVersionsRequest(limit=limit)
        response = await self._unary(self._policies.ListPolicyVersions, request, timeout)
        return tuple(convert.policy_version(v) for v in response.versions)

    async def activate_policy(
        self, revision: int, *, expected_active_revision: int | None = None, timeout: float | None = None
    ) -> r.PolicyVersion:
        request = policies.ActivatePolicyRequest(revision=revision)
        if expected_active_revision is not None:
            request.expected_active_revision = expected_active_revision
        response = await self._unary(self._policies.ActivatePolicy, request, timeout or 30.0)
        return convert.policy_version(response.version)
