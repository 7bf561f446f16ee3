//! Clients for every door of one `capgate serve`: capgate's own `Decide`, Envoy's ext_authz
//! `Check`, agentgateway's ExtMCP `CheckRequest` and AuthZEN's `POST /access/v1/evaluation`, each
//! speaking its protocol on the wire as its peer would, and the helpers that build their messages.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use capgate::store::Door;
use capgate::wire::ext_mcp::ext_mcp_client::ExtMcpClient;
use capgate::wire::ext_mcp::{mcp_request_result, McpRequest};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{credential, decide_request, decide_response, Credential, DecideRequest};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
    HttpRequest, Peer, Request as HttpAttributes,
};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest, CheckResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost_types::value::Kind;
use prost_types::{Struct, Value as ProtoValue};
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Request;

use super::postgres::TestDatabase;
use super::process::Serve;

/// A client for each door of one server, as the gateway whose token is `token`.
pub struct Doors {
    pub http: SocketAddr,
    pub token: String,
    pub http_client: Client<HttpConnector, Full<Bytes>>,
    pub decisions: DecisionServiceClient<Channel>,
    pub ext_authz: AuthorizationClient<Channel>,
    pub ext_mcp: ExtMcpClient<Channel>,
}

/// One `tools/call` as a door carries it: the caller's own API key (`None`: no credential at
/// all), the exposed tool name `<upstream>__<tool>`, and the gateway's request id.
#[derive(Clone, Copy, Debug)]
pub struct KeyedCall<'a> {
    pub api_key: Option<&'a str>,
    /// The subject the key belongs to, which AuthZEN's `subject.id` must name.
    pub subject: &'a str,
    pub tool: &'a str,
    pub request_id: &'a str,
    /// ext_authz only: when Envoy received the request (`attributes.request.time`), in
    /// milliseconds. A check Envoy retries for the same request carries the same instant; a new
    /// request through the proxy, another.
    pub received_ms: i64,
}

/// What a door's client read from its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// Allowed; the decision id when the door's answer carries one (an ExtMCP `Pass` does not).
    Allow {
        decision_id: Option<String>,
    },
    Deny {
        code: String,
        decision_id: Option<String>,
    },
    Unauthenticated {
        code: String,
    },
    /// Refused because the request id was used for another request: the door's words.
    ReusedId {
        message: String,
    },
    /// Anything else, as the client saw it.
    Other(String),
}

impl Read {
    pub fn is_allow(&self) -> bool {
        matches!(self, Read::Allow { .. })
    }

    pub fn decision_id(&self) -> Option<&str> {
        match self {
            Read::Allow { decision_id } | Read::Deny { decision_id, .. } => decision_id.as_deref(),
            _ => None,
        }
    }
}

impl Doors {
    /// Clients for `serve`, whose `--http-listen` address is read from its log.
    pub async fn connect(serve: &Serve, token: &str) -> Doors {
        let channel = serve.channel().await;
        Doors {
            http: http_addr(serve),
            token: token.to_owned(),
            http_client: Client::builder(TokioExecutor::new()).build_http(),
            decisions: DecisionServiceClient::new(channel.clone()),
            ext_authz: AuthorizationClient::new(channel.clone()),
            ext_mcp: ExtMcpClient::new(channel),
        }
    }

    /// `message` with this gateway's token in the call's metadata.
    pub fn as_gateway<T>(&self, message: T) -> Request<T> {
        as_gateway(message, &self.token)
    }

    /// Asks for `call` through `door`.
    pub async fn keyed(&mut self, door: Door, call: KeyedCall<'_>) -> Read {
        match door {
            Door::Capgate => self.keyed_decide(call).await,
            Door::ExtAuthz => self.keyed_check(call).await,
            Door::ExtMcp => self.keyed_check_request(call).await,
            Door::Authzen => self.keyed_evaluate(call).await,
            Door::ForwardAuth => self.keyed_forward_auth(call).await,
        }
    }

