//! capgate's own gRPC doors: `capgate.v1.DecisionService` over the decision pipeline, and
//! `capgate.v1.PolicyService` for publishing, listing and activating versions, and Envoy's
//! `envoy.service.auth.v3.Authorization` (ext_authz) over the same pipeline. Each converts
//! protobuf in and out; the work is done in the rooms below.

pub mod decisions;
pub mod ext_authz;
pub mod policies;
