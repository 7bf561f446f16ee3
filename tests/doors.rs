//! The doors agree (issues 11, 27): the example policy's worked cases asked through capgate's own
//! `Decide`, Envoy's ext_authz `Check`, agentgateway's ExtMCP `CheckRequest`, AuthZEN's
//! `POST /access/v1/evaluation` and a proxy's forward-auth subrequest, of one real
//! `capgate serve` over PostgreSQL. Each case is asked
//! through every door that can express its caller — an asserted principal on the doors that take
//! one, and the caller's own credential (the nightly runner's API key, the mesh's client
//! certificate) wherever the door forwards it — and every answer, read as that door's client
//! reads it, must be the table's (outcome, reason code). The audit trail then holds exactly one
//! decision record per call, with the door it came through and the same outcome and code.
//!
//! No case consumes a ceiling it could exhaust, so the rows may run in any order.
//!
//! Needs `DATABASE_URL` (skipped without it, unless `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use capgate::store::{AuditFilter, AuditRecord, Door, RecordKind, RecordOutcome, Store};
use capgate::wire::ext_mcp::ext_mcp_client::ExtMcpClient;
use capgate::wire::ext_mcp::{authorization_error, mcp_request_result, AuthorizationError, McpRequest};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{credential, decide_request, decide_response, Credential, DecideRequest};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::CheckResponse;
use envoy_types::pb::google::protobuf::value::Kind as EnvoyKind;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost_types::Value as ProtoValue;
use serde_json::{json, Value};
use support::client::{principal, recorded_code, wait_serving, CATALOG, POLICY};
use support::doors::{as_gateway, forwarded, http_addr, object, string, structure, FORWARD_AUTH_REQUEST_ID};
use support::postgres::TestDatabase;
use support::process::Serve;
use tonic::transport::Channel;
use tonic::Code;

/// The one gateway, trusted to assert (so that every door may assert a principal, and ext_authz
/// may forward a client certificate).
const GATEWAY: &str = "doors-gw";
const GATEWAY_TOKEN: &str = "doors-gateway-token-3f3f";
/// `env://NIGHTLY_RUNNER_KEY`, the example's static key.
const NIGHTLY_KEY: &str = "doors-nightly-key-8d8d";

/// How a door's answer is read: the outcome class, and the reason code (or the problem, for an
/// unauthenticated caller; `unknown_tool` for an unknown tool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Allow,
    Deny,
    UnknownTool,
    Unauthenticated,
}

/// A door's reading of one answer. `code` is `None` where the door's answer carries no code
/// (an ExtMCP `Pass`); the audit record is then where the code is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    outcome: Outcome,
    code: Option<String>,
}

impl Seen {
    fn new(outcome: Outcome, code: &str) -> Seen {
        Seen {
            outcome,
            code: Some(code.to_owned()),
        }
    }

    /// Whether this is the expected answer (a door that says no code agrees on the outcome).
    fn agrees_with(&self, expected: &Seen) -> bool {
        self.outcome == expected.outcome
            && self
                .code
                .as_ref()
                .is_none_or(|code| Some(code) == expected.code.as_ref())
    }
}

/// Who calls, as the example policy knows them.
#[derive(Clone, Copy, Debug)]
enum Caller {
    /// An `oidc` principal of `staff`: only a gateway's assertion can carry it here (the example's
    /// discovery document is not reachable, so no token can be verified).
    Staff {
        subject: &'static str,
        attributes: &'static [(&'static str, &'static str)],
    },
    /// The `static-key` issuer `nightly` (subject `nightly-runner`, role batch, env prod).
    Nightly,
    /// The `mtls` issuer `mesh`: a certificate `CN=<cn>,OU=<unit>,O=<org>`.
    Mesh {
        cn: &'static str,
        org: &'static str,
        unit: &'static str,
    },
}

/// How the caller is put on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// An asserted principal (issuer, subject, attributes).
    Asserted,
    /// The nightly runner's own API key.
    ApiKey,
    /// The mesh caller's client certificate as the TLS terminator forwards it.
    Certificate,
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Via::Asserted => "asserted",
            Via::ApiKey => "api_key",
            Via::Certificate => "certificate",
        })
    }
}

