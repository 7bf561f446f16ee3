//! `--metrics-listen ADDR`: the metrics as Prometheus text, `GET /metrics`, for those who scrape
//! rather than run a collector. The same meter provider feeds it and the OTLP exporter, so both
//! show the same instruments (docs/decisions/0010-telemetry.md says why it needs no token).
//!
//! HTTP/1.1 only, one path, bounded: at most [`MAX_CONNECTIONS`] connections at a time, and a
//! connection that has not sent its request head within [`HEAD_TIMEOUT`] is closed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The text exposition format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running endpoint.
pub struct MetricsServer {
    /// Where it listens (the port resolved).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `addr` and serves `registry` there until [`MetricsServer::stop`].
    pub async fn start(addr: SocketAddr, registry: ::prometheus::Registry) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener, Arc::new(registry)));
        Ok(MetricsServer { addr, task })
    }

    /// Stops accepting; a scrape in flight is cut (the next one goes to another process).
    pub fn stop(self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, registry: Arc<::prometheus::Registry>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(%error, "the metrics listener cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let registry = registry.clone();
                async move { Ok::<_, Infallible>(answer(&request, &registry)) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "a metrics connection ended with an error");
            }
            drop(permit);
        });
    }
}

fn answer(request: &Request<Incoming>, registry: &::prometheus::Registry) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match ::prometheus::TextEncoder::new().encode_to_string(&registry.gather()) {
        Ok(text) => response(StatusCode::OK, CONTENT_TYPE, text),
        Err(error) => {
            tracing::warn!(%error, "the metrics cannot be encoded");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the metrics cannot be encoded\n",
            )
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", text.to_owned())
}

fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
