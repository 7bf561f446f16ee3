//! Envoy's door: `envoy.service.auth.v3.Authorization/Check` (ext_authz v3), so that Envoy,
//! Envoy Gateway, Istio (`CUSTOM`), kgateway and Kuadrant call capgate with no code of their own
//! (docs/gateways/envoy.md, docs/decisions/0017-ext-authz.md).
//!
//! It lives next to `decisions.rs` because it is the same kind of door: a gRPC service on the
//! same listener, behind the same gateway tokens, TLS, connection limits and RPC layer. Like every
//! door it converts and adds nothing: the forwarded HTTP request becomes an [`Ask`] and a
//! [`Target`], the pipeline decides and audits (`door = ext_authz`), and the answer becomes a
//! `CheckResponse`.
//!
//! From the forwarded request:
//!
//! | what | where it is read, first found wins |
//! |---|---|
//! | MCP method | `mcp-method` header (MCP 2026-07-28), `mcp_proxy` metadata `method` (Envoy's MCP filter), `x-mcp-method` (Kuadrant), the JSON-RPC body |
//! | tool name | `mcp-name` header, `mcp_proxy` metadata `params.name`, `x-mcp-toolname` (Kuadrant), the body's `params.name` |
//! | server name (for an un-prefixed tool) | `context_extensions.mcp_server` (the route's), `x-mcp-servername` header |
//! | caller | `authorization: Bearer …`, the API-key header (`--ext-authz-api-key-header`), `x-forwarded-client-cert`, `source.certificate` (PEM), `source.principal` |
//! | `request_id` | `x-request-id`, else `request.http.id` |
//!
//! A body, when Envoy forwards it (`with_request_body`), is parsed as JSON-RPC and must agree
//! with every header it overlaps: a request that says one thing to the router and another to
//! the upstream is refused. A `tools/call` body's `params.arguments` (an object, or absent) are
//! the arguments a grant's conditions read; without a body, or without `arguments` in it, the
//! arguments were not forwarded, and a grant that reads one denies `arguments_missing`. A body
//! Envoy cut (`x-envoy-auth-partial-body: true`) is refused whole, as before: it is never read
//! for a method, a tool or arguments. Methods, failing closed: `tools/call` is decided; `initialize`,
//! `ping`, `tools/list` and `notifications/*` pass without a decision (ext_authz cannot filter a
//! response); any other method is refused unless `--ext-authz-allow-method` names it.
//!
//! Every refusal is an answered `CheckResponse` denial, never a gRPC error, so that it holds
//! whatever the filter's `failure_mode_allow` says. The one exception is the gateway's own token:
//! an unauthenticated gateway gets `UNAUTHENTICATED`, as on `Decide`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode as HttpCode};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::HttpRequest;
use envoy_types::pb::envoy::service::auth::v3::authorization_server::Authorization;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as ProtoValue};
use envoy_types::pb::google::rpc;
use percent_encoding::percent_decode_str;
use prost::Message;
use serde_json::Value;
use tonic::{Code, Request, Response, Status};

use capgate_core::capabilities::exposed_name;

use crate::identity::Presented;
use crate::service::auth::Role;
use crate::service::bounds;
use crate::service::config::ExtAuthzSettings as Settings;
use crate::service::grpc::lenient::LenientAuthorization;
use crate::service::identify::Asked;
use crate::service::pipeline::{self, Answer, Ask, CallArguments, Refusal, Remember, Replied, Target};
use crate::service::proxied::{
    self, bearer_token, Class, Fact, HttpAnswer, AUTHORIZATION, CLIENT_CERT, KUADRANT_METHOD,
    KUADRANT_SERVER, KUADRANT_TOOL, MCP_METHOD, MCP_NAME, RPC_INVALID_REQUEST, RPC_PARSE_ERROR,
};
use crate::service::State;
use crate::store::{Door, Store};

