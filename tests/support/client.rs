//! The client side of the decision service in tests: the example policy,
//! asserted principals, `Decide` requests and what their answers say, and
//! channels to a server (health included).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use capgate::wire::proto::policy_service_client::PolicyServiceClient;
use capgate::wire::proto::{
    decide_request, decide_response, AssertedPrincipal, Attribute, DecideRequest, DecideResponse, Decision,
    Outcome, PublishPolicyRequest, PublishPolicyResponse, ReasonCode,
};
use tonic::transport::{Channel, Endpoint};
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

pub const POLICY: &str = include_str!("../../examples/policy.yaml");
pub const CATALOG: &str = include_str!("../../examples/catalog.yaml");

/// The example with a ceiling of `calls` per hour on `/grants/0` (support
/// reading tickets).
pub fn example_with_ceiling(calls: u64) -> String {
    let limited = POLICY.replace(
        "limits: { calls: 600, per: 1h }",
        &format!("limits: {{ calls: {calls}, per: 1h }}"),
    );
    assert_ne!(limited, POLICY, "the example's ceiling moved");
    limited
}

pub fn principal(issuer: &str, subject: &str, attributes: &[(&str, &[&str])]) -> AssertedPrincipal {
    AssertedPrincipal {
        issuer: issuer.into(),
        subject: subject.into(),
        attributes: attributes
            .iter()
            .map(|(name, values)| Attribute {
                name: (*name).into(),
                values: values.iter().map(|value| (*value).to_owned()).collect(),
            })
            .collect(),
    }
}

/// Ana, in support: `/grants/0` lets her read tickets, with a ceiling.
pub fn ana() -> AssertedPrincipal {
    principal("staff", "ana", &[("dept", &["support"])])
}

/// Dee, staff without a department: `/grants/2` lets her search docs, with
/// no ceiling.
pub fn dee() -> AssertedPrincipal {
    principal("staff", "dee", &[])
}

pub fn for_capability(who: AssertedPrincipal, capability: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Principal(who)),
        target: Some(decide_request::Target::Capability(capability.into())),
        request_id: String::new(),
        arguments_json: None,
    }
}

pub fn for_tool(who: AssertedPrincipal, tool: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Principal(who)),
        target: Some(decide_request::Target::Tool(tool.into())),
        request_id: String::new(),
        arguments_json: None,
    }
}

/// A call that counts against a ceiling (Ana reading tickets).
pub fn capped() -> DecideRequest {
    for_capability(ana(), "tickets.issue.read")
}

/// A call no ceiling applies to (Dee searching docs).
pub fn uncapped() -> DecideRequest {
    for_capability(dee(), "docs.page.search")
}

#[track_caller]
pub fn decision(response: &DecideResponse) -> &Decision {
    match &response.result {
        Some(decide_response::Result::Decision(decision)) => decision,
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// (outcome, code, path, subject) of a decision.
#[track_caller]
pub fn summary(response: &DecideResponse) -> (Outcome, ReasonCode, String, String) {
    let decision = decision(response);
    let reason = decision.reason.as_ref().expect("every decision has a reason");
    (
        decision.outcome(),
        reason.code(),
        reason.path.clone(),
        reason.subject.clone(),
    )
}

/// The reason code of a decision.
#[track_caller]
pub fn code(response: &DecideResponse) -> ReasonCode {
    summary(response).1
}

/// What `audit_log.outcome` says for this answer.
pub fn recorded_outcome(response: &DecideResponse) -> &'static str {
    match &response.result {
        Some(decide_response::Result::Decision(d)) if d.outcome() == Outcome::Allow => "allow",
        Some(decide_response::Result::Decision(_)) => "deny",
        Some(decide_response::Result::Unauthenticated(_)) => "unauthenticated",
        Some(decide_response::Result::UnknownTool(_)) => "unknown_tool",
        None => panic!("an empty response"),
    }
}

/// What `audit_log.code` says for a reason code: `REASON_CODE_LIMIT_EXHAUSTED`
/// is `limit_exhausted`.
pub fn recorded_code(code: ReasonCode) -> String {
    code.as_str_name()
        .trim_start_matches("REASON_CODE_")
        .to_lowercase()
}

/// A plaintext channel to a server on loopback.
pub async fn connect(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the server")
}

/// Publishes through `channel` (no token, so a loopback server).
pub async fn publish(
    channel: &Channel,
    artifact: &str,
    catalog: Option<&str>,
) -> Result<PublishPolicyResponse, Status> {
    PolicyServiceClient::new(channel.clone())
        .max_encoding_message_size(usize::MAX)
        .publish_policy(PublishPolicyRequest {
            artifact: artifact.to_owned(),
            catalog: catalog.map(str::to_owned),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The server's overall health.
pub async fn health(channel: &Channel) -> Result<ServingStatus, Status> {
    HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|response| response.into_inner().status())
}

/// Waits until the server reports SERVING; panics after `within`.
pub async fn wait_serving(channel: &Channel, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let status = health(channel).await;
        if matches!(status, Ok(ServingStatus::Serving)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not SERVING within {within:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
