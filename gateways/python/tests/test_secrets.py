"""Secret resolution: each scheme, each failure, and that no failure names the secret."""

from __future__ import annotations

import pytest
from capgate_gateway.secrets import CredentialError, SecretResolver
from fixtures.servers import TokenEndpoint, Vault

pytestmark = pytest.mark.anyio
SECRET = "s3cr3t-value-never-shown"


async def resolve(ref: str, env: dict[str, str]) -> str:
    resolver = SecretResolver(env)
    try:
        return await resolver.resolve(ref)
    finally:
        await resolver.aclose()


async def failure(ref: str, env: dict[str, str]) -> CredentialError:
    with pytest.raises(CredentialError) as caught:
        await resolve(ref, env)
    assert SECRET not in str(caught.value)
    return caught.value


async def test_env() -> None:
    assert await resolve("env://X", {"X": SECRET}) == SECRET
    assert "`X` is not set" in str(await failure("env://X", {}))
    assert "`X` is not set" in str(await failure("env://X", {"X": ""}))


async def test_file(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "s"
    path.write_text(SECRET + "\n")
    assert await resolve(f"file://{path}", {}) == SECRET
    assert "no file" in str(await failure(f"file://{tmp_path}/absent", {}))
    assert "absolute" in str(await failure("file://relative/path", {}))


async def test_unknown_scheme() -> None:
    error = await failure("gcp-secrets://projects/p/secrets/s/versions/1", {})
    assert str(error) == "gcp-secrets: no resolver for scheme `gcp-secrets`"


async def test_vault_kv2() -> None:
    vault = Vault("root-token", {"secret": {"app/db": {"token": SECRET, "value": "default-field"}}})
    env = {"VAULT_ADDR": vault.url, "VAULT_TOKEN": "root-token"}
    try:
        assert await resolve("vault://secret/app/db#token", env) == SECRET
        assert await resolve("vault://secret/app/db", env) == "default-field"
        assert "no secret at `secret/app/missing`" in str(await failure("vault://secret/app/missing", env))
        assert "no string field `nope`" in str(await failure("vault://secret/app/db#nope", env))
        assert "no secret at `kv/app/db`" in str(await failure("vault://kv/app/db", env))
        assert "permission denied" in str(await failure("vault://secret/app/db", {**env, "VAULT_TOKEN": "wrong"}))
        assert "VAULT_TOKEN is not set" in str(await failure("vault://secret/app/db", {"VAULT_ADDR": vault.url}))
        assert "VAULT_ADDR is not set" in str(await failure("vault://secret/app/db", {"VAULT_TOKEN": "t"}))
    finally:
        vault.close()


async def test_oauth_client_credentials_cached() -> None:
    endpoint = TokenEndpoint("cid", SECRET, "access-token-1", expires_in=3600)
    env = {"CS": SECRET}
    ref = f"oauth+{endpoint.url}?client=cid&secret=env://CS&scope=a%20b+c"
    resolver = SecretResolver(env)
    try:
        assert await resolver.resolve(ref) == "access-token-1"
        assert await resolver.resolve(ref) == "access-token-1"
        # One grant for two resolutions; the scope percent-decoded with `+` kept.
        assert endpoint.grants == [{"client_id": "cid", "scope": "a b+c"}]
    finally:
        await resolver.aclose()
        endpoint.close()


async def test_oauth_failures() -> None:
    endpoint = TokenEndpoint("cid", SECRET, "tok")
    try:
        wrong = await failure(f"oauth+{endpoint.url}?client=cid&secret=env://CS", {"CS": "not-it"})
        assert "HTTP 401" in str(wrong)
        assert "client secret must itself be a secret reference" in str(
            await failure(f"oauth+{endpoint.url}?client=cid&secret={SECRET}", {})
        )
        assert "loopback" in str(await failure("oauth+http://auth.example.net/token?client=c&secret=env://CS", {"CS": "x"}))
        assert "needs `client=` and `secret=`" in str(await failure(f"oauth+{endpoint.url}?client=cid", {}))
        assert "not set" in str(await failure(f"oauth+{endpoint.url}?client=cid&secret=env://NOPE", {}))
    finally:
        endpoint.close()