/// The `context_extensions` key a route sets to name the MCP server behind it.
const SERVER_EXTENSION: &str = "mcp_server";
/// The dynamic metadata namespaces of Envoy's MCP filter: `envoy.filters.http.mcp` since Envoy
/// 1.38, `mcp_proxy` before (and with the runtime guard
/// `mcp_filter_use_new_metadata_namespace` off).
const MCP_METADATA: [&str; 2] = ["envoy.filters.http.mcp", "mcp_proxy"];
const REQUEST_ID: &str = "x-request-id";
/// Set by Envoy when `allow_partial_message` cut the body at `max_request_bytes`.
const PARTIAL_BODY: &str = "x-envoy-auth-partial-body";

/// The ext_authz service over a store.
pub struct ExtAuthz<S: Store> {
    state: Arc<State<S>>,
    settings: Arc<Settings>,
}

impl<S: Store> ExtAuthz<S> {
    pub fn new(state: Arc<State<S>>, settings: Settings) -> Self {
        ExtAuthz {
            state,
            settings: Arc::new(settings),
        }
    }
}

#[tonic::async_trait]
impl<S: Store> Authorization for ExtAuthz<S> {
    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<CheckResponse>, Status> {
        let gateway = self.state.tokens.authorize(request.metadata(), Role::Gateway)?;
        let request = request.into_inner();
        let forwarded = match Forwarded::read(&request, &self.settings) {
            Ok(forwarded) => forwarded,
            Err(rejected) => return Ok(Response::new(rejected.response())),
        };
        let rpc_id = forwarded.rpc_id.clone();
        let tool = match forwarded.class(&self.settings) {
            Class::Pass => return Ok(Response::new(passed())),
            Class::Refused(refused) => return Ok(Response::new(check_response(refused))),
            Class::Decide(tool) => tool,
        };
        let active = match pipeline::current(&self.state) {
            Ok(active) => active,
            Err(refusal) => return Ok(Response::new(refused(&refusal, &rpc_id))),
        };
        let ask = Ask {
            gateway: &gateway,
            caller: forwarded.caller(),
            request_id: forwarded.request_id,
            door: Door::ExtAuthz,
            // What the answer repeats (the JSON-RPC id its body echoes) and what tells Envoy's own
            // retry of this check from a new request with the client's id.
            retry_facts: vec![
                ("received", forwarded.received.clone().unwrap_or_default()),
                ("rpc_id", rpc_id.to_string()),
            ],
            arguments: forwarded.arguments.clone(),
            replayable: pipeline::every_answer,
        };
        let encode: Remember = {
            let rpc_id = rpc_id.clone();
            let api_key_header = self.settings.api_key_header.clone();
            Arc::new(move |answer: &Answer<'_>| response(answer, &rpc_id, &api_key_header).encode_to_vec())
        };
        let replied = match pipeline::decide(&self.state, &active, ask, Target::Tool(&tool), &encode).await {
            Ok(replied) => replied,
            Err(refusal) => return Ok(Response::new(refused(&refusal, &rpc_id))),
        };
        match replied {
            Replied::Fresh(answer) => Ok(Response::new(response(
                &answer,
                &rpc_id,
                &self.settings.api_key_header,
            ))),
            Replied::Replayed(bytes) => CheckResponse::decode(bytes.as_slice())
                .map(Response::new)
                .map_err(|error| {
                    tracing::error!(%error, "a remembered ext_authz response does not decode");
                    Status::internal("the remembered answer to this x-request-id cannot be read")
                }),
        }
    }
}

#[tonic::async_trait]
impl<S: Store> LenientAuthorization for ExtAuthz<S> {
    /// A `CheckRequest` that does not decode is a malformed request: an answered `400`, never a
    /// gRPC error, so that it is refused under `failure_mode_allow: true` too.
    async fn undecodable(&self, why: Request<String>) -> Result<Response<CheckResponse>, Status> {
        self.state.tokens.authorize(why.metadata(), Role::Gateway)?;
        let rejected = Rejected::new(
            HttpCode::BadRequest,
            Code::InvalidArgument,
            RPC_INVALID_REQUEST,
            format!("the forwarded request cannot be read: {}", why.into_inner()),
            &Value::Null,
        );
        Ok(Response::new(rejected.response()))
    }
}

/// What the door read from a `CheckRequest`, borrowed from it; every field within its bound.
struct Forwarded<'a> {
    method: Option<Cow<'a, str>>,
    /// The tool as the client named it, resolved against the server name to the exposed name.
    tool: Option<Cow<'a, str>>,
    /// From `authorization: Bearer …`; another scheme counts as no bearer token.
    bearer: Option<&'a str>,
    api_key: Option<&'a str>,
    /// An XFCC value or a DN, or the peer certificate as PEM (URL encoding undone).
    certificate: Option<Cow<'a, str>>,
    request_id: Option<&'a str>,
    /// When Envoy received the request (`attributes.request.time`, `seconds.nanos`): Envoy asking
    /// again about one request sends the same instant, a new request another, so that a
    /// client's own `x-request-id` names one request only (docs/decisions/0027 §6).
    received: Option<String>,
    /// The JSON-RPC `id` of the body, echoed in an error body.
    rpc_id: Value,
    /// The body's `params.arguments`: `None` when no body was forwarded or it has none.
    arguments: Option<Arc<CallArguments>>,
}

