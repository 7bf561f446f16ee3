"""The edge's DNS-rebinding rules (`HostCheck`), the `--relay` file's validation, prompt routing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from capgate_client import Account, HttpTransport, StdioTransport
from capgate_gateway.edge import HostCheck
from capgate_gateway.relay import Reach, RelayConfigError, RelayedUpstream, load_config, prompt_route


def test_a_loopback_bind_answers_to_loopback_names_on_any_port() -> None:
    check = HostCheck.for_bind("127.0.0.1", [], [])
    assert check is not None
    for host in ("localhost", "LOCALHOST:8080", "127.0.0.1:3000", "[::1]:9", "[::1]"):
        assert check.host_allowed(host), host
    for host in ("evil.example.com", "evil.example.com:8080", "localhost.evil.example.com", "127.0.0.2", "", None):
        assert not check.host_allowed(host), host
    assert check.origin_allowed(None) and check.origin_allowed("http://localhost:5173")
    assert not check.origin_allowed("http://evil.example.com") and not check.origin_allowed("null")


def test_allowed_hosts_replace_the_defaults_and_a_routable_bind_has_none() -> None:
    check = HostCheck.for_bind("0.0.0.0", ["mcp.internal", "gw.example.com:8443"], ["https://console.example.com/"])
    assert check is not None
    assert check.host_allowed("mcp.internal:1") and check.host_allowed("gw.example.com:8443")
    assert not check.host_allowed("gw.example.com:80") and not check.host_allowed("localhost")
    assert check.origin_allowed("https://console.example.com") and check.origin_allowed("http://mcp.internal")
    assert not check.origin_allowed("https://evil.example.com")
    assert HostCheck.for_bind("0.0.0.0", [], []) is None
    assert HostCheck.for_bind("::1", [], []) is not None and HostCheck.for_bind("localhost", [], []) is not None


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "relay.json"
    path.write_text(json.dumps(document))
    return path


def test_a_relay_file_is_read_as_the_policy_writes_transports(tmp_path: Path) -> None:
    upstreams = load_config(write(tmp_path, {"upstreams": [
        {"id": "docs", "transport": {"kind": "mcp-http", "url": "https://docs.example.com/mcp"}, "relay": ["resources"]},
        {"id": "fs", "transport": {"kind": "mcp-stdio", "command": "fs-server", "args": ["/srv"]},
         "relay": ["prompts", "logging"]},
    ]}))
    assert [u.id for u in upstreams] == ["docs", "fs"]
    assert upstreams[0].transport == HttpTransport("https://docs.example.com/mcp")
    assert upstreams[1].transport == StdioTransport("fs-server", ("/srv",))
    assert upstreams[1].features == {"prompts", "logging"}


@pytest.mark.parametrize(("document", "message"), [
    ([], "the file must be an object"),
    ({"upstreams": {}}, "`upstreams` must be a list"),
    ({"upstream": []}, "unknown field `upstream`"),
    ({"upstreams": [{"id": "a_b", "transport": {"kind": "mcp-http", "url": "http://x"}, "relay": []}]}, "no `_`"),
    ({"upstreams": [{"id": "a", "transport": {"kind": "mcp-http", "url": "http://x"}, "relay": ["tools"]}]},
     "relay must list some of"),
    ({"upstreams": [{"id": "a", "transport": {"kind": "mcp-sse", "url": "http://x"}, "relay": []}]}, "kind must be"),
    ({"upstreams": [{"id": "a", "transport": {"kind": "mcp-http", "url": "ftp://x"}, "relay": []}]}, "http(s) URL"),
    ({"upstreams": [{"id": "a", "transport": {"kind": "mcp-stdio", "command": ""}, "relay": []}]}, "needs `command`"),
    ({"upstreams": [{"id": "a", "transport": {"kind": "mcp-http", "url": "http://x"}, "relay": []}] * 2}, "named twice"),
])
def test_a_relay_file_that_cannot_be_used_says_why(tmp_path: Path, document: object, message: str) -> None:
    with pytest.raises(RelayConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(write(tmp_path, document))


def test_a_prompt_name_is_upstream_then_prompt() -> None:
    reach = Reach(RelayedUpstream("everything", HttpTransport("http://x"), frozenset({"prompts"})), Account("a", "env://X"), "l")
    assert prompt_route([reach], "everything__args-prompt") == (reach, "args-prompt")
    assert prompt_route([reach], "everything__a__b") == (reach, "a__b")
    for name in ("args-prompt", "other__args-prompt", "everything__", "__x"):
        assert prompt_route([reach], name) is None, name
