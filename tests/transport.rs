//! Connection and wire hygiene of a real `capgate serve` process (docs/service.md, "Connections";
//! docs/decisions/0013): a request that is not valid protobuf is `INVALID_ARGUMENT`; silent,
//! idle and dead connections are closed; connections past `--max-connections` and streams past
//! `--max-concurrent-streams` are refused without harming the clients already served; an
//! exhausted open-file limit is waited out, not spun on.
//!
//! The clients are real: tonic channels, bare TCP sockets, a TLS client, and a small HTTP/2
//! client written here ([`H2`]) that sends hand-encoded frames, so that a test can do what a
//! well-behaved client library never would (ignore pings, open more streams than allowed).
//! The store is SQLite in a temporary directory, except under the open-file limit, where the
//! PostgreSQL pool is one of the things that must keep working.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::ReasonCode;
use prost::bytes::{Buf, BufMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codec::{DecodeBuf, EncodeBuf};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use support::client::{code, connect, uncapped, wait_serving, CATALOG, POLICY};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;

/// A server over SQLite with the example policy active, and the directory its files are in.
async fn serve(flags: &[&str]) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let serve = Serve::start(&strs(&server_args(&dir, "", flags))).await;
    wait_serving(&serve.channel().await, Duration::from_secs(5)).await;
    (serve, dir)
}

/// `--database-url` (SQLite in `dir` unless `database_url` is given), the example policy, then
/// `flags`.
fn server_args(dir: &tempfile::TempDir, database_url: &str, flags: &[&str]) -> Vec<String> {
    let path = |name: &str| dir.path().join(name).to_str().expect("a UTF-8 path").to_owned();
    std::fs::write(path("policy.yaml"), POLICY).expect("write the policy");
    std::fs::write(path("catalog.yaml"), CATALOG).expect("write the catalog");
    let database_url = if database_url.is_empty() {
        format!("sqlite://{}", path("capgate.db"))
    } else {
        database_url.to_owned()
    };
    let mut args = vec![
        "--database-url".to_owned(),
        database_url,
        "--policy".to_owned(),
        path("policy.yaml"),
        "--catalog".to_owned(),
        path("catalog.yaml"),
    ];
    args.extend(flags.iter().map(|flag| (*flag).to_owned()));
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// One `Decide` on `channel`, answered `granted` within `within`.
async fn decide_promptly(channel: &Channel, within: Duration) {
    decide_promptly_as(channel, within, None).await;
}

/// As [`decide_promptly`], presenting the gateway token `token` when there is one.
async fn decide_promptly_as(channel: &Channel, within: Duration, token: Option<&str>) {
    let started = Instant::now();
    let request = match token {
        Some(token) => support::doors::as_gateway(uncapped(), token),
        None => tonic::Request::new(uncapped()),
    };
    let answer = tokio::time::timeout(
        within,
        DecisionServiceClient::new(channel.clone()).decide(request),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer within {within:?}"))
    .expect("a decision");
    assert_eq!(code(&answer.into_inner()), ReasonCode::Granted);
    eprintln!("answered in {:?}", started.elapsed());
}

/// Waits until the peer closes `stream` (EOF or reset) and returns how long that took; panics
/// after `within`. Whatever the server sends before closing is read and dropped.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection was still open after {within:?}"),
        }
    }
}

/// When, after `since`, the server closed each of `streams` (watched at once); panics if one
/// is still open `within` after it is watched.
async fn close_times(streams: Vec<TcpStream>, since: Instant, within: Duration) -> Vec<Duration> {
    let mut closing = tokio::task::JoinSet::new();
    for mut stream in streams {
        closing.spawn(async move {
            closed_within(&mut stream, within).await;
            since.elapsed()
        });
    }
    closing.join_all().await
}

/// Whether the peer keeps `stream` open for `period` (reading and dropping what it sends).
async fn stays_open(stream: &mut TcpStream, period: Duration) -> bool {
    let deadline = Instant::now() + period;
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return false,
            Ok(Ok(_)) => {}
            Err(_) => return true,
        }
    }
}

/// How many lines the server logged that hold `text`.
fn lines_logged(serve: &Serve, text: &str) -> usize {
    serve.logs().lines().filter(|line| line.contains(text)).count()
}

