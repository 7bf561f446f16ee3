//! What `capgate serve` exports, received for real: an OTLP/gRPC receiver
//! (a tonic server implementing the collector's `TraceService` and
//! `MetricsService` from `opentelemetry-proto`) on a loopback port, readers
//! for the spans, attributes and metric points that arrived, and the
//! Prometheus side — the address `--metrics-listen` bound, a plain HTTP `GET`
//! to scrape it and a reader for its series.
//!
//! Used by tests/telemetry.rs (what the telemetry says) and tests/identity.rs
//! (that no credential or secret reaches it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use super::process::Serve;

/// The span of a `Decide`, as documented.
pub const DECIDE_SPAN: &str = "capgate.v1.DecisionService/Decide";
pub const LIST_SPAN: &str = "capgate.v1.DecisionService/ListVisible";

// ── The receiver ──────────────────────────────────────────────────────────

/// Everything a receiver was sent, in arrival order.
#[derive(Clone, Default)]
struct Received {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// A collector on a loopback port; it stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Listens on `127.0.0.1:0`, over TLS with `tls`.
    pub async fn start(tls: Option<Identity>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let addr = listener.local_addr().expect("the receiver's address");
        let received = Received::default();
        let mut server = Server::builder();
        if let Some(identity) = tls {
            server = server
                .tls_config(ServerTlsConfig::new().identity(identity))
                .expect("the receiver's TLS");
        }
        let router = server
            .add_service(TraceServiceServer::new(received.clone()))
            .add_service(MetricsServiceServer::new(received.clone()));
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .expect("the receiver serves");
        });
        Receiver { addr, received, task }
    }

    /// `http://ADDR`, for `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received, with its resource's attributes.
    pub fn spans(&self) -> Vec<(Vec<KeyValue>, Span)> {
        let traces = self.received.traces.lock().unwrap();
        let mut spans = Vec::new();
        for request in traces.iter() {
            for resource_spans in &request.resource_spans {
                let resource = resource_spans
                    .resource
                    .as_ref()
                    .map(|resource| resource.attributes.clone())
                    .unwrap_or_default();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        spans.push((resource.clone(), span.clone()));
                    }
                }
            }
        }
        spans
    }

    /// The span whose `capgate.decision_id` is `id`.
    pub fn decision_span(&self, id: &str) -> Option<(Vec<KeyValue>, Span)> {
        self.spans()
            .into_iter()
            .find(|(_, span)| text(&span.attributes, "capgate.decision_id") == Some(id.to_owned()))
    }

    /// The metric `name` of the latest export that holds it, with that export's resource.
    pub fn latest_metric(&self, name: &str) -> Option<(Vec<KeyValue>, Metric)> {
        let exports = self.received.metrics.lock().unwrap();
        for request in exports.iter().rev() {
            for resource_metrics in &request.resource_metrics {
                for scope in &resource_metrics.scope_metrics {
                    if let Some(metric) = scope.metrics.iter().find(|metric| metric.name == name) {
                        let resource = resource_metrics
                            .resource
                            .as_ref()
                            .map(|resource| resource.attributes.clone())
                            .unwrap_or_default();
                        return Some((resource, metric.clone()));
                    }
                }
            }
        }
        None
    }

    /// Everything received, encoded as it came over the wire, and as Debug text.
    pub fn everything(&self) -> (Vec<u8>, String) {
        let mut bytes = Vec::new();
        let mut text = String::new();
        for request in self.received.traces.lock().unwrap().iter() {
            bytes.extend(request.encode_to_vec());
            text.push_str(&format!("{request:?}\n"));
        }
        for request in self.received.metrics.lock().unwrap().iter() {
            bytes.extend(request.encode_to_vec());
            text.push_str(&format!("{request:?}\n"));
        }
        (bytes, text)
    }
}

// ── Reading what arrived ──────────────────────────────────────────────────

/// The value of the attribute `key`, if it has one.
pub fn value<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| attribute.value.as_ref())
        .and_then(|value| value.value.as_ref())
}

/// A string attribute, or an integer one as text.
pub fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value(attributes, key)? {
        any_value::Value::StringValue(text) => Some(text.clone()),
        any_value::Value::IntValue(number) => Some(number.to_string()),
        any_value::Value::BoolValue(flag) => Some(flag.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// An integer attribute.
pub fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match value(attributes, key)? {
        any_value::Value::IntValue(number) => Some(*number),
        _ => None,
    }
}

/// Whether every `(key, value)` of `wanted` is among `attributes`.
pub fn matches(attributes: &[KeyValue], wanted: &[(&str, &str)]) -> bool {
    wanted
        .iter()
        .all(|(key, expected)| text(attributes, key).as_deref() == Some(*expected))
}

/// The value of a sum (counter) point with these attributes.
pub fn sum_value(metric: &Metric, wanted: &[(&str, &str)]) -> Option<i64> {
    let Some(metric::Data::Sum(sum)) = &metric.data else {
        panic!("{} is not a sum: {:?}", metric.name, metric.data);
    };
    sum.data_points
        .iter()
        .find(|point| matches(&point.attributes, wanted))
        .map(|point| match point.value {
            Some(number_data_point::Value::AsInt(value)) => value,
            Some(number_data_point::Value::AsDouble(value)) => value as i64,
            None => 0,
        })
}

/// (count, sum) over the histogram points with these attributes.
pub fn histogram(metric: &Metric, wanted: &[(&str, &str)]) -> (u64, f64) {
    let Some(metric::Data::Histogram(histogram)) = &metric.data else {
        panic!("{} is not a histogram: {:?}", metric.name, metric.data);
    };
    histogram
        .data_points
        .iter()
        .filter(|point| matches(&point.attributes, wanted))
        .fold((0, 0.0), |(count, sum), point| {
            (count + point.count, sum + point.sum.unwrap_or(0.0))
        })
}

/// The latest point of a gauge.
pub fn gauge_value(metric: &Metric) -> Option<i64> {
    let Some(metric::Data::Gauge(gauge)) = &metric.data else {
        panic!("{} is not a gauge: {:?}", metric.name, metric.data);
    };
    gauge.data_points.last().map(|point| match point.value {
        Some(number_data_point::Value::AsInt(value)) => value,
        Some(number_data_point::Value::AsDouble(value)) => value as i64,
        None => 0,
    })
}

/// Polls `check` until it gives a value; panics with `what` after `within`.
pub async fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `needle` occurs in `haystack` (raw bytes: an encoded export).
pub fn leaks(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

// ── Prometheus text over HTTP ─────────────────────────────────────────────

/// `GET path` over a plain TCP connection: (status code, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the metrics port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read the answer");
    let answer = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// The value of the series `name{…}` whose labels include `labels`.
pub fn prometheus_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(series, _)| {
            let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
            series_name == name
                && labels
                    .iter()
                    .all(|(key, value)| series_labels.contains(&format!("{key}=\"{value}\"")))
        })
        .and_then(|(_, value)| value.parse().ok())
}

/// The address `--metrics-listen` resolved to, from the start-up log line.
pub fn metrics_addr(serve: &Serve) -> SocketAddr {
    serve
        .logs()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["fields"]["message"] == "serving Prometheus metrics at /metrics")
        .and_then(|line| line["fields"]["address"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address logged:\n{}", serve.logs()))
}
