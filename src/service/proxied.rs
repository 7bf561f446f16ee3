//! What a proxy in front of MCP servers is told: the doors a proxy calls before it forwards an MCP
//! request (Envoy's ext_authz, `grpc/ext_authz.rs`; the forward-auth door of nginx, Caddy, Traefik
//! and HAProxy, `forward_auth.rs`) read the same MCP headers, apply the same method policy and
//! answer the same HTTP answer, each in its own protocol's envelope.
//!
//! An answer ([`HttpAnswer`]) is what the proxy acts on: on an allow, `200`, the headers it sets on
//! the request to the upstream (the decision id and the execution account) and on the client's
//! response (`RateLimit*`); on anything else, the status, the headers and the JSON-RPC error body
//! the client receives:
//!
//! | answer | status | headers | JSON-RPC `error.code`, `data.code` |
//! |---|---|---|---|
//! | allowed | 200 | `x-capgate-decision-id`, `x-capgate-account` upstream; `RateLimit-Policy`, `RateLimit` | — |
//! | denied | 403 | | -32001, the reason code |
//! | over the ceiling | 429 | `Retry-After` | -32001, `limit_exhausted` |
//! | usage unknown, or no answer can be given | 503 | `Retry-After: 1` | -32001, `usage_unknown` |
//! | caller not authenticated | 401 | `WWW-Authenticate` | -32001, the problem |
//! | unknown tool | 403 | | -32602, `unknown_tool` |
//! | a malformed request | 400 / 413 | | -32600 / -32700 |
//! | a reused request id | 422 | | -32600, `request_id_reused` |

use capgate_core::access::{Decision, Limits, ReasonCode, Standing};
use capgate_core::principals::AuthProblem;
use serde_json::{json, Value};
use tonic::Code;

use super::config::ExtAuthzSettings;
use super::pipeline::{self, Answer, Refusal, Verdict};

/// The headers that name the MCP target (lower-case): MCP 2026-07-28's own, and Kuadrant's
/// router's.
pub const MCP_METHOD: &str = "mcp-method";
pub const MCP_NAME: &str = "mcp-name";
pub const KUADRANT_METHOD: &str = "x-mcp-method";
pub const KUADRANT_TOOL: &str = "x-mcp-toolname";
pub const KUADRANT_SERVER: &str = "x-mcp-servername";
pub const AUTHORIZATION: &str = "authorization";
pub const CLIENT_CERT: &str = "x-forwarded-client-cert";

/// Headers set on the request to the upstream on an allow (overwriting whatever the client sent).
pub const DECISION_ID_HEADER: &str = "x-capgate-decision-id";
pub const ACCOUNT_HEADER: &str = "x-capgate-account";

/// The methods that pass without a decision: they read nothing a grant guards, and a proxy sees
/// only the request, so it cannot filter a listing's response. `server/discover` is MCP
/// 2026-07-28's handshake: refused, a client falls back to the older one and sends no
/// `Mcp-Method` (gateways/peers saw the official SDK do so).
const PASSING: [&str; 4] = ["initialize", "server/discover", "ping", "tools/list"];
const NOTIFICATIONS: &str = "notifications/";
pub const TOOLS_CALL: &str = "tools/call";

/// JSON-RPC error codes in the answer's body: MCP's own for an unknown tool ("Invalid params"),
/// a server-defined one for every refusal by policy, and the standard ones for a bad request.
pub const RPC_UNKNOWN_TOOL: i64 = -32602;
pub const RPC_REFUSED: i64 = -32001;
pub const RPC_INVALID_REQUEST: i64 = -32600;
pub const RPC_PARSE_ERROR: i64 = -32700;

/// A fact about the decision, for the proxy's logs (Envoy's dynamic metadata).
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    Text(String),
    Number(f64),
}

