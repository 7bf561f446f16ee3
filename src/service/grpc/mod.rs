//! The gRPC doors: capgate's own `capgate.v1.DecisionService` over the decision pipeline and
//! `capgate.v1.PolicyService` for publishing, listing and activating versions, and the callouts
//! gateways already make — Envoy's `envoy.service.auth.v3.Authorization` (ext_authz) and
//! agentgateway's ExtMCP — over the same pipeline. Each converts protobuf in and out; the work is
//! done in the rooms below.

pub mod decisions;
pub mod ext_authz;
pub mod ext_mcp;
pub mod lenient;
pub mod policies;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::pipeline::Refusal;

/// A pipeline refusal as a gRPC status, for the doors whose protocol has no answer of its own for
/// it: the gateway, not its caller, has to act.
pub(super) fn status(refusal: Refusal) -> Status {
    match refusal {
        Refusal::PermissionDenied(message) => Status::permission_denied(message),
        Refusal::Unavailable(message) => Status::unavailable(message),
        Refusal::RequestIdReused { request_id, reuse } => {
            let message = crate::service::pipeline::reused("request_id", &request_id, reuse);
            Status::with_error_details(
                Code::InvalidArgument,
                message.clone(),
                ErrorDetails::with_bad_request_violation("request_id", message),
            )
        }
    }
}
