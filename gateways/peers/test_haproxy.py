"""Why docs/gateways/haproxy.md says HAProxy cannot ask capgate with configuration alone, checked
against Debian 12's HAProxy: the page's version, the configuration a Lua setup needs (refused
without the script), and the `http-request` actions the page says leave HAProxy (all the others
act on the request, the connection or HAProxy's own tables)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pages import checked_version, one_block, page

PAGE = page("haproxy.md")
# The actions of HAProxy 2.6.12 that stay inside it: on the request (headers, path, method,
# variables), the connection, its tables and maps, or an answer of its own. A version that adds
# an action fails the last test, for someone to see whether it can ask another server.
STAYING = set("""
add-acl add-header allow auth cache-use capture del-acl del-header del-map deny disable-l7-retry
early-hint normalize-uri ot-group redirect reject replace-header replace-path replace-pathq
replace-uri replace-value return sc-inc-gpc sc-inc-gpc0 sc-inc-gpc1 sc-set-gpt sc-set-gpt0 set-dst
set-dst-port set-header set-log-level set-map set-mark set-method set-nice set-path set-pathq
set-priority-class set-priority-offset set-query set-src set-src-port set-timeout set-tos set-uri
set-var set-var-fmt silent-drop strict-mode tarpit track-sc unset-var use-service wait-for-body
wait-for-handshake
""".split())


def haproxy() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if found is None:
        pytest.fail("no haproxy (Debian's `haproxy` package; scripts/test.sh installs it)")
    return found


def run(*args: str) -> str:
    done = subprocess.run([haproxy(), *args], capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def test_the_haproxy_is_the_version_its_page_names() -> None:
    assert re.search(r"HAProxy version (\d+\.\d+\.\d+)", run("-v")).group(1) == checked_version(PAGE)


def test_the_lua_setup_is_refused_without_its_script(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(one_block(PAGE, "haproxy", "lua.auth-request"), encoding="utf-8")
    out = run("-c", "-f", str(config))
    assert "but got 'lua.auth-request'" in out, out


def test_only_the_actions_the_page_names_leave_haproxy() -> None:
    actions = {name.rstrip("*") for name in re.findall(r"^\s*http-request (\S+)$", run("-dKcfg", "-q", "-c", "-f",
                                                                                         "/dev/null"), re.MULTILINE)}
    leaving = set(re.findall(r"^  - `([a-z-]+)`", PAGE.read_text(encoding="utf-8"), re.MULTILINE))
    assert leaving and leaving <= actions, (leaving, actions)
    assert actions - STAYING == leaving, sorted(actions - STAYING)
    assert f"Of the {len(actions)} that HAProxy" in PAGE.read_text(encoding="utf-8")
