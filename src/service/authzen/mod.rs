//! The OpenID AuthZEN 1.0 door: the Authorization API over HTTP/JSON on `--http-listen`, a thin
//! adapter over the decision pipeline (docs/gateways/authzen.md, docs/decisions/0018-authzen.md).
//!
//! | route | what it is |
//! |---|---|
//! | `POST /access/v1/evaluation` | one `tools/call` decision (`pipeline::decide`) |
//! | `POST /access/v1/evaluations` | a batch of them, with `options.evaluations_semantic` |
//! | `POST /access/v1/search/resource` | the tools (or capabilities) the subject may call (`pipeline::list`) |
//! | `POST /access/v1/search/subject` | who may call a tool: `who-can` (`subjects.rs`; admin token) |
//! | `GET /.well-known/authzen-configuration` | the PDP metadata: which of the above are served |
//! | `GET /healthz`, `GET /readyz` | alive; ready once a policy version is active |
//!
//! The metadata's URLs are under `--http-public-url`, else under the address the connection was
//! accepted on: never under the client's `Host` header, which anyone can set
//! (docs/decisions/0032).
//!
//! Every POST authenticates the gateway as the gRPC port does (`authorization: Bearer <gateway
//! token>`), bounds the body ([`mapping::MAX_BODY`], [`mapping::MAX_DEPTH`]) and each field
//! (`bounds.rs`), reads the request into an `Ask` and a `Target` (`mapping.rs`) and answers with
//! the pipeline's answer: the decision's reason, pointer, account and ceiling in `context`. An
//! error is `{"error": {"status", "message"}}` with the HTTP status: 400 for a request that is
//! not one, 401 for a gateway that did not authenticate, 403 for one that may not ask this way,
//! 413 for an oversize body, 503 when no answer can be given now. So is every other answer of
//! the port that is not a decision: 404, 405, and what hyper answers by itself to a request head
//! it cannot parse, 400, 414 and 431 (`head_errors.rs`).

mod head_errors;
mod mapping;
mod server;
mod subjects;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};

use capgate_core::access::{Allow, Decision};

use crate::service::auth::{Gateway, Role};
use crate::service::bounds::MAX_REQUEST_ID;
use crate::service::identify::Asked;
use crate::service::pipeline::{self, Answer, Ask, Listing, Refusal, Remember, Replied, Verdict};
use crate::service::State;
use crate::store::{Door, Store};
use crate::telemetry;
use mapping::{Kind, Parts, Problem, Semantic, MAX_BODY, MAX_EVALUATIONS};

pub use server::HttpServer;

/// The routes this door serves, as span names (a closed set: never the request's path).
const EVALUATION: &str = "POST /access/v1/evaluation";
const EVALUATIONS: &str = "POST /access/v1/evaluations";
const SEARCH_RESOURCE: &str = "POST /access/v1/search/resource";
const SEARCH_SUBJECT: &str = "POST /access/v1/search/subject";

/// The router over the shared state; `tls` says which scheme the metadata's URLs take when no
/// `public_url` is configured.
fn router<S: Store>(state: Arc<State<S>>, tls: bool, public_url: Option<String>) -> Router {
    let door = Arc::new(Served {
        state,
        tls,
        // Checked to name a host (`Config::check`), so only a path's slashes go.
        public_url: public_url.map(|url| url.trim_end_matches('/').to_owned()),
    });
    Router::new()
        .route("/access/v1/evaluation", post(evaluation::<S>))
        .route("/access/v1/evaluations", post(evaluations::<S>))
        .route("/access/v1/search/resource", post(search_resource::<S>))
        .route("/access/v1/search/subject", post(search_subject::<S>))
        .route("/.well-known/authzen-configuration", get(configuration::<S>))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(door)
}

/// What the handlers share: the service's state, whether the listener speaks TLS, and
/// `--http-public-url`.
struct Served<S: Store> {
    state: Arc<State<S>>,
    tls: bool,
    public_url: Option<String>,
}

/// A failed request: the spec's error body with its status.
struct Failed {
    problem: Problem,
    request_id: Option<HeaderValue>,
}

