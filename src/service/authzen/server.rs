//! The HTTP port's connections (AuthZEN and forward-auth): HTTP/1.1 (TLS with the gRPC port's
//! certificate and client CA when `--tls-cert` is set), and a drain at shutdown: no new
//! connections, each open one finishes the request in flight and closes.
//!
//! What a client can hold, and for how long (docs/decisions/0013, docs/service.md "Connections"):
//!
//! * a connection takes a permit from the budget the gRPC port draws from too (`--max-connections`
//!   across every listener, by default half the open-file limit), and at most half of that budget:
//!   a flood on this port leaves the gRPC port (the gateways' `Decide`, the admin's publish) the
//!   other half, and the store pool and the spool the descriptors outside the budget;
//! * a request's head must arrive within `--handshake-timeout` (TLS handshake included), its body
//!   within as long again (`408`, the connection closed: the doors' handlers), and a kept-alive
//!   connection with no request is closed after `--handshake-timeout` as well;
//! * a request head has at most [`MAX_HEAD_FIELDS`] fields and [`MAX_HEAD_BYTES`]; hyper's own
//!   answer to one it cannot parse (`400`, `414`, `431`) is given the door's JSON error body
//!   (`head_errors.rs`);
//! * an `accept` that fails (out of descriptors) is retried after a pause that doubles up to a
//!   second, and logged at most every ten seconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use super::head_errors::{Answering, Ledger, Watched, MAX_HEAD_BYTES, MAX_HEAD_FIELDS};
use crate::service::config::Config;
use crate::service::connections::{tls_config, Throttle};
use crate::service::State;
use crate::store::Store;

/// How long the drain waits for open connections to finish their request.
const DRAIN_WITHIN: Duration = Duration::from_secs(30);
/// Back-off after an `accept` that failed for want of resources.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// The running AuthZEN listeners.
pub struct HttpServer {
    /// Where they listen, in the order given (ports resolved).
    pub addrs: Vec<SocketAddr>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Serves on the bound `--http-listen` listeners (none: nothing runs) until `stop` turns
    /// true. A connection draws a permit from `budget` (`max_connections` of them, shared with
    /// the gRPC port), and this port holds at most half of them.
    pub async fn bind<S: Store>(
        state: Arc<State<S>>,
        config: &Config,
        listeners: Vec<TcpListener>,
        (budget, max_connections): (Arc<Semaphore>, usize),
        stop: watch::Receiver<bool>,
    ) -> Result<HttpServer, crate::service::StartError> {
        let tls = config
            .tls
            .as_ref()
            .map(|tls| {
                tls_config(tls).map(|mut config| {
                    config.alpn_protocols = vec![b"http/1.1".to_vec()];
                    TlsAcceptor::from(Arc::new(config))
                })
            })
            .transpose()
            .map_err(crate::service::StartError::Tls)?;
        let mut addrs = Vec::with_capacity(listeners.len());
        for (listener, addr) in listeners.iter().zip(&config.http_listen) {
            let bind = |error| crate::service::StartError::Bind { addr: *addr, error };
            addrs.push(listener.local_addr().map_err(bind)?);
        }
        // The forward-auth door shares the listener: one HTTP port for the proxies' doors.
        let head_timeout = config.connections.handshake_timeout;
        let router = super::router(state.clone(), tls.is_some(), config.http_public_url.clone())
            .merge(crate::service::forward_auth::routes(
                state,
                config.forward_auth.clone(),
                config.ext_authz.clone(),
            ))
            .layer(axum::middleware::from_fn_with_state(head_timeout, body_deadline));
        let door = Arc::new(Accepting {
            service: TowerToHyperService::new(router),
            tls,
            budget,
            share: Arc::new(Semaphore::new((max_connections / 2).max(1))),
            head_timeout,
            accept_errors: Throttle::default(),
            refusals: Throttle::default(),
        });
        let task = tokio::spawn(serve(listeners, door, stop));
        Ok(HttpServer { addrs, task })
    }

