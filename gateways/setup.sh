#!/usr/bin/env bash
# Installs what the Python gateway needs, and nothing else: uv (into a venv of its own when
# missing), the Python workspace from its lock (gateways/python/.venv: the gateway, the client,
# the official `mcp` SDK, the scenario suite's tools and mcp-server-time), then the client code
# generated from proto/. run-tests.sh sources it (and then uses its `$uv`, from
# gateways/python), so there is one way to install; the README's tour runs it on its own.
# Network: the Python package index only.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_dir="$here/python"
UV_VERSION=0.13.9
if command -v uv >/dev/null 2>&1; then
  uv=uv
else
  tools="$python_dir/.tools"
  if [ ! -x "$tools/bin/uv" ]; then
    echo "setup: installing uv $UV_VERSION into $tools" >&2
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  fi
  uv="$tools/bin/uv"
fi

cd "$python_dir"
timeout 300 "$uv" sync --frozen --quiet
timeout 120 "$uv" run --frozen python scripts/generate.py
echo "setup: ready — $python_dir/.venv/bin/python" >&2