impl From<Problem> for Failed {
    fn from(problem: Problem) -> Failed {
        Failed {
            problem,
            request_id: None,
        }
    }
}

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        let Problem { status, message } = self.problem;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = json_response(status, &error_body(status.as_u16(), &message));
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(id) = self.request_id {
            response.headers_mut().insert("x-request-id", id);
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still be coming: the connection cannot carry another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// The error body of every answer of the port that is not a decision.
fn error_body(status: u16, message: &str) -> Value {
    json!({"error": {"status": status, "message": message}})
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A 200 with `body`, echoing the request's `X-Request-ID` as the spec requires.
fn answered(body: &Value, request_id: Option<HeaderValue>) -> Response {
    let mut response = json_response(StatusCode::OK, body);
    if let Some(id) = request_id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

fn refused(refusal: Refusal) -> Problem {
    match refusal {
        Refusal::PermissionDenied(message) => Problem { status: 403, message },
        Refusal::Unavailable(message) => Problem { status: 503, message },
        // draft-ietf-httpapi-idempotency-key-header: a key reused with another request is 422.
        Refusal::RequestIdReused { request_id, reuse } => Problem {
            status: 422,
            message: pipeline::reused("X-Request-ID", &request_id, reuse),
        },
    }
}

/// An authenticated POST: the gateway, the body as a JSON object and the request id.
struct Posted {
    gateway: Gateway,
    request: Map<String, Value>,
    request_id: Option<String>,
    request_id_header: Option<HeaderValue>,
}

/// Authenticates the gateway, then reads the request id and the body, in that order: an
/// unauthenticated caller learns nothing about its request.
async fn posted<S: Store>(
    state: &State<S>,
    headers: &HeaderMap,
    body: Body,
    role: Role,
) -> Result<Posted, Failed> {
    let gateway = state.tokens.authorize_http(headers, role).map_err(|status| {
        let code = if status.code() == tonic::Code::PermissionDenied {
            403
        } else {
            401
        };
        Problem {
            status: code,
            message: status.message().to_owned(),
        }
    })?;
    let request_id_header = headers.get("x-request-id").cloned();
    let request_id = match &request_id_header {
        None => None,
        Some(value) => Some(request_id(value)?),
    };
    let fail = |problem: Problem| Failed {
        problem,
        request_id: request_id_header.clone(),
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(fail(Problem::bad_request(
            "content-type",
            "must be `application/json`",
        )));
    }
    let bytes = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|error| {
            fail(
                if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    Problem {
                        status: 413,
                        message: format!("the request body is more than {MAX_BODY} bytes"),
                    }
                } else if server::body_timed_out(error.as_ref()) {
                    Problem {
                        status: 408,
                        message: "the request body did not arrive within `--handshake-timeout` of its head"
                            .to_owned(),
                    }
                } else {
                    Problem {
                        status: 400,
                        message: "the request body could not be read".to_owned(),
                    }
                },
            )
        })?
        .to_bytes();
    let request = mapping::parse_body(&bytes).map_err(fail)?;
    Ok(Posted {
        gateway,
        request,
        request_id,
        request_id_header,
    })
}

/// `X-Request-ID`: text within the `request_id` bound, without U+0000.
fn request_id(value: &HeaderValue) -> Result<String, Problem> {
    let text = value
        .to_str()
        .map_err(|_| Problem::bad_request("x-request-id", "must be visible ASCII"))?;
    if text.len() > MAX_REQUEST_ID {
        return Err(Problem::bad_request(
            "x-request-id",
            format!("{} bytes, more than the limit of {MAX_REQUEST_ID}", text.len()),
        ));
    }
    Ok(text.to_owned())
}

async fn evaluation<S: Store>(
    Shared(door): Shared<Arc<Served<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::rpc::http(EVALUATION, &headers.clone(), async move {
        match evaluate_one(&door.state, &headers, body).await {
            Ok(response) => response,
            Err(failed) => failed.into_response(),
        }
    })
    .await
}

async fn evaluate_one<S: Store>(
    state: &State<S>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failed> {
    let posted = posted(state, headers, body, Role::Gateway).await?;
    let with_id = |problem: Problem| Failed {
        problem,
        request_id: posted.request_id_header.clone(),
    };
    let item = Parts::of(&posted.request, "").evaluation("").map_err(with_id)?;
    let active = pipeline::current(state).map_err(refused).map_err(with_id)?;
    let decided = decide(
        state,
        &active,
        &posted.gateway,
        item,
        posted.request_id.as_deref(),
    )
    .await
    .map_err(with_id)?;
    Ok(answered(&decided, posted.request_id_header.clone()))
}

async fn evaluations<S: Store>(
    Shared(door): Shared<Arc<Served<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::rpc::http(EVALUATIONS, &headers.clone(), async move {
        match evaluate_batch(&door.state, &headers, body).await {
            Ok(response) => response,
            Err(failed) => failed.into_response(),
        }
    })
    .await
}

/// A batch: every item is read (with the top level's defaults) and checked before the first is
/// decided, so that a malformed or forbidden item costs no decision of the others. Items are
/// decided in order; a short-circuiting semantic ends the batch at the item that decides it,
/// which is then the last in the response (as the spec's examples show).
async fn evaluate_batch<S: Store>(
    state: &State<S>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failed> {
    let posted = posted(state, headers, body, Role::Gateway).await?;
    let with_id = |problem: Problem| Failed {
        problem,
        request_id: posted.request_id_header.clone(),
    };
    let request = &posted.request;
    let defaults = Parts::of(request, "");
    let items: &[Value] = match request.get("evaluations") {
        None => &[],
        Some(Value::Array(items)) => items,
        Some(_) => return Err(with_id(Problem::bad_request("evaluations", "must be an array"))),
    };
    let active = pipeline::current(state).map_err(refused).map_err(with_id)?;
    if items.is_empty() {
        // No `evaluations`: the request is a single evaluation, and so is its answer.
        let item = defaults.evaluation("").map_err(with_id)?;
        let decided = decide(
            state,
            &active,
            &posted.gateway,
            item,
            posted.request_id.as_deref(),
        )
        .await
        .map_err(with_id)?;
        return Ok(answered(&decided, posted.request_id_header.clone()));
    }
    if items.len() > MAX_EVALUATIONS {
        return Err(with_id(Problem::bad_request(
            "evaluations",
            format!("{} items, more than the limit of {MAX_EVALUATIONS}", items.len()),
        )));
    }
    let semantic = Semantic::of(request).map_err(with_id)?;
    let mut read = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let at = format!("evaluations[{index}]");
        let item = mapping::object(item, &at).map_err(with_id)?;
        let prefix = format!("{at}.");
        let evaluation = Parts::of(item, &prefix)
            .or(defaults.clone())
            .evaluation(&prefix)
            .map_err(with_id)?;
        may_ask(&posted.gateway, &evaluation.caller).map_err(with_id)?;
        read.push(evaluation);
    }
    let mut decisions = Vec::with_capacity(read.len());
    for (index, item) in read.into_iter().enumerate() {
        // Each item has its own id, so that a retry of the batch replays every item it reached.
        let item_id = posted.request_id.as_deref().map(|id| format!("{id}/{index}"));
        let span = telemetry::rpc::http_item(index);
        let decided = tracing::Instrument::instrument(
            decide(state, &active, &posted.gateway, item, item_id.as_deref()),
            span,
        )
        .await
        .map_err(with_id)?;
        let permitted = decided["decision"] == Value::Bool(true);
        decisions.push(decided);
        if semantic.stops_after(permitted) {
            break;
        }
    }
    Ok(answered(
        &json!({"evaluations": decisions}),
        posted.request_id_header.clone(),
    ))
}

/// Refuses, before anything is decided, an item the gateway may not send: an assertion or a
/// forwarded client certificate from a gateway not trusted to assert.
fn may_ask(gateway: &Gateway, caller: &Asked<'_>) -> Result<(), Problem> {
    let checked = match caller {
        Asked::Principal(_) => gateway.check_may_assert(),
        Asked::Credential {
            presented: Some(crate::identity::Presented::ClientCertificate(_)),
            ..
        }
        | Asked::CredentialOf {
            presented: Some(crate::identity::Presented::ClientCertificate(_)),
            ..
        } => gateway.check_may_forward_certificate(),
        _ => Ok(()),
    };
    checked.map_err(refused)
}

/// One decision through the pipeline, as the AuthZEN Decision object; a retry with the same
/// request id gets the object its original got.
async fn decide<S: Store>(
    state: &State<S>,
    active: &Arc<crate::service::active::Active>,
    gateway: &Gateway,
    item: mapping::Evaluation<'_>,
    request_id: Option<&str>,
) -> Result<Value, Problem> {
    let ask = Ask {
        gateway,
        caller: item.caller,
        request_id,
        door: Door::Authzen,
        retry_facts: Vec::new(),
        arguments: item.arguments,
        replayable: pipeline::every_answer,
    };
    let remember: Remember = Arc::new(|answer: &Answer<'_>| decision_object(answer).to_string().into_bytes());
    match pipeline::decide(state, active, ask, item.target, &remember)
        .await
        .map_err(refused)?
    {
        Replied::Fresh(answer) => Ok(decision_object(&answer)),
        Replied::Replayed(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
            tracing::error!(%error, "a remembered AuthZEN answer does not parse");
            Problem {
                status: 500,
                message: "the remembered answer to this X-Request-ID cannot be read".to_owned(),
            }
        }),
    }
}

/// The pipeline's answer as an AuthZEN Decision: `decision`, and in `context` the decision id,
/// the version, the reason code and the pointer to the policy text that decided, and on an
/// allow the execution account (its id and secret *reference*) and the ceiling after this call.
fn decision_object(answer: &Answer<'_>) -> Value {
    let Answer {
        decision_id,
        at_ms,
        active,
        verdict,
    } = answer;
    let mut context = Map::new();
    context.insert("decision_id".into(), json!(decision_id));
    context.insert("policy_version".into(), json!(active.version));
    context.insert("policy_revision".into(), json!(active.revision));
    context.insert("at".into(), json!(crate::clock::format(*at_ms)));
    let permitted = match verdict {
        Verdict::Unauthenticated(problem) => {
            context.insert(
                "reason".into(),
                json!({"code": "unauthenticated", "problem": problem.as_str(), "message": problem.describe()}),
            );
            false
        }
        Verdict::UnknownTool(name) => {
            context.insert(
                "reason".into(),
                json!({"code": "unknown_tool", "message": crate::wire::convert::unknown_tool_message(name, &active.policy.tools)}),
            );
            false
        }
        Verdict::Decided(decided) => match &decided.decision {
            Decision::Allow(Allow {
                reason,
                account,
                limits,
                grant: _,
                conditional: _,
            }) => {
                context.insert(
                    "reason".into(),
                    json!({"code": reason.code.as_str(), "pointer": reason.path, "message": reason.message()}),
                );
                context.insert(
                    "account".into(),
                    json!({
                        "id": account.id,
                        "secret_ref": decided.secret_ref.map_or("", |secret_ref| secret_ref.as_str()),
                    }),
                );
                if let (Some(limits), Some(standing)) = (limits, decided.standing) {
                    context.insert(
                        "ceiling".into(),
                        json!({
                            "calls": limits.calls,
                            "per": limits.per,
                            "window_ms": limits.window_ms,
                            "remaining": standing.remaining,
                            "resets_at": crate::clock::format(standing.resets_at),
                        }),
                    );
                }
                true
            }
            Decision::Deny(reason) => {
                let mut why = json!({"code": reason.code.as_str(), "pointer": reason.path, "message": reason.message()});
                if let Some(resets_at) = decided.resets_at {
                    why["resets_at"] = json!(crate::clock::format(resets_at));
                }
                context.insert("reason".into(), why);
                false
            }
        },
    };
    json!({"decision": permitted, "context": context})
}

async fn search_resource<S: Store>(
    Shared(door): Shared<Arc<Served<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::rpc::http(SEARCH_RESOURCE, &headers.clone(), async move {
        match search(&door.state, &headers, body).await {
            Ok(response) => response,
            Err(failed) => failed.into_response(),
        }
    })
    .await
}

/// A resource search: the listing (`ListVisible`'s function, one audit record), as the tools the
/// subject may call (`resource.type = "tool"`) or the capabilities (`"capability"`). The whole
/// set is one page: capgate's listing is bounded (docs/decisions/0015), so no `next_token`.
async fn search<S: Store>(state: &State<S>, headers: &HeaderMap, body: Body) -> Result<Response, Failed> {
    let posted = posted(state, headers, body, Role::Gateway).await?;
    let with_id = |problem: Problem| Failed {
        problem,
        request_id: posted.request_id_header.clone(),
    };
    let request = &posted.request;
    let part = |name: &str| {
        request
            .get(name)
            .ok_or_else(|| with_id(Problem::bad_request(name, "required")))
    };
    let subject = part("subject")?;
    mapping::action_is_tools_call(part("action")?, "action").map_err(with_id)?;
    let kind = mapping::resource_kind(part("resource")?, "resource").map_err(with_id)?;
    if let Some(page) = request.get("page") {
        let page = mapping::object(page, "page").map_err(with_id)?;
        if mapping::text(page, "token", "page", MAX_REQUEST_ID)
            .map_err(with_id)?
            .is_some_and(|token| !token.is_empty())
        {
            return Err(with_id(Problem::bad_request(
                "page.token",
                "capgate answers a search in one page and issues no tokens",
            )));
        }
    }
    let caller = mapping::caller(subject, "subject").map_err(with_id)?;
    let active = pipeline::current(state).map_err(refused).map_err(with_id)?;
    let ask = Ask {
        gateway: &posted.gateway,
        caller,
        request_id: posted.request_id.as_deref(),
        door: Door::Authzen,
        retry_facts: Vec::new(),
        arguments: None,
        replayable: pipeline::every_answer,
    };
    let listing = pipeline::list(state, &active, ask)
        .await
        .map_err(refused)
        .map_err(with_id)?;
    Ok(answered(&found(&listing, kind), posted.request_id_header.clone()))
}

/// The listing as a search response: `results` of the type asked for, and the listing's
/// decision id (its audit record) in `context`.
fn found(listing: &Listing<'_>, kind: Kind) -> Value {
    let Listing {
        decision_id,
        at_ms,
        active,
        seen,
    } = listing;
    let mut context = Map::new();
    context.insert("decision_id".into(), json!(decision_id));
    context.insert("policy_version".into(), json!(active.version));
    context.insert("policy_revision".into(), json!(active.revision));
    context.insert("at".into(), json!(crate::clock::format(*at_ms)));
    let results: Vec<Value> = match seen {
        Err(problem) => {
            context.insert(
                "reason".into(),
                json!({"code": "unauthenticated", "problem": problem.as_str()}),
            );
            Vec::new()
        }
        Ok(seen) => match kind {
            Kind::Tool => seen
                .tools
                .iter()
                .map(|tool| json!({"type": kind.as_str(), "id": tool.exposed_name}))
                .collect(),
            Kind::Capability => seen
                .capabilities
                .iter()
                .map(|item| json!({"type": kind.as_str(), "id": item.capability.id}))
                .collect(),
        },
    };
    json!({
        "page": {"next_token": "", "count": results.len(), "total": results.len()},
        "context": context,
        "results": results,
    })
}

async fn search_subject<S: Store>(
    Shared(door): Shared<Arc<Served<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    telemetry::rpc::http(SEARCH_SUBJECT, &headers.clone(), async move {
        match who_can(&door.state, &headers, body).await {
            Ok(response) => response,
            Err(failed) => failed.into_response(),
        }
    })
    .await
}

/// A subject search: the policy's map for one target, so the admin token (`subjects.rs`).
async fn who_can<S: Store>(state: &State<S>, headers: &HeaderMap, body: Body) -> Result<Response, Failed> {
    let posted = posted(state, headers, body, Role::Admin).await?;
    let with_id = |problem: Problem| Failed {
        problem,
        request_id: posted.request_id_header.clone(),
    };
    let asked = subjects::read(&posted.request).map_err(with_id)?;
    let active = pipeline::current(state).map_err(refused).map_err(with_id)?;
    let at_ms = crate::clock::now();
    Ok(answered(
        &subjects::answer(&active, &asked, at_ms),
        posted.request_id_header.clone(),
    ))
}

/// The PDP metadata (spec §"Policy Decision Point Metadata"): the endpoints this door serves,
/// under `--http-public-url`, else under the address the connection was accepted on; never
/// under the request's `Host`, which the client chooses (docs/decisions/0032). It holds nothing
/// secret, so it needs no token.
async fn configuration<S: Store>(
    Shared(door): Shared<Arc<Served<S>>>,
    accepted_on: Option<axum::Extension<head_errors::AcceptedOn>>,
) -> Response {
    let scheme = if door.tls { "https" } else { "http" };
    let base = match (&door.public_url, accepted_on) {
        (Some(url), _) => url.clone(),
        (None, Some(axum::Extension(head_errors::AcceptedOn(addr)))) => format!("{scheme}://{addr}"),
        (None, None) => {
            return Failed::from(Problem {
                status: 503,
                message: "the PDP's base URL is unknown: set `--http-public-url`".to_owned(),
            })
            .into_response()
        }
    };
    json_response(
        StatusCode::OK,
        &json!({
            "policy_decision_point": base,
            "access_evaluation_endpoint": format!("{base}/access/v1/evaluation"),
            "access_evaluations_endpoint": format!("{base}/access/v1/evaluations"),
            "search_resource_endpoint": format!("{base}/access/v1/search/resource"),
            "search_subject_endpoint": format!("{base}/access/v1/search/subject"),
        }),
    )
}

/// Alive: the process answers HTTP.
async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// Ready once a policy version is active; before that every decision would be a 503.
async fn readyz<S: Store>(Shared(door): Shared<Arc<Served<S>>>) -> Response {
    match door.state.active.current() {
        Some(active) => json_response(
            StatusCode::OK,
            &json!({"status": "ready", "policy_revision": active.revision, "policy_version": active.version}),
        ),
        None => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "not ready", "message": "no policy version is active: publish one first"}),
        ),
    }
}

/// A route that exists, asked with another method (axum keeps the `Allow` header).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    Failed::from(Problem {
        status: 405,
        message: format!(
            "`{method}` is not served at `{}`; see the `Allow` header",
            uri.path()
        ),
    })
    .into_response()
}

async fn not_found() -> Response {
    Failed::from(Problem {
        status: 404,
        message: "no such AuthZEN endpoint; see /.well-known/authzen-configuration".to_owned(),
    })
    .into_response()
}
