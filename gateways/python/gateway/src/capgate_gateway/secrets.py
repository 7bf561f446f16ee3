"""Resolving an account's `secret_ref` into the credential handed to the upstream.

Schemes (gateways/README.md, "Secret references"): `env://`, `file://`, `vault://` (KV v2),
`oauth+https://` (client credentials, cached until shortly before expiry). Anything else
fails with "no resolver for scheme `x`". INVARIANT: a CredentialError's message names the
scheme and the reason, never a secret value; no value is logged.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from urllib.parse import unquote

import anyio
import httpx


class CredentialError(Exception):
    """The secret reference could not be resolved; `str()` is safe to show and to store."""

    def __init__(self, scheme: str, reason: str) -> None:
        super().__init__(f"{scheme}: {reason}")
        self.scheme = scheme
        self.reason = reason


def scheme_of(ref: str) -> str:
    head, sep, _ = ref.partition("://")
    return head if sep else ""


@dataclass
class _CachedToken:
    value: str
    expires_at: float


class SecretResolver:
    """Resolves references; owns the HTTP client for Vault and token endpoints."""

    # A token is refreshed this long before its `expires_in` runs out (or at 90% of
    # its life, for very short ones), so it never expires between here and the upstream.
    REFRESH_MARGIN_SECONDS = 30.0

    def __init__(self, env: Mapping[str, str] | None = None, *, http_timeout: float = 5.0) -> None:
        self._env = env if env is not None else os.environ
        self._http = httpx.AsyncClient(timeout=http_timeout, follow_redirects=False, trust_env=False)
        self._tokens: dict[str, _CachedToken] = {}
        self._locks: dict[str, anyio.Lock] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def resolve(self, ref: str) -> str:
        scheme = scheme_of(ref)
        if scheme == "env":
            return self._env_value(ref.removeprefix("env://"))
        if scheme == "file":
            return self._file_value(ref.removeprefix("file://"))
        if scheme == "vault":
            return await self._vault_value(ref.removeprefix("vault://"))
        if scheme in ("oauth+https", "oauth+http"):
            return await self._oauth_token(ref)
        raise CredentialError(scheme or "(none)", f"no resolver for scheme `{scheme}`")

    # ── env:// and file:// ───────────────────────────────────────────────────

    def _env_value(self, name: str) -> str:
        if not name:
            raise CredentialError("env", "the reference names no variable")
        value = self._env.get(name, "")
        if not value:
            raise CredentialError("env", f"the environment variable `{name}` is not set or empty")
        return value

    def _file_value(self, path: str) -> str:
        if not path.startswith("/"):
            raise CredentialError("file", "the path must be absolute (file:///abs/path)")
        try:
            value = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CredentialError("file", f"no file at `{path}`") from None
        except (OSError, UnicodeDecodeError) as error:
            raise CredentialError("file", f"cannot read `{path}` ({type(error).__name__})") from None
        value = value.rstrip("\r\n")
        if not value:
            raise CredentialError("file", f"the file `{path}` is empty")
        return value

    # ── vault:// (HashiCorp Vault KV v2) ─────────────────────────────────────

    async def _vault_value(self, rest: str) -> str:
        location, _, field = rest.partition("#")
        field = field or "value"
        mount, _, path = location.partition("/")
        if not mount or not path:
            raise CredentialError("vault", "the reference must be vault://<mount>/<path>[#<field>]")
        address = self._env.get("VAULT_ADDR", "")
        token = self._env.get("VAULT_TOKEN", "")
        if not address:
            raise CredentialError("vault", "VAULT_ADDR is not set")
        if not token:
            raise CredentialError("vault", "VAULT_TOKEN is not set")
        url = f"{address.rstrip('/')}/v1/{mount}/data/{path}"
        try:
            response = await self._http.get(url, headers={"X-Vault-Token": token})
        except httpx.HTTPError as error:
            raise CredentialError("vault", f"Vault is unreachable ({type(error).__name__})") from None
        where = f"`{mount}/{path}`"
        if response.status_code == 404:
            raise CredentialError("vault", f"no secret at {where}")
        if response.status_code == 403:
            raise CredentialError("vault", f"permission denied reading {where}")
        if response.status_code != 200:
            raise CredentialError("vault", f"Vault answered HTTP {response.status_code} for {where}")
        try:
            data = response.json()["data"]["data"]
        except (ValueError, KeyError, TypeError):
            raise CredentialError("vault", f"the answer for {where} is not a KV v2 secret") from None
        value = data.get(field) if isinstance(data, dict) else None
        if not isinstance(value, str) or not value:
            raise CredentialError("vault", f"the secret at {where} has no string field `{field}`")
        return value

    # ── oauth+https:// (client credentials) ──────────────────────────────────

    async def _oauth_token(self, ref: str) -> str:
        scheme = scheme_of(ref)
        request = _parse_oauth_ref(ref)
        client_secret = await self._nested_secret(scheme, request.secret_ref)
        # The cache key covers everything that changes the token, the client secret by hash only.
        key = "\0".join((request.token_url, request.client_id, request.scope, sha256(client_secret.encode()).hexdigest()))
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            cached = self._tokens.get(key)
            if cached is not None and time.monotonic() < cached.expires_at:
                return cached.value
            form = {"grant_type": "client_credentials", "client_id": request.client_id, "client_secret": client_secret}
            if request.scope:
                form["scope"] = request.scope
            try:
                response = await self._http.post(request.token_url, data=form, headers={"Accept": "application/json"})
            except httpx.HTTPError as error:
                raise CredentialError(scheme, f"the token endpoint is unreachable ({type(error).__name__})") from None
            if response.status_code != 200:
                raise CredentialError(scheme, f"the token endpoint answered HTTP {response.status_code}")
            try:
                body = response.json()
                token = body["access_token"]
            except (ValueError, KeyError, TypeError):
                raise CredentialError(scheme, "the token endpoint's answer has no access_token") from None
            if not isinstance(token, str) or not token:
                raise CredentialError(scheme, "the token endpoint's answer has no access_token")
            expires_in = body.get("expires_in")
            if isinstance(expires_in, int | float) and expires_in > 0:
                margin = min(self.REFRESH_MARGIN_SECONDS, expires_in * 0.1)
                self._tokens[key] = _CachedToken(token, time.monotonic() + expires_in - margin)
            else:
                # No lifetime given: not cached, so a revoked token is never reused.
                self._tokens.pop(key, None)
            return token

    async def _nested_secret(self, outer: str, ref: str) -> str:
        scheme = scheme_of(ref)
        if not scheme:
            raise CredentialError(outer, "the client secret must itself be a secret reference")
        if scheme.startswith("oauth+"):
            raise CredentialError(outer, "the client secret cannot be another oauth+ reference")
        return await self.resolve(ref)


@dataclass(frozen=True)
class _OAuthRequest:
    token_url: str
    client_id: str
    secret_ref: str
    scope: str


def _parse_oauth_ref(ref: str) -> _OAuthRequest:
    """`oauth+https://host/path?client=ID&secret=REF[&scope=S]`, read by hand.

    Not urllib's URL parser: the nested reference may hold `#field` (a Vault field), which
    is part of the value here, not a fragment; and values are percent-decoded only, so a
    `+` stays a `+`.
    """
    scheme = scheme_of(ref)
    url = ref.removeprefix("oauth+")
    base, _, query = url.partition("?")
    params: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        name, _, value = pair.partition("=")
        params[unquote(name)] = unquote(value)
    if not params.get("client") or not params.get("secret"):
        raise CredentialError(scheme, "the reference needs `client=` and `secret=`")
    host = base.split("://", 1)[1].split("/", 1)[0]
    hostname = host.rsplit(":", 1)[0].strip("[]") if not host.startswith("[") else host[1:].split("]")[0]
    if base.startswith("http://") and not _is_loopback(hostname):
        raise CredentialError(scheme, "plain http is allowed only for a loopback token endpoint")
    return _OAuthRequest(base, params["client"], params["secret"], params.get("scope", ""))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
