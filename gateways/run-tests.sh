#!/usr/bin/env bash
# The gateways' tests, from scratch: setup.sh (uv, the Python workspace from its lock, the
# generated client code), the TypeScript gateway's own script when it exists (it builds
# dist/, which the scenario suite starts), then the Python unit tests and the shared scenario
# suite against a real `capgate serve`.
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

if [ ! -x "$CAPGATE_BIN" ]; then
  echo "run-tests: no capgate binary at $CAPGATE_BIN (build it, or set CAPGATE_BIN)" >&2
  exit 1
fi

# One pytest run: the unit tests, then the scenarios (each gateway in turn).
exec timeout 900 "$uv" run --frozen pytest -p no:cacheprovider "$python_dir/tests" "$here/scenarios" "$@"