    /// A proxy's forward-auth subrequest: no body, the original request's MCP headers and the
    /// caller's key, the proxy's token in its own header and its request id in
    /// [`FORWARD_AUTH_REQUEST_ID`].
    async fn keyed_forward_auth(&mut self, call: KeyedCall<'_>) -> Read {
        let mut headers = vec![
            ("mcp-method", "tools/call"),
            ("mcp-name", call.tool),
            (FORWARD_AUTH_REQUEST_ID, call.request_id),
        ];
        if let Some(key) = call.api_key {
            headers.push(("x-api-key", key));
        }
        let (status, headers, body) = self.forward_auth("/forward-auth", &headers).await;
        read_forward_auth(status, &headers, &body)
    }

    async fn keyed_decide(&mut self, call: KeyedCall<'_>) -> Read {
        let request = DecideRequest {
            caller: Some(decide_request::Caller::Credential(Credential {
                kind: call.api_key.map(|key| credential::Kind::ApiKey(key.to_owned())),
                issuer: String::new(),
            })),
            target: Some(decide_request::Target::Tool(call.tool.to_owned())),
            request_id: call.request_id.to_owned(),
            arguments_json: None,
        };
        let response = match self.decisions.decide(self.as_gateway(request)).await {
            Ok(response) => response.into_inner(),
            Err(status) if mentions_request_id(status.message()) => {
                return Read::ReusedId {
                    message: format!("{:?}: {}", status.code(), status.message()),
                }
            }
            Err(status) => return Read::Other(format!("{status:?}")),
        };
        match &response.result {
            Some(decide_response::Result::Decision(decision)) => {
                let decision_id = Some(response.decision_id.clone());
                if decision.outcome() == capgate::wire::proto::Outcome::Allow {
                    Read::Allow { decision_id }
                } else {
                    let code = decision.reason.as_ref().map(|reason| reason.code());
                    Read::Deny {
                        code: code.map(super::client::recorded_code).unwrap_or_default(),
                        decision_id,
                    }
                }
            }
            Some(decide_response::Result::Unauthenticated(problem)) => Read::Unauthenticated {
                code: problem.problem().as_str_name().to_owned(),
            },
            other => Read::Other(format!("{other:?}")),
        }
    }

    async fn keyed_check(&mut self, call: KeyedCall<'_>) -> Read {
        let mut headers = vec![
            ("mcp-method", "tools/call"),
            ("mcp-name", call.tool),
            ("x-request-id", call.request_id),
        ];
        if let Some(key) = call.api_key {
            headers.push(("x-api-key", key));
        }
        let mut request = forwarded(&headers);
        if let Some(http) = request.attributes.as_mut().and_then(|a| a.request.as_mut()) {
            http.time = Some(envoy_types::pb::google::protobuf::Timestamp {
                seconds: call.received_ms.div_euclid(1000),
                nanos: (call.received_ms.rem_euclid(1000) * 1_000_000) as i32,
            });
        }
        match self.ext_authz.check(self.as_gateway(request)).await {
            Ok(response) => read_check(&response.into_inner()),
            Err(status) => Read::Other(format!("{status:?}")),
        }
    }

    async fn keyed_check_request(&mut self, call: KeyedCall<'_>) -> Read {
        let (service, name) = call.tool.split_once("__").expect("an exposed name");
        let mut context = Struct::default();
        if let Some(key) = call.api_key {
            context.fields.insert("api_key".to_owned(), string(key));
        }
        context
            .fields
            .insert("request_id".to_owned(), string(call.request_id));
        let request = McpRequest {
            service_names: vec![service.to_owned()],
            method: "tools/call".to_owned(),
            metadata_context: Some(context),
            mcp_request: Some(json!({"name": name, "arguments": {}}).to_string().into_bytes()),
            headers: Vec::new(),
        };
        let result = match self.ext_mcp.check_request(self.as_gateway(request)).await {
            Ok(result) => result.into_inner(),
            Err(status) => return Read::Other(format!("{status:?}")),
        };
        match &result.result {
            Some(mcp_request_result::Result::Pass(_)) => Read::Allow { decision_id: None },
            Some(mcp_request_result::Result::Error(error)) => {
                let data: Value = error
                    .mcp_error
                    .as_deref()
                    .and_then(|bytes| serde_json::from_slice(bytes).ok())
                    .unwrap_or(Value::Null);
                let code = data["code"].as_str().unwrap_or_default().to_owned();
                let decision_id = data["decision_id"].as_str().map(str::to_owned);
                match code.as_str() {
                    "request_id_reused" => Read::ReusedId {
                        message: error.reason.clone(),
                    },
                    "" => Read::Other(format!("{error:?}")),
                    code if code.starts_with("credential_") || code.starts_with("issuer_") => {
                        Read::Unauthenticated {
                            code: code.to_owned(),
                        }
                    }
                    _ => Read::Deny { code, decision_id },
                }
            }
            other => Read::Other(format!("{other:?}")),
        }
    }

