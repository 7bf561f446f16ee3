//! One span per capgate RPC, its duration and its gRPC status: a tower layer around the gRPC
//! router ([`RpcLayer`]), and what the handlers add to it ([`decided`], [`listed`], [`policy`]).
//!
//! The layer knows the RPCs from the proto's own descriptor set, so a new RPC is covered without
//! touching this file, and a request for any other path (health, reflection, a path nobody
//! serves) passes through with no span and no metric: a caller cannot mint attribute values.
//!
//! The span is named `capgate.v1.<Service>/<Method>` in OpenTelemetry (the semantic conventions'
//! `{rpc.service}/{rpc.method}`), is a child of the caller's span when the request carries a W3C
//! `traceparent`, and holds the fields below, recorded as the call goes. In the JSON logs every
//! line logged inside a call carries them too.
//!
//! INVARIANT: nothing recorded here comes from request metadata (where tokens travel) except
//! `traceparent`/`tracestate`, and nothing comes from a response's account (secret references),
//! a principal's attributes or a tool call's arguments.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use prost::Message;
use tonic::codegen::http;
use tracing::field::Empty;
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use capgate_core::principals::AuthProblem;

use crate::store::{AuditRecord, Door, RecordOutcome};

use super::metrics::metrics;

/// An RPC of the proto: its path, fully qualified service and method.
#[derive(Debug, Clone, Copy)]
struct Rpc {
    /// `capgate.v1.DecisionService/Decide`: the span's OpenTelemetry name.
    name: &'static str,
    service: &'static str,
    method: &'static str,
}

/// Every RPC the proto declares, by path (`/capgate.v1.DecisionService/Decide`), and Envoy's
/// ext_authz `Check`.
fn rpcs() -> &'static [(&'static str, Rpc)] {
    static RPCS: OnceLock<Vec<(&'static str, Rpc)>> = OnceLock::new();
    RPCS.get_or_init(|| {
        let Ok(set) = prost_types::FileDescriptorSet::decode(crate::wire::proto::FILE_DESCRIPTOR_SET) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let qualified = format!("{package}.{}", service.name());
                for method in &service.method {
                    // Built once for a handful of RPCs: leaking gives the `'static` names that
                    // span fields and metric attributes take without a copy per call.
                    let name: &'static str =
                        Box::leak(format!("{qualified}/{}", method.name()).into_boxed_str());
                    let path: &'static str = Box::leak(format!("/{name}").into_boxed_str());
                    let service: &'static str = Box::leak(qualified.clone().into_boxed_str());
                    let method: &'static str = Box::leak(method.name().to_owned().into_boxed_str());
                    found.push((
                        path,
                        Rpc {
                            name,
                            service,
                            method,
                        },
                    ));
                }
            }
        }
        // The one RPC served from another proto: Envoy's ext_authz `Check`
        // (src/service/grpc/ext_authz.rs), whose types come from the `envoy-types` crate.
        found.push((
            "/envoy.service.auth.v3.Authorization/Check",
            Rpc {
                name: "envoy.service.auth.v3.Authorization/Check",
                service: "envoy.service.auth.v3.Authorization",
                method: "Check",
            },
        ));
        found
    })
}

fn rpc_of(path: &str) -> Option<Rpc> {
    rpcs()
        .iter()
        .find(|(known, _)| *known == path)
        .map(|(_, rpc)| *rpc)
}

