//! The forward-auth door: the bodyless subrequest that nginx (`auth_request`), Caddy
//! (`forward_auth`), Traefik (`forwardAuth`) and HAProxy send before they forward a request, on
//! the HTTP listener (`--http-listen`), at `/forward-auth` or `/forward-auth/<server>`, any method
//! (docs/gateways/forward-auth.md, docs/decisions/0029).
//!
//! A proxy acts on the status alone: 2xx lets the request through (copying the headers it is
//! told to upstream), anything else is the client's answer. So this door answers as
//! [`HttpAnswer`] says, with the same statuses, headers and JSON-RPC bodies as Envoy's door.
//!
//! What it reads from the subrequest's headers (the original request's, as the proxy copies them):
//!
//! | what | where, first found wins |
//! |---|---|
//! | the proxy's gateway token | `--forward-auth-token-header` (`x-capgate-gateway-token`), bare or `Bearer` |
//! | MCP method | `mcp-method` (MCP 2026-07-28), `x-mcp-method` (Kuadrant) |
//! | tool | `mcp-name`, `x-mcp-toolname`; without its `<server>__` prefix, the server from the path segment, else `--forward-auth-server-header` (`x-mcp-servername`) |
//! | the original HTTP method | `x-forwarded-method` (Caddy, Traefik, nginx as configured), `x-original-method`; a request carries no call only when every one of them that comes says so |
//! | caller | `authorization: Bearer`, the API-key header (`--ext-authz-api-key-header`), a client certificate in `x-forwarded-client-cert` (XFCC or a DN), `x-forwarded-tls-client-cert` (Traefik) or `x-ssl-client-cert` (nginx's `$ssl_client_escaped_cert`): asserting gateways only |
//! | `request_id` | `--forward-auth-request-id-header`, when set (none by default: a client's id is never taken) |
//!
//! Methods as Envoy's door: `tools/call` is decided; `initialize`, `ping`, `tools/list` and
//! `notifications/*` pass; others are refused unless `--ext-authz-allow-method` names them. A
//! subrequest with no MCP method passes only when the proxy says the original request could not
//! carry a call (a `GET` stream, a `DELETE` ending the session); any other — an older client's
//! `POST` without `Mcp-Method`, or a proxy that does not say — is refused, since the subrequest
//! carries no body to read the method from.
//!
//! Nor the call's arguments: the door reads no body, even where a proxy sends one, so every
//! decision here is taken without arguments. A grant with a condition on an argument (policy
//! version 2, `when: - argument: …`) denies `arguments_missing` (403), naming that condition; a
//! grant whose conditions are all on the instant (`- time: …`) decides as on any door. A call
//! that such a grant should allow needs a door that sees the body: Envoy's with
//! `with_request_body`, agentgateway's, or AuthZEN from a gateway that forwards the arguments.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as Shared};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use percent_encoding::percent_decode_str;
use serde_json::Value;
use tonic::Code;

use capgate_core::capabilities::exposed_name;

use super::auth::Role;
use super::bounds;
use super::config::{ExtAuthzSettings, ForwardAuthSettings};
use super::identify::Asked;
use super::pipeline::{self, Answer, Ask, Remember, Replied, Target};
use super::proxied::{
    bearer_token, classify, Class, HttpAnswer, AUTHORIZATION, CLIENT_CERT, KUADRANT_METHOD, KUADRANT_TOOL,
    MCP_METHOD, MCP_NAME, RPC_INVALID_REQUEST, RPC_REFUSED,
};
use super::State;
use crate::identity::Presented;
use crate::store::{Door, Store};
use crate::telemetry;

/// The span's name: a closed set, never the request's path.
const ROUTE: &str = "forward-auth";
/// The headers that carry the original HTTP method.
const ORIGINAL_METHOD: [&str; 2] = ["x-forwarded-method", "x-original-method"];
/// Traefik's (`passTLSClientCert`) and nginx's usual header for the client certificate, as
/// URL-encoded PEM.
const ESCAPED_CERTS: [&str; 2] = ["x-forwarded-tls-client-cert", "x-ssl-client-cert"];