    async fn keyed_evaluate(&mut self, call: KeyedCall<'_>) -> Read {
        let body = json!({
            "subject": {"type": "identity", "id": call.subject,
                "properties": {"api_key": call.api_key.unwrap_or_default()}},
            "action": {"name": "tools/call"},
            "resource": {"type": "tool", "id": call.tool},
        });
        let (status, answer) = self
            .post(
                "/access/v1/evaluation",
                &body,
                &[("x-request-id", call.request_id)],
            )
            .await;
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        if status != 200 {
            return if mentions_request_id(message) {
                Read::ReusedId {
                    message: format!("{status}: {message}"),
                }
            } else {
                Read::Other(format!("{status}: {answer}"))
            };
        }
        let reason = &answer["context"]["reason"];
        let code = reason["code"].as_str().unwrap_or_default().to_owned();
        let decision_id = answer["context"]["decision_id"].as_str().map(str::to_owned);
        match (&answer["decision"], code.as_str()) {
            (Value::Bool(true), _) => Read::Allow { decision_id },
            (Value::Bool(false), "unauthenticated") => Read::Unauthenticated {
                code: reason["problem"].as_str().unwrap_or_default().to_owned(),
            },
            (Value::Bool(false), _) => Read::Deny { code, decision_id },
            _ => Read::Other(answer.to_string()),
        }
    }

    /// A forward-auth subrequest (`GET path`, no body) as this gateway, its token in
    /// `x-capgate-gateway-token`: the status, the answer's headers and its body (`null` when it
    /// is not JSON).
    pub async fn forward_auth(&self, path: &str, headers: &[(&str, &str)]) -> (u16, hyper::HeaderMap, Value) {
        let mut request = hyper::Request::builder()
            .method("GET")
            .uri(format!("http://{}{path}", self.http))
            .header("x-capgate-gateway-token", self.token.as_str());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::new())).expect("a request");
        let response = self.http_client.request(request).await.expect("an HTTP answer");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.expect("a body").to_bytes();
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// `POST path` on the HTTP listener as this gateway, with `headers`: the status and the
    /// body (`null` when it is not JSON).
    pub async fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut request = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.http))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", self.token));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        let response = self.http_client.request(request).await.expect("an HTTP answer");
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.expect("a body").to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// Whether a refusal's words name the `request_id` (as every door's refusal of a reused id does).
fn mentions_request_id(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("request_id") || message.contains("request id") || message.contains("x-request-id")
}

/// A `CheckResponse` as Envoy acts on it: `OK` is an allow; a denial is read from its JSON-RPC
/// error body's `data.code`.
pub fn read_check(response: &CheckResponse) -> Read {
    match &response.http_response {
        Some(HttpResponse::OkResponse(ok)) => {
            let decision_id = ok
                .headers
                .iter()
                .filter_map(|option| option.header.as_ref())
                .find(|header| header.key == "x-capgate-decision-id")
                .map(|header| header.value.clone());
            Read::Allow { decision_id }
        }
        Some(HttpResponse::DeniedResponse(denied)) => {
            let http = denied.status.as_ref().map_or(-1, |status| status.code);
            let body: Value = serde_json::from_str(&denied.body).unwrap_or(Value::Null);
            let data = &body["error"]["data"];
            let code = data["code"].as_str().unwrap_or_default().to_owned();
            let decision_id = data["decision_id"].as_str().map(str::to_owned);
            match (http, code.as_str()) {
                (_, "request_id_reused") => Read::ReusedId {
                    message: format!("{http}: {}", body["error"]["message"]),
                },
                (401, code) => Read::Unauthenticated {
                    code: code.to_owned(),
                },
                (_, "") => Read::Other(format!("{response:?}")),
                _ => Read::Deny { code, decision_id },
            }
        }
        other => Read::Other(format!("{other:?}")),
    }
}

