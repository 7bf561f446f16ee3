"""The configuration a page of docs/gateways/ gives, read as the page writes it.

A proxy in this suite runs the configuration of its page, not a copy kept here: each page holds
one fenced block per file the proxy reads, and the suite takes that block and changes only what
this machine changes (addresses, ports, the gateway token). `replace` does that, and fails when
the page no longer says what it is asked to change, so a page edited out of step with the suite
is noticed.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GATEWAYS = REPO / "docs" / "gateways"


def page(name: str) -> Path:
    return GATEWAYS / name


def blocks(path: Path, tag: str) -> list[str]:
    """Every fenced block of `path` tagged `tag`, as written."""
    text = path.read_text(encoding="utf-8")
    return re.findall(rf"^```{re.escape(tag)}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def one_block(path: Path, tag: str, holding: str) -> str:
    """The one block tagged `tag` that holds `holding`."""
    found = [block for block in blocks(path, tag) if holding in block]
    if len(found) != 1:
        raise AssertionError(f"{path} should hold one {tag} block with `{holding}`, found {len(found)}")
    return found[0]


def replace(text: str, old: str, new: str, *, count: int | None = None, where: str = "the page") -> str:
    """`text` with `old` replaced by `new`: `count` times exactly when given, else at least once."""
    found = text.count(old)
    if (count is not None and found != count) or found == 0:
        wanted = "at least once" if count is None else f"{count} time(s)"
        raise AssertionError(f"{where} should name `{old}` {wanted}, found {found}")
    return text.replace(old, new)


def checked_version(path: Path) -> str:
    """The version the page says it was checked against: its line `Checked against <name> <version>`."""
    found = re.findall(r"^Checked against \S+ (\d+(?:\.\d+)+)", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    if len(found) != 1:
        raise AssertionError(f"{path} should say once which version it was checked against, found {found}")
    return found[0]


def capgate_flags(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    """The flags of the page's `capgate serve` command that start with one of `prefixes`, each
    with its value (`--flag value` or `--flag=value`)."""
    command = shlex.split(one_block(path, "sh", "capgate serve").replace("\\\n", " "))
    flags: list[str] = []
    for index, word in enumerate(command):
        if not word.startswith(prefixes):
            continue
        flags.append(word)
        if "=" not in word:
            flags.append(command[index + 1])
    return flags
