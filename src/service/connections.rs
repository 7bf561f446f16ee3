//! The decision port's connections, from `accept` to close: how many may be open, how long a
//! handshake may take, how long a connection may sit idle, and what an exhausted open-file limit
//! does (docs/decisions/0013; the flags in docs/service.md, "Connections").
//!
//! tonic serves HTTP/2 on what [`Acceptor::incoming`] hands it. Before that, each accepted socket
//!
//! 1. takes a permit from a semaphore of `--max-connections` permits, shared with the HTTP
//!    listener (`authzen/server.rs`: one budget of descriptors for every door), or is closed at once — the
//!    clients already connected keep being served, and the file descriptors the store pool and
//!    the spool need are not spent on a flood;
//! 2. does TLS, when configured, and sends the HTTP/2 client preface (the magic and its first
//!    SETTINGS frame) within `--handshake-timeout`, or is closed — a silent socket costs a
//!    permit for that long, not forever;
//! 3. becomes a [`Connection`]: the socket, the preface bytes read so far (replayed to hyper),
//!    the permit (released when hyper drops the connection) and an idle watch, which ends the
//!    connection once no stream has been open for `--idle-timeout`. [`StreamLayer`] counts the
//!    open streams: from a request to the end of its response body.
//!
//! An `accept` that fails for any reason but the one connection going away — above all for want
//! of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) — is retried after a pause that
//! doubles up to a second, and logged at most every ten seconds: the pending connections wait in
//! the kernel's backlog, and the process does not spin. HTTP/2
//! keepalive pings and SETTINGS_MAX_CONCURRENT_STREAMS are hyper's, set on tonic's builder in
//! `mod.rs`.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::http;
use tonic::transport::server::Connected;

use super::config::{Connections, Tls};
use crate::telemetry::metrics::{metrics, CloseReason};
pub(crate) use crate::telemetry::Throttle;

/// The first 24 bytes a client sends on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An HTTP/2 frame header: length (3 bytes), type, flags, stream (4 bytes).
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
/// The largest frame a peer may send before it has seen our SETTINGS (RFC 9113 §4.2).
const INITIAL_MAX_FRAME: usize = 16_384;
/// The default cap is the open-file limit divided by this: half of the descriptors for
/// connections, half for the store pool, the spool, the listeners and the rest.
const DEFAULT_SHARE_OF_FILES: u64 = 2;
/// An explicit cap within this many descriptors of the open-file limit is warned about.
const FILES_FOR_THE_REST: u64 = 64;
/// Back-off after an `accept` that failed for want of resources.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Accepts on the listeners and hands tonic the connections that finished their handshake.
pub struct Acceptor {
    settings: Connections,
    max_connections: usize,
    /// The `max_connections` permits every listener of the process draws from: the gRPC port's
    /// and the HTTP port's connections are one budget of descriptors.
    budget: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
}

impl Acceptor {
    /// Resolves the connection cap (warning when the open-file limit cannot hold it) and reads
    /// the TLS material. An error names the flag whose file cannot be used.
    pub fn new(settings: &Connections, tls: Option<&Tls>) -> Result<Acceptor, String> {
        let files = open_file_limit();
        let max_connections = match (settings.max_connections, files) {
            (Some(max), Some(files)) => {
                if u64::try_from(max)
                    .unwrap_or(u64::MAX)
                    .saturating_add(FILES_FOR_THE_REST)
                    > files
                {
                    tracing::warn!(
                        max_connections = max,
                        open_file_limit = files,
                        "`--max-connections` is more than the open-file limit leaves room for: \
                         accepting will fail (and be retried) before the cap is reached; raise \
                         `ulimit -n` or lower the cap"
                    );
                }
                max
            }
            (Some(max), None) => max,
            (None, Some(files)) => usize::try_from(files / DEFAULT_SHARE_OF_FILES)
                .unwrap_or(usize::MAX)
                .clamp(1, Connections::DEFAULT_MAX),
            (None, None) => Connections::DEFAULT_MAX,
        };
        Ok(Acceptor {
            settings: settings.clone(),
            max_connections,
            budget: Arc::new(Semaphore::new(max_connections)),
            tls: tls.map(tls_acceptor).transpose()?,
        })
    }

    /// The connection cap in force, across every listener.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The permits every listener draws a connection from ([`Acceptor::max_connections`] of
    /// them), for the HTTP listener to share.
    pub fn budget(&self) -> Arc<Semaphore> {
        self.budget.clone()
    }

    /// Starts accepting on every listener. The stream never ends by itself; once tonic drops it
    /// (at shutdown) the accept loops end and the listeners close.
    pub fn incoming(self, listeners: Vec<TcpListener>) -> impl Stream<Item = Result<Connection, Infallible>> {
        let (ready, connections) = mpsc::channel(64);
        let door = Arc::new(Door {
            settings: self.settings,
            max_connections: self.max_connections,
            permits: self.budget,
            tls: self.tls,
            refusals: Throttle::default(),
            accept_errors: Throttle::default(),
        });
        for listener in listeners {
            tokio::spawn(accept_loop(listener, door.clone(), ready.clone()));
        }
        ReceiverStream::new(connections).map(Ok)
    }
}