impl<'a> Forwarded<'a> {
    fn read(request: &'a CheckRequest, settings: &Settings) -> Result<Forwarded<'a>, Rejected> {
        let attributes = request.attributes.as_ref();
        let http = attributes.and_then(|attributes| attributes.request.as_ref()?.http.as_ref());
        let headers = Headers::of(http);
        let mut fields = Fields;
        // Counted before any header is read: a request with more headers than a gateway forwards
        // is refused whole, whatever it holds.
        fields.headers(headers.field(), headers.len())?;

        let body = Body::read(http, &headers, &mut fields)?;
        let metadata =
            attributes.and_then(|attributes| McpMetadata::of(attributes.metadata_context.as_ref()));

        let server = attributes
            .and_then(|attributes| attributes.context_extensions.get(SERVER_EXTENSION))
            .map(|server| ("context_extensions.mcp_server", server.as_str()))
            .or_else(|| {
                headers
                    .get(KUADRANT_SERVER)
                    .map(|server| (KUADRANT_SERVER, server))
            });
        let server = match server {
            Some((field, value)) => Some(fields.target(field, value)?),
            None => None,
        }
        // Kuadrant names a server `<namespace>/<name>`; the upstream id is the name.
        .map(|server| server.rsplit('/').next().unwrap_or(server))
        .filter(|server| !server.is_empty());

        // The first source that names the method (or the tool) wins; the body is checked against it.
        let mut method: Option<(&str, Cow<'a, str>)> = None;
        for (field, value) in [
            (MCP_METHOD, headers.get(MCP_METHOD).map(Cow::Borrowed)),
            (
                "metadata_context.mcp_proxy.method",
                metadata.as_ref().and_then(|m| m.method.clone()),
            ),
            (KUADRANT_METHOD, headers.get(KUADRANT_METHOD).map(Cow::Borrowed)),
        ] {
            if let (None, Some(value)) = (&method, value) {
                fields.target(field, &value)?;
                method = Some((field, value));
            }
        }
        let mut tool: Option<(&str, Cow<'a, str>)> = None;
        for (field, value) in [
            (MCP_NAME, headers.get(MCP_NAME).map(Cow::Borrowed)),
            (
                "metadata_context.mcp_proxy.params.name",
                metadata.as_ref().and_then(|m| m.name.clone()),
            ),
            (KUADRANT_TOOL, headers.get(KUADRANT_TOOL).map(Cow::Borrowed)),
        ] {
            if let (None, Some(value)) = (&tool, value) {
                fields.target(field, &value)?;
                tool = Some((field, value));
            }
        }
        let resolve = |name: Cow<'a, str>| -> Cow<'a, str> {
            match server {
                Some(server) if !name.starts_with(&format!("{server}__")) => {
                    Cow::Owned(exposed_name(server, &name))
                }
                _ => name,
            }
        };
        let mut rpc_id = metadata
            .as_ref()
            .map_or(Value::Null, |metadata| metadata.id.clone());
        let mut arguments = None;
        if let Some(body) = body {
            rpc_id = body.id.clone();
            arguments = body.arguments.map(Arc::new);
            if let (Some((field, said)), Some(parsed)) = (&method, &body.method) {
                if said != parsed {
                    return Err(Rejected::disagreement(field, "method", &rpc_id));
                }
            }
            method = method.or(body.method.map(|parsed| ("body", Cow::Owned(parsed))));
            if let (Some((field, said)), Some(parsed)) = (&tool, &body.name) {
                if resolve(said.clone()) != resolve(Cow::Owned(parsed.clone())) {
                    return Err(Rejected::disagreement(field, "params.name", &rpc_id));
                }
            }
            if tool.is_none() {
                if let Some(name) = body.name {
                    fields.target("body.params.name", &name)?;
                    tool = Some(("body", Cow::Owned(name)));
                }
            }
        }

        let bearer = match headers.get(AUTHORIZATION) {
            Some(value) => {
                fields.credential(AUTHORIZATION, value)?;
                bearer_token(value)
            }
            None => None,
        };
        let api_key = headers.get(&settings.api_key_header);
        if let Some(key) = api_key {
            fields.credential(&settings.api_key_header, key)?;
        }
        // A front proxy's XFCC first; else the peer certificate Envoy saw itself, whole
        // (`include_peer_certificate`, URL-encoded PEM), else its principal (a DN).
        let source = attributes.and_then(|attributes| attributes.source.as_ref());
        let certificate = headers
            .get(CLIENT_CERT)
            .map(|value| (CLIENT_CERT, value))
            .or_else(|| {
                source
                    .map(|source| source.certificate.as_str())
                    .filter(|certificate| !certificate.is_empty())
                    .map(|certificate| ("source.certificate", certificate))
            })
            .or_else(|| {
                source
                    .map(|source| source.principal.as_str())
                    .filter(|principal| !principal.is_empty())
                    .map(|principal| ("source.principal", principal))
            });
        if let Some((field, value)) = certificate {
            fields.credential(field, value)?;
        }
        let certificate = certificate.map(|(field, value)| match field {
            "source.certificate" => percent_decode_str(value).decode_utf8_lossy(),
            _ => Cow::Borrowed(value),
        });
        let request_id = headers.get(REQUEST_ID).map(|id| (REQUEST_ID, id)).or_else(|| {
            http.map(|http| http.id.as_str())
                .filter(|id| !id.is_empty())
                .map(|id| ("request.http.id", id))
        });
        if let Some((field, id)) = request_id {
            fields.text(field, id, bounds::MAX_REQUEST_ID)?;
        }
        Ok(Forwarded {
            method: method.map(|(_, method)| method),
            tool: tool.map(|(_, name)| resolve(name)),
            bearer,
            api_key,
            certificate,
            request_id: request_id.map(|(_, id)| id),
            received: attributes
                .and_then(|attributes| attributes.request.as_ref()?.time.as_ref())
                .map(|time| format!("{}.{:09}", time.seconds, time.nanos)),
            rpc_id,
            arguments,
        })
    }

    /// The method policy, failing closed.
    fn class(&self, settings: &Settings) -> Class {
        proxied::classify(
            self.method.as_deref(),
            self.tool.as_deref(),
            settings,
            &self.rpc_id,
            (
                "ext_authz",
                "send `mcp-method` (MCP 2026-07-28), run Envoy's MCP filter, or forward the JSON-RPC \
                 body (`with_request_body`)",
            ),
        )
    }

    /// The caller's credential: a bearer token, else an API key, else a client certificate.
    fn caller(&self) -> Asked<'_> {
        let presented = self
            .bearer
            .map(Presented::BearerToken)
            .or(self.api_key.map(Presented::ApiKey))
            .or(self.certificate.as_deref().map(Presented::ClientCertificate));
        Asked::Credential {
            presented,
            hint: None,
        }
    }
}

/// The forwarded headers: the `headers` map, or `header_map` when Envoy's `encode_raw_headers`
/// is on. Names are lower-case either way.
enum Headers<'a> {
    Map(&'a HashMap<String, String>),
    Raw(&'a [HeaderValue]),
    None,
}

impl<'a> Headers<'a> {
    fn of(http: Option<&'a HttpRequest>) -> Headers<'a> {
        match http {
            None => Headers::None,
            Some(http) => match &http.header_map {
                Some(map) if http.headers.is_empty() => Headers::Raw(&map.headers),
                _ => Headers::Map(&http.headers),
            },
        }
    }

    /// The field the headers came in, as a refusal names it.
    fn field(&self) -> &'static str {
        match self {
            Headers::Raw(_) => "request.http.header_map",
            Headers::Map(_) | Headers::None => "request.http.headers",
        }
    }

    fn len(&self) -> usize {
        match self {
            Headers::Map(map) => map.len(),
            Headers::Raw(raw) => raw.len(),
            Headers::None => 0,
        }
    }

    /// A header's value; an empty one counts as absent. A raw value that is not UTF-8 is absent
    /// too: no header the door reads can be binary.
    fn get(&self, name: &str) -> Option<&'a str> {
        let value = match self {
            Headers::Map(map) => map.get(name).map(String::as_str),
            Headers::Raw(raw) => raw
                .iter()
                .find(|header| header.key.eq_ignore_ascii_case(name))
                .and_then(|header| match header.value.is_empty() {
                    false => Some(header.value.as_str()),
                    true => std::str::from_utf8(&header.raw_value).ok(),
                }),
            Headers::None => None,
        };
        value.filter(|value| !value.is_empty())
    }
}

/// What Envoy's MCP filter wrote about the request.
struct McpMetadata<'a> {
    method: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    id: Value,
}

impl<'a> McpMetadata<'a> {
    fn of(metadata: Option<&'a Metadata>) -> Option<McpMetadata<'a>> {
        let fields = MCP_METADATA
            .iter()
            .find_map(|namespace| metadata?.filter_metadata.get(*namespace))?;
        let text = |value: &'a ProtoValue| match &value.kind {
            Some(Kind::StringValue(text)) => Some(Cow::Borrowed(text.as_str())),
            _ => None,
        };
        let name = fields.fields.get("params").and_then(|params| match &params.kind {
            Some(Kind::StructValue(params)) => params.fields.get("name").and_then(text),
            _ => None,
        });
        // The request's JSON-RPC id, echoed in an error body when Envoy sends no body.
        let id = match fields.fields.get("id").and_then(|id| id.kind.as_ref()) {
            Some(Kind::StringValue(id)) => Value::from(id.as_str()),
            // A JSON number in a protobuf `Value`; MCP's ids are integers.
            Some(Kind::NumberValue(id)) if id.fract() == 0.0 && id.abs() < 9.0e15 => Value::from(*id as i64),
            _ => Value::Null,
        };
        Some(McpMetadata {
            method: fields.fields.get("method").and_then(text),
            name,
            id,
        })
    }
}

/// A forwarded JSON-RPC request: what it says about the target, and the call's arguments.
struct Body {
    method: Option<String>,
    name: Option<String>,
    id: Value,
    /// `params.arguments`, taken out of the one parse of the body.
    arguments: Option<CallArguments>,
}

impl Body {
    /// The body, when Envoy forwarded one; refused when it is cut, too big, or not a JSON-RPC
    /// request.
    fn read(
        http: Option<&HttpRequest>,
        headers: &Headers<'_>,
        fields: &mut Fields,
    ) -> Result<Option<Body>, Rejected> {
        let Some(http) = http else { return Ok(None) };
        let bytes = if http.raw_body.is_empty() {
            http.body.as_bytes()
        } else {
            http.raw_body.as_slice()
        };
        if bytes.is_empty() {
            return Ok(None);
        }
        fields.body(bytes.len())?;
        if headers.get(PARTIAL_BODY) == Some("true") {
            return Err(Rejected::new(
                HttpCode::PayloadTooLarge,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                "`request.http.body`: cut at the filter's `max_request_bytes` (`allow_partial_message`), so \
                 it cannot be checked; raise `max_request_bytes` or turn `allow_partial_message` off"
                    .to_owned(),
                &Value::Null,
            ));
        }
        let parsed: Value = serde_json::from_slice(bytes).map_err(|error| {
            Rejected::new(
                HttpCode::BadRequest,
                Code::InvalidArgument,
                RPC_PARSE_ERROR,
                format!(
                    "`request.http.body`: not JSON (line {}, column {})",
                    error.line(),
                    error.column()
                ),
                &Value::Null,
            )
        })?;
        let Value::Object(mut message) = parsed else {
            return Err(Rejected::new(
                HttpCode::BadRequest,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                "`request.http.body`: not a JSON-RPC request object (batches are not part of MCP)".to_owned(),
                &Value::Null,
            ));
        };
        let id = match message.get("id") {
            Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
            _ => Value::Null,
        };
        let text = |value: Option<&Value>, field: &str| -> Result<Option<String>, Rejected> {
            match value {
                None => Ok(None),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(Rejected::new(
                    HttpCode::BadRequest,
                    Code::InvalidArgument,
                    RPC_INVALID_REQUEST,
                    format!("`request.http.body`: `{field}` is not a string"),
                    &id,
                )),
            }
        };
        let method = text(message.get("method"), "method")?;
        let name = text(
            message.get("params").and_then(|params| params.get("name")),
            "params.name",
        )?;
        // Moved out of the parsed body, not copied: the one parse is the only one.
        let arguments = match message
            .get_mut("params")
            .and_then(Value::as_object_mut)
            .and_then(|params| params.remove("arguments"))
        {
            None => None,
            Some(Value::Object(arguments)) => Some(arguments),
            Some(_) => {
                return Err(Rejected::new(
                    HttpCode::BadRequest,
                    Code::InvalidArgument,
                    RPC_INVALID_REQUEST,
                    "`request.http.body`: `params.arguments` is not an object".to_owned(),
                    &id,
                ))
            }
        };
        Ok(Some(Body {
            method,
            name,
            id,
            arguments,
        }))
    }
}

/// The bounds of the fields the door reads (`bounds.rs`): the first one over is the answer.
struct Fields;

impl Fields {
    fn text(&mut self, field: &str, value: &str, limit: usize) -> Result<(), Rejected> {
        match bounds::violation(value, limit) {
            None => Ok(()),
            Some(problem) => Err(Rejected::new(
                HttpCode::BadRequest,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                format!("`{field}`: {problem}"),
                &Value::Null,
            )),
        }
    }

