"""gRPC failures from capgate as typed exceptions, with the rich details decoded.

capgate puts `google.rpc.BadRequest` (which field, why) and `google.rpc.ErrorInfo`
(a machine-readable reason) in `grpc-status-details-bin`; grpcio-status unpacks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass(frozen=True)
class ErrorInfo:
    reason: str
    domain: str
    metadata: dict[str, str] = field(default_factory=dict)


class CapgateError(Exception):
    """capgate could not answer: a gRPC error, or an answer a gateway cannot act on."""

    def __init__(
        self,
        status: str,
        message: str,
        field_violations: tuple[FieldViolation, ...] = (),
        error_info: ErrorInfo | None = None,
    ) -> None:
        super().__init__(f"{status.lower()}: {message}" if message else status.lower())
        self.status = status
        """The gRPC status name, e.g. `"UNAVAILABLE"` (`"MALFORMED_RESPONSE"` for a bad answer)."""
        self.message = message
        self.field_violations = field_violations
        self.error_info = error_info


class InvalidArgumentError(CapgateError):
    """A malformed request; `field_violations` names the fields."""


class UnauthenticatedError(CapgateError):
    """The gateway's own token is missing or wrong."""


class PermissionDeniedError(CapgateError):
    """The gateway's token may not make this call."""


class NotFoundError(CapgateError):
    """E.g. NoteDecision for a decision this gateway was not given."""


class UnavailableError(CapgateError):
    """capgate is unreachable, has no active policy, or its store is down."""


class DeadlineExceededError(CapgateError):
    """No answer within the deadline."""


class UnimplementedError(CapgateError):
    """This capgate build does not serve the RPC (yet)."""


class MalformedResponseError(CapgateError):
    """An answer with an unset or unknown oneof or enum: acted on, it would not fail closed."""

    def __init__(self, message: str) -> None:
        super().__init__("MALFORMED_RESPONSE", message)


_BY_CODE: dict[grpc.StatusCode, type[CapgateError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
}


def decode_rpc_error(error: grpc.RpcError) -> CapgateError:
    """The typed exception for a failed call, its BadRequest and ErrorInfo details unpacked."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else "") or ""
    violations: list[FieldViolation] = []
    info: ErrorInfo | None = None
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError):
        # A details trailer that disagrees with the status code, or is not a Status:
        # the code and message still say what happened.
        status = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend(FieldViolation(v.field, v.description) for v in bad_request.field_violations)
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            unpacked = error_details_pb2.ErrorInfo()
            detail.Unpack(unpacked)
            info = ErrorInfo(unpacked.reason, unpacked.domain, dict(unpacked.metadata))
    cls = _BY_CODE.get(code, CapgateError)
    return cls(code.name, message, tuple(violations), info)