    /// Waits for the drain to end (after `stop`): every request in flight answered, so that
    /// every record they wrote is with the audit writer.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

struct Accepting {
    service: TowerToHyperService<axum::Router>,
    tls: Option<TlsAcceptor>,
    /// The process's connection budget, shared with the gRPC port.
    budget: Arc<Semaphore>,
    /// This port's share of it: half.
    share: Arc<Semaphore>,
    head_timeout: Duration,
    accept_errors: Throttle,
    refusals: Throttle,
}

impl Accepting {
    /// A permit of this port's share and one of the budget, or `None`: the connection is closed.
    fn admit(&self) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let share = self.share.clone().try_acquire_owned().ok()?;
        let budget = self.budget.clone().try_acquire_owned().ok()?;
        Some((share, budget))
    }
}

async fn serve(listeners: Vec<TcpListener>, door: Arc<Accepting>, stop: watch::Receiver<bool>) {
    let mut loops = JoinSet::new();
    for listener in listeners {
        loops.spawn(accept(listener, door.clone(), stop.clone()));
    }
    while loops.join_next().await.is_some() {}
}

async fn accept(listener: TcpListener, door: Arc<Accepting>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    let mut pause = FIRST_PAUSE;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopping(&mut stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                pause = FIRST_PAUSE;
                stream
            }
            Err(error) => {
                // Out of descriptors and the like: wait, longer each time, rather than spin.
                if let Some(suppressed) = door.accept_errors.check() {
                    tracing::warn!(
                        %error,
                        retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                        similar_since_last_warning = suppressed,
                        "the HTTP listener cannot accept a connection; pausing before the next try"
                    );
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stopping(&mut stop) => break,
                }
                pause = (pause * 2).min(LONGEST_PAUSE);
                continue;
            }
        };
        // Past the cap a connection is closed at once; the ones already open go on.
        let Some(permit) = door.admit() else {
            drop(stream);
            crate::telemetry::metrics::metrics()
                .connection_closed(crate::telemetry::metrics::CloseReason::MaxConnections);
            if let Some(suppressed) = door.refusals.check() {
                tracing::warn!(
                    refused_since_last_warning = suppressed,
                    "HTTP connection refused: `--max-connections` reached, or this port's half of it"
                );
            }
            continue;
        };
        let door = door.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            connection(stream, &door, stop).await;
            drop(permit);
        });
        // Finished connections are reaped as they end, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_WITHIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!("HTTP connections still open after the drain; closing them");
    }
}

async fn connection(stream: tokio::net::TcpStream, door: &Accepting, stop: watch::Receiver<bool>) {
    let Ok(accepted_on) = stream.local_addr() else {
        return;
    };
    let ledger = Arc::new(Ledger::default());
    let service = Watched {
        inner: door.service.clone(),
        ledger: ledger.clone(),
        accepted_on,
    };
    match &door.tls {
        None => http1(TokioIo::new(Answering::new(stream, ledger)), service, door, stop).await,
        Some(tls) => match tokio::time::timeout(door.head_timeout, tls.accept(stream)).await {
            Ok(Ok(stream)) => http1(TokioIo::new(Answering::new(stream, ledger)), service, door, stop).await,
            Ok(Err(error)) => tracing::debug!(%error, "an AuthZEN TLS handshake failed"),
            Err(_) => tracing::debug!("an AuthZEN TLS handshake took too long"),
        },
    }
}

async fn http1<I>(
    io: I,
    service: Watched<TowerToHyperService<axum::Router>>,
    door: &Accepting,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(door.head_timeout)
        .max_headers(MAX_HEAD_FIELDS)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(io, service);
    tokio::pin!(served);
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = stopping(&mut stop) => {
            // Finish the request in flight, then close.
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "an AuthZEN connection ended with an error");
    }
}

/// Resolves once the server is told to stop (the watch's guard is not held past it).
async fn stopping(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Gives a request's body `within` from the moment its head was read to arrive in full: a body
/// that is still coming then ends in [`BodyTimedOut`], which the doors answer `408`.
async fn body_deadline(
    axum::extract::State(within): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let request = request.map(|body| {
        axum::body::Body::new(Deadline {
            body,
            deadline: Box::pin(tokio::time::sleep(within)),
        })
    });
    next.run(request).await
}

/// A request body that must be read in full before its deadline.
struct Deadline {
    body: axum::body::Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => match std::future::Future::poll(self.deadline.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that did not arrive within `--handshake-timeout` of its head.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

/// Whether `error`, or an error it wraps, is a [`BodyTimedOut`].
pub fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<BodyTimedOut>() {
            return true;
        }
        next = error.source();
    }
    false
}