impl Caller {
    /// Every (door, way) that can express this caller. ext_authz cannot assert a principal: it
    /// takes the callers that have credentials.
    fn ways(self) -> Vec<(Door, Via)> {
        match self {
            Caller::Staff { .. } => vec![
                (Door::Capgate, Via::Asserted),
                (Door::ExtMcp, Via::Asserted),
                (Door::Authzen, Via::Asserted),
            ],
            Caller::Nightly => vec![
                (Door::Capgate, Via::Asserted),
                (Door::Capgate, Via::ApiKey),
                (Door::ExtAuthz, Via::ApiKey),
                (Door::ForwardAuth, Via::ApiKey),
                (Door::ExtMcp, Via::Asserted),
                (Door::ExtMcp, Via::ApiKey),
                (Door::Authzen, Via::Asserted),
                (Door::Authzen, Via::ApiKey),
            ],
            Caller::Mesh { .. } => vec![
                (Door::Capgate, Via::Asserted),
                (Door::Capgate, Via::Certificate),
                (Door::ExtAuthz, Via::Certificate),
                (Door::ForwardAuth, Via::Certificate),
                (Door::ExtMcp, Via::Asserted),
                (Door::Authzen, Via::Asserted),
                (Door::Authzen, Via::Certificate),
            ],
        }
    }

    /// (issuer, subject, attributes) as a gateway asserts them.
    fn asserted(self) -> (&'static str, &'static str, Vec<(&'static str, &'static str)>) {
        match self {
            Caller::Staff { subject, attributes } => ("staff", subject, attributes.to_vec()),
            Caller::Nightly => (
                "nightly",
                "nightly-runner",
                vec![("role", "batch"), ("env", "prod")],
            ),
            Caller::Mesh { cn, org, unit } => ("mesh", cn, vec![("org", org), ("unit", unit)]),
        }
    }

    /// The client certificate's subject as a bare distinguished name.
    fn dn(self) -> String {
        match self {
            Caller::Mesh { cn, org, unit } => format!("CN={cn},OU={unit},O={org}"),
            other => panic!("{other:?} has no certificate"),
        }
    }

    /// The verified subject of the caller's own credential.
    fn subject(self) -> &'static str {
        self.asserted().1
    }
}

