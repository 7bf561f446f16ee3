"""Compiles capgate's protos into capgate_client's protobuf and gRPC modules (`capgate_client._gen`).

The generated code is never committed: proto/ is the one source of truth. This module is the one
generator, for every way the client is made: the build hook (hatch_build.py) runs it whenever a
wheel or an editable install is built (`pip install gateways/python/client`, `uv sync`), and
gateways/python/scripts/generate.py runs it when the workspace is set up. It needs grpcio-tools,
which the build system requires. grpc_tools writes absolute imports (`from capgate.v1 import
...`); they are rewritten to the package's own path, so nothing is added to sys.path.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

PACKAGE = "capgate_client._gen"


def find_protos(project: Path) -> Path:
    """The folder holding `capgate/v1/*.proto`: `proto/` inside the project when it is unpacked from
    an sdist (the hook puts it there), else the repository's `proto/`, three folders up."""
    candidates = [project / "proto", project.parents[2] / "proto"]
    for candidate in candidates:
        if any((candidate / "capgate" / "v1").glob("*.proto")):
            return candidate
    raise FileNotFoundError(f"no capgate/v1/*.proto under {' or '.join(str(c) for c in candidates)}")


def generate(protos: Path, out: Path) -> int:
    """Writes the modules of every `capgate/v1/*.proto` under `protos` into `out` (emptied first);
    returns how many protos were compiled."""
    from grpc_tools import protoc

    names = sorted(str(p.relative_to(protos)) for p in (protos / "capgate" / "v1").glob("*.proto"))
    if not names:
        raise FileNotFoundError(f"no protos under {protos / 'capgate' / 'v1'}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # protoc's own well-known types (google/protobuf/timestamp.proto) ship with grpc_tools.
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{protos}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *names,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    absolute = re.compile(r"^from capgate\.v1 import", re.MULTILINE)
    for path in out.rglob("*"):
        if path.suffix in (".py", ".pyi"):
            path.write_text(absolute.sub(f"from {PACKAGE}.capgate.v1 import", path.read_text()))
    for directory in [out, *(d for d in out.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()
    (out / "README").write_text("Generated from capgate's proto/ by capgate-client's protogen.py; do not edit.\n")
    return len(names)
