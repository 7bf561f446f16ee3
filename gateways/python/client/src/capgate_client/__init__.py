"""capgate_client: ask capgate whether a caller may use a tool, with no protobuf in sight.

    async with CapgateClient("http://127.0.0.1:50051", token=gateway_token) as capgate:
        answer = await capgate.decide(Credential.bearer(jwt), tool="helpdesk__get_ticket")
        match answer:
            case Allow(account=account, tool=tool): ...
            case Deny(reason=reason): ...
"""

from capgate_client.client import CapgateClient
from capgate_client.errors import (
    CapgateError,
    DeadlineExceededError,
    ErrorInfo,
    FieldViolation,
    InvalidArgumentError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from capgate_client.results import (
    Account,
    ActivePolicy,
    Allow,
    Credential,
    DecideResult,
    Deny,
    Diagnostic,
    HttpTransport,
    Limits,
    ListVisibleResult,
    NoteKind,
    NotVisible,
    PolicyRevision,
    PolicyVersion,
    PublishResult,
    Reason,
    StdioTransport,
    ToolRoute,
    Unauthenticated,
    UnknownTool,
    Visible,
    VisibleCapability,
    VisibleTool,
)

__all__ = [
    "Account",
    "ActivePolicy",
    "Allow",
    "CapgateClient",
    "CapgateError",
    "Credential",
    "DeadlineExceededError",
    "DecideResult",
    "Deny",
    "Diagnostic",
    "ErrorInfo",
    "FieldViolation",
    "HttpTransport",
    "InvalidArgumentError",
    "Limits",
    "ListVisibleResult",
    "MalformedResponseError",
    "NotFoundError",
    "NotVisible",
    "NoteKind",
    "PermissionDeniedError",
    "PolicyRevision",
    "PolicyVersion",
    "PublishResult",
    "Reason",
    "StdioTransport",
    "ToolRoute",
    "Unauthenticated",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownTool",
    "Visible",
    "VisibleCapability",
    "VisibleTool",
]
