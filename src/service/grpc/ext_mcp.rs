//! agentgateway's door: the ExtMCP callout (`agentgateway.dev.ext_mcp.ExtMcp`, the `remote`
//! processor of agentgateway's `mcpGuardrails` policy), an adapter over the decision pipeline like
//! capgate's own door (docs/gateways/agentgateway.md, docs/decisions/0028).
//!
//! agentgateway calls `CheckRequest` before it forwards an MCP request to a backend and
//! `CheckResponse` before it returns a backend's result:
//!
//! | call | method | capgate |
//! |---|---|---|
//! | `CheckRequest` | `tools/call` | the decision on `<service_names[0]>__<params.name>` with `params.arguments` (absent: not forwarded, so a grant that reads one denies `arguments_missing`): `Pass` with the decision's headers and metadata, or an `AuthorizationError` with the reason |
//! | `CheckRequest` | `initialize`, `ping`, `tools/list`, `notifications/*` | `Pass` without a decision (nothing is executed) |
//! | `CheckRequest` | anything else | `PERMISSION_DENIED`: fail closed |
//! | `CheckResponse` | `tools/list` | the result cut to the tools the caller may see (the listing's function), as `mutated` |
//! | `CheckResponse` | anything else | `Pass` |
//!
//! The caller travels in `metadata_context`, which the gateway's configuration fills: `principal`
//! (`{issuer, subject, attributes}`: an assertion, so only for gateways trusted to assert) or the
//! caller's own credential (`token`: a bearer JWT; `api_key`), with an optional `issuer` hint and
//! `request_id`; without either, the forwarded `authorization: Bearer` header or the API-key
//! header. The gateway itself authenticates as on every capgate call.
//!
//! Every refusal is an answered `AuthorizationError`, never a gRPC error, so that it holds
//! whatever the processor's `failureMode` says (agentgateway lets a call through on a gRPC error
//! when it fails open). The one exception is the gateway's own token, as on every door.
//!
//! What agentgateway does with an error (`translate_error` in its `mcp/guardrails/client.rs`):
//! the JSON-RPC error's `code` comes from the class (`PERMISSION_DENIED` -32001,
//! `RESOURCE_EXHAUSTED` -32003, `INVALID` -32600, `UNKNOWN` -32603), its `message` is `reason`, and
//! its `data` is `mcp_error` as given. So `mcp_error` is the data a client reads, shaped as the
//! reference gateways shape theirs: `{code, message, pointer, decision_id, policy_version, …}`.

use std::collections::HashSet;
use std::sync::Arc;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{json, Map, Value as Json};
use tonic::{Request, Response, Status};

use capgate_core::access::{Decision, ReasonCode};

use crate::identity::Presented;
use crate::service::auth::Role;
use crate::service::bounds;
use crate::service::config::ExtAuthzSettings;
use crate::service::identify::{Asked, AssertedCaller};
use crate::service::pipeline::{self, Answer, Ask, Refusal, Remember, Replied, Target, Verdict};
use crate::service::proxied::{ACCOUNT_HEADER, DECISION_ID_HEADER};
use crate::service::State;
use crate::store::{Door, Store};
use crate::wire::ext_mcp::{
    authorization_error, ext_mcp_server::ExtMcp, mcp_request_result, mcp_response_result, AuthorizationError,
    HeaderMutation, McpHeader, McpRequest, McpRequestResult, McpResponse, McpResponseResult, Pass,
};

/// The longest method name taken (MCP's are a few words).
const MAX_METHOD: usize = 128;
/// The most backends one call may fan out to.
const MAX_SERVICES: usize = 256;
/// The most headers a call may forward (agentgateway's filter picks them).
const MAX_HEADERS: usize = 256;

/// The ExtMCP service over a store.
pub struct ExtMcpDoor<S: Store> {
    state: Arc<State<S>>,
    /// The header that carries a `static-key` issuer's key when `metadata_context` has no
    /// credential (`--ext-authz-api-key-header`, lower-case).
    api_key_header: String,
}

