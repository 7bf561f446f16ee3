//! Envoy's `envoy.service.auth.v3.Authorization` service as capgate serves it: the generated
//! server's routing, with a codec that hands the door a request that does not decode (a header
//! value that is not UTF-8, garbage) instead of failing the call.
//!
//! Why not the generated `AuthorizationServer`: its codec answers an undecodable message with a
//! gRPC error (`INTERNAL`), and Envoy's ext_authz filter configured with `failure_mode_allow: true`
//! lets the request through on any gRPC error — so a client able to put one byte that is not UTF-8
//! in a header would pass every check. Here the door gets `Err(why)` and answers a denial, which
//! holds whatever the filter's failure mode (docs/decisions/0028).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::auth::v3::authorization_server::Authorization;
use envoy_types::pb::envoy::service::auth::v3::{CheckRequest, CheckResponse};
use prost::bytes::Buf;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::metadata::MetadataMap;
use tonic::server::{NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};
use tonic_prost::{ProstCodec, ProstEncoder};

/// A request as the door receives it: decoded, or why it does not decode.
pub type Decoded<T> = Result<T, String>;

/// The Check handler of a door that takes undecodable requests too.
#[tonic::async_trait]
pub trait LenientAuthorization: Authorization {
    /// Answers a `CheckRequest` that is not valid protobuf: the request's metadata (the gateway's
    /// token), with prost's description of what did not decode.
    async fn undecodable(&self, why: Request<String>) -> Result<Response<CheckResponse>, Status>;
}

/// The `Authorization` service over `door`, its messages bounded to `max_message_bytes`.
pub struct AuthorizationService<T> {
    door: Arc<T>,
    max_message_bytes: usize,
}

impl<T> AuthorizationService<T> {
    pub fn new(door: T, max_message_bytes: usize) -> Self {
        AuthorizationService {
            door: Arc::new(door),
            max_message_bytes,
        }
    }
}

impl<T> Clone for AuthorizationService<T> {
    fn clone(&self) -> Self {
        AuthorizationService {
            door: self.door.clone(),
            max_message_bytes: self.max_message_bytes,
        }
    }
}

impl<T> NamedService for AuthorizationService<T> {
    const NAME: &'static str = "envoy.service.auth.v3.Authorization";
}

/// `Check`, as a unary service over the lenient codec.
struct Check<T>(Arc<T>);

impl<T: LenientAuthorization> UnaryService<Decoded<CheckRequest>> for Check<T> {
    type Response = CheckResponse;
    type Future = BoxFuture<Response<CheckResponse>, Status>;

    fn call(&mut self, request: Request<Decoded<CheckRequest>>) -> Self::Future {
        let door = self.0.clone();
        Box::pin(async move {
            let (metadata, extensions, decoded) = request.into_parts();
            match decoded {
                Ok(check) => door.check(Request::from_parts(metadata, extensions, check)).await,
                Err(why) => {
                    door.undecodable(Request::from_parts(metadata, extensions, why))
                        .await
                }
            }
        })
    }
}

impl<T, B> tower::Service<http::Request<B>> for AuthorizationService<T>
where
    T: LenientAuthorization,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != "/envoy.service.auth.v3.Authorization/Check" {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let door = self.door.clone();
        let max = self.max_message_bytes;
        Box::pin(async move {
            let metadata = MetadataMap::from_headers(request.headers().clone());
            let mut grpc = tonic::server::Grpc::new(LenientCodec::<CheckResponse, CheckRequest>::default())
                .apply_max_message_size_config(Some(max), None);
            let answered = grpc.unary(Check(door.clone()), request).await;
            if grpc_status(&answered) != Some(Code::OutOfRange) {
                return Ok(answered);
            }
            // tonic refused a message over the bound before the door saw it. A gRPC error would
            // let the request through a filter with `failure_mode_allow`; the door's denial of an
            // unreadable request is answered instead.
            let why = format!("the CheckRequest is larger than the {max}-byte bound");
            let denied = door
                .undecodable(Request::from_parts(metadata, Default::default(), why))
                .await;
            Ok(answer(denied).await)
        })
    }
}

/// The `grpc-status` of a response that ended in its headers (tonic's errors do), if any.
fn grpc_status(response: &http::Response<tonic::body::Body>) -> Option<Code> {
    let status = response
        .headers()
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(Code::from_i32(status))
}

/// `answer` as a gRPC response: tonic's own encoding, driven by a request that carries an empty
/// message and a service that answers `answer` whatever it is given.
async fn answer(answer: Result<Response<CheckResponse>, Status>) -> http::Response<tonic::body::Body> {
    struct Answer(Option<Result<Response<CheckResponse>, Status>>);
    impl UnaryService<Decoded<CheckRequest>> for Answer {
        type Response = CheckResponse;
        type Future = BoxFuture<Response<CheckResponse>, Status>;
        fn call(&mut self, _: Request<Decoded<CheckRequest>>) -> Self::Future {
            let answer = self
                .0
                .take()
                .unwrap_or_else(|| Err(Status::internal("answered twice")));
            Box::pin(async move { answer })
        }
    }
    // A gRPC frame: not compressed, zero bytes long.
    let empty = http_body_util::Full::new(prost::bytes::Bytes::from_static(&[0, 0, 0, 0, 0]));
    let request = http::Request::builder()
        .header("content-type", "application/grpc")
        .body(empty)
        .unwrap_or_default();
    let mut grpc = tonic::server::Grpc::new(LenientCodec::<CheckResponse, CheckRequest>::default());
    grpc.unary(Answer(Some(answer)), request).await
}

/// tonic-prost's codec, decoding to [`Decoded`] so that a malformed message reaches the handler.
struct LenientCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for LenientCodec<T, U> {
    fn default() -> Self {
        LenientCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for LenientCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = Decoded<U>;
    type Encoder = ProstEncoder<T>;
    type Decoder = LenientDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LenientDecoder {
            buffer_settings: self.inner.decoder().buffer_settings(),
            _message: PhantomData,
        }
    }
}

struct LenientDecoder<U> {
    buffer_settings: BufferSettings,
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for LenientDecoder<U> {
    type Item = Decoded<U>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Decoded<U>>, Status> {
        // The whole message is taken, whether it decodes or not: nothing of it is left to be read
        // as the next one.
        let bytes = buf.copy_to_bytes(buf.remaining());
        Ok(Some(U::decode(bytes).map_err(|error| error.to_string())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}