/// The door: the service's state and how to read a subrequest.
struct ForwardAuth<S: Store> {
    state: Arc<State<S>>,
    settings: ForwardAuthSettings,
    methods: ExtAuthzSettings,
}

/// The door's routes, to be merged into the HTTP listener's router.
pub fn routes<S: Store>(
    state: Arc<State<S>>,
    settings: ForwardAuthSettings,
    methods: ExtAuthzSettings,
) -> Router {
    let door = Arc::new(ForwardAuth {
        state,
        settings,
        methods,
    });
    Router::new()
        .route("/forward-auth", any(unnamed::<S>))
        .route("/forward-auth/{server}", any(named::<S>))
        .with_state(door)
}

async fn unnamed<S: Store>(
    Shared(door): Shared<Arc<ForwardAuth<S>>>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    served(door, None, method, headers).await
}

async fn named<S: Store>(
    Shared(door): Shared<Arc<ForwardAuth<S>>>,
    Path(server): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    served(door, Some(server), method, headers).await
}

/// One subrequest, in its span; its decision is counted whatever the status (a denial is one).
async fn served<S: Store>(
    door: Arc<ForwardAuth<S>>,
    server: Option<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let span_method: &'static str = match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "PATCH" => "PATCH",
        _ => "_OTHER",
    };
    let seen = headers.clone();
    telemetry::rpc::http_door(ROUTE, span_method, &seen, |_| true, async move {
        http_response(door.answer(server.as_deref(), &headers).await)
    })
    .await
}

impl<S: Store> ForwardAuth<S> {
    async fn answer(&self, server: Option<&str>, headers: &HeaderMap) -> HttpAnswer {
        let gateway =
            match self
                .state
                .tokens
                .authorize_header(headers, &self.settings.token_header, Role::Gateway)
            {
                Ok(gateway) => gateway,
                Err(status) => {
                    let code = if status.code() == Code::PermissionDenied {
                        403
                    } else {
                        401
                    };
                    return HttpAnswer::rejected(
                        code,
                        status.code(),
                        RPC_REFUSED,
                        format!("the proxy is not authenticated to capgate: {}", status.message()),
                        &Value::Null,
                    );
                }
            };
        let read = match Subrequest::read(headers, server, &self.settings, &self.methods) {
            Ok(read) => read,
            Err(rejected) => return *rejected,
        };
        let tool = match read.class(&self.methods) {
            Class::Pass => return HttpAnswer::passed(),
            Class::Refused(refused) => return refused,
            Class::Decide(tool) => tool,
        };
        let active = match pipeline::current(&self.state) {
            Ok(active) => active,
            Err(refusal) => return HttpAnswer::refused(&refusal, &Value::Null, self.request_id_field()),
        };
        let ask = Ask {
            gateway: &gateway,
            caller: read.caller(),
            request_id: read.request_id,
            door: Door::ForwardAuth,
            retry_facts: Vec::new(),
            // A subrequest carries no body, so no arguments: a grant that reads one denies
            // `arguments_missing` through this door (the module's doc).
            arguments: None,
            // The proxy forwards the request on every 2xx: an allow given twice would run the call
            // twice on one count. A denial may be given again (nginx asks again for its body).
            replayable: Remembered::was_denied,
        };
        let encode: Remember = Arc::new(|answer: &Answer<'_>| {
            serde_json::to_vec(&Remembered::of(&HttpAnswer::decided(answer, &Value::Null)))
                .unwrap_or_default()
        });
        match pipeline::decide(&self.state, &active, ask, Target::Tool(&tool), &encode).await {
            Ok(Replied::Fresh(answer)) => HttpAnswer::decided(&answer, &Value::Null),
            Ok(Replied::Replayed(bytes)) => match serde_json::from_slice::<Remembered>(&bytes) {
                Ok(remembered) => remembered.into_answer(),
                Err(error) => {
                    tracing::error!(%error, "a remembered forward-auth answer does not parse");
                    HttpAnswer::refused(
                        &pipeline::Refusal::Unavailable(
                            "the remembered answer to this request id cannot be read".to_owned(),
                        ),
                        &Value::Null,
                        self.request_id_field(),
                    )
                }
            },
            Err(refusal) => HttpAnswer::refused(&refusal, &Value::Null, self.request_id_field()),
        }
    }

    fn request_id_field(&self) -> &str {
        self.settings.request_id_header.as_deref().unwrap_or("request id")
    }
}

