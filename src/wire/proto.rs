//! The generated gRPC types and services of `proto/capgate/v1/`.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("capgate.v1");

/// The encoded descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/capgate_descriptor.bin"));

/// The encoded descriptor set of Envoy's `envoy.service.auth.v3.Authorization`, which capgate
/// also serves (the ext_authz door), for server reflection (proto/third_party/README.md).
pub const ENVOY_AUTHORIZATION_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/envoy_authorization_descriptor.bin"));