/// The number the Prometheus endpoint gives `capgate_connections_closed_total{reason}`.
async fn closed_count(serve: &Serve, reason: &str) -> f64 {
    let (status, text) = http_get(metrics_addr(serve), "/metrics").await;
    assert_eq!(status, 200);
    prometheus_value(&text, "capgate_connections_closed_total", &[("reason", reason)]).unwrap_or(0.0)
}

// ── Malformed protobuf ─────────────────────────────────────────────────────

/// Sends bytes as they are and hands back the response's bytes: a real gRPC client (tonic's
/// `Grpc` over a channel) whose messages are hand-encoded.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let length = buf.remaining();
        Ok(Some(buf.copy_to_bytes(length).to_vec()))
    }
}

/// Calls `path` with `message` as its encoded request.
async fn call_raw(channel: &Channel, path: &'static str, message: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("the channel is ready");
    grpc.unary(
        tonic::Request::new(message),
        PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

const DECIDE: &str = "/capgate.v1.DecisionService/Decide";

/// Every capgate RPC.
const RPCS: [&str; 9] = [
    DECIDE,
    "/capgate.v1.DecisionService/ListVisible",
    "/capgate.v1.PolicyService/PublishPolicy",
    "/capgate.v1.PolicyService/GetActivePolicy",
    "/capgate.v1.PolicyService/ListPolicyVersions",
    "/capgate.v1.PolicyService/ActivatePolicy",
    "/capgate.v1.PolicyService/GetPolicyVersion",
    "/capgate.v1.PolicyService/ListPolicyActivations",
    "/capgate.v1.PolicyService/ResetUsage",
];

/// `DecideRequest` bytes that are not valid protobuf, each with what the message must name.
fn malformed_decide_requests() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    // Field 15, wire type 3 (start group), 200 times: groups nested far past prost's recursion
    // limit.
    let deep_groups = vec![0x7b; 200];
    // `tool` is field 2 (a string in the `target` oneof, wire type 2): tag 0x12; prost names
    // the oneof. `request_id` is field 4: tag 0x22.
    vec![
        (
            "invalid UTF-8 in a string",
            vec![0x12, 0x02, 0xff, 0xfe],
            "DecideRequest.target",
        ),
        (
            "invalid UTF-8 in the request id",
            vec![0x22, 0x01, 0x80],
            "DecideRequest.request_id",
        ),
        (
            "a wrong wire type",
            // Field 2 as a varint.
            vec![0x10, 0x01],
            "DecideRequest.target",
        ),
        (
            "a truncated field",
            // 10 bytes announced, 3 sent.
            vec![0x12, 0x0a, b'a', b'b', b'c'],
            "DecideRequest.target",
        ),
        (
            "a varint longer than ten bytes",
            vec![
                0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            "DecideRequest.target",
        ),
        ("groups nested 200 deep", deep_groups, "recursion limit"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_valid_protobuf_is_invalid_argument_naming_the_field() {
    let (serve, _dir) = serve(&[]).await;
    let channel = serve.channel().await;

    for (what, message, named) in malformed_decide_requests() {
        let refused = call_raw(&channel, DECIDE, message).await.expect_err(what);
        assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
        assert!(
            refused.message().contains(named),
            "{what}: the message does not name `{named}`: {:?}",
            refused.message()
        );
    }
    // Every capgate RPC: a length-delimited field 1 that announces more bytes than it has (an
    // unknown field for some requests, so the message cannot always name one).
    for rpc in RPCS {
        let refused = call_raw(&channel, rpc, vec![0x0a, 0x05, 0x01])
            .await
            .expect_err(rpc);
        assert_eq!(refused.code(), Code::InvalidArgument, "{rpc}: {refused:?}");
    }
    let refused = call_raw(
        &channel,
        "/capgate.v1.PolicyService/PublishPolicy",
        vec![0x0a, 0x01, 0xc0],
    )
    .await
    .expect_err("an artifact that is not UTF-8");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("PublishPolicyRequest.artifact"),
        "{:?}",
        refused.message()
    );

    // Nothing panicked, and the same connection still serves a valid request.
    decide_promptly(&channel, Duration::from_secs(5)).await;
    assert!(
        !serve.logs().contains("panicked"),
        "the server panicked:\n{}",
        serve.logs()
    );
}

// ── A hand-driven HTTP/2 client ────────────────────────────────────────────

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

mod frame {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;

    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;

    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// RST_STREAM's REFUSED_STREAM.
    pub const REFUSED_STREAM: u32 = 0x7;
    /// RST_STREAM's CANCEL.
    pub const CANCEL: u32 = 0x8;
}

/// One HTTP/2 frame.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// An HTTP/2 connection driven frame by frame. It acknowledges the server's SETTINGS and
/// nothing else: a PING is handed to the test, which may answer it or not.
struct H2 {
    stream: TcpStream,
}

/// `grpc.health.v1.Health/Watch`: a stream that stays open as long as the client wants.
const WATCH: &str = "/grpc.health.v1.Health/Watch";
/// `grpc.health.v1.Health/Check`: one request, one response.
const CHECK: &str = "/grpc.health.v1.Health/Check";

impl H2 {
    /// Connects and sends the client connection preface (the magic and an empty SETTINGS).
    async fn connect(addr: SocketAddr) -> H2 {
        let mut h2 = H2 {
            stream: TcpStream::connect(addr).await.expect("connect"),
        };
        h2.stream.write_all(PREFACE).await.expect("send the preface");
        h2.send(frame::SETTINGS, 0, 0, &[]).await;
        h2
    }

    async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let length = u32::try_from(payload.len()).expect("a small frame");
        let mut bytes = length.to_be_bytes()[1..].to_vec();
        bytes.extend([kind, flags]);
        bytes.extend(stream.to_be_bytes());
        bytes.extend(payload);
        self.stream.write_all(&bytes).await.expect("send a frame");
    }

    /// The next frame, but for SETTINGS acknowledgements (dropped); the server's own SETTINGS
    /// are acknowledged on the way. `None` when the server closed the connection, or sent
    /// nothing within `within`.
    async fn next(&mut self, within: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut head = [0u8; 9];
            match tokio::time::timeout_at(deadline, self.stream.read_exact(&mut head)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
            let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; length];
            match tokio::time::timeout_at(deadline, self.stream.read_exact(&mut payload)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
            let frame = Frame {
                kind: head[3],
                flags: head[4],
                stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
                payload,
            };
            if frame.kind == frame::SETTINGS {
                if frame.flags & frame::ACK != 0 {
                    continue;
                }
                self.send(frame::SETTINGS, frame::ACK, 0, &[]).await;
            }
            return Some(frame);
        }
    }

    /// The next frame of `kind` (others are dropped); `None` as for [`H2::next`].
    async fn next_of(&mut self, kind: u8, within: Duration) -> Option<Frame> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self.next(left).await?;
            if frame.kind == kind {
                return Some(frame);
            }
        }
    }

    /// Opens stream `id` with a gRPC call to `path` whose request is an empty message (both
    /// health requests may be empty), sent whole.
    async fn call(&mut self, id: u32, path: &str) {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "capgate"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            // HPACK "literal header field without indexing, new name", no Huffman coding.
            assert!(name.len() < 127 && value.len() < 127, "one-byte HPACK lengths");
            block.push(0x00);
            block.push(u8::try_from(name.len()).expect("short"));
            block.extend(name.as_bytes());
            block.push(u8::try_from(value.len()).expect("short"));
            block.extend(value.as_bytes());
        }
        self.send(frame::HEADERS, frame::END_HEADERS, id, &block).await;
        // The gRPC message: not compressed, length 0.
        self.send(frame::DATA, frame::END_STREAM, id, &[0, 0, 0, 0, 0])
            .await;
    }
}