/// What the door read from a subrequest; every field within its bound.
struct Subrequest<'a> {
    /// The MCP method, when the request named one.
    method: Option<&'a str>,
    /// Whether the original HTTP request may carry a tool call: unless the proxy says it was a
    /// `GET`, `HEAD`, `DELETE` or `OPTIONS`.
    may_call: bool,
    /// The tool, resolved to its exposed name.
    tool: Option<Cow<'a, str>>,
    bearer: Option<&'a str>,
    api_key: Option<&'a str>,
    certificate: Option<Cow<'a, str>>,
    request_id: Option<&'a str>,
}

impl<'a> Subrequest<'a> {
    fn read(
        headers: &'a HeaderMap,
        server: Option<&'a str>,
        settings: &ForwardAuthSettings,
        methods: &ExtAuthzSettings,
    ) -> Result<Subrequest<'a>, Box<HttpAnswer>> {
        let get = |name: &str| -> Result<Option<&'a str>, Box<HttpAnswer>> {
            match headers.get(name) {
                None => Ok(None),
                Some(value) => match std::str::from_utf8(value.as_bytes()) {
                    Ok("") => Ok(None),
                    Ok(text) => Ok(Some(text)),
                    Err(_) => Err(malformed(format!("`{name}`: not UTF-8"))),
                },
            }
        };
        let bounded = |name: &str, limit: usize| -> Result<Option<&'a str>, Box<HttpAnswer>> {
            let value = get(name)?;
            if let Some(problem) = value.and_then(|value| bounds::violation(value, limit)) {
                return Err(malformed(format!("`{name}`: {problem}")));
            }
            Ok(value)
        };
        let first = |names: &[&str], limit: usize| -> Result<Option<&'a str>, Box<HttpAnswer>> {
            for name in names {
                if let Some(value) = bounded(name, limit)? {
                    return Ok(Some(value));
                }
            }
            Ok(None)
        };
        let mcp_method = first(&[MCP_METHOD, KUADRANT_METHOD], bounds::MAX_TARGET)?;
        let tool = first(&[MCP_NAME, KUADRANT_TOOL], bounds::MAX_TARGET)?;
        let server = match server {
            Some(server) => {
                if let Some(problem) = bounds::violation(server, bounds::MAX_TARGET) {
                    return Err(malformed(format!("the path's server: {problem}")));
                }
                Some(server)
            }
            None => bounded(&settings.server_header, bounds::MAX_TARGET)?,
        }
        // Kuadrant names a server `<namespace>/<name>`; the upstream id is the name.
        .map(|server| server.rsplit('/').next().unwrap_or(server))
        .filter(|server| !server.is_empty());
        let tool = tool.map(|name| match server {
            Some(server) if !name.starts_with(&format!("{server}__")) => {
                Cow::Owned(exposed_name(server, name))
            }
            _ => Cow::Borrowed(name),
        });
        // Only a proxy that says so makes a request one that carries no call: some proxies send
        // every subrequest as a `GET`, whatever the original was.
        // Both headers may come: one set by the proxy, the other the client's own, passed on
        // untouched. Only when every one of them names a method that carries no call is the
        // request one that carries none: a client cannot name its `POST` a `GET`.
        let mut said = Vec::new();
        for name in ORIGINAL_METHOD {
            if let Some(method) = bounded(name, 16)? {
                said.push(method);
            }
        }
        let harmless = |method: &str| {
            ["GET", "HEAD", "DELETE", "OPTIONS"]
                .iter()
                .any(|harmless| method.eq_ignore_ascii_case(harmless))
        };
        let may_call = said.is_empty() || !said.iter().all(|method| harmless(method));
        let bearer = bounded(AUTHORIZATION, bounds::MAX_CREDENTIAL)?.and_then(bearer_token);
        let api_key = bounded(&methods.api_key_header, bounds::MAX_CREDENTIAL)?;
        let certificate = match bounded(CLIENT_CERT, bounds::MAX_CREDENTIAL)? {
            Some(certificate) => Some(Cow::Borrowed(certificate)),
            None => first(&ESCAPED_CERTS, bounds::MAX_CREDENTIAL)?
                .map(|escaped| percent_decode_str(escaped).decode_utf8_lossy()),
        };
        let request_id = match &settings.request_id_header {
            Some(name) => bounded(name, bounds::MAX_REQUEST_ID)?,
            None => None,
        };
        Ok(Subrequest {
            method: mcp_method,
            may_call,
            tool,
            bearer,
            api_key,
            certificate,
            request_id,
        })
    }

    /// The method policy, failing closed.
    fn class(&self, methods: &ExtAuthzSettings) -> Class {
        if self.method.is_none() && !self.may_call {
            // A `GET` stream or a `DELETE` of the session: nothing is executed.
            return Class::Pass;
        }
        classify(
            self.method,
            self.tool.as_deref(),
            methods,
            &Value::Null,
            (
                "forward-auth",
                "MCP 2026-07-28 clients send `Mcp-Method`; a forward-auth subrequest carries no body to \
                 read an older client's method from",
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

/// A subrequest the door cannot read: `400`, nothing decided.
fn malformed(message: String) -> Box<HttpAnswer> {
    Box::new(HttpAnswer::rejected(
        400,
        Code::InvalidArgument,
        RPC_INVALID_REQUEST,
        message,
        &Value::Null,
    ))
}

/// The answer as the proxy reads it: the status; on a `200`, every header to copy (upstream, and
/// the ceiling's for the client); otherwise the client's headers and the JSON-RPC error body.
fn http_response(answer: HttpAnswer) -> Response {
    let HttpAnswer {
        status,
        headers,
        upstream,
        body,
        ..
    } = answer;
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = match &body {
        Some(body) => (status, body.to_string()).into_response(),
        None => (status, Body::empty()).into_response(),
    };
    let set = response.headers_mut();
    for (name, value) in upstream.iter().chain(headers.iter()) {
        if let Ok(value) = HeaderValue::from_str(value) {
            set.insert(HeaderName::from_static(name), value);
        }
    }
    if body.is_some() {
        set.insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    response
}

/// An answer as it is remembered for a retry with the same request id: what the proxy is told.
#[derive(serde::Serialize, serde::Deserialize)]
struct Remembered {
    status: u16,
    headers: Vec<(String, String)>,
    upstream: Vec<(String, String)>,
    body: Option<Value>,
}

impl Remembered {
    /// Whether a remembered answer let nothing through; one that cannot be read counts as an
    /// allow, so it is never replayed.
    fn was_denied(bytes: &[u8]) -> bool {
        serde_json::from_slice::<Remembered>(bytes).is_ok_and(|remembered| remembered.status >= 300)
    }

    fn of(answer: &HttpAnswer) -> Remembered {
        let pairs = |pairs: &[(&'static str, String)]| {
            pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect()
        };
        Remembered {
            status: answer.status,
            headers: pairs(&answer.headers),
            upstream: pairs(&answer.upstream),
            body: answer.body.clone(),
        }
    }

    fn into_answer(self) -> HttpAnswer {
        // Only the names the door itself sets are answered again.
        let known = |pairs: Vec<(String, String)>| -> Vec<(&'static str, String)> {
            pairs
                .into_iter()
                .filter_map(|(name, value)| {
                    REPLAYED_HEADERS
                        .iter()
                        .find(|known| **known == name)
                        .map(|known| (*known, value))
                })
                .collect()
        };
        HttpAnswer {
            status: self.status,
            grpc: Code::Ok,
            message: String::new(),
            headers: known(self.headers),
            upstream: known(self.upstream),
            body: self.body,
            facts: None,
        }
    }
}

/// Every header an answer of this door may carry.
const REPLAYED_HEADERS: [&str; 6] = [
    super::proxied::DECISION_ID_HEADER,
    super::proxied::ACCOUNT_HEADER,
    "ratelimit-policy",
    "ratelimit",
    "retry-after",
    "www-authenticate",
];