    fn target<'v>(&mut self, field: &str, value: &'v str) -> Result<&'v str, Rejected> {
        self.text(field, value, bounds::MAX_TARGET).map(|()| value)
    }

    fn credential(&mut self, field: &str, value: &str) -> Result<(), Rejected> {
        self.text(field, value, bounds::MAX_CREDENTIAL)
    }

    fn headers(&mut self, field: &str, count: usize) -> Result<(), Rejected> {
        if count > bounds::MAX_EXT_AUTHZ_HEADERS {
            return Err(Rejected::new(
                HttpCode::RequestHeaderFieldsTooLarge,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                format!(
                    "`{field}`: {count} headers, more than the limit of {}",
                    bounds::MAX_EXT_AUTHZ_HEADERS
                ),
                &Value::Null,
            ));
        }
        Ok(())
    }

    fn body(&mut self, length: usize) -> Result<(), Rejected> {
        if length > bounds::MAX_EXT_AUTHZ_BODY {
            return Err(Rejected::new(
                HttpCode::PayloadTooLarge,
                Code::InvalidArgument,
                RPC_INVALID_REQUEST,
                format!(
                    "`request.http.body`: {length} bytes, more than the limit of {}",
                    bounds::MAX_EXT_AUTHZ_BODY
                ),
                &Value::Null,
            ));
        }
        Ok(())
    }
}