impl<S: Store> ExtMcpDoor<S> {
    pub fn new(state: Arc<State<S>>, settings: &ExtAuthzSettings) -> Self {
        ExtMcpDoor {
            state,
            api_key_header: settings.api_key_header.clone(),
        }
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
        "initialize" | "server/discover" | "ping" | "tools/list" => Method::Harmless,
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
            service_names,
            method: name,
            metadata_context,
            mcp_request,
            headers,
        } = request.into_inner();
        if let Err(status) = check_call(&service_names, &name, &headers) {
            return Ok(Response::new(refused(&Refused::invalid(status.message()))));
        }
        match method(&name) {
            Method::Harmless => return Ok(Response::new(passed())),
            Method::Other => {
                return Ok(Response::new(refused(&Refused::new(
                    authorization_error::Code::PermissionDenied,
                    "method_refused",
                    format!(
                        "`{name}` is neither a tools/call capgate decides nor a method known to execute \
                         nothing: refused"
                    ),
                ))))
            }
            Method::Call => {}
        }
        let [service] = service_names.as_slice() else {
            return Ok(Response::new(refused(&Refused::invalid(
                "`service_names`: a `tools/call` goes to exactly one backend",
            ))));
        };
        let mut params = match mcp_request.as_deref().map(serde_json::from_slice::<Json>) {
            Some(Ok(params)) => params,
            Some(Err(error)) => {
                return Ok(Response::new(refused(&Refused::invalid(&format!(
                    "`mcp_request`: not JSON ({error})"
                )))))
            }
            None => Json::Null,
        };
        // Moved out of the parsed params, not copied.
        let arguments = match params
            .as_object_mut()
            .and_then(|params| params.remove("arguments"))
        {
            None => None,
            Some(Json::Object(arguments)) => Some(Arc::new(arguments)),
            Some(_) => {
                return Ok(Response::new(refused(&Refused::invalid(
                    "`mcp_request.arguments`: not an object",
                ))))
            }
        };
        let Some(tool) = params.get("name").and_then(Json::as_str) else {
            return Ok(Response::new(refused(&Refused::invalid(
                "`mcp_request.name`: a `tools/call` names its tool",
            ))));
        };
        let exposed = format!("{service}__{tool}");
        let context = metadata_context.unwrap_or_default();
        let forwarded = Forwarded::of(&headers, &self.api_key_header);
        let caller = match caller(&context, &forwarded) {
            Ok(caller) => caller,
            Err(status) => return Ok(Response::new(refused(&Refused::invalid(status.message())))),
        };
        let request_id = text(&context, "request_id");
        if let Err(status) = bounds::texts(&[
            ("mcp_request.name", &exposed, bounds::MAX_TARGET),
            (
                "metadata_context.request_id",
                request_id.unwrap_or_default(),
                bounds::MAX_REQUEST_ID,
            ),
        ]) {
            return Ok(Response::new(refused(&Refused::invalid(status.message()))));
        }
        let active = match pipeline::current(&self.state) {
            Ok(active) => active,
            Err(refusal) => return Ok(Response::new(refused(&Refused::from(&refusal)))),
        };
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id,
            door: Door::ExtMcp,
            retry_facts: Vec::new(),
            arguments,
            replayable: pipeline::every_answer,
        };
        let encode: Remember =
            Arc::new(|answer: &Answer<'_>| prost::Message::encode_to_vec(&checked(answer)));
        match pipeline::decide(&self.state, &active, ask, Target::Tool(&exposed), &encode).await {
            Ok(Replied::Fresh(answer)) => Ok(Response::new(checked(&answer))),
            Ok(Replied::Replayed(bytes)) => {
                let replayed = prost::Message::decode(bytes.as_slice()).unwrap_or_else(|error| {
                    tracing::error!(%error, "a remembered ExtMCP answer does not decode");
                    refused(&Refused::new(
                        authorization_error::Code::Unknown,
                        "capgate_unavailable",
                        "the remembered answer to this request_id cannot be read".to_owned(),
                    ))
                });
                Ok(Response::new(replayed))
            }
            Err(refusal) => Ok(Response::new(refused(&Refused::from(&refusal)))),
        }
    }

    async fn check_response(
        &self,
        request: Request<McpResponse>,
    ) -> Result<Response<McpResponseResult>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let McpResponse {
            service_names,
            method: name,
            metadata_context,
            mcp_response,
        } = request.into_inner();
        if let Err(status) = check_call(&service_names, &name, &[]) {
            return Ok(Response::new(response_refused(&Refused::invalid(
                status.message(),
            ))));
        }
        if name != "tools/list" {
            return Ok(Response::new(McpResponseResult {
                result: Some(mcp_response_result::Result::Pass(Pass {})),
            }));
        }
        let context = metadata_context.unwrap_or_default();
        let caller = match caller(&context, &Forwarded::default()) {
            Ok(caller) => caller,
            Err(status) => {
                return Ok(Response::new(response_refused(&Refused::invalid(
                    status.message(),
                ))))
            }
        };
        let mut result: Json = match serde_json::from_slice(&mcp_response) {
            Ok(result) => result,
            Err(error) => {
                return Ok(Response::new(response_refused(&Refused::invalid(&format!(
                    "`mcp_response`: not JSON ({error})"
                )))))
            }
        };
        let active = match pipeline::current(&self.state) {
            Ok(active) => active,
            Err(refusal) => return Ok(Response::new(response_refused(&Refused::from(&refusal)))),
        };
        let ask = Ask {
            gateway: &gateway,
            caller,
            request_id: None,
            door: Door::ExtMcp,
            retry_facts: Vec::new(),
            arguments: None,
            replayable: pipeline::every_answer,
        };
        let listing = match pipeline::list(&self.state, &active, ask).await {
            Ok(listing) => listing,
            Err(refusal) => return Ok(Response::new(response_refused(&Refused::from(&refusal)))),
        };
        let seen = match &listing.seen {
            Ok(seen) => seen,
            Err(problem) => {
                let mut refusal = Refused::new(
                    authorization_error::Code::PermissionDenied,
                    problem.as_str(),
                    format!("the caller is not authenticated: {}", problem.describe()),
                );
                refusal
                    .data
                    .insert("decision_id".into(), json!(listing.decision_id));
                return Ok(Response::new(response_refused(&refusal)));
            }
        };
        // The names a backend's tool may have in the listing: its own (one backend), agentgateway's
        // multiplexed `<service>_<tool>` (several), or capgate's exposed `<upstream>__<tool>`.
        let visible: HashSet<String> = seen
            .tools
            .iter()
            .flat_map(|tool| {
                let native = service_names
                    .iter()
                    .filter(|service| **service == tool.upstream)
                    .flat_map(|service| [tool.name.clone(), format!("{service}_{}", tool.name)]);
                let single = service_names.len() == 1;
                native
                    .filter(move |name| single || *name != tool.name)
                    .chain([tool.exposed_name.clone()])
                    .collect::<Vec<_>>()
            })
            .collect();
        if let Some(Json::Array(tools)) = result.get_mut("tools") {
            // Only tools the caller may call stay; a tool without a name is not one of them.
            tools.retain(|tool| {
                tool.get("name")
                    .and_then(Json::as_str)
                    .is_some_and(|name| visible.contains(name))
            });
        }
        Ok(Response::new(McpResponseResult {
            result: Some(mcp_response_result::Result::Mutated(
                result.to_string().into_bytes(),
            )),
        }))
    }
}