/// One row of the table: a caller, a tool as `<upstream>__<tool>`, the expected answer.
struct Row {
    name: &'static str,
    caller: Caller,
    tool: &'static str,
    expected: (Outcome, &'static str),
}

const ANA: Caller = Caller::Staff {
    subject: "ana",
    attributes: &[("dept", "support")],
};
const DEE: Caller = Caller::Staff {
    subject: "dee",
    attributes: &[],
};
const SAM: Caller = Caller::Staff {
    subject: "sam",
    attributes: &[("dept", "support"), ("level", "senior")],
};
const FAY: Caller = Caller::Staff {
    subject: "fay",
    attributes: &[("dept", "finance")],
};
const PAYMENTS_SVC: Caller = Caller::Mesh {
    cn: "svc-pay",
    org: "Acme Corp",
    unit: "payments",
};
const SRE_SVC: Caller = Caller::Mesh {
    cn: "svc-sre",
    org: "Acme Corp",
    unit: "sre",
};

/// The worked examples of examples/policy.yaml. The allows that count against a ceiling stay far
/// below it (/grants/0 600/h, /grants/1 100/h, /grants/5 5000/d, /grants/7 20/h); denials and
/// unknown tools consume nothing.
fn table() -> Vec<Row> {
    use Outcome::{Allow, Deny, UnknownTool};
    vec![
        Row {
            name: "Ana (support) reads a ticket: /grants/0",
            caller: ANA,
            tool: "helpdesk__get_ticket",
            expected: (Allow, "granted"),
        },
        Row {
            name: "Dee (staff, no dept) reads a ticket",
            caller: DEE,
            tool: "helpdesk__get_ticket",
            expected: (Deny, "no_grant_matches"),
        },
        Row {
            name: "Sam (senior support) comments: /grants/1",
            caller: SAM,
            tool: "helpdesk__comment_ticket",
            expected: (Allow, "granted"),
        },
        Row {
            name: "Ana (support, not senior) comments",
            caller: ANA,
            tool: "helpdesk__comment_ticket",
            expected: (Deny, "no_grant_matches"),
        },
        Row {
            name: "Fay (finance) refunds: /grants/10, calls 0",
            caller: FAY,
            tool: "payments__issue_refund",
            expected: (Deny, "limit_exhausted"),
        },
        Row {
            name: "Ana asks for the unmapped delete_ticket",
            caller: ANA,
            tool: "helpdesk__delete_ticket",
            expected: (UnknownTool, "unknown_tool"),
        },
        Row {
            name: "nightly reads a ticket: /grants/5",
            caller: Caller::Nightly,
            tool: "helpdesk__get_ticket",
            expected: (Allow, "granted"),
        },
        Row {
            name: "nightly approves a release: /grants/11, release-robot disabled",
            caller: Caller::Nightly,
            tool: "releases__approve_release",
            expected: (Deny, "account_disabled"),
        },
        Row {
            name: "nightly refunds",
            caller: Caller::Nightly,
            tool: "payments__issue_refund",
            expected: (Deny, "no_grant_matches"),
        },
        Row {
            name: "nightly asks for a tool nobody declared",
            caller: Caller::Nightly,
            tool: "helpdesk__no_such_tool",
            expected: (UnknownTool, "unknown_tool"),
        },
        Row {
            name: "mesh O=Acme Corp,OU=payments refunds: /grants/7",
            caller: PAYMENTS_SVC,
            tool: "payments__issue_refund",
            expected: (Allow, "granted"),
        },
        Row {
            name: "mesh O=Acme Corp,OU=sre refunds",
            caller: SRE_SVC,
            tool: "payments__issue_refund",
            expected: (Deny, "no_grant_matches"),
        },
    ]
}

/// One `capgate serve` with the example policy and catalog, `--http-listen`, and one asserting
/// gateway token; its database; clients for each door.
struct World {
    serve: Serve,
    http: SocketAddr,
    database: TestDatabase,
    http_client: Client<HttpConnector, Full<Bytes>>,
    decisions: DecisionServiceClient<Channel>,
    ext_authz: AuthorizationClient<Channel>,
    ext_mcp: ExtMcpClient<Channel>,
    _dir: tempfile::TempDir,
}

impl World {
    /// `None` when the PostgreSQL tests are skipped (no `DATABASE_URL`).
    async fn start() -> Option<World> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.yaml");
        let catalog = dir.path().join("catalog.yaml");
        std::fs::write(&policy, POLICY).expect("write the policy");
        std::fs::write(&catalog, CATALOG).expect("write the catalog");
        let url = database.url();
        let gateway = format!("{GATEWAY}=env://CAPGATE_TEST_DOORS_TOKEN");
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
                &gateway,
                "--forward-auth-request-id-header",
                FORWARD_AUTH_REQUEST_ID,
            ],
            &[
                ("CAPGATE_TEST_DOORS_TOKEN", GATEWAY_TOKEN),
                ("NIGHTLY_RUNNER_KEY", NIGHTLY_KEY),
            ],
        )
        .await;
        let http = http_addr(&serve);
        let channel = serve.channel().await;
        wait_serving(&channel, Duration::from_secs(10)).await;
        Some(World {
            http,
            database,
            http_client: Client::builder(TokioExecutor::new()).build_http(),
            decisions: DecisionServiceClient::new(channel.clone()),
            ext_authz: AuthorizationClient::new(channel.clone()),
            ext_mcp: ExtMcpClient::new(channel),
            serve,
            _dir: dir,
        })
    }

    /// Asks `tool` for `caller` through `door`, the way `via`, with `request_id`; the answer as
    /// that door's client reads it, and the answer itself for the failure message.
    async fn ask(
        &mut self,
        door: Door,
        via: Via,
        caller: Caller,
        tool: &str,
        request_id: &str,
    ) -> (Seen, String) {
        match door {
            Door::Capgate => self.decide(via, caller, tool, request_id).await,
            Door::ExtAuthz => self.check(via, caller, tool, request_id).await,
            Door::ExtMcp => self.check_request(via, caller, tool, request_id).await,
            Door::Authzen => self.evaluate(via, caller, tool, request_id).await,
            Door::ForwardAuth => self.forward_auth(via, caller, tool, request_id).await,
        }
    }

    /// A proxy's forward-auth subrequest: no body; `mcp-method`/`mcp-name`, the caller's key or
    /// the client certificate the TLS terminator forwards, the proxy's token and request id.
    async fn forward_auth(
        &mut self,
        via: Via,
        caller: Caller,
        tool: &str,
        request_id: &str,
    ) -> (Seen, String) {
        let xfcc;
        let credential = match via {
            Via::ApiKey => ("x-api-key", NIGHTLY_KEY),
            Via::Certificate => {
                xfcc = format!("Hash=ab;Subject=\"{}\"", caller.dn());
                ("x-forwarded-client-cert", xfcc.as_str())
            }
            Via::Asserted => panic!("a forward-auth subrequest cannot assert a principal"),
        };
        let mut request = hyper::Request::builder()
            .method("GET")
            .uri(format!("http://{}/forward-auth", self.http))
            .header("x-capgate-gateway-token", GATEWAY_TOKEN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .header(FORWARD_AUTH_REQUEST_ID, request_id);
        request = request.header(credential.0, credential.1);
        let request = request.body(Full::new(Bytes::new())).expect("a request");
        let response = self.http_client.request(request).await.expect("an HTTP answer");
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.expect("a body").to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let code = body["error"]["data"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let seen = match (status, body["error"]["code"].as_i64()) {
            (200, _) => Seen {
                outcome: Outcome::Allow,
                code: None,
            },
            (401, _) => Seen::new(Outcome::Unauthenticated, &code),
            (_, Some(-32602)) => Seen::new(Outcome::UnknownTool, &code),
            _ => Seen::new(Outcome::Deny, &code),
        };
        (seen, format!("{status} {body}"))
    }

    /// `capgate.v1.DecisionService/Decide`.
    async fn decide(&mut self, via: Via, caller: Caller, tool: &str, request_id: &str) -> (Seen, String) {
        let who = match via {
            Via::Asserted => {
                let (issuer, subject, attributes) = caller.asserted();
                let attributes: Vec<(&str, [&str; 1])> =
                    attributes.iter().map(|(name, value)| (*name, [*value])).collect();
                let attributes: Vec<(&str, &[&str])> = attributes
                    .iter()
                    .map(|(name, values)| (*name, values.as_slice()))
                    .collect();
                decide_request::Caller::Principal(principal(issuer, subject, &attributes))
            }
            Via::ApiKey => decide_request::Caller::Credential(Credential {
                kind: Some(credential::Kind::ApiKey(NIGHTLY_KEY.to_owned())),
                issuer: String::new(),
            }),
            Via::Certificate => decide_request::Caller::Credential(Credential {
                kind: Some(credential::Kind::ClientCertificate(caller.dn())),
                issuer: "mesh".to_owned(),
            }),
        };
        let request = DecideRequest {
            caller: Some(who),
            target: Some(decide_request::Target::Tool(tool.to_owned())),
            request_id: request_id.to_owned(),
            arguments_json: None,
        };
        let response = self
            .decisions
            .decide(as_gateway(request, GATEWAY_TOKEN))
            .await
            .expect("an answered Decide")
            .into_inner();
        let seen = match &response.result {
            Some(decide_response::Result::Decision(decision)) => {
                let reason = decision.reason.as_ref().expect("every decision has a reason");
                let outcome = if decision.outcome() == capgate::wire::proto::Outcome::Allow {
                    Outcome::Allow
                } else {
                    Outcome::Deny
                };
                Seen::new(outcome, &recorded_code(reason.code()))
            }
            Some(decide_response::Result::UnknownTool(_)) => Seen::new(Outcome::UnknownTool, "unknown_tool"),
            Some(decide_response::Result::Unauthenticated(problem)) => {
                Seen::new(Outcome::Unauthenticated, problem.problem().as_str_name())
            }
            None => panic!("an empty DecideResponse: {response:?}"),
        };
        (seen, format!("{response:?}"))
    }

    /// `envoy.service.auth.v3.Authorization/Check`: a forwarded `tools/call` with `mcp-method` and
    /// `mcp-name`, and the caller's `x-api-key` or `x-forwarded-client-cert`.
    async fn check(&mut self, via: Via, caller: Caller, tool: &str, request_id: &str) -> (Seen, String) {
        let xfcc;
        let credential = match via {
            Via::ApiKey => ("x-api-key", NIGHTLY_KEY),
            Via::Certificate => {
                xfcc = format!("Hash=ab;Subject=\"{}\"", caller.dn());
                ("x-forwarded-client-cert", xfcc.as_str())
            }
            Via::Asserted => panic!("ext_authz cannot assert a principal"),
        };
        let request = forwarded(&[
            ("mcp-method", "tools/call"),
            ("mcp-name", tool),
            credential,
            ("x-request-id", request_id),
        ]);
        let response = self
            .ext_authz
            .check(as_gateway(request, GATEWAY_TOKEN))
            .await
            .expect("an answered Check")
            .into_inner();
        (read_check(&response), format!("{response:?}"))
    }

    /// `agentgateway.dev.ext_mcp.ExtMcp/CheckRequest`: the backend's own tool name under its
    /// `service_names`, the caller in `metadata_context`.
    async fn check_request(
        &mut self,
        via: Via,
        caller: Caller,
        tool: &str,
        request_id: &str,
    ) -> (Seen, String) {
        let (service, name) = tool.split_once("__").expect("an exposed name");
        let mut context = match via {
            Via::Asserted => {
                let (issuer, subject, attributes) = caller.asserted();
                let attributes: Vec<(&str, ProtoValue)> = attributes
                    .iter()
                    .map(|(name, value)| (*name, string(value)))
                    .collect();
                structure(&[(
                    "principal",
                    object(&[
                        ("issuer", string(issuer)),
                        ("subject", string(subject)),
                        ("attributes", object(&attributes)),
                    ]),
                )])
            }
            Via::ApiKey => structure(&[("api_key", string(NIGHTLY_KEY))]),
            Via::Certificate => panic!("ExtMCP takes no client certificate"),
        };
        context.fields.insert("request_id".to_owned(), string(request_id));
        let request = McpRequest {
            service_names: vec![service.to_owned()],
            method: "tools/call".to_owned(),
            metadata_context: Some(context),
            mcp_request: Some(json!({"name": name, "arguments": {}}).to_string().into_bytes()),
            headers: Vec::new(),
        };
        let result = self
            .ext_mcp
            .check_request(as_gateway(request, GATEWAY_TOKEN))
            .await
            .expect("an answered CheckRequest")
            .into_inner();
        let seen = match &result.result {
            Some(mcp_request_result::Result::Pass(_)) => Seen {
                outcome: Outcome::Allow,
                code: None,
            },
            Some(mcp_request_result::Result::Error(error)) => read_authorization_error(error),
            other => panic!("neither a pass nor an error: {other:?}"),
        };
        (seen, format!("{result:?}"))
    }

    /// `POST /access/v1/evaluation`.
    async fn evaluate(&mut self, via: Via, caller: Caller, tool: &str, request_id: &str) -> (Seen, String) {
        let subject = match via {
            Via::Asserted => {
                let (issuer, subject, attributes) = caller.asserted();
                let attributes: serde_json::Map<String, Value> = attributes
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), json!([value])))
                    .collect();
                json!({"type": "identity", "id": subject,
                    "properties": {"issuer": issuer, "attributes": attributes}})
            }
            Via::ApiKey => json!({"type": "identity", "id": caller.subject(),
                "properties": {"api_key": NIGHTLY_KEY}}),
            Via::Certificate => json!({"type": "identity", "id": caller.subject(),
                "properties": {"client_certificate": caller.dn(), "issuer": "mesh"}}),
        };
        let body = json!({"subject": subject, "action": {"name": "tools/call"},
            "resource": {"type": "tool", "id": tool}});
        let request = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{}/access/v1/evaluation", self.http))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {GATEWAY_TOKEN}"))
            .header("x-request-id", request_id)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        let response = self.http_client.request(request).await.expect("an HTTP answer");
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.expect("a body").to_bytes();
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!(status, 200, "AuthZEN {body}: {answer}");
        let reason = &answer["context"]["reason"];
        let code = reason["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no reason code in {answer}"));
        let seen = match (&answer["decision"], code) {
            (Value::Bool(true), code) => Seen::new(Outcome::Allow, code),
            (Value::Bool(false), "unknown_tool") => Seen::new(Outcome::UnknownTool, code),
            (Value::Bool(false), "unauthenticated") => Seen::new(
                Outcome::Unauthenticated,
                reason["problem"].as_str().unwrap_or_default(),
            ),
            (Value::Bool(false), code) => Seen::new(Outcome::Deny, code),
            _ => panic!("no decision in {answer}"),
        };
        (seen, answer.to_string())
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        self.database
            .store()
            .await
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail")
    }
}

