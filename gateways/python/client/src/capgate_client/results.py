"""What capgate answers, as plain frozen dataclasses: a gateway author reads these, never protobuf.

Reason codes, auth problems and note kinds are the lowercase strings capgate's audit
trail uses (`REASON_CODE_NO_GRANT_MATCHES` is `"no_grant_matches"`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args


ReasonCode = Literal[
    "granted",
    "capability_not_declared",
    "capability_not_realized",
    "no_grant_matches",
    "ambiguous_grant",
    "account_disabled",
    "usage_unknown",
    "limit_exhausted",
    "condition_failed",
    "arguments_missing",
]
"""Every reason code capgate decides with (the proto's `ReasonCode`, less its zero value).
`condition_failed` and `arguments_missing` come from a grant's `when:` conditions: the pointer is
the failing condition (`/grants/0/when/1`) and the subject its argument path, or `time`. A number
this build does not know reads as `"unknown_<n>"`."""

REASON_CODES: tuple[str, ...] = get_args(ReasonCode)


class NoteKind(enum.StrEnum):
    """What a gateway notes about an allowed call (`DecisionService.NoteDecision`)."""

    CREDENTIAL_FAILED = "credential_failed"
    UPSTREAM_FAILED = "upstream_failed"


@dataclass(frozen=True)
class Credential:
    """The caller's own credential, forwarded as is; its value never appears in a repr."""

    kind: Literal["bearer_token", "api_key", "client_certificate"]
    value: str = field(repr=False)
    issuer: str = ""

    @classmethod
    def bearer(cls, token: str, issuer: str = "") -> Credential:
        return cls("bearer_token", token, issuer)

    @classmethod
    def api_key(cls, key: str, issuer: str = "") -> Credential:
        return cls("api_key", key, issuer)

    @classmethod
    def client_certificate(cls, value: str, issuer: str = "") -> Credential:
        return cls("client_certificate", value, issuer)


@dataclass(frozen=True)
class Reason:
    code: str
    """A reason code (`REASON_CODES`), e.g. `"granted"`, `"limit_exhausted"`, `"condition_failed"`."""
    pointer: str
    """The RFC 6901 pointer into the policy of the place to change (`"/grants/3"`), as gateways'
    refusals and AuthZEN name it (the wire's `Reason.path`)."""
    subject: str
    message: str


@dataclass(frozen=True)
class Account:
    id: str
    secret_ref: str


@dataclass(frozen=True)
class Limits:
    calls: int
    per: str
    window_ms: int
    remaining: int
    resets_at: datetime | None


@dataclass(frozen=True)
class StdioTransport:
    command: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class HttpTransport:
    url: str


@dataclass(frozen=True)
class ToolRoute:
    """The tool an allow is about, and how to reach its upstream."""

    exposed_name: str
    upstream: str
    name: str
    capability: str
    transport: StdioTransport | HttpTransport


@dataclass(frozen=True)
class Answer:
    """What every `Decide` answer carries."""

    decision_id: str
    policy_version: str
    policy_revision: int
    at: datetime | None


@dataclass(frozen=True)
class Allow(Answer):
    reason: Reason
    account: Account
    tool: ToolRoute | None
    """None only when a capability (not a tool) was asked about."""
    limits: Limits | None


@dataclass(frozen=True)
class Deny(Answer):
    reason: Reason
    resets_at: datetime | None
    """limit_exhausted only: the earliest instant a retry can be allowed."""


@dataclass(frozen=True)
class Unauthenticated(Answer):
    problem: str
    """`"credential_missing"`, `"credential_invalid"`, `"credential_expired"` or `"issuer_unknown"`."""
    message: str


@dataclass(frozen=True)
class UnknownTool(Answer):
    name: str
    message: str


DecideResult = Allow | Deny | Unauthenticated | UnknownTool


@dataclass(frozen=True)
class VisibleTool:
    exposed_name: str
    upstream: str
    name: str
    capability: str
    description: str
    input_schema_json: str
    conditional: bool = False
    """Every grant that shows the tool carries conditions: a call may still be denied on its
    arguments or its time (`condition_failed`, `arguments_missing`)."""


@dataclass(frozen=True)
class VisibleCapability:
    capability: str
    account: Account | None
    pointer: str
    """The winning grant's pointer (the wire's `path`)."""
    decision_id: str
    conditional: bool = False
    """Every grant that gives it carries conditions (see `VisibleTool.conditional`)."""


@dataclass(frozen=True)
class Visible:
    policy_version: str
    policy_revision: int
    at: datetime | None
    capabilities: tuple[VisibleCapability, ...]
    tools: tuple[VisibleTool, ...]


@dataclass(frozen=True)
class NotVisible:
    """The caller did not authenticate: nothing is visible."""

    policy_version: str
    policy_revision: int
    at: datetime | None
    problem: str
    message: str


ListVisibleResult = Visible | NotVisible


@dataclass(frozen=True)
class PolicyRevision:
    policy_revision: int
    policy_version: str
    installed_at: datetime | None


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    code: str
    message: str
    pointer: str
    """Where in the artifact (the wire's `path`); `""` for a YAML syntax error."""


@dataclass(frozen=True)
class PublishResult:
    accepted: bool
    revision: int
    version: str
    unchanged: bool
    diagnostics: tuple[Diagnostic, ...]


@dataclass(frozen=True)
class PolicyVersion:
    revision: int
    version: str
    author: str
    comment: str
    created_at: datetime | None
    active: bool


@dataclass(frozen=True)
class ActivePolicy:
    version: PolicyVersion
    artifact: str
    catalog: str | None