/// The server's first SETTINGS frame, as (identifier, value) pairs.
async fn server_settings(h2: &mut H2) -> Vec<(u16, u32)> {
    let settings = h2
        .next_of(frame::SETTINGS, Duration::from_secs(5))
        .await
        .expect("the server's SETTINGS");
    settings
        .payload
        .chunks(6)
        .map(|pair| {
            (
                u16::from_be_bytes([pair[0], pair[1]]),
                u32::from_be_bytes([pair[2], pair[3], pair[4], pair[5]]),
            )
        })
        .collect()
}

// ── Streams per connection ─────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_stream_limit_is_announced() {
    let (serve, _dir) = serve(&[]).await;
    let mut h2 = H2::connect(serve.addr).await;
    let settings = server_settings(&mut h2).await;
    assert!(
        settings.contains(&(frame::MAX_CONCURRENT_STREAMS, 256)),
        "SETTINGS_MAX_CONCURRENT_STREAMS is not 256: {settings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_maximum_are_refused_and_the_connection_goes_on() {
    let (serve, _dir) = serve(&["--max-concurrent-streams", "4"]).await;
    let mut h2 = H2::connect(serve.addr).await;
    let settings = server_settings(&mut h2).await;
    assert!(
        settings.contains(&(frame::MAX_CONCURRENT_STREAMS, 4)),
        "SETTINGS_MAX_CONCURRENT_STREAMS is not 4: {settings:?}"
    );

    // Four watches stay open; the fifth stream is one too many.
    for id in [1, 3, 5, 7] {
        h2.call(id, WATCH).await;
    }
    h2.call(9, WATCH).await;
    let reset = h2
        .next_of(frame::RST_STREAM, Duration::from_secs(5))
        .await
        .expect("the fifth stream is reset");
    assert_eq!(reset.stream, 9, "{reset:?}");
    assert_eq!(
        u32::from_be_bytes(reset.payload[..4].try_into().expect("an error code")),
        frame::REFUSED_STREAM
    );

    // One watch ends: a new call on the same connection is answered.
    h2.send(frame::RST_STREAM, 0, 1, &frame::CANCEL.to_be_bytes())
        .await;
    h2.call(11, CHECK).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = h2
            .next(left)
            .await
            .expect("an answer to the call after a watch ended");
        assert!(
            !(frame.kind == frame::RST_STREAM && frame.stream == 11),
            "the call after a watch ended was refused: {frame:?}"
        );
        if frame.kind == frame::DATA && frame.stream == 11 {
            break;
        }
    }
}