/// A request refused before any decision: nothing is audited (as a `Decide` over its bounds).
struct Rejected {
    http: HttpCode,
    grpc: Code,
    rpc_code: i64,
    message: String,
    rpc_id: Value,
}

impl Rejected {
    fn new(http: HttpCode, grpc: Code, rpc_code: i64, message: String, rpc_id: &Value) -> Rejected {
        Rejected {
            http,
            grpc,
            rpc_code,
            message,
            rpc_id: rpc_id.clone(),
        }
    }

    fn disagreement(field: &str, body_field: &str, rpc_id: &Value) -> Rejected {
        Rejected::new(
            HttpCode::BadRequest,
            Code::InvalidArgument,
            RPC_INVALID_REQUEST,
            format!("`{field}` disagrees with the JSON-RPC body's `{body_field}`"),
            rpc_id,
        )
    }

    fn response(self) -> CheckResponse {
        check_response(HttpAnswer::rejected(
            self.http as i32 as u16,
            self.grpc,
            self.rpc_code,
            self.message,
            &self.rpc_id,
        ))
    }
}

/// An allowed request that needs no decision.
fn passed() -> CheckResponse {
    check_response(HttpAnswer::passed())
}

/// No answer could be had: a denial, so that the request fails closed.
fn refused(refusal: &Refusal, rpc_id: &Value) -> CheckResponse {
    check_response(HttpAnswer::refused(refusal, rpc_id, REQUEST_ID))
}

