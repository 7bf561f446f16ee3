#!/usr/bin/env bash
# The reference gateways' overhead, from scratch (gateways/bench/README.md): the Python workspace
# (setup.sh), the TypeScript gateway built, Node 22 and server-everything from
# conformance/package-lock.json, then overhead.py with the arguments given. Not a test: it prints
# figures and fails only when something cannot run.
#
#   CAPGATE_BIN   the capgate binary (default: target/debug/capgate at the repository root)
set -euo pipefail

bench="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gateways="$(cd "$bench/.." && pwd)"
repo="$(cd "$gateways/.." && pwd)"
export CAPGATE_BIN="${CAPGATE_BIN:-$repo/target/debug/capgate}"
case "$CAPGATE_BIN" in /*) ;; *) CAPGATE_BIN="$repo/$CAPGATE_BIN" ;; esac

# setup.sh is sourced (it leaves $uv set) and sets its own $here.
source "$gateways/setup.sh"
(cd "$gateways/typescript" && npm ci --no-audit --no-fund --loglevel=error && npm run build --silent)
(cd "$gateways/conformance" && npm ci --no-audit --no-fund --loglevel=error)
exec "$uv" run --frozen python "$bench/overhead.py" "$@"