// ── Handshake, idle and keepalive ──────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_handshaken_connections_are_closed_after_the_default_handshake_timeout() {
    let (serve, _dir) = serve(&["--metrics-listen", "127.0.0.1:0"]).await;
    let channel = connect(serve.addr).await;

    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(serve.addr).await.expect("connect"));
    }
    let mut half = TcpStream::connect(serve.addr).await.expect("connect");
    half.write_all(&PREFACE[..10]).await.expect("half a preface");
    silent.push(half);
    // Silent connections do not delay a client that is already connected.
    decide_promptly(&channel, Duration::from_secs(1)).await;

    // The default handshake timeout is 5 s.
    for took in close_times(silent, opened, Duration::from_secs(8)).await {
        assert!(took >= Duration::from_secs(4), "closed after only {took:?}");
    }
    decide_promptly(&channel, Duration::from_secs(1)).await;
    let counted = closed_count(&serve, "handshake_timeout").await;
    assert!(
        counted >= 21.0,
        "capgate_connections_closed_total{{reason=\"handshake_timeout\"}} is {counted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_open_streams_is_closed_after_the_idle_timeout() {
    let (serve, _dir) = serve(&["--idle-timeout", "1s", "--metrics-listen", "127.0.0.1:0"]).await;

    // A connection that made one call and then none.
    let mut used = H2::connect(serve.addr).await;
    used.call(1, CHECK).await;
    used.next_of(frame::DATA, Duration::from_secs(5))
        .await
        .expect("the health answer");
    // A connection with a watch open is not idle, however long it lasts.
    let mut watching = H2::connect(serve.addr).await;
    watching.call(1, WATCH).await;
    watching
        .next_of(frame::DATA, Duration::from_secs(5))
        .await
        .expect("the first health status");

    let took = closed_within(&mut used.stream, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(800), "closed after only {took:?}");
    assert!(
        stays_open(&mut watching.stream, Duration::from_secs(3)).await,
        "a connection with an open stream was closed"
    );
    // Once its watch ends, it is idle too.
    watching
        .send(frame::RST_STREAM, 0, 1, &frame::CANCEL.to_be_bytes())
        .await;
    closed_within(&mut watching.stream, Duration::from_secs(5)).await;
    let counted = closed_count(&serve, "idle_timeout").await;
    assert!(
        counted >= 2.0,
        "capgate_connections_closed_total{{reason=\"idle_timeout\"}} is {counted}"
    );

    // A tonic channel notices and reconnects: the next call is answered.
    let channel = connect(serve.addr).await;
    decide_promptly(&channel, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    decide_promptly(&channel, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_answer_keepalive_pings_is_disconnected() {
    let (serve, _dir) = serve(&["--keepalive-interval", "500ms", "--keepalive-timeout", "500ms"]).await;

    // Both connections keep a watch open, so neither is idle.
    let mut dead = H2::connect(serve.addr).await;
    dead.call(1, WATCH).await;
    let mut alive = H2::connect(serve.addr).await;
    alive.call(1, WATCH).await;

    // A peer that answers stays connected through several pings, all along.
    let answering = tokio::spawn(async move {
        let until = Instant::now() + Duration::from_secs(4);
        let mut pings = 0;
        while let Some(frame) = alive.next(until.saturating_duration_since(Instant::now())).await {
            assert_ne!(frame.kind, frame::GOAWAY, "a live peer was sent away: {frame:?}");
            if frame.kind == frame::PING && frame.flags & frame::ACK == 0 {
                pings += 1;
                alive.send(frame::PING, frame::ACK, 0, &frame.payload).await;
            }
        }
        (
            pings,
            stays_open(&mut alive.stream, Duration::from_millis(200)).await,
        )
    });

    let ping = dead
        .next_of(frame::PING, Duration::from_secs(5))
        .await
        .expect("a keepalive ping");
    assert_eq!(ping.flags & frame::ACK, 0, "{ping:?}");
    // No answer: the connection ends (after a GOAWAY, or not) within the timeout and a margin.
    let started = Instant::now();
    while let Some(frame) = dead.next(Duration::from_secs(5)).await {
        assert_ne!(
            frame.kind,
            frame::DATA,
            "the dead peer's watch went on: {frame:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "still connected {:?} after an unanswered ping",
        started.elapsed()
    );

    let (pings, open) = answering.await.expect("the answering peer");
    assert!(pings >= 3, "only {pings} pings in 4 s");
    assert!(open, "a peer that answered every ping was disconnected");
}

// ── The connection cap ─────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_once_and_open_clients_keep_being_served() {
    let (serve, _dir) = serve(&[
        "--max-connections",
        "4",
        "--handshake-timeout",
        "2s",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .await;
    // `serve` has already closed its own health channel; this one stays.
    let channel = connect(serve.addr).await;
    decide_promptly(&channel, Duration::from_secs(5)).await;

    // Three silent connections fill the cap; the next ones are closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(serve.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..10 {
        let mut refused = TcpStream::connect(serve.addr).await.expect("connect");
        closed_within(&mut refused, Duration::from_secs(1)).await;
    }
    decide_promptly(&channel, Duration::from_secs(1)).await;
    // A new client's connection is closed too. tonic notices at its first call and reports a
    // transport error (UNAVAILABLE, CANCELLED or UNKNOWN, depending on how the close met its
    // request), at once rather than at its deadline.
    let fresh = Endpoint::from_shared(format!("http://{}", serve.addr))
        .expect("an endpoint")
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let started = Instant::now();
    let refused = DecisionServiceClient::new(fresh).decide(uncapped()).await;
    assert!(refused.is_err(), "a fifth connection was served: {refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the refusal took {:?}: {refused:?}",
        started.elapsed()
    );

    // The silent ones go at the handshake timeout; then there is room again.
    close_times(held, Instant::now(), Duration::from_secs(4)).await;
    decide_promptly(&connect(serve.addr).await, Duration::from_secs(1)).await;
    let refused = closed_count(&serve, "max_connections").await;
    assert!(
        refused >= 11.0,
        "capgate_connections_closed_total{{reason=\"max_connections\"}} is {refused}"
    );
    assert!(
        serve
            .logs()
            .contains("connection refused: `--max-connections` connections are open"),
        "the refusals were not logged:\n{}",
        serve.logs()
    );
}

// ── An exhausted open-file limit ───────────────────────────────────────────

/// CPU time (user + system) the process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The command name is in parentheses and may hold spaces: count the fields after it.
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of proc(5), 12 and 13 after the command name.
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // Linux reports in USER_HZ, 100 per second on every architecture it runs on.
    Duration::from_millis(ticks * 10)
}

/// Opens `count` silent connections to `addr` (as many as the kernel lets through).
async fn silent_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut streams = Vec::new();
    for _ in 0..count {
        // Long enough for a SYN the kernel dropped (a full accept queue) to be sent again.
        match tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => streams.push(stream),
            // The listen backlog stays full: enough.
            _ => break,
        }
    }
    streams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_silent_connections_under_a_256_file_limit_do_not_starve_real_calls() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Every connection setting at its default.
    let args = server_args(&dir, &database.url(), &[]);
    let serve = Serve::start_with_open_file_limit(&strs(&args), 256, &[]).await;
    let channel = connect(serve.addr).await;
    wait_serving(&channel, Duration::from_secs(5)).await;
    decide_promptly(&channel, Duration::from_secs(5)).await;

    let silent = silent_connections(serve.addr, 300).await;
    assert!(silent.len() > 200, "only {} connections opened", silent.len());
    let cpu_before = cpu_time(serve.pid());
    // The client already connected is served at once, and its calls reach the store.
    decide_promptly(&channel, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_time(serve.pid()) - cpu_before;
    eprintln!("{} silent connections: {cpu:?} of CPU in 2 s", silent.len());
    assert!(
        cpu < Duration::from_millis(500),
        "the server used {cpu:?} of CPU in 2 s of flood"
    );
    // Once the silent connections' handshake time (5 s) is up, a new client is served too.
    tokio::time::sleep(Duration::from_secs(4)).await;
    decide_promptly(&connect(serve.addr).await, Duration::from_secs(2)).await;
    // The cap that did it: half the open-file limit, so the store and the spool keep theirs.
    assert!(
        serve.logs().contains("\"max_connections\":128"),
        "the default cap is not half the open-file limit:\n{}",
        serve.logs()
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_open_file_limit_is_logged_and_waited_out_not_spun_on() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // A cap above what the limit allows: accepting fails with EMFILE before the cap is reached.
    let args = server_args(
        &dir,
        "",
        &["--max-connections", "1000", "--handshake-timeout", "3s"],
    );
    let serve = Serve::start_with_open_file_limit(&strs(&args), 256, &[]).await;
    let channel = connect(serve.addr).await;
    wait_serving(&channel, Duration::from_secs(5)).await;
    assert!(
        serve
            .logs()
            .contains("`--max-connections` is more than the open-file limit leaves room for"),
        "no warning that the cap is above the open-file limit:\n{}",
        serve.logs()
    );

    let silent = silent_connections(serve.addr, 400).await;
    assert!(silent.len() > 256, "only {} connections opened", silent.len());
    let cpu_before = cpu_time(serve.pid());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_time(serve.pid()) - cpu_before;
    eprintln!(
        "{} silent connections, EMFILE: {cpu:?} of CPU in 2 s",
        silent.len()
    );
    // Spinning on `accept` burns a core; backing off costs next to nothing.
    assert!(
        cpu < Duration::from_millis(500),
        "{cpu:?} of CPU in 2 s of EMFILE"
    );
    decide_promptly(&channel, Duration::from_secs(1)).await;
    let logged = lines_logged(&serve, "cannot accept a connection");
    assert!(
        (1..=3).contains(&logged),
        "the accept error was logged {logged} times (once, rate-limited, is right):\n{}",
        serve.logs()
    );
    // The silent connections time out, the descriptors come back, a new client is served.
    tokio::time::sleep(Duration::from_secs(3)).await;
    decide_promptly(&connect(serve.addr).await, Duration::from_secs(5)).await;
    drop(silent);
}

// ── TLS ────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_handshake_timeout_covers_the_tls_handshake_and_the_preface() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio_rustls::rustls;

    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a key")).expect("a CA");
    let key = KeyPair::generate().expect("a key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("parameters")
        .signed_by(&key, &ca)
        .expect("a certificate");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write");
    std::fs::write(&key_path, key.serialize_pem()).expect("write");
    let args = server_args(
        &dir,
        "",
        &[
            "--tls-cert",
            cert_path.to_str().expect("UTF-8"),
            "--tls-key",
            key_path.to_str().expect("UTF-8"),
            "--handshake-timeout",
            "1s",
        ],
    );
    let serve = Serve::start(&strs(&args)).await;

    // Silent before TLS.
    let mut silent = TcpStream::connect(serve.addr).await.expect("connect");
    // TLS done, then silent: no HTTP/2 preface.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).expect("the CA");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(serve.addr).await.expect("connect");
    let mut tls = connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").expect("a name"),
            tcp,
        )
        .await
        .expect("the TLS handshake");

    closed_within(&mut silent, Duration::from_secs(3)).await;
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(3), tls.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {}
            Err(_) => panic!("a TLS connection without a preface was still open after 3 s"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(3));

    // A real TLS client is served.
    let channel = Endpoint::from_shared(format!("https://{}", serve.addr))
        .expect("an endpoint")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
                .domain_name("localhost"),
        )
        .expect("TLS settings")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("a TLS client connects");
    decide_promptly(&channel, Duration::from_secs(5)).await;
}

// ── The HTTP port (AuthZEN and forward-auth) ───────────────────────────────

/// The asserting gateway's token on the HTTP port, from the environment.
const HTTP_TOKEN: &str = "transport-http-gateway-5f3a";

/// `--http-listen` and an asserting gateway token, then `flags`.
fn http_flags<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "--http-listen",
        "127.0.0.1:0",
        "--asserting-gateway-token",
        "edge=env://CAPGATE_TEST_HTTP_TOKEN",
    ];
    all.extend_from_slice(flags);
    all
}