/// The backends, the method and the forwarded headers, within bounds.
fn check_call(service_names: &[String], method: &str, headers: &[McpHeader]) -> Result<(), Status> {
    if service_names.len() > MAX_SERVICES {
        return Err(Status::invalid_argument(format!(
            "`service_names`: {} backends, more than the limit of {MAX_SERVICES}",
            service_names.len()
        )));
    }
    if headers.len() > MAX_HEADERS {
        return Err(Status::invalid_argument(format!(
            "`headers`: {} headers, more than the limit of {MAX_HEADERS}",
            headers.len()
        )));
    }
    let mut fields: Vec<(&str, &str, usize)> = service_names
        .iter()
        .map(|service| ("service_names", service.as_str(), bounds::MAX_TARGET))
        .collect();
    fields.push(("method", method, MAX_METHOD));
    bounds::texts(&fields)
}

/// A string field of a `Struct`.
fn text<'a>(object: &'a Struct, key: &str) -> Option<&'a str> {
    match object.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(text) => Some(text.as_str()),
        _ => None,
    }
}

/// The caller's credential as the HTTP request carried it (agentgateway forwards the headers its
/// `requestHeaders` filter lets through). A value that is not UTF-8 is no credential.
#[derive(Default)]
struct Forwarded<'a> {
    bearer: Option<&'a str>,
    api_key: Option<&'a str>,
}

