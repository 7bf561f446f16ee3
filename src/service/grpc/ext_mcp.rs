//! agentgateway's door: the ExtMCP callout (`agentgateway.dev.ext_mcp.ExtMcp`), an adapter over
//! the decision pipeline like capgate's own door (docs/gateways/agentgateway.md).
//!
//! agentgateway calls `CheckRequest` before it forwards an MCP request to a backend and
//! `CheckResponse` before it returns a backend's result:
//!
//! | call | method | capgate |
//! |---|---|---|
//! | `CheckRequest` | `tools/call` | the decision on `<service_name>__<params.name>`: `Pass`, or an `AuthorizationError` with the reason |
//! | `CheckRequest` | `initialize`, `ping`, `tools/list`, `notifications/*` | `Pass` without a decision (nothing is executed) |
//! | `CheckRequest` | anything else | `PERMISSION_DENIED`: fail closed |
//! | `CheckResponse` | `tools/list` | the result cut to the tools the caller may see (the listing's function), as `mutated` |
//! | `CheckResponse` | anything else | `Pass` |
//!
//! The caller travels in `metadata_context`, which the gateway's configuration fills:
//! `principal` (`{issuer, subject, attributes}`: an assertion, so only for gateways trusted to
//! assert) or the caller's own credential (`token`: a bearer JWT; `api_key`), with an optional
//! `issuer` hint and `request_id`. The gateway itself authenticates as on every capgate call.

use std::sync::Arc;

use prost::Message;
use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use tonic::{Request, Response, Status};

use crate::identity::Presented;
use crate::service::auth::Role;
use crate::service::bounds;
use crate::service::identify::{Asked, AssertedCaller};
use crate::service::pipeline::{self, Answer, Ask, Refusal, Remember, Replied, Target, Verdict};
use crate::service::State;
use crate::store::{Door, Store};
use crate::wire::ext_mcp::{
    authorization_error, ext_mcp_server::ExtMcp, mcp_request_result, mcp_response_result, AuthorizationError,
    McpRequest, McpRequestResult, McpResponse, McpResponseResult, Pass,
};
use capgate_core::access::{Decision, ReasonCode};

/// The longest method name taken (MCP's are a few words).
const MAX_METHOD: usize = 128;

/// The ExtMCP service over a store.
pub struct ExtMcpDoor<S: Store> {
    state: Arc<State<S>>,
}

impl<S: Store> ExtMcpDoor<S> {
    pub fn new(state: Arc<State<S>>) -> Self {
        ExtMcpDoor { state }
    }
}

/// What a request's method asks of capgate.
enum Method {
    /// A tool is about to be executed: decide.
    Call,
    /// Nothing is executed (the session, a listing whose result is filtered later): pass.
    Harmless,
    /// Not known to be harmless: refuse.
    Other,
}

fn method(name: &str) -> Method {
    match name {
        "tools/call" => Method::Call,
        "initialize" | "ping" | "tools/list" => Method::Harmless,
        notification if notification.starts_with("notifications/") => Method::Harmless,
        _ => Method::Other,
    }
}

