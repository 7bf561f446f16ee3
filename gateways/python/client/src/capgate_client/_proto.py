"""The generated protobuf and gRPC modules, imported in one place.

They are generated from proto/ when the package is built (hatch_build.py runs protogen.py for
every wheel and editable install) and never committed. They can only be missing from a copy of
src/ that no build made, such as a PYTHONPATH pointed at the source tree; the error says what to do.
"""

from __future__ import annotations

try:
    from capgate_client._gen.capgate.v1 import common_pb2 as common
    from capgate_client._gen.capgate.v1 import decisions_pb2 as decisions
    from capgate_client._gen.capgate.v1 import decisions_pb2_grpc as decisions_grpc
    from capgate_client._gen.capgate.v1 import policies_pb2 as policies
    from capgate_client._gen.capgate.v1 import policies_pb2_grpc as policies_grpc
except ImportError as error:  # pragma: no cover - only without generation
    raise ImportError(
        "capgate_client's generated modules are missing: install the package (`pip install "
        "gateways/python/client`, or `uv sync` in gateways/python), whose build generates them, "
        "rather than importing its source tree"
    ) from error

__all__ = ["common", "decisions", "decisions_grpc", "policies", "policies_grpc"]