/// What a handler noted for the layer: the `Decide` outcome and code, counted once the answer
/// leaves (a call that then fails `UNAVAILABLE` is no decision).
#[derive(Default)]
struct Note {
    /// The door, the outcome and the code of each decision the call answered (one for `Decide`;
    /// one per item of an AuthZEN batch).
    decisions: Mutex<Vec<(&'static str, &'static str, &'static str)>>,
}

impl Note {
    fn take(&self) -> Vec<(&'static str, &'static str, &'static str)> {
        std::mem::take(
            &mut *self
                .decisions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

tokio::task_local! {
    static NOTE: Arc<Note>;
}

/// Wraps the gRPC router: [`RpcService`] per connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcLayer;

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> RpcService<S> {
        RpcService { inner }
    }
}

/// See [`RpcLayer`].
#[derive(Debug, Clone)]
pub struct RpcService<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for RpcService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(rpc) = rpc_of(request.uri().path()) else {
            return Box::pin(self.inner.call(request));
        };
        let span = tracing::info_span!(
            "rpc",
            otel.name = rpc.name,
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = "grpc",
            rpc.service = rpc.service,
            rpc.method = rpc.method,
            rpc.grpc.status_code = Empty,
            capgate.decision_id = Empty,
            capgate.outcome = Empty,
            capgate.code = Empty,
            capgate.policy.revision = Empty,
            capgate.policy.version = Empty,
            capgate.visible.count = Empty,
        );
        if request.headers().contains_key("traceparent") {
            let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
            // Refused only when no OpenTelemetry layer is installed: then there is nothing to join.
            let _ = span.set_parent(parent);
        }
        let note = Arc::new(Note::default());
        let started = Instant::now();
        let call = span.in_scope(|| self.inner.call(request));
        let call = NOTE.scope(note.clone(), call.instrument(span.clone()));
        Box::pin(async move {
            let result = call.await;
            let status = match &result {
                Ok(response) => grpc_status(response.headers()),
                // The router itself failed: no status was sent; UNKNOWN is what a client sees.
                Err(_) => 2,
            };
            span.record("rpc.grpc.status_code", status);
            if is_server_error(status) {
                span.record("otel.status_code", "error");
            }
            let decisions = note.take();
            let outcome = match (decisions.first(), status) {
                (Some((door, outcome, code)), 0) => {
                    metrics().decision(door, outcome, code);
                    Some(*outcome)
                }
                _ => None,
            };
            metrics().rpc(rpc.method, status, outcome, started.elapsed());
            result
        })
    }
}

/// One request through an HTTP door (AuthZEN): a span named after its route (a closed set the
/// door passes, never the request's path), a child of the caller's `traceparent`, with the HTTP
/// status once answered. Its decisions are counted, with their door, when the answer is a 200:
/// like a gRPC call that fails after deciding, a request answered with an error decided nothing
/// the gateway saw. Each item of a batch runs in a [`http_item`] span of its own.
pub async fn http<F, B>(route: &'static str, headers: &http::HeaderMap, call: F) -> http::Response<B>
where
    F: Future<Output = http::Response<B>>,
{
    http_door(route, "POST", headers, |status| status == 200, call).await
}

/// As [`http`], for a door whose every status may carry a decision (`decided` says which do):
/// the forward-auth door answers a denial as a 403 or a 429, and it is a decision all the same.
pub async fn http_door<F, B>(
    route: &'static str,
    method: &'static str,
    headers: &http::HeaderMap,
    decided: impl Fn(u16) -> bool,
    call: F,
) -> http::Response<B>
where
    F: Future<Output = http::Response<B>>,
{
    let span = tracing::info_span!(
        "http",
        otel.name = route,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
        capgate.decision_id = Empty,
        capgate.outcome = Empty,
        capgate.code = Empty,
        capgate.policy.revision = Empty,
        capgate.policy.version = Empty,
        capgate.visible.count = Empty,
    );
    if headers.contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let _ = span.set_parent(parent);
    }
    let note = Arc::new(Note::default());
    let started = Instant::now();
    let response = NOTE.scope(note.clone(), call.instrument(span.clone())).await;
    let status = response.status().as_u16();
    metrics().http(route, status, started.elapsed());
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
    if decided(status) {
        for (door, outcome, code) in note.take() {
            metrics().decision(door, outcome, code);
        }
    }
    response
}

/// The span of one item of an AuthZEN batch (`evaluations[index]`), inside the request's span:
/// it holds that item's decision, as the request's span holds a single evaluation's.
pub fn http_item(index: usize) -> Span {
    tracing::info_span!(
        "evaluation",
        capgate.index = int(index),
        capgate.decision_id = Empty,
        capgate.outcome = Empty,
        capgate.code = Empty,
        capgate.policy.revision = Empty,
        capgate.policy.version = Empty,
    )
}

/// The status of a unary response: in the headers when the call failed (a "trailers-only"
/// response), else OK — the trailers that carry `0` come after the body.
fn grpc_status<T>(headers: &http::HeaderMap<T>) -> i64
where
    T: AsRef<[u8]>,
{
    headers
        .get("grpc-status")
        .and_then(|value| std::str::from_utf8(value.as_ref()).ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// The codes the OpenTelemetry conventions count as a server's own error: UNKNOWN,
/// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS. The rest (a deny's
/// neighbours INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, …) are the caller's.
fn is_server_error(status: i64) -> bool {
    matches!(status, 2 | 4 | 12 | 13 | 14 | 15)
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A number as a span field: OpenTelemetry has 64-bit signed integers, and the tracing bridge
/// turns an unsigned one into text.
fn int(number: impl TryInto<i64>) -> i64 {
    number.try_into().unwrap_or(i64::MAX)
}

/// The outcome as the closed set the metrics use: the audit trail's spelling.
fn outcome_of(outcome: RecordOutcome) -> &'static str {
    match outcome {
        RecordOutcome::Allow => "allow",
        RecordOutcome::Deny => "deny",
        RecordOutcome::Unauthenticated => "unauthenticated",
        RecordOutcome::UnknownTool => "unknown_tool",
        RecordOutcome::Replayed => "replayed",
        RecordOutcome::RequestIdReused => "request_id_reused",
    }
}

/// A `Decide` reached its answer (its audit record is about to be written): the span gets the
/// decision id, outcome, code and version; the decision is counted once the answer leaves.
pub fn decided(record: &AuditRecord) {
    let span = Span::current();
    let outcome = outcome_of(record.outcome);
    // An unknown tool has no reason code; `none` keeps the attribute present and closed.
    let code = record.code.map_or("none", |code| code.as_str());
    span.record("capgate.decision_id", record.decision_id.as_str());
    span.record("capgate.outcome", outcome);
    span.record("capgate.code", code);
    if let Some(revision) = record.policy_revision {
        span.record("capgate.policy.revision", int(revision));
    }
    if let Some(version) = &record.policy_version {
        span.record("capgate.policy.version", version.as_str());
    }
    let _ = NOTE.try_with(|note| {
        note.decisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((record.door.as_str(), outcome, code));
    });
}

/// How a request's `request_id` was met when it was not decided afresh (docs/decisions/0027).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestIdUse {
    /// A retry, answered with its first answer.
    Replayed,
    /// Refused: the id belongs to another request.
    Reused,
}

impl RequestIdUse {
    /// The metric's `result` label, and the span's outcome.
    pub fn as_str(self) -> (&'static str, &'static str) {
        match self {
            RequestIdUse::Replayed => ("replayed", "replayed"),
            RequestIdUse::Reused => ("reused", "request_id_reused"),
        }
    }
}

/// A request whose `request_id` was used before was answered with its first answer, or refused:
/// the span says which (its outcome as the audit record's), and `capgate.request_ids` counts it.
/// Its record is durable by now.
pub fn request_id(door: Door, used: RequestIdUse) {
    let (result, outcome) = used.as_str();
    Span::current().record("capgate.outcome", outcome);
    metrics().request_id(door.as_str(), result);
}

/// A listing's answer: the version it was listed on, and how many capabilities are visible (or
/// the problem when the caller could not be authenticated).
pub fn listed(revision: u64, version: &str, seen: Result<usize, AuthProblem>) {
    let span = Span::current();
    span.record("capgate.policy.revision", int(revision));
    span.record("capgate.policy.version", version);
    match seen {
        Ok(count) => {
            span.record("capgate.outcome", "allow");
            span.record("capgate.visible.count", int(count));
        }
        Err(problem) => {
            span.record("capgate.outcome", "unauthenticated");
            span.record("capgate.code", problem.as_str());
        }
    }
}

/// A policy RPC's revision and content version, as far as they are known.
pub fn policy(revision: Option<u64>, version: Option<&str>) {
    let span = Span::current();
    if let Some(revision) = revision.filter(|revision| *revision > 0) {
        span.record("capgate.policy.revision", int(revision));
    }
    if let Some(version) = version {
        span.record("capgate.policy.version", version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rpcs_come_from_the_proto() {
        let decide = rpc_of("/capgate.v1.DecisionService/Decide").expect("Decide is known");
        assert_eq!(decide.name, "capgate.v1.DecisionService/Decide");
        assert_eq!(decide.service, "capgate.v1.DecisionService");
        assert_eq!(decide.method, "Decide");
        assert!(rpc_of("/capgate.v1.PolicyService/PublishPolicy").is_some());
        assert!(rpc_of("/grpc.health.v1.Health/Check").is_none());
        assert!(rpc_of("/capgate.v1.DecisionService/Nonsense").is_none());
    }

    #[test]
    fn statuses_come_from_trailers_only_responses() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(grpc_status(&headers), 0);
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert_eq!(grpc_status(&headers), 14);
        assert!(is_server_error(14));
        assert!(!is_server_error(16));
        assert!(!is_server_error(0));
    }
}