/// What every accept loop and handshake shares.
struct Door {
    settings: Connections,
    max_connections: usize,
    permits: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    refusals: Throttle,
    accept_errors: Throttle,
}

async fn accept_loop(listener: TcpListener, door: Arc<Door>, ready: mpsc::Sender<Connection>) {
    let mut pause = FIRST_PAUSE;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = ready.closed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                pause = FIRST_PAUSE;
                door.admit(stream, peer, &ready);
            }
            // This one connection went away before it was accepted: take the next.
            Err(error) if gone_before_accepted(&error) => {}
            Err(error) => {
                if let Some(suppressed) = door.accept_errors.check() {
                    tracing::warn!(
                        error = %error,
                        retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                        similar_since_last_warning = suppressed,
                        "cannot accept a connection; pausing before the next try"
                    );
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = ready.closed() => return,
                }
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

/// An `accept` error about the connection being accepted, not about the process: retried at once.
fn gone_before_accepted(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
    )
}

impl Door {
    /// Takes a permit for `stream` (or closes it) and does its handshake in a task of its own, so
    /// that a slow peer never holds up the next `accept`.
    fn admit(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr, ready: &mpsc::Sender<Connection>) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            drop(stream);
            metrics().connection_closed(CloseReason::MaxConnections);
            if let Some(suppressed) = self.refusals.check() {
                tracing::warn!(
                    max_connections = self.max_connections,
                    refused_since_last_warning = suppressed,
                    "connection refused: `--max-connections` connections are open"
                );
            }
            return;
        };
        // Small messages both ways: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let door = self.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(door.settings.handshake_timeout, door.handshake(stream));
            let (transport, preface) = match handshake.await {
                Ok(Ok(done)) => done,
                Ok(Err(error)) => {
                    metrics().connection_closed(CloseReason::HandshakeError);
                    tracing::debug!(%peer, error = %error, "connection closed: no HTTP/2 handshake");
                    return;
                }
                Err(_) => {
                    metrics().connection_closed(CloseReason::HandshakeTimeout);
                    tracing::debug!(%peer, "connection closed: `--handshake-timeout` passed before its handshake was done");
                    return;
                }
            };
            let connection = Connection::new(transport, preface, peer, door.settings.idle_timeout, permit);
            // An error means the server stopped accepting: the connection is dropped, closed.
            let _ = ready.send(connection).await;
        });
    }

    /// TLS when configured, then the client preface: the magic and a whole SETTINGS frame.
    async fn handshake(&self, stream: TcpStream) -> io::Result<(Transport, Vec<u8>)> {
        let mut transport = match &self.tls {
            Some(tls) => Transport::Tls(Box::new(tls.accept(stream).await?)),
            None => Transport::Plain(stream),
        };
        let mut preface = vec![0u8; PREFACE.len() + FRAME_HEADER];
        transport.read_exact(&mut preface).await?;
        let header = &preface[PREFACE.len()..];
        let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if &preface[..PREFACE.len()] != PREFACE || header[3] != SETTINGS || length > INITIAL_MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 client preface",
            ));
        }
        let settings_at = preface.len();
        preface.resize(settings_at + length, 0);
        transport.read_exact(&mut preface[settings_at..]).await?;
        Ok((transport, preface))
    }
}