/// The pipeline's answer as a `CheckResponse`.
fn response(answer: &Answer<'_>, rpc_id: &Value, api_key_header: &str) -> CheckResponse {
    let mut response = check_response(HttpAnswer::decided(answer, rpc_id));
    // The caller's static key is capgate's to check, not the upstream's to see: an allowed
    // request goes on without it (the upstream hop runs as the execution account).
    if let Some(HttpResponse::OkResponse(ok)) = &mut response.http_response {
        ok.headers_to_remove.push(api_key_header.to_owned());
    }
    response
}

/// The answer in Envoy's terms: an `OkHttpResponse` with the upstream's headers and the client's
/// added ones, or a `DeniedHttpResponse` with the client's status, headers and JSON-RPC body;
/// what was decided as dynamic metadata under the ext_authz filter's namespace.
fn check_response(answer: HttpAnswer) -> CheckResponse {
    let HttpAnswer {
        status,
        grpc,
        message,
        headers,
        upstream,
        body,
        facts,
    } = answer;
    let metadata = facts.map(|facts| {
        structure(
            facts
                .into_iter()
                .map(|(key, fact)| {
                    let value = match fact {
                        Fact::Text(value) => text(&value),
                        Fact::Number(value) => number(value),
                    };
                    (key, value)
                })
                .collect(),
        )
    });
    let options = |pairs: Vec<(&'static str, String)>| -> Vec<HeaderValueOption> {
        pairs.iter().map(|(key, value)| header(key, value)).collect()
    };
    let Some(body) = body else {
        return CheckResponse {
            status: Some(rpc::Status {
                code: Code::Ok as i32,
                ..Default::default()
            }),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers: options(upstream),
                response_headers_to_add: options(headers),
                ..Default::default()
            })),
            dynamic_metadata: metadata,
        };
    };
    let mut denied_headers = options(headers);
    denied_headers.push(header("content-type", "application/json"));
    CheckResponse {
        status: Some(rpc::Status {
            code: grpc as i32,
            message,
            details: Vec::new(),
        }),
        http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: denied_headers,
            body: body.to_string(),
        })),
        dynamic_metadata: metadata,
    }
}

/// A header set on the request (or the response), replacing any the client sent of that name.
fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
            raw_value: Vec::new(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn text(value: &str) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StringValue(value.to_owned())),
    }
}

fn number(value: f64) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::NumberValue(value)),
    }
}

/// The dynamic metadata Envoy files under the ext_authz filter's namespace, for access logs and
/// later filters.
fn structure(fields: Vec<(&'static str, ProtoValue)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect(),
    }
}
