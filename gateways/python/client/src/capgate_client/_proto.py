"""The generated protobuf and gRPC modules, imported in one place.

They are generated from proto/ by gateways/python/scripts/generate.py and not
committed; a clear error says so when they are missing.
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
        "capgate_client's generated modules are missing: run gateways/python/scripts/generate.sh"
    ) from error

__all__ = ["common", "decisions", "decisions_grpc", "policies", "policies_grpc"]
