//! The protobuf codec of every capgate RPC: tonic-prost's, except that a message which does not
//! decode is the sender's mistake, `INVALID_ARGUMENT`, not `INTERNAL`.
//!
//! tonic-prost maps every `prost::DecodeError` to `INTERNAL`, following the table in gRPC's
//! `statuscodes.md`. For capgate a request that is not valid protobuf — a string that is not UTF-8,
//! a wrong wire type, a truncated field, a varint longer than ten bytes, groups nested past prost's
//! recursion limit — says nothing about the server: answering `INTERNAL` tells a gateway to page
//! someone and perhaps to retry, when the only fix is on its side (docs/decisions/0013). The
//! message keeps prost's own description, which names the message and field it stopped at, e.g.
//! `failed to decode Protobuf message: DecideRequest.tool: invalid string value: data is not UTF-8
//! encoded`; it holds no byte of the request.
//!
//! `build.rs` names [`Codec`] as the generated services' and clients' codec. On the client side
//! (the command line) the decoded message is a response; a server sending a malformed one is as
//! unlikely as it is unhelpful to tell apart, so the same status serves.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder as _};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

/// tonic-prost's codec with [`Decoder`] in place of its decoder. `T` is encoded, `U` decoded.
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder {
            buffer_settings: self.inner.decoder().buffer_settings(),
            _message: PhantomData,
        }
    }
}

/// Decodes a `U`; a message that is not valid protobuf is `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct Decoder<U> {
    buffer_settings: BufferSettings,
    _message: PhantomData<U>,
}

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|error| Status::invalid_argument(error.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}