#[tonic::async_trait]
impl<S: Store> ExtMcp for ExtMcpDoor<S> {
    async fn check_request(
        &self,
        request: Request<McpRequest>,
    ) -> Result<Response<McpRequestResult>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let McpRequest {
            service_name,
            method: name,
            metadata_context,
            mcp_request,
        } = request.into_inner();
        check_lengths(&service_name, &name)?;
        match method(&name) {
            Method::Harmless => return Ok(Response::new(passed())),
            Method::Other => {
                return Ok(Response::new(refused_request(
                    authorization_error::Code::PermissionDenied,
                    format!("`{name}` is neither a tools/call capgate decides nor a method known to execute nothing: refused"),
                )))
            }
            Method::Call => {}
        }
        let context = metadata_context.unwrap_or_default();
        let params = mcp_request.unwrap_or_default();
        let Some(tool) = text(&params, "name") else {
            return Ok(Response::new(refused_request(
                authorization_error::Code::Invalid,
                "`mcp_request.name`: a `tools/call` names its tool".to_owned(),
            )));
        };
        let exposed = format!("{service_name}__{tool}");
        let caller = caller(&context)?;
        let request_id = text(&context, "request_id");
        bounds::texts(&[
            ("mcp_request.name", &exposed, bounds::MAX_TARGET),
            (
                "metadata_context.request_id",
                request_id.unwrap_or_default(),
                bounds::MAX_REQUEST_ID,
            ),
        ])?;
        let active = pipeline::current(&self.state).map_err(super::status)?;
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id,
            door: Door::ExtMcp,
            retry_facts: Vec::new(),
        };
        let encode: Remember = Arc::new(|answer: &Answer<'_>| checked(answer).encode_to_vec());
        let replied = match pipeline::decide(&self.state, &active, ask, Target::Tool(&exposed), &encode).await
        {
            Ok(replied) => replied,
            // An answer, not a gRPC error: agentgateway may be set to let a request through when
            // the callout fails (docs/decisions/0027 §4).
            Err(Refusal::RequestIdReused { request_id }) => {
                return Ok(Response::new(reused_request(&request_id)))
            }
            Err(refusal) => return Err(super::status(refusal)),
        };
        match replied {
            Replied::Fresh(answer) => Ok(Response::new(checked(&answer))),
            Replied::Replayed(bytes) => McpRequestResult::decode(bytes.as_slice())
                .map(Response::new)
                .map_err(|error| {
                    tracing::error!(%error, "a remembered ExtMCP answer does not decode");
                    Status::internal("the remembered answer to this request_id cannot be read")
                }),
        }
    }

    async fn check_response(
        &self,
        request: Request<McpResponse>,
    ) -> Result<Response<McpResponseResult>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let McpResponse {
            service_name,
            method: name,
            metadata_context,
            mcp_response,
        } = request.into_inner();
        check_lengths(&service_name, &name)?;
        if name != "tools/list" {
            return Ok(Response::new(McpResponseResult {
                result: Some(mcp_response_result::Result::Pass(Pass {})),
            }));
        }
        let context = metadata_context.unwrap_or_default();
        let caller = caller(&context)?;
        let active = pipeline::current(&self.state).map_err(super::status)?;
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id: None,
            door: Door::ExtMcp,
            retry_facts: Vec::new(),
        };
        let listing = pipeline::list(&self.state, &active, ask)
            .await
            .map_err(super::status)?;
        let seen = match &listing.seen {
            Ok(seen) => seen,
            Err(problem) => {
                return Ok(Response::new(McpResponseResult {
                    result: Some(mcp_response_result::Result::Error(AuthorizationError {
                        code: authorization_error::Code::PermissionDenied.into(),
                        reason: format!(
                            "unauthenticated: {} (decision {})",
                            problem.as_str(),
                            listing.decision_id
                        ),
                        mcp_error: None,
                    })),
                }))
            }
        };
        // agentgateway lists one backend in its own names (`service_name` is that backend), or
        // several multiplexed under names of its own. A tool stays when it is a visible tool of
        // the named backend, or is named as capgate exposes it; any other name is cut: fail closed.
        let visible: std::collections::HashSet<&str> = seen
            .tools
            .iter()
            .flat_map(|tool| {
                let native = (tool.upstream == service_name).then_some(tool.name.as_str());
                native.into_iter().chain([tool.exposed_name.as_str()])
            })
            .collect();
        let mut result = mcp_response.unwrap_or_default();
        if let Some(Value {
            kind: Some(Kind::ListValue(ListValue { values })),
        }) = result.fields.get_mut("tools")
        {
            // Only tools the caller may call stay; a tool without a name is not one of them.
            values.retain(|tool| match &tool.kind {
                Some(Kind::StructValue(tool)) => {
                    text(tool, "name").is_some_and(|name| visible.contains(name))
                }
                _ => false,
            });
        }
        Ok(Response::new(McpResponseResult {
            result: Some(mcp_response_result::Result::Mutated(result)),
        }))
    }
}

/// The backend's name and the method, within bounds.
fn check_lengths(service_name: &str, method: &str) -> Result<(), Status> {
    bounds::texts(&[
        ("service_name", service_name, bounds::MAX_TARGET),
        ("method", method, MAX_METHOD),
    ])
}

/// A string field of a `Struct`.
fn text<'a>(object: &'a Struct, key: &str) -> Option<&'a str> {
    match object.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(text) => Some(text.as_str()),
        _ => None,
    }
}

