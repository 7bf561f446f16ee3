//! The AuthZEN port's connections: HTTP/1.1 (TLS with the gRPC port's certificate and client CA
//! when `--tls-cert` is set), at most `--max-connections` at once (its own count), a request head
//! within `--handshake-timeout`, and a drain at shutdown: no new connections, each open one
//! finishes the request in flight and closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::service::config::{Config, Connections};
use crate::service::connections::tls_config;
use crate::service::State;
use crate::store::Store;

/// How long the drain waits for open connections to finish their request.
const DRAIN_WITHIN: Duration = Duration::from_secs(30);

/// The running AuthZEN listeners.
pub struct HttpServer {
    /// Where they listen, in the order given (ports resolved).
    pub addrs: Vec<SocketAddr>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Binds every `--http-listen` address (none: nothing runs) and serves until `stop` turns
    /// true. The listeners are bound here, so that a port in use fails the start.
    pub async fn bind<S: Store>(
        state: Arc<State<S>>,
        config: &Config,
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
        let mut listeners = Vec::with_capacity(config.http_listen.len());
        let mut addrs = Vec::with_capacity(config.http_listen.len());
        for addr in &config.http_listen {
            let bind = |error| crate::service::StartError::Bind { addr: *addr, error };
            let listener = TcpListener::bind(addr).await.map_err(bind)?;
            addrs.push(listener.local_addr().map_err(bind)?);
            listeners.push(listener);
        }
        // The forward-auth door shares the listener: one HTTP port for the proxies' doors.
        let router = super::router(state.clone(), tls.is_some()).merge(crate::service::forward_auth::routes(
            state,
            config.forward_auth.clone(),
            config.ext_authz.clone(),
        ));
        let door = Arc::new(Accepting {
            service: TowerToHyperService::new(router),
            tls,
            permits: Arc::new(Semaphore::new(
                config
                    .connections
                    .max_connections
                    .unwrap_or(Connections::DEFAULT_MAX),
            )),
            head_timeout: config.connections.handshake_timeout,
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
    permits: Arc<Semaphore>,
    head_timeout: Duration,
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
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopping(&mut stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(%error, "the AuthZEN listener cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Past the cap a connection is closed at once; the ones already open go on.
        let Ok(permit) = door.permits.clone().try_acquire_owned() else {
            drop(stream);
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
        tracing::warn!("AuthZEN connections still open after the drain; closing them");
    }
}

async fn connection(stream: tokio::net::TcpStream, door: &Accepting, stop: watch::Receiver<bool>) {
    match &door.tls {
        None => http1(TokioIo::new(stream), door, stop).await,
        Some(tls) => match tokio::time::timeout(door.head_timeout, tls.accept(stream)).await {
            Ok(Ok(stream)) => http1(TokioIo::new(stream), door, stop).await,
            Ok(Err(error)) => tracing::debug!(%error, "an AuthZEN TLS handshake failed"),
            Err(_) => tracing::debug!("an AuthZEN TLS handshake took too long"),
        },
    }
}

async fn http1<I>(io: I, door: &Accepting, mut stop: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(door.head_timeout)
        .serve_connection(io, door.service.clone());
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