/// An AuthZEN evaluation Dee may have (an uncapped capability), as bytes of JSON.
fn evaluation_body() -> Vec<u8> {
    serde_json::json!({
        "subject": {"type": "identity", "id": "dee", "properties": {"issuer": "staff", "attributes": {}}},
        "action": {"name": "tools/call"},
        "resource": {"type": "capability", "id": "docs.page.search"},
    })
    .to_string()
    .into_bytes()
}

/// The head of a `POST /access/v1/evaluation` whose body is `length` bytes.
fn evaluation_head(length: usize) -> String {
    format!(
        "POST /access/v1/evaluation HTTP/1.1\r\nHost: capgate\r\nAuthorization: Bearer {HTTP_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// One request on a new connection that asks to be closed after it; the status and the whole
/// response as text.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send the request");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .expect("an answer within 5 s")
        .expect("read the answer");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    (status, text)
}

/// A gateway that sends a whole head, then its body one byte every 200 ms, for as long as the
/// connection lets it. Resolves to what it was answered and when, after `since`, the connection
/// closed.
fn trickle(addr: SocketAddr, since: Instant) -> tokio::task::JoinHandle<(String, Duration)> {
    tokio::spawn(async move {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut reading, mut writing) = stream.into_split();
        let head = evaluation_head(evaluation_body().len());
        writing.write_all(head.as_bytes()).await.expect("send the head");
        let writer = tokio::spawn(async move {
            // JSON allows whitespace before the value: every byte is valid, none completes it.
            while writing.write_all(b" ").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let mut response = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), reading.read_to_end(&mut response)).await;
        writer.abort();
        (String::from_utf8_lossy(&response).into_owned(), since.elapsed())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_answered_408_in_time_and_the_http_port_holds_half_the_connections() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let flags = http_flags(&["--max-connections", "8", "--handshake-timeout", "1s"]);
    let args = server_args(&dir, "", &flags);
    let mut serve = Serve::start_with_env(&strs(&args), &[("CAPGATE_TEST_HTTP_TOKEN", HTTP_TOKEN)]).await;
    let http = support::doors::http_addr(&serve);
    let grpc = connect(serve.addr).await;
    wait_serving(&grpc, Duration::from_secs(5)).await;

    // An honest gateway is served.
    let mut honest = evaluation_head(evaluation_body().len()).into_bytes();
    honest.extend(evaluation_body());
    let (status, text) = exchange(http, &honest).await;
    assert!(status == 200 && text.contains("\"decision\":true"), "{text}");

    // Four trickling gateways hold the HTTP port's half of the eight connections ...
    let since = Instant::now();
    let trickling: Vec<_> = (0..4).map(|_| trickle(http, since)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... so a fifth HTTP connection is closed at once, while the gRPC port keeps its half:
    // a new gateway connection is served.
    let mut fifth = TcpStream::connect(http).await.expect("connect");
    closed_within(&mut fifth, Duration::from_millis(500)).await;
    decide_promptly_as(
        &connect(serve.addr).await,
        Duration::from_secs(1),
        Some(HTTP_TOKEN),
    )
    .await;
    // Each trickled body ends at its deadline, one `--handshake-timeout` after its head: `408`,
    // and the connection closed.
    for handle in trickling {
        let (response, closed_after) = handle.await.expect("the trickling gateway");
        assert!(
            response.starts_with("HTTP/1.1 408") && response.contains("`--handshake-timeout`"),
            "{response:?}"
        );
        assert!(
            closed_after < Duration::from_millis(2500),
            "closed after {closed_after:?}"
        );
    }
    let (status, text) = exchange(http, &honest).await;
    assert_eq!(status, 200, "{text}");

    // A kept-alive connection that sends nothing more is closed after the handshake timeout.
    let mut kept = TcpStream::connect(http).await.expect("connect");
    kept.write_all(b"GET /.well-known/authzen-configuration HTTP/1.1\r\nHost: capgate\r\n\r\n")
        .await
        .expect("send a request");
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).await.expect("read the status line");
    assert_eq!(&first, b"HTTP/1.1 200");
    let idle = closed_within(&mut kept, Duration::from_secs(3)).await;
    assert!(
        idle > Duration::from_millis(500),
        "closed after {idle:?}, before the timeout"
    );

    // Shutting down waits for a trickled body no longer than its deadline (19.9 s before).
    let trickling: Vec<_> = (0..3).map(|_| trickle(http, Instant::now())).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    serve.terminate();
    let status = serve.wait(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}\n{}", serve.logs());
    assert!(
        stopping.elapsed() < Duration::from_secs(3),
        "SIGTERM took {:?} with trickled bodies open",
        stopping.elapsed()
    );
    for handle in trickling {
        let (response, _) = handle.await.expect("the trickling gateway");
        assert!(
            response.is_empty() || response.starts_with("HTTP/1.1 408"),
            "{response:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_http_bodies_under_a_256_file_limit_leaves_the_grpc_port_its_half() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Every connection setting at its default: 128 connections (half of 256) across both ports.
    let args = server_args(&dir, &database.url(), &http_flags(&[]));
    let serve =
        Serve::start_with_open_file_limit(&strs(&args), 256, &[("CAPGATE_TEST_HTTP_TOKEN", HTTP_TOKEN)])
            .await;
    let http = support::doors::http_addr(&serve);
    let channel = connect(serve.addr).await;
    wait_serving(&channel, Duration::from_secs(5)).await;
    decide_promptly_as(&channel, Duration::from_secs(5), Some(HTTP_TOKEN)).await;

    // 240 gateways send a head and the first byte of a body that never comes.
    let mut slow = silent_connections(http, 240).await;
    let head = format!("{}{{", evaluation_head(evaluation_body().len()));
    for stream in &mut slow {
        let _ = stream.write_all(head.as_bytes()).await;
    }
    assert!(slow.len() > 200, "only {} connections opened", slow.len());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The gateway already connected and a new one are both served, and their calls reach the
    // store: the HTTP port took 64 descriptors, not all of them.
    decide_promptly_as(&channel, Duration::from_secs(1), Some(HTTP_TOKEN)).await;
    decide_promptly_as(
        &connect(serve.addr).await,
        Duration::from_secs(2),
        Some(HTTP_TOKEN),
    )
    .await;
    let refused = lines_logged(&serve, "HTTP connection refused");
    assert!(
        (1..=3).contains(&refused),
        "the refusals were logged {refused} times (once, rate-limited, is right):\n{}",
        serve.logs()
    );
    drop(slow);
}
