#!/usr/bin/env bash
# Regenerates capgate_client's protobuf/gRPC modules from proto/ (see generate.py for why
# they are not committed). Run from anywhere; uses the workspace's locked grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
exec uv run --frozen python scripts/generate.py
