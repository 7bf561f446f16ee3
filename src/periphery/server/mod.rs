//! The gRPC decision service (`capgate serve`): decisions, policy versions,
//! counters and audit over a store (spec: service.md).

pub mod proto;