/// The server's TLS configuration from `--tls-cert`, `--tls-key` and `--tls-client-ca` (PEM),
/// offering HTTP/2 by ALPN. With a client CA, a client must show a certificate it signed.
fn tls_acceptor(tls: &Tls) -> Result<TlsAcceptor, String> {
    let mut config = tls_config(tls)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The server's TLS configuration from the `--tls-*` material, without ALPN: the gRPC port
/// offers `h2`, the AuthZEN port `http/1.1`, on the same certificate and client CA.
pub fn tls_config(tls: &Tls) -> Result<rustls::ServerConfig, String> {
    let certificates = |flag: &str, pem: &[u8]| -> Result<Vec<CertificateDer<'static>>, String> {
        let found = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| format!("`{flag}` is not PEM: {error}"))?;
        if found.is_empty() {
            return Err(format!("`{flag}` holds no certificate"));
        }
        Ok(found)
    };
    let chain = certificates("--tls-cert", &tls.cert)?;
    // The key's own parse error is not shown: nothing of the key may reach a message.
    let key = PrivateKeyDer::from_pem_slice(&tls.key)
        .map_err(|_| "`--tls-key` holds no private key (PEM: PKCS#8, PKCS#1 or SEC1)".to_owned())?;
    let builder = rustls::ServerConfig::builder();
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates("--tls-client-ca", pem)? {
                roots
                    .add(certificate)
                    .map_err(|error| format!("`--tls-client-ca`: {error}"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|error| format!("`--tls-client-ca`: {error}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(chain, key)
        .map_err(|error| format!("`--tls-cert` and `--tls-key` do not go together: {error}"))
}

/// The process's soft limit on open files, when it has one.
#[cfg(unix)]
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live, writable one.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // `rlim_t` is `u64` here but narrower on 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let soft = u64::from(limit.rlim_cur);
    (read == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<u64> {
    None
}

/// A socket, in the clear or in TLS.
enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Transport::Tls(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Transport::Tls(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Transport::Tls(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(stream) => stream.is_write_vectored(),
            Transport::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Transport::Tls(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Transport::Tls(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// A connection past its handshake, as tonic serves it.
pub struct Connection {
    transport: Transport,
    /// What the handshake read, given to hyper first.
    preface: Vec<u8>,
    replayed: usize,
    peer: SocketAddr,
    streams: Arc<Streams>,
    idle_timeout: Duration,
    /// Fires when the connection may have been idle for `idle_timeout`; checked, and re-armed,
    /// whenever hyper waits to read.
    idle_check: Pin<Box<Sleep>>,
    /// Set once the connection was ended for being idle.
    ended_idle: bool,
    /// One of `--max-connections`, given back when hyper drops the connection.
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    fn new(
        transport: Transport,
        preface: Vec<u8>,
        peer: SocketAddr,
        idle_timeout: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Connection {
        Connection {
            transport,
            preface,
            replayed: 0,
            peer,
            streams: Arc::new(Streams::default()),
            idle_timeout,
            idle_check: Box::pin(tokio::time::sleep(idle_timeout)),
            ended_idle: false,
            _permit: permit,
        }
    }

    /// Whether no stream has been open for `idle_timeout`; otherwise arms `idle_check` for the
    /// earliest instant that could be true, so that hyper's next wait to read wakes then.
    fn idle_for_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle_check.as_mut().poll(cx).is_ready() {
            let next_check = match self.streams.idle_since() {
                // A stream is open: it cannot be idle before `idle_timeout` from now.
                None => Instant::now() + self.idle_timeout,
                Some(since) if since + self.idle_timeout <= Instant::now() => return true,
                Some(since) => since + self.idle_timeout,
            };
            self.idle_check.as_mut().reset(next_check);
        }
        false
    }
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.preface.len() {
            let rest = &this.preface[this.replayed..];
            let taken = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..taken]);
            this.replayed += taken;
            return Poll::Ready(Ok(()));
        }
        if this.ended_idle {
            return Poll::Ready(Ok(()));
        }
        if let Poll::Ready(read) = Pin::new(&mut this.transport).poll_read(cx, buf) {
            return Poll::Ready(read);
        }
        // Nothing to read: hyper waits. If no stream has been open for `idle_timeout`, end of
        // file instead — hyper finishes the connection and drops it, which closes the socket.
        // No request is lost in between: bytes not read yet were never a request.
        if this.idle_for_too_long(cx) {
            this.ended_idle = true;
            metrics().connection_closed(CloseReason::IdleTimeout);
            tracing::debug!(peer = %this.peer, "connection closed: no call for `--idle-timeout`");
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().transport).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().transport).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.transport.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().transport).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().transport).poll_shutdown(cx)
    }
}

/// What a request carries of its connection (a request extension, set by tonic): the count
/// of its open streams.
#[derive(Clone)]
pub struct ConnectionInfo {
    streams: Arc<Streams>,
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            streams: self.streams.clone(),
        }
    }
}

/// A connection's open streams, and since when none has been.
struct Streams {
    state: Mutex<StreamCount>,
}

struct StreamCount {
    open: usize,
    idle_since: Instant,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            state: Mutex::new(StreamCount {
                open: 0,
                idle_since: Instant::now(),
            }),
        }
    }
}

impl Streams {
    fn count(&self) -> std::sync::MutexGuard<'_, StreamCount> {
        // The count is two plain fields, consistent after any panic.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn opened(self: &Arc<Self>) -> OpenStream {
        self.count().open += 1;
        OpenStream(self.clone())
    }

    /// `None` while a stream is open.
    fn idle_since(&self) -> Option<Instant> {
        let count = self.count();
        (count.open == 0).then_some(count.idle_since)
    }
}

/// One open stream, counted until dropped.
struct OpenStream(Arc<Streams>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut count = self.0.count();
        count.open -= 1;
        if count.open == 0 {
            count.idle_since = Instant::now();
        }
    }
}

/// Counts each request as an open stream of its connection, until its response body is done
/// (or dropped: a call the client cancelled), so that a long `Watch` keeps its connection
/// from being idle and a finished call does not.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamLayer;

impl<S> tower::Layer<S> for StreamLayer {
    type Service = StreamCounting<S>;

    fn layer(&self, inner: S) -> StreamCounting<S> {
        StreamCounting { inner }
    }
}

/// See [`StreamLayer`].
#[derive(Debug, Clone)]
pub struct StreamCounting<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for StreamCounting<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = http::Response<CountedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Counted here, before the handler runs, so that an idle check between now and the
        // response sees the stream.
        let stream = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|info| info.streams.opened());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| CountedBody {
                body,
                _stream: stream,
            }))
        })
    }
}

/// A response body that holds its stream's count until hyper drops it.
pub struct CountedBody<B> {
    body: B,
    _stream: Option<OpenStream>,
}

impl<B: Body + Unpin> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
