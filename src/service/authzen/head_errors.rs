//! What hyper answers by itself, in the door's error shape.
//!
//! A request whose head hyper cannot parse never reaches the router: hyper writes a bodyless
//! `400` (a malformed request line or header field), `414` (a target over its 65,534 bytes) or
//! `431` (more than [`MAX_HEAD_FIELDS`] fields, or a head over [`MAX_HEAD_BYTES`]) and closes the
//! connection, and no builder option gives that answer a body. So the connection's writes pass
//! through [`Answering`], which reads the responses hyper writes, and [`Watched`] counts the
//! requests the router was given: a final response head with no request of its own is hyper's,
//! and is written instead as the JSON error body every other answer of the port carries
//! (`{"error": {"status", "message"}}`), with `connection: close`.
//!
//! Reading the responses needs their framing: `content-length`, or none for `HEAD`, `1xx`, `204`
//! and `304`. Every answer of capgate's has a length; should one not (`transfer-encoding`, or a
//! body that ends with the connection), the rest of that connection is passed through untouched,
//! hyper's own answers included.
//!
//! INVARIANT: hyper parses the next request head only once the previous response is wholly
//! buffered, and answers a parse error before anything else of that connection, so the bytes
//! seen here are every earlier response, then hyper's answer.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// At most this many header fields in a request head (hyper's `max_headers`), else `431`.
pub const MAX_HEAD_FIELDS: usize = 100;
/// The longest request head, in bytes (hyper's `max_header_size`): else `431`.
pub const MAX_HEAD_BYTES: usize = 128 * 1024;
/// The longest response head this reads before it gives up on a connection (capgate's are
/// well under 1 KiB).
const LONGEST_RESPONSE_HEAD: usize = 64 * 1024;

/// The address a connection was accepted on, as the router's requests carry it: the PDP's
/// base URL when `--http-public-url` is not given.
#[derive(Debug, Clone, Copy)]
pub struct AcceptedOn(pub SocketAddr);

/// The requests of one connection that the router was given, in order: whether each is a
/// `HEAD` (whose response has no body, whatever its `content-length`).
#[derive(Default)]
pub struct Ledger {
    requests: Mutex<VecDeque<bool>>,
}

impl Ledger {
    fn given(&self, head: bool) {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(head);
    }

    /// The request a final response answers, or `None`: hyper's own.
    fn answered(&self) -> Option<bool> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front()
    }
}

/// The router for one connection: each request is entered in the ledger, and carries the
/// address it was accepted on.
#[derive(Clone)]
pub struct Watched<S> {
    pub inner: S,
    pub ledger: Arc<Ledger>,
    pub accepted_on: SocketAddr,
}

impl<S> hyper::service::Service<hyper::Request<Incoming>> for Watched<S>
where
    S: hyper::service::Service<hyper::Request<Incoming>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        self.ledger.given(request.method() == hyper::Method::HEAD);
        request.extensions_mut().insert(AcceptedOn(self.accepted_on));
        self.inner.call(request)
    }
}

/// Where the response stream is.
enum Out {
    /// Collecting a response head.
    Head(Vec<u8>),
    /// In a body: this many bytes to go.
    Body(u64),
    /// A framing this does not follow: everything passes.
    Untracked,
    /// hyper's answer was replaced: what it writes after is dropped.
    Replaced,
}

/// A connection's stream, whose writes are read as responses (module docs).
pub struct Answering<T> {
    io: T,
    ledger: Arc<Ledger>,
    out: Out,
    /// Bytes taken from hyper, not yet written to `io`.
    queued: Vec<u8>,
    sent: usize,
}

impl<T> Answering<T> {
    pub fn new(io: T, ledger: Arc<Ledger>) -> Self {
        Answering {
            io,
            ledger,
            out: Out::Head(Vec::new()),
            queued: Vec::new(),
            sent: 0,
        }
    }

    /// Takes `buf` into the queue as the state says; returns how much of it was taken.
    fn take(&mut self, buf: &[u8]) -> usize {
        match &mut self.out {
            Out::Untracked => {
                self.queued.extend_from_slice(buf);
                buf.len()
            }
            Out::Replaced => buf.len(),
            Out::Body(left) => {
                let taken = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                self.queued.extend_from_slice(&buf[..taken]);
                *left -= taken as u64;
                if *left == 0 {
                    self.out = Out::Head(Vec::new());
                }
                taken
            }
            Out::Head(head) => {
                let before = head.len();
                head.extend_from_slice(buf);
                let Some(end) = find(head, b"\r\n\r\n").map(|at| at + 4) else {
                    if head.len() > LONGEST_RESPONSE_HEAD {
                        let head = std::mem::take(head);
                        self.queued.extend_from_slice(&head);
                        self.out = Out::Untracked;
                    }
                    return buf.len();
                };
                head.truncate(end);
                let head = std::mem::take(head);
                self.respond(head);
                end - before
            }
        }
    }

