#!/usr/bin/env bash
# The TypeScript gateway and client from scratch: `npm ci` (the lockfile, no
# network beyond the npm registry), generate the client from proto/, build
# with tsc, run every test (node --test). Needs a capgate binary for the
# integration and end-to-end tests: $CAPGATE_BIN, default target/debug/capgate
# at the repository root. Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CAPGATE_BIN="${CAPGATE_BIN:-$repo/target/debug/capgate}"
case "$CAPGATE_BIN" in /*) ;; *) CAPGATE_BIN="$PWD/$CAPGATE_BIN" ;; esac

if [[ ! -x "$CAPGATE_BIN" ]]; then
  echo "run-tests.sh: no capgate binary at $CAPGATE_BIN (build it, or set CAPGATE_BIN)" >&2
  exit 1
fi

cd "$here"
npm ci --no-audit --no-fund
npm run build
npm test
