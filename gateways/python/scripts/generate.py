"""Regenerates capgate_client's protobuf and gRPC modules in place, from the repository's proto/.

The client's own build does this too (client/hatch_build.py, on every wheel and editable build);
gateways/setup.sh runs this after `uv sync` so that a proto changed since the last sync is picked
up at once. The generator itself is client/protogen.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[1] / "client"
sys.path.insert(0, str(CLIENT))

import protogen  # noqa: E402  (client/, put on the path just above)


def main() -> int:
    out = CLIENT / "src" / "capgate_client" / "_gen"
    count = protogen.generate(protogen.find_protos(CLIENT), out)
    print(f"generated {count} protos into {out.relative_to(CLIENT.parents[2])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