/// The header a world's servers take the forward-auth door's request id from
/// (`--forward-auth-request-id-header`).
pub const FORWARD_AUTH_REQUEST_ID: &str = "x-capgate-request-id";

/// A forward-auth answer as a proxy acts on it: a 2xx is an allow (its decision id in
/// `x-capgate-decision-id`); anything else is the client's answer, read from its JSON-RPC body.
pub fn read_forward_auth(status: u16, headers: &hyper::HeaderMap, body: &Value) -> Read {
    if (200..300).contains(&status) {
        let decision_id = headers
            .get("x-capgate-decision-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        return Read::Allow { decision_id };
    }
    let data = &body["error"]["data"];
    let code = data["code"].as_str().unwrap_or_default().to_owned();
    let decision_id = data["decision_id"].as_str().map(str::to_owned);
    match (status, code.as_str()) {
        (_, "request_id_reused") => Read::ReusedId {
            message: format!("{status}: {}", body["error"]["message"]),
        },
        (401, code) if !code.is_empty() => Read::Unauthenticated {
            code: code.to_owned(),
        },
        (_, "") => Read::Other(format!("{status}: {body}")),
        _ => Read::Deny { code, decision_id },
    }
}

pub fn as_gateway<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    request
}

/// The address `--http-listen` resolved to, from the start-up log line.
pub fn http_addr(serve: &Serve) -> SocketAddr {
    serve
        .logs()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "serving HTTP: AuthZEN and forward-auth")
        .and_then(|line| line["fields"]["addresses"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no AuthZEN address logged:\n{}", serve.logs()))
}

/// A forwarded HTTP request with these headers (names lower-case, as Envoy sends them).
pub fn forwarded(headers: &[(&str, &str)]) -> CheckRequest {
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer::default()),
            request: Some(HttpAttributes {
                http: Some(HttpRequest {
                    method: "POST".into(),
                    path: "/mcp".into(),
                    host: "mcp.example.net".into(),
                    headers: headers
                        .iter()
                        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

pub fn string(text: &str) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

pub fn object(fields: &[(&str, ProtoValue)]) -> ProtoValue {
    ProtoValue {
        kind: Some(Kind::StructValue(structure(fields))),
    }
}

pub fn structure(fields: &[(&str, ProtoValue)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// A version 2 policy whose grants read a call's arguments
/// (docs/policy-guide.md#conditions-what-a-call-does): examples/refunds.yaml with a static-key
/// caller every door can carry, and without the office hours, so that no answer depends on the
/// clock. With examples/refunds.catalog.yaml.
pub const CONDITIONAL_POLICY: &str = r#"
version: 2
capabilities:
  - id: billing.refund.create
  - id: deploy.release.approve
upstreams:
  - id: payments
    transport: { kind: mcp-http, url: "https://payments.example.net/mcp" }
    tools:
      - { name: create_refund, capability: billing.refund.create }
  - id: ci
    transport: { kind: mcp-http, url: "https://ci.example.net/mcp" }
    tools:
      - { name: approve_release, capability: deploy.release.approve }
accounts:
  - id: support-payments
    secret: { ref: "env://CONDITIONAL_ACCOUNT_SECRET" }
    upstreams: [payments]
  - id: release-robot
    secret: { ref: "env://CONDITIONAL_ACCOUNT_SECRET" }
    upstreams: [ci]
principals:
  issuers:
    - id: desk
      kind: static-key
      subject: support-desk
      secret: { ref: "env://CONDITIONAL_DESK_KEY" }
      attributes: { dept: support }
grants:
  # /grants/0: refunds up to 100, in EUR or USD.
  - to: { issuer: desk, attributes: { dept: support } }
    capabilities: [billing.refund.create]
    using: support-payments
    when:
      - argument: amount
        at_most: 100
      - argument: currency
        in: [EUR, USD]
  # /grants/1: releases at any hour of any day (a condition on the instant only).
  - to: { issuer: desk }
    capabilities: [deploy.release.approve]
    using: release-robot
    when:
      - time:
          zone: Europe/Madrid
          days: [mon, tue, wed, thu, fri, sat, sun]
          from: "00:00"
          until: "24:00"
"#;

/// The catalog [`CONDITIONAL_POLICY`]'s conditions are checked against.
pub const CONDITIONAL_CATALOG: &str = include_str!("../../examples/refunds.catalog.yaml");

/// The `desk` caller's API key (`x-api-key` on the HTTP doors).
pub const DESK_KEY: &str = "conditional-desk-key-5e5e";
/// The one gateway's token: trusted to assert, so every door may carry any caller.
pub const CONDITIONAL_TOKEN: &str = "conditional-gateway-token-6f6f";
/// The refund tool and the release tool, as exposed.
pub const REFUND: &str = "payments__create_refund";
pub const RELEASE: &str = "ci__approve_release";
/// The pointers of the refund grant's conditions.
pub const AMOUNT_CONDITION: &str = "/grants/0/when/0";
pub const CURRENCY_CONDITION: &str = "/grants/0/when/1";

/// One `capgate serve` with [`CONDITIONAL_POLICY`] over a fresh PostgreSQL database, with
/// `--http-listen` and the forward-auth door's request id header; a client for each door.
pub struct Conditional {
    pub serve: Serve,
    pub doors: Doors,
    pub database: TestDatabase,
    _dir: tempfile::TempDir,
}

impl Conditional {
    /// `None` when the PostgreSQL tests are skipped (no `DATABASE_URL`).
    pub async fn start() -> Option<Conditional> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.yaml");
        let catalog = dir.path().join("catalog.yaml");
        std::fs::write(&policy, CONDITIONAL_POLICY).expect("write the policy");
        std::fs::write(&catalog, CONDITIONAL_CATALOG).expect("write the catalog");
        let url = database.url();
        let serve = Serve::start_with_env(
            &[
                "--database-url",
                &url,
                "--policy",
                policy.to_str().expect("utf-8"),
                "--catalog",
                catalog.to_str().expect("utf-8"),
                "--http-listen",
                "127.0.0.1:0",
                "--asserting-gateway-token",
                "conditional-gw=env://CONDITIONAL_GATEWAY_TOKEN",
                "--forward-auth-request-id-header",
                FORWARD_AUTH_REQUEST_ID,
            ],
            &[
                ("CONDITIONAL_GATEWAY_TOKEN", CONDITIONAL_TOKEN),
                ("CONDITIONAL_DESK_KEY", DESK_KEY),
                ("CONDITIONAL_ACCOUNT_SECRET", "conditional-account-secret-7a7a"),
            ],
        )
        .await;
        let doors = Doors::connect(&serve, CONDITIONAL_TOKEN).await;
        Some(Conditional {
            serve,
            doors,
            database,
            _dir: dir,
        })
    }

    /// The audit record of `decision_id`.
    pub async fn record(&self, decision_id: &str) -> capgate::store::AuditRecord {
        use capgate::store::Store;
        self.database
            .store()
            .await
            .query_audit(&capgate::store::AuditFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .expect("read the audit trail")
            .into_iter()
            .find(|record| record.decision_id == decision_id)
            .unwrap_or_else(|| panic!("no audit record {decision_id}"))
    }
}

/// A refund's arguments, as the catalog's `create_refund` takes them.
pub fn refund(amount: f64, currency: &str) -> Value {
    json!({"paymentId": "pay-1", "amount": amount, "currency": currency})
}