/// What the proxy is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpAnswer {
    /// 200 lets the request through; anything else is the client's response.
    pub status: u16,
    /// The same answer as a gRPC code (ext_authz's `CheckResponse.status`).
    pub grpc: Code,
    /// One line: the reason (ext_authz's status message).
    pub message: String,
    /// On a denial, the client's response headers; on an allow, headers added to the client's
    /// response (the ceiling's).
    pub headers: Vec<(&'static str, String)>,
    /// On an allow, headers set on the request to the upstream.
    pub upstream: Vec<(&'static str, String)>,
    /// On a denial, the JSON-RPC error the client receives.
    pub body: Option<Value>,
    /// What was decided, when something was: the proxy's to log.
    pub facts: Option<Vec<(&'static str, Fact)>>,
}

impl HttpAnswer {
    /// An allowed request that needs no decision.
    pub fn passed() -> HttpAnswer {
        HttpAnswer {
            status: 200,
            grpc: Code::Ok,
            message: String::new(),
            headers: Vec::new(),
            upstream: Vec::new(),
            body: None,
            facts: None,
        }
    }

    /// A request refused before any decision (malformed, a method not decided): nothing is
    /// audited.
    pub fn rejected(status: u16, grpc: Code, rpc_code: i64, message: String, rpc_id: &Value) -> HttpAnswer {
        let body = json!({
            "jsonrpc": "2.0",
            "id": rpc_id,
            "error": { "code": rpc_code, "message": message },
        });
        HttpAnswer::denied(status, grpc, message, Vec::new(), body, None)
    }

    fn denied(
        status: u16,
        grpc: Code,
        message: String,
        headers: Vec<(&'static str, String)>,
        body: Value,
        facts: Option<Vec<(&'static str, Fact)>>,
    ) -> HttpAnswer {
        HttpAnswer {
            status,
            grpc,
            message,
            headers,
            upstream: Vec::new(),
            body: Some(body),
            facts,
        }
    }

    /// No answer could be had (no active version, keys or audit out of reach; a gateway not
    /// trusted to forward a certificate; a reused request id, read from `request_id_field`): a
    /// denial, so that the request fails closed.
    pub fn refused(refusal: &Refusal, rpc_id: &Value, request_id_field: &str) -> HttpAnswer {
        let (status, grpc, headers) = match refusal {
            Refusal::PermissionDenied(_) => (403, Code::PermissionDenied, Vec::new()),
            Refusal::Unavailable(_) => (503, Code::Unavailable, vec![("retry-after", "1".to_owned())]),
            Refusal::RequestIdReused { request_id, reuse } => {
                // draft-ietf-httpapi-idempotency-key-header: a key reused with another request is 422.
                let message = pipeline::reused(request_id_field, request_id, *reuse);
                let body = json!({
                    "jsonrpc": "2.0",
                    "id": rpc_id,
                    "error": {
                        "code": RPC_INVALID_REQUEST,
                        "message": message,
                        "data": { "code": "request_id_reused" },
                    },
                });
                return HttpAnswer::denied(422, Code::InvalidArgument, message, Vec::new(), body, None);
            }
        };
        let message = refusal.to_string();
        let body = json!({
            "jsonrpc": "2.0",
            "id": rpc_id,
            "error": { "code": RPC_REFUSED, "message": message },
        });
        HttpAnswer::denied(status, grpc, message, headers, body, None)
    }

    /// The pipeline's answer.
    pub fn decided(answer: &Answer<'_>, rpc_id: &Value) -> HttpAnswer {
        let Answer {
            decision_id,
            at_ms,
            active,
            verdict,
        } = answer;
        let text = |value: &str| Fact::Text(value.to_owned());
        let mut facts = vec![
            ("decision_id", text(decision_id)),
            ("policy_version", text(&active.version)),
            ("policy_revision", Fact::Number(active.revision as f64)),
        ];
        let error = |rpc_code: i64, message: &str, code: &str, pointer: &str| {
            json!({
                "jsonrpc": "2.0",
                "id": rpc_id,
                "error": {
                    "code": rpc_code,
                    "message": message,
                    "data": {
                        "decision_id": decision_id,
                        "code": code,
                        "pointer": pointer,
                        "policy_version": active.version,
                    },
                },
            })
        };
        match verdict {
            Verdict::Unauthenticated(problem) => {
                let code = problem.as_str();
                facts.extend([("outcome", text("unauthenticated")), ("code", text(code))]);
                let challenge = match problem {
                    AuthProblem::CredentialMissing => "Bearer".to_owned(),
                    _ => format!("Bearer error=\"invalid_token\", error_description=\"{code}\""),
                };
                let message = format!("the caller is not authenticated: {code}: {}", problem.describe());
                let body = error(RPC_REFUSED, &message, code, "");
                HttpAnswer::denied(
                    401,
                    Code::Unauthenticated,
                    code.to_owned(),
                    vec![("www-authenticate", challenge)],
                    body,
                    Some(facts),
                )
            }
            Verdict::UnknownTool(name) => {
                facts.extend([("outcome", text("unknown_tool")), ("code", text("unknown_tool"))]);
                let hint = active.policy.tools.did_you_mean(name);
                let message = format!("unknown tool `{name}`: not in the active catalog{hint}");
                let body = error(RPC_UNKNOWN_TOOL, &message, "unknown_tool", "");
                HttpAnswer::denied(
                    403,
                    Code::NotFound,
                    "unknown tool".to_owned(),
                    Vec::new(),
                    body,
                    Some(facts),
                )
            }
            Verdict::Decided(decided) => {
                let reason = decided.decision.reason();
                let code = reason.code.as_str();
                facts.extend([("code", text(code)), ("pointer", text(reason.path))]);
                match &decided.decision {
                    Decision::Allow(allow) => {
                        facts.extend([("outcome", text("allow")), ("account", text(&allow.account.id))]);
                        let headers = match (allow.limits, decided.standing) {
                            (Some(limits), Some(standing)) => rate_limit(limits, standing, *at_ms),
                            _ => Vec::new(),
                        };
                        HttpAnswer {
                            status: 200,
                            grpc: Code::Ok,
                            message: String::new(),
                            headers,
                            upstream: vec![
                                (DECISION_ID_HEADER, decision_id.clone()),
                                (ACCOUNT_HEADER, allow.account.id.clone()),
                            ],
                            body: None,
                            facts: Some(facts),
                        }
                    }
                    Decision::Deny(_) => {
                        facts.push(("outcome", text("deny")));
                        let (status, grpc, headers) = match reason.code {
                            ReasonCode::LimitExhausted => (
                                429,
                                Code::ResourceExhausted,
                                retry_after(decided.resets_at, *at_ms).into_iter().collect(),
                            ),
                            ReasonCode::UsageUnknown => {
                                (503, Code::Unavailable, vec![("retry-after", "1".to_owned())])
                            }
                            _ => (403, Code::PermissionDenied, Vec::new()),
                        };
                        let message = format!("denied: {code}: {}", reason.message());
                        let body = error(RPC_REFUSED, &message, code, reason.path);
                        HttpAnswer::denied(status, grpc, code.to_owned(), headers, body, Some(facts))
                    }
                }
            }
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for the client:
/// the ceiling, and what is left of it after this call.
fn rate_limit(limits: &Limits, standing: Standing, at_ms: i64) -> Vec<(&'static str, String)> {
    let window_s = limits.window_ms.div_ceil(1000);
    let reset_s = seconds_until(standing.resets_at, at_ms);
    vec![
        (
            "ratelimit-policy",
            format!("\"capgate\";q={};w={window_s}", limits.calls),
        ),
        (
            "ratelimit",
            format!("\"capgate\";r={};t={reset_s}", standing.remaining),
        ),
    ]
}

/// Whole seconds from `at_ms` until `instant`, rounded up; 0 once it has passed.
fn seconds_until(instant: i64, at_ms: i64) -> u64 {
    (instant - at_ms).max(0).unsigned_abs().div_ceil(1000)
}

/// `Retry-After` for an exhausted ceiling: the seconds until its full window ends (at least 1).
/// The pipeline sets `resets_at` on every `limit_exhausted`.
fn retry_after(resets_at: Option<i64>, at_ms: i64) -> Option<(&'static str, String)> {
    resets_at.map(|resets_at| ("retry-after", seconds_until(resets_at, at_ms).max(1).to_string()))
}

/// The token of an `authorization: Bearer <token>` value (the scheme is case-insensitive).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

/// How a request is answered, by its MCP method.
pub enum Class {
    Pass,
    Refused(HttpAnswer),
    Decide(String),
}

/// The method policy, failing closed: `tools/call` is decided (on `tool`); `initialize`, `ping`,
/// `tools/list` and `notifications/*` pass, as any method the settings allow; anything else is
/// refused. `door` names the door and `source` says how to send a method, for the refusal's words.
pub fn classify(
    method: Option<&str>,
    tool: Option<&str>,
    settings: &ExtAuthzSettings,
    rpc_id: &Value,
    (door, source): (&str, &str),
) -> Class {
    let Some(method) = method else {
        return Class::Refused(HttpAnswer::rejected(
            403,
            Code::PermissionDenied,
            RPC_INVALID_REQUEST,
            format!("no MCP method: {source}"),
            rpc_id,
        ));
    };
    if method == TOOLS_CALL {
        return match tool {
            Some(tool) => Class::Decide(tool.to_owned()),
            None => Class::Refused(HttpAnswer::rejected(
                400,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                "`mcp-name`: required for `tools/call` (or `params.name` in the forwarded body)".to_owned(),
                rpc_id,
            )),
        };
    }
    if PASSING.contains(&method)
        || method.starts_with(NOTIFICATIONS)
        || settings.allowed_methods.iter().any(|allowed| allowed == method)
    {
        return Class::Pass;
    }
    Class::Refused(HttpAnswer::rejected(
        403,
        Code::PermissionDenied,
        RPC_REFUSED,
        format!(
            "MCP method `{method}` is not allowed through {door}: only `tools/call` is decided; allow \
             others with `--ext-authz-allow-method`"
        ),
        rpc_id,
    ))
}