/// A `CheckResponse` as Envoy reads it: `OK` or a denied response, its dynamic metadata's `code`
/// and `outcome`, and (on a denial) the JSON-RPC error body, which must say the same code.
fn read_check(response: &CheckResponse) -> Seen {
    let grpc = response.status.as_ref().map_or(-1, |status| status.code);
    let metadata: HashMap<String, String> = response
        .dynamic_metadata
        .as_ref()
        .map(|metadata| {
            metadata
                .fields
                .iter()
                .filter_map(|(key, value)| match &value.kind {
                    Some(EnvoyKind::StringValue(text)) => Some((key.clone(), text.clone())),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let code = metadata
        .get("code")
        .unwrap_or_else(|| panic!("no `code` in the dynamic metadata: {response:?}"))
        .clone();
    let said = metadata.get("outcome").map(String::as_str);
    match &response.http_response {
        Some(HttpResponse::OkResponse(ok)) => {
            assert_eq!(grpc, Code::Ok as i32, "{response:?}");
            assert_eq!(said, Some("allow"), "{response:?}");
            let account = ok
                .headers
                .iter()
                .filter_map(|option| option.header.as_ref())
                .any(|header| header.key == "x-capgate-account");
            assert!(account, "an allow names the account: {response:?}");
            Seen::new(Outcome::Allow, &code)
        }
        Some(HttpResponse::DeniedResponse(denied)) => {
            let http = denied.status.as_ref().map_or(-1, |status| status.code);
            let body: Value = serde_json::from_str(&denied.body).expect("a JSON-RPC body");
            assert_eq!(
                body["error"]["data"]["code"].as_str(),
                Some(code.as_str()),
                "the body and the metadata disagree: {response:?}"
            );
            let outcome = match (http, body["error"]["code"].as_i64()) {
                (401, _) => Outcome::Unauthenticated,
                (_, Some(-32602)) => Outcome::UnknownTool,
                _ => Outcome::Deny,
            };
            let expected_said = match outcome {
                Outcome::Deny => "deny",
                Outcome::UnknownTool => "unknown_tool",
                Outcome::Unauthenticated => "unauthenticated",
                Outcome::Allow => unreachable!(),
            };
            assert_eq!(said, Some(expected_said), "{response:?}");
            let (status, http_expected) = match code.as_str() {
                "limit_exhausted" => (Code::ResourceExhausted, 429),
                "usage_unknown" => (Code::Unavailable, 503),
                _ if outcome == Outcome::UnknownTool => (Code::NotFound, 403),
                _ if outcome == Outcome::Unauthenticated => (Code::Unauthenticated, 401),
                _ => (Code::PermissionDenied, 403),
            };
            assert_eq!((grpc, http), (status as i32, http_expected), "{response:?}");
            Seen::new(outcome, &code)
        }
        other => panic!("neither OK nor denied: {other:?}"),
    }
}

/// An ExtMCP `AuthorizationError` as agentgateway reads it: the code class and the JSON-RPC
/// payload's `data.code`, which must agree.
fn read_authorization_error(error: &AuthorizationError) -> Seen {
    let data: Value = serde_json::from_slice(error.mcp_error.as_deref().expect("a JSON-RPC error payload"))
        .expect("`mcp_error` is JSON");
    let code = data["code"]
        .as_str()
        .unwrap_or_else(|| panic!("`data.code` is not a string: {data}"))
        .to_owned();
    assert!(
        error.reason.starts_with(&format!("denied: {code}: ")),
        "the reason and the payload disagree: {error:?}"
    );
    let class = match code.as_str() {
        "limit_exhausted" => authorization_error::Code::ResourceExhausted,
        "usage_unknown" => authorization_error::Code::Unknown,
        _ => authorization_error::Code::PermissionDenied,
    };
    assert_eq!(error.code(), class, "{error:?}");
    let outcome = match code.as_str() {
        "unknown_tool" => Outcome::UnknownTool,
        code if code.starts_with("credential_") || code.starts_with("issuer_") => Outcome::Unauthenticated,
        _ => Outcome::Deny,
    };
    Seen::new(outcome, &code)
}

/// What an audit record says, in the same terms.
fn recorded(record: &AuditRecord) -> Seen {
    let code = record.code.map(|code| code.as_str().to_owned());
    match record.outcome {
        RecordOutcome::Allow => Seen {
            outcome: Outcome::Allow,
            code,
        },
        RecordOutcome::Deny => Seen {
            outcome: Outcome::Deny,
            code,
        },
        RecordOutcome::Unauthenticated => Seen {
            outcome: Outcome::Unauthenticated,
            code,
        },
        // An unknown tool's record has no code: nothing was decided.
        RecordOutcome::UnknownTool => Seen {
            outcome: Outcome::UnknownTool,
            code: Some(code.unwrap_or_else(|| "unknown_tool".to_owned())),
        },
        // Every call here has a request id of its own: none is a retry or a reuse.
        RecordOutcome::Replayed | RecordOutcome::RequestIdReused => {
            panic!(
                "a call of its own request id recorded as {}: {record:?}",
                record.outcome
            )
        }
    }
}

/// One call made: which row, through which door and how, under which request id.
struct Asked {
    row: &'static str,
    door: Door,
    via: Via,
    request_id: String,
    expected: Seen,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_examples_get_the_same_answer_through_every_door() {
    let Some(mut world) = World::start().await else {
        return;
    };
    let table = table();
    let mut asked = Vec::new();
    let mut disagreements = Vec::new();
    for (index, row) in table.iter().enumerate() {
        let expected = Seen::new(row.expected.0, row.expected.1);
        for (door, via) in row.caller.ways() {
            let request_id = format!("doors-{index}-{}-{via}", door.as_str());
            let (seen, answer) = world.ask(door, via, row.caller, row.tool, &request_id).await;
            if !seen.agrees_with(&expected) {
                disagreements.push(format!(
                    "{}: {} via {via} saw {seen:?}, expected {expected:?}\n  answer: {answer}",
                    row.name,
                    door.as_str()
                ));
            }
            asked.push(Asked {
                row: row.name,
                door,
                via,
                request_id,
                expected: expected.clone(),
            });
        }
    }
    // Every door was used, and every credential kind.
    for door in Door::ALL {
        assert!(asked.iter().any(|call| call.door == door), "{door:?} untried");
    }
    for via in [Via::Asserted, Via::ApiKey, Via::Certificate] {
        assert!(asked.iter().any(|call| call.via == via), "{via} untried");
    }

    // The audit trail: one decision record per call, through its door, saying the same.
    let audit = world.audit().await;
    let decides: Vec<&AuditRecord> = audit
        .iter()
        .filter(|record| record.kind == RecordKind::Decide)
        .collect();
    let mut wrong = Vec::new();
    if decides.len() != asked.len() {
        wrong.push(format!(
            "{} decision records for {} calls",
            decides.len(),
            asked.len()
        ));
    }
    for call in &asked {
        let records: Vec<&&AuditRecord> = decides
            .iter()
            .filter(|record| record.request_id.as_deref() == Some(call.request_id.as_str()))
            .collect();
        let [record] = records.as_slice() else {
            wrong.push(format!(
                "{} ({} via {}): {} records for {}",
                call.row,
                call.door.as_str(),
                call.via,
                records.len(),
                call.request_id
            ));
            continue;
        };
        let seen = recorded(record);
        if record.door != call.door || seen != call.expected || record.gateway != GATEWAY {
            wrong.push(format!(
                "{} ({} via {}): recorded {seen:?} through {} by {}, expected {:?}",
                call.row,
                call.door.as_str(),
                call.via,
                record.door.as_str(),
                record.gateway,
                call.expected
            ));
        }
    }
    assert!(
        disagreements.is_empty() && wrong.is_empty(),
        "the doors disagree with the table:\n{}\nthe audit trail disagrees:\n{}",
        disagreements.join("\n"),
        wrong.join("\n")
    );
    assert!(
        !world.serve.logs().contains(NIGHTLY_KEY) && !format!("{audit:?}").contains(NIGHTLY_KEY),
        "the API key leaked"
    );
}