impl<'a> Forwarded<'a> {
    fn of(headers: &'a [McpHeader], api_key_header: &str) -> Forwarded<'a> {
        let value = |name: &str| {
            headers
                .iter()
                .find(|header| header.key.eq_ignore_ascii_case(name))
                .and_then(|header| std::str::from_utf8(&header.value).ok())
        };
        Forwarded {
            bearer: value("authorization").and_then(|value| value.strip_prefix("Bearer ")),
            api_key: value(api_key_header),
        }
    }
}

/// Who the call is for: the gateway's `metadata_context` (an assertion, or the credential its
/// configuration picked), else the credential the forwarded headers carry.
fn caller<'a>(context: &'a Struct, forwarded: &Forwarded<'a>) -> Result<Asked<'a>, Status> {
    let hint = text(context, "issuer");
    if let Some(principal) = context.fields.get("principal") {
        return asserted(principal);
    }
    let (field, presented) = if let Some(token) = text(context, "token") {
        // A gateway often forwards the whole header.
        let token = token.strip_prefix("Bearer ").unwrap_or(token);
        (
            "metadata_context.token",
            Some((token, Presented::BearerToken(token))),
        )
    } else if let Some(key) = text(context, "api_key") {
        ("metadata_context.api_key", Some((key, Presented::ApiKey(key))))
    } else if let Some(token) = forwarded.bearer {
        (
            "headers.authorization",
            Some((token, Presented::BearerToken(token))),
        )
    } else if let Some(key) = forwarded.api_key {
        ("headers (API key)", Some((key, Presented::ApiKey(key))))
    } else {
        ("metadata_context.token", None)
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

/// `metadata_context.principal`: `{issuer, subject, attributes}`, an attribute a string or a list
/// of strings.
fn asserted(principal: &Value) -> Result<Asked<'_>, Status> {
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
    Ok(Asked::Principal(AssertedCaller {
        issuer,
        subject,
        attributes,
    }))
}

fn passed() -> McpRequestResult {
    McpRequestResult {
        result: Some(mcp_request_result::Result::Pass(Pass {})),
        header_mutation: None,
        metadata: None,
    }
}

/// A refusal as agentgateway shows it to the client: the class (the JSON-RPC code) and the error's
/// `data`, whose `code` is the reason code, and whose `message` is capgate's own line.
struct Refused {
    class: authorization_error::Code,
    data: Map<String, Json>,
}

impl Refused {
    fn new(class: authorization_error::Code, code: &str, message: String) -> Refused {
        let mut data = Map::new();
        data.insert("code".into(), json!(code));
        data.insert("message".into(), json!(message));
        Refused { class, data }
    }

    /// A request the door cannot take as sent.
    fn invalid(message: &str) -> Refused {
        Refused::new(
            authorization_error::Code::Invalid,
            "invalid_request",
            message.to_owned(),
        )
    }

    fn from(refusal: &Refusal) -> Refused {
        match refusal {
            Refusal::PermissionDenied(message) => Refused::new(
                authorization_error::Code::PermissionDenied,
                "permission_denied",
                message.clone(),
            ),
            Refusal::Unavailable(message) => Refused::new(
                authorization_error::Code::Unknown,
                "capgate_unavailable",
                message.clone(),
            ),
            Refusal::RequestIdReused { request_id, reuse } => Refused::new(
                authorization_error::Code::Invalid,
                "request_id_reused",
                pipeline::reused("metadata_context.request_id", request_id, *reuse),
            ),
        }
    }

    fn error(&self) -> AuthorizationError {
        let code = self.data.get("code").and_then(Json::as_str).unwrap_or_default();
        let message = self
            .data
            .get("message")
            .and_then(Json::as_str)
            .unwrap_or_default();
        AuthorizationError {
            code: self.class.into(),
            reason: format!("denied: {code}: {message}"),
            mcp_error: Some(Json::Object(self.data.clone()).to_string().into_bytes()),
        }
    }
}

fn refused(refusal: &Refused) -> McpRequestResult {
    McpRequestResult {
        result: Some(mcp_request_result::Result::Error(refusal.error())),
        header_mutation: None,
        metadata: None,
    }
}

fn response_refused(refusal: &Refused) -> McpResponseResult {
    McpResponseResult {
        result: Some(mcp_response_result::Result::Error(refusal.error())),
    }
}

/// The decision as agentgateway takes it: `Pass` for an allow, with the decision's headers for the
/// backend (as Envoy's door sets them) and its metadata for the gateway's later policies
/// (`mcpGuardrails.account` picks the account's credential); an error whose data carries the
/// code, the pointer and the decision id for anything else.
fn checked(answer: &Answer<'_>) -> McpRequestResult {
    let mut refusal = match &answer.verdict {
        Verdict::Decided(decided) => match &decided.decision {
            Decision::Allow(allow) => {
                let account = allow.account.id.as_str();
                let header = |key: &str, value: &str| McpHeader {
                    key: key.to_owned(),
                    value: value.as_bytes().to_vec(),
                };
                let metadata: [(&str, &str); 4] = [
                    ("decision_id", &answer.decision_id),
                    ("account", account),
                    ("code", "granted"),
                    ("policy_version", &answer.active.version),
                ];
                return McpRequestResult {
                    result: Some(mcp_request_result::Result::Pass(Pass {})),
                    header_mutation: Some(HeaderMutation {
                        set: vec![
                            header(DECISION_ID_HEADER, &answer.decision_id),
                            header(ACCOUNT_HEADER, account),
                        ],
                        remove: Vec::new(),
                    }),
                    metadata: Some(Struct {
                        fields: metadata
                            .into_iter()
                            .map(|(key, value)| {
                                let value = Value {
                                    kind: Some(Kind::StringValue(value.to_owned())),
                                };
                                (key.to_owned(), value)
                            })
                            .collect(),
                    }),
                };
            }
            Decision::Deny(reason) => {
                let class = match reason.code {
                    ReasonCode::LimitExhausted => authorization_error::Code::ResourceExhausted,
                    ReasonCode::UsageUnknown => authorization_error::Code::Unknown,
                    _ => authorization_error::Code::PermissionDenied,
                };
                let mut refusal = Refused::new(class, reason.code.as_str(), reason.message());
                refusal.data.insert("pointer".into(), json!(reason.path));
                if let Some(resets_at) = decided.resets_at {
                    let seconds = (resets_at - answer.at_ms).max(0).unsigned_abs().div_ceil(1000);
                    refusal.data.insert("retry_after_seconds".into(), json!(seconds));
                    refusal
                        .data
                        .insert("resets_at".into(), json!(crate::clock::format(resets_at)));
                }
                refusal
            }
        },
        Verdict::Unauthenticated(problem) => Refused::new(
            authorization_error::Code::PermissionDenied,
            problem.as_str(),
            format!("the caller is not authenticated: {}", problem.describe()),
        ),
        Verdict::UnknownTool(name) => Refused::new(
            authorization_error::Code::PermissionDenied,
            "unknown_tool",
            crate::wire::convert::unknown_tool_message(name, &answer.active.policy.tools),
        ),
    };
    refusal
        .data
        .insert("decision_id".into(), json!(answer.decision_id));
    refusal
        .data
        .insert("policy_version".into(), json!(answer.active.version));
    refused(&refusal)
}