/// Who the call is for, from the gateway's `metadata_context`.
fn caller(context: &Struct) -> Result<Asked<'_>, Status> {
    let hint = text(context, "issuer");
    if let Some(principal) = context.fields.get("principal") {
        let Some(Kind::StructValue(principal)) = &principal.kind else {
            return Err(Status::invalid_argument(
                "`metadata_context.principal`: an object {issuer, subject, attributes}",
            ));
        };
        let (Some(issuer), Some(subject)) = (text(principal, "issuer"), text(principal, "subject")) else {
            return Err(Status::invalid_argument(
                "`metadata_context.principal`: `issuer` and `subject` are required strings",
            ));
        };
        let mut attributes = Vec::new();
        if let Some(Value {
            kind: Some(Kind::StructValue(given)),
        }) = principal.fields.get("attributes")
        {
            for (name, value) in &given.fields {
                match &value.kind {
                    Some(Kind::StringValue(value)) => attributes.push((name.as_str(), value.as_str())),
                    Some(Kind::ListValue(ListValue { values })) => {
                        for value in values {
                            if let Some(Kind::StringValue(value)) = &value.kind {
                                attributes.push((name.as_str(), value.as_str()));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        if attributes.len() > bounds::MAX_ATTRIBUTES {
            return Err(Status::invalid_argument(format!(
                "`metadata_context.principal.attributes`: {} values, more than the limit of {}",
                attributes.len(),
                bounds::MAX_ATTRIBUTES
            )));
        }
        let mut fields = vec![
            ("metadata_context.principal.issuer", issuer, bounds::MAX_ISSUER),
            ("metadata_context.principal.subject", subject, bounds::MAX_SUBJECT),
        ];
        for (name, value) in &attributes {
            fields.push((
                "metadata_context.principal.attributes",
                name,
                bounds::MAX_ATTRIBUTE_NAME,
            ));
            fields.push((
                "metadata_context.principal.attributes",
                value,
                bounds::MAX_ATTRIBUTE_VALUE,
            ));
        }
        bounds::texts(&fields)?;
        return Ok(Asked::Principal(AssertedCaller {
            issuer,
            subject,
            attributes,
        }));
    }
    let (field, presented) = if let Some(token) = text(context, "token") {
        // A gateway often forwards the whole header.
        let token = token.strip_prefix("Bearer ").unwrap_or(token);
        (
            "metadata_context.token",
            Some((token, Presented::BearerToken(token))),
        )
    } else {
        let key = text(context, "api_key");
        (
            "metadata_context.api_key",
            key.map(|key| (key, Presented::ApiKey(key))),
        )
    };
    bounds::texts(&[
        (
            "metadata_context.issuer",
            hint.unwrap_or_default(),
            bounds::MAX_ISSUER,
        ),
        (
            field,
            presented.as_ref().map_or("", |(value, _)| value),
            bounds::MAX_CREDENTIAL,
        ),
    ])?;
    Ok(Asked::Credential {
        presented: presented.map(|(_, presented)| presented),
        hint,
    })
}

fn passed() -> McpRequestResult {
    McpRequestResult {
        result: Some(mcp_request_result::Result::Pass(Pass {})),
    }
}

fn refused_request(code: authorization_error::Code, reason: String) -> McpRequestResult {
    McpRequestResult {
        result: Some(mcp_request_result::Result::Error(AuthorizationError {
            code: code.into(),
            reason,
            mcp_error: None,
        })),
    }
}

/// A `tools/call` refused for reusing another request's `request_id`: nothing was decided.
fn reused_request(request_id: &str) -> McpRequestResult {
    let reason = pipeline::reused("metadata_context.request_id", request_id);
    let data = Struct {
        fields: [("code".to_owned(), string("request_id_reused"))]
            .into_iter()
            .collect(),
    };
    let mcp_error = Struct {
        fields: [
            ("code".to_owned(), number(-32600.0)),
            ("message".to_owned(), string(&reason)),
            (
                "data".to_owned(),
                Value {
                    kind: Some(Kind::StructValue(data)),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    McpRequestResult {
        result: Some(mcp_request_result::Result::Error(AuthorizationError {
            code: authorization_error::Code::Invalid.into(),
            reason,
            mcp_error: Some(mcp_error),
        })),
    }
}

/// The decision as agentgateway takes it: `Pass` for an allow; an error whose reason and JSON-RPC
/// payload carry the code, the pointer and the decision id for anything else.
fn checked(answer: &Answer<'_>) -> McpRequestResult {
    let (code, reason_code, pointer, message) = match &answer.verdict {
        Verdict::Decided(decided) => match &decided.decision {
            Decision::Allow(_) => return passed(),
            Decision::Deny(deny) => {
                let reason = deny;
                let code = match reason.code {
                    ReasonCode::LimitExhausted => authorization_error::Code::ResourceExhausted,
                    ReasonCode::UsageUnknown => authorization_error::Code::Unknown,
                    _ => authorization_error::Code::PermissionDenied,
                };
                (code, reason.code.as_str(), reason.path, reason.message())
            }
        },
        Verdict::Unauthenticated(problem) => (
            authorization_error::Code::PermissionDenied,
            problem.as_str(),
            "",
            problem.describe().to_owned(),
        ),
        Verdict::UnknownTool(name) => (
            authorization_error::Code::PermissionDenied,
            "unknown_tool",
            "",
            crate::wire::convert::unknown_tool_message(name),
        ),
    };
    let reason = if pointer.is_empty() {
        format!("{reason_code} (decision {}): {message}", answer.decision_id)
    } else {
        format!(
            "{reason_code} at {pointer} (decision {}): {message}",
            answer.decision_id
        )
    };
    let data = Struct {
        fields: [
            ("decision_id", answer.decision_id.as_str()),
            ("code", reason_code),
            ("pointer", pointer),
            ("policy_version", answer.active.version.as_str()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), string(value)))
        .collect(),
    };
    let mcp_error = Struct {
        fields: [
            ("code".to_owned(), number(json_rpc_code(code))),
            ("message".to_owned(), string(&reason)),
            (
                "data".to_owned(),
                Value {
                    kind: Some(Kind::StructValue(data)),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    McpRequestResult {
        result: Some(mcp_request_result::Result::Error(AuthorizationError {
            code: code.into(),
            reason,
            mcp_error: Some(mcp_error),
        })),
    }
}

/// The JSON-RPC error code a client sees: implementation-defined server errors.
fn json_rpc_code(code: authorization_error::Code) -> f64 {
    match code {
        authorization_error::Code::ResourceExhausted => -32029.0,
        authorization_error::Code::Unknown => -32003.0,
        _ => -32001.0,
    }
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn number(value: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(value)),
    }
}