    /// A whole response head: passed on with its body's framing, or replaced when it is hyper's.
    fn respond(&mut self, head: Vec<u8>) {
        let Some((status, reason, fields)) = read_head(&head) else {
            self.queued.extend_from_slice(&head);
            self.out = Out::Untracked;
            return;
        };
        if (100..200).contains(&status) {
            // `100 Continue` and the like: the final response follows.
            self.queued.extend_from_slice(&head);
            self.out = Out::Head(Vec::new());
            return;
        }
        let Some(to_head) = self.ledger.answered() else {
            tracing::debug!(
                status,
                "a request head hyper could not parse; answered with a body"
            );
            self.queued
                .extend_from_slice(&replacement(status, reason, &fields));
            self.out = Out::Replaced;
            return;
        };
        self.queued.extend_from_slice(&head);
        let length = fields
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse::<u64>().ok());
        let chunked = fields
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("transfer-encoding"));
        self.out = if to_head || status == 204 || status == 304 {
            Out::Head(Vec::new())
        } else {
            match (length, chunked) {
                (Some(0), false) => Out::Head(Vec::new()),
                (Some(length), false) => Out::Body(length),
                _ => {
                    tracing::debug!(
                        status,
                        "a response without a length: the connection is passed through"
                    );
                    Out::Untracked
                }
            }
        };
    }
}

impl<T: AsyncWrite + Unpin> Answering<T> {
    /// Writes the queue to `io`.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.queued.len() {
            let written = ready!(Pin::new(&mut self.io).poll_write(cx, &self.queued[self.sent..]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += written;
        }
        self.queued.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Answering<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Answering<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // What was taken before goes first: the queue never holds more than one write's worth.
        ready!(self.drain(cx))?;
        let taken = self.take(buf);
        // Written now if the socket takes it; else on the flush hyper always makes.
        if let Poll::Ready(Err(error)) = self.drain(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// A response head's fields, in order: (name, value).
type Fields<'a> = Vec<(&'a str, &'a str)>;

/// A response head as hyper writes it: the status, its reason phrase and the fields.
fn read_head(head: &[u8]) -> Option<(u16, &str, Fields<'_>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line.strip_prefix("HTTP/1.")?.get(2..)?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    let status = code.parse().ok()?;
    let fields = lines
        .filter(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim(), value.trim()))
        .collect();
    Some((status, reason, fields))
}

/// hyper's bodyless answer, with the door's JSON error body.
fn replacement(status: u16, reason: &str, fields: &[(&str, &str)]) -> Vec<u8> {
    let message = match status {
        400 => "the request is not HTTP/1.1: its request line or a header field is malformed".to_owned(),
        414 => "the request target is longer than 65534 bytes".to_owned(),
        431 => format!(
            "the request head is too large: at most {MAX_HEAD_FIELDS} header fields and {} KiB",
            MAX_HEAD_BYTES / 1024
        ),
        _ => format!("the request cannot be read: {}", reason.to_ascii_lowercase()),
    };
    let body = super::error_body(status, &message).to_string();
    let mut answer = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("date") {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    answer.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    answer.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `writes` through the response reader, with `requests` given to the router.
    fn through(requests: &[bool], writes: &[&[u8]]) -> String {
        let ledger = Arc::new(Ledger::default());
        for head in requests {
            ledger.given(*head);
        }
        let mut answering = Answering::new(Vec::<u8>::new(), ledger);
        for write in writes {
            let mut rest = *write;
            while !rest.is_empty() {
                let taken = answering.take(rest);
                rest = &rest[taken..];
            }
        }
        String::from_utf8(answering.queued).expect("UTF-8")
    }

    const HYPERS_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sat, 05 Dec 2026 09:00:00 GMT\r\n\r\n";

    #[test]
    fn hypers_answer_after_the_routers_is_replaced_and_the_routers_pass() {
        let ours: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        let seen = through(&[false], &[&ours[..20], &ours[20..], HYPERS_431]);
        let (first, second) = seen.split_at(ours.len());
        assert_eq!(first.as_bytes(), ours);
        assert!(
            second.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ndate: Sat"),
            "{second}"
        );
        assert!(second.contains("content-type: application/json\r\n"), "{second}");
        assert!(second.ends_with(r#"{"error":{"status":431,"message":"the request head is too large: at most 100 header fields and 128 KiB"}}"#), "{second}");
    }

    #[test]
    fn a_head_response_a_continue_and_an_empty_body_are_followed() {
        let continued: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
        let to_head: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n";
        let empty: &[u8] = b"HTTP/1.1 204 No Content\r\n\r\n";
        let seen = through(&[false, true], &[continued, empty, to_head, HYPERS_431]);
        assert!(seen.ends_with("}}"), "{seen}");
        // A request too many: the router's, so passed as it is.
        assert!(through(&[false], &[HYPERS_431]).ends_with("\r\n\r\n"));
    }

    #[test]
    fn a_response_without_a_length_passes_the_rest_untouched() {
        let chunked: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        let seen = through(&[false], &[chunked, HYPERS_431]);
        assert_eq!(seen.as_bytes(), [chunked, HYPERS_431].concat());
    }
}
