//! The load: the bench policy and the requests that exercise it, the callers that send them back
//! to back over their own connections, the store baseline's writer, and what they tally — the
//! completed calls inside the counted window and their latencies.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capgate::cli::remote::{Connection, Server};
use capgate::cli::Failure;
use capgate::store::{AuditRecord, Door, RecordCode, RecordKind, RecordOutcome, Store};
use capgate::wire::ext_mcp::ext_mcp_client::ExtMcpClient;
use capgate::wire::ext_mcp::{mcp_request_result, McpRequest};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::policy_service_client::PolicyServiceClient;
use capgate::wire::proto::{
    decide_request, decide_response, AssertedPrincipal, Attribute, DecideRequest, Outcome as DecisionOutcome,
    PublishPolicyRequest, ReasonCode, SetShadowPolicyRequest,
};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::{attribute_context, AttributeContext, CheckRequest};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use uuid::Uuid;

use crate::plan::{Plan, Scenario, Shadow};
use crate::progress;

/// The policy every run publishes: one issuer, one account, an uncapped
/// grant and a capped one whose ceiling (a billion calls a day) no run
/// reaches.
/// The bench policy, its static key read from `key_file` (which holds [`BENCH_KEY`]): the
/// ext_authz scenario forwards the caller's own credential, since Envoy cannot assert one.
pub fn policy(key_file: &Path) -> String {
    POLICY.replace("{key_file}", &key_file.display().to_string())
}

/// The shadow version a shadow scenario sets beside [`policy`]: the bench policy with one more grant
/// (to a team no bench caller is in), which decides every bench call as the active version does; or,
/// for [`Shadow::Differs`], one that also runs the uncapped tool as another account, so that every
/// uncapped call is a difference.
pub fn shadow_policy(key_file: &Path, shadow: Shadow) -> String {
    let mut artifact = policy(key_file);
    artifact.push_str(
        r#"  - to:
      issuer: bench
      attributes: { team: audit }
    capabilities: [bench.free.call]
    using: bench-runner
"#,
    );
    if shadow == Shadow::Differs {
        artifact = artifact
            .replace(
                "accounts:\n",
                "accounts:\n  - id: bench-other\n    secret: { ref: \"env://CAPGATE_BENCH_OTHER_TOKEN\" }\n",
            )
            .replacen(
                "    capabilities: [bench.free.call]\n    using: bench-runner\n",
                "    capabilities: [bench.free.call]\n    using: bench-other\n",
                1,
            );
    }
    artifact
}

/// The API key of the bench's `static-key` issuer.
pub const BENCH_KEY: &str = "capgate-bench-static-key";

const POLICY: &str = r#"# The service bench's policy (benches/service.rs, docs/benchmarks.md "The service").
version: 1
capabilities:
  - id: bench.free.call
    description: A tool any bench agent may call, with no ceiling
  - id: bench.metered.call
    description: A tool under a ceiling no run exhausts
upstreams:
  - id: bench
    transport:
      kind: mcp-http
      url: https://bench.invalid/mcp
    tools:
      - name: free
        capability: bench.free.call
      - name: metered
        capability: bench.metered.call
accounts:
  - id: bench-runner
    secret: { ref: "env://CAPGATE_BENCH_RUNNER_TOKEN" }
principals:
  issuers:
    - id: bench
      kind: oidc
      discovery: https://login.bench.invalid/.well-known/openid-configuration
      audience: capgate-bench
      attributes:
        team: claim:team
    - id: bench-key
      kind: static-key
      subject: keyed-agent
      secret: { ref: "file://{key_file}" }
      attributes:
        team: load
grants:
  - to:
      issuer: bench
      attributes: { team: load }
    capabilities: [bench.free.call]
    using: bench-runner
  - to:
      issuer: bench-key
    capabilities: [bench.free.call]
    using: bench-runner
  - to:
      issuer: bench-key
    capabilities: [bench.metered.call]
    using: bench-runner
    limits: { calls: 1000000000, per: 1d }
  - to:
      issuer: bench
      attributes: { team: load }
    capabilities: [bench.metered.call]
    using: bench-runner
    limits: { calls: 1000000000, per: 1d }
"#;

// ── Connections ────────────────────────────────────────────────────────────

/// Opens `count` connections to `url`, each its own tonic channel, i.e. its own HTTP/2 connection,
/// through the client helper every service command uses (`capgate decide`, `publish`, …): the same
/// endpoint settings (5 s to connect, a 60 s deadline per call, so a server that stops answering
/// still ends each measurement) and the same token, from `token_file` or `CAPGATE_TOKEN`. A server
/// started in-process has no tokens and takes every caller as `loopback`, whatever it presents.
pub async fn connect(
    url: &str,
    token_file: Option<&Path>,
    count: usize,
) -> Result<Vec<Arc<Connection>>, Failure> {
    let server = Server {
        server: url.to_owned(),
        token_file: token_file.map(Path::to_path_buf),
        tls_ca: None,
    };
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(Arc::new(server.connect().await?));
    }
    Ok(connections)
}

/// Publishes the bench policy to a server that runs elsewhere.
pub async fn publish(connection: &Connection, policy: &str) -> Result<(), Failure> {
    let mut client = PolicyServiceClient::new(connection.channel.clone());
    let published = client
        .publish_policy(connection.request(PublishPolicyRequest {
            artifact: policy.to_owned(),
            catalog: None,
            expected_active_revision: None,
            dry_run: false,
            comment: "cargo bench --bench service".to_owned(),
            shadow: false,
        }))
        .await
        .map_err(|status| Failure::Input(format!("cannot publish the bench policy: {}", status.message())))?
        .into_inner();
    if !published.accepted {
        return Err(Failure::Input("the server refused the bench policy".to_owned()));
    }
    progress(&format!("bench policy active as revision {}", published.revision));
    Ok(())
}

/// Publishes `artifact` as the shadow version (`shadow: Some`) or clears the shadow pointer. The
/// replica that answers installs it before it answers, and the bench drives one replica.
pub async fn set_shadow(connection: &Connection, artifact: Option<&str>) -> Result<(), Failure> {
    let mut client = PolicyServiceClient::new(connection.channel.clone());
    match artifact {
        Some(artifact) => {
            let published = client
                .publish_policy(connection.request(PublishPolicyRequest {
                    artifact: artifact.to_owned(),
                    catalog: None,
                    expected_active_revision: None,
                    dry_run: false,
                    comment: "cargo bench --bench service: a shadow scenario".to_owned(),
                    shadow: true,
                }))
                .await
                .map_err(|status| {
                    Failure::Input(format!("cannot publish the shadow version: {}", status.message()))
                })?
                .into_inner();
            if !published.accepted {
                return Err(Failure::Input("the server refused the shadow version".to_owned()));
            }
            progress(&format!("shadow version set: revision {}", published.revision));
        }
        None => {
            client
                .set_shadow_policy(connection.request(SetShadowPolicyRequest { revision: None }))
                .await
                .map_err(|status| {
                    Failure::Input(format!("cannot clear the shadow version: {}", status.message()))
                })?;
        }
    }
    Ok(())
}

// ── What is sent ───────────────────────────────────────────────────────────

/// The requests a scenario rotates through.
pub fn requests(scenario: Scenario, principals: usize) -> Vec<DecideRequest> {
    let (tool, count) = match scenario {
        Scenario::Uncapped
        | Scenario::UncappedKeyed
        | Scenario::ExtMcpUncapped
        | Scenario::ExtAuthzUncapped
        | Scenario::AuthzenUncapped
        | Scenario::ForwardAuthUncapped
        | Scenario::UncappedShadow
        | Scenario::UncappedShadowDiffers => ("bench__free", principals),
        Scenario::Capped | Scenario::ExtMcpCapped | Scenario::AuthzenCapped | Scenario::CappedShadow => {
            ("bench__metered", principals)
        }
        Scenario::CappedHot | Scenario::ExtAuthzCappedHot => ("bench__metered", 1),
    };
    (0..count)
        .map(|index| DecideRequest {
            caller: Some(decide_request::Caller::Principal(AssertedPrincipal {
                issuer: "bench".to_owned(),
                subject: if scenario == Scenario::CappedHot {
                    "agent-hot".to_owned()
                } else {
                    format!("agent-{index:05}")
                },
                attributes: vec![Attribute {
                    name: "team".to_owned(),
                    values: vec!["load".to_owned()],
                }],
            })),
            target: Some(decide_request::Target::Tool(tool.to_owned())),
            // Only the keyed scenario sends one; each caller makes it unique per call.
            request_id: if scenario == Scenario::UncappedKeyed {
                KEYED.to_owned()
            } else {
                String::new()
            },
            arguments_json: None,
        })
        .collect()
}

/// The `request_id` of a keyed request template; each caller sends `<run>-<caller>-<n>` instead.
const KEYED: &str = "keyed";

/// What the callers of one measurement send.
#[derive(Clone, Copy)]
pub enum Load<'a> {
    Health,
    Decide(&'a [DecideRequest]),
    /// The same requests through agentgateway's ExtMCP door.
    ExtMcp(&'a [DecideRequest]),
    /// The bench key's `tools/call` of this tool through Envoy's ext_authz door.
    ExtAuthz(&'a str),
    /// The same requests as AuthZEN evaluations, to the HTTP listener at this address.
    Authzen(&'a [DecideRequest], SocketAddr),
    /// The bench key's `tools/call` of this tool as a proxy's forward-auth subrequest, to the HTTP
    /// listener at this address.
    ForwardAuth(&'a str, SocketAddr),
}

/// What one caller sends: [`Load`] with its own starting point.
enum Work {
    Health,
    Decide(Vec<DecideRequest>),
    ExtMcp(Vec<McpRequest>),
    ExtAuthz(Box<CheckRequest>),
    Authzen(Vec<Vec<u8>>, SocketAddr),
    ForwardAuth(String, SocketAddr),
}

// ── The callers ────────────────────────────────────────────────────────────

/// N callers, one per connection, each calling back to back until the window
/// closes.
pub async fn measure_calls(
    connections: &[Arc<Connection>],
    load: Load<'_>,
    plan: &Plan,
    name: &'static str,
    label: String,
) -> Measured {
    let window = Window::after(plan.warmup, plan.duration);
    let mut tasks = Vec::with_capacity(connections.len());
    for (index, connection) in connections.iter().enumerate() {
        let work = match load {
            Load::Health => Work::Health,
            Load::ForwardAuth(tool, addr) => Work::ForwardAuth(tool.to_owned(), addr),
            Load::ExtAuthz(tool) => Work::ExtAuthz(Box::new(ext_authz_request(tool))),
            Load::Authzen(requests, addr) => {
                let start = index * requests.len() / connections.len().max(1);
                let bodies = requests[start..]
                    .iter()
                    .chain(&requests[..start])
                    .map(authzen_evaluation)
                    .collect();
                Work::Authzen(bodies, addr)
            }
            Load::Decide(requests) | Load::ExtMcp(requests) => {
                // Callers start at different principals, and each walks
                // through all of them.
                let start = index * requests.len() / connections.len().max(1);
                let mut mine = requests[start..].to_vec();
                mine.extend_from_slice(&requests[..start]);
                if matches!(load, Load::ExtMcp(_)) {
                    Work::ExtMcp(mine.iter().map(ext_mcp_request).collect())
                } else {
                    Work::Decide(mine)
                }
            }
        };
        // Unique across runs on the same database too: a key seen before would be a replay.
        let keys = format!("{}-{index}", now_ms());
        tasks.push(tokio::spawn(caller(Arc::clone(connection), work, window, keys)));
    }
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(error) => {
                total.errors += 1;
                total.problem.get_or_insert(format!("a caller failed: {error}"));
            }
        }
    }
    total.into_measured(connections.len(), name, label, plan.duration.as_secs_f64())
}

async fn caller(connection: Arc<Connection>, work: Work, window: Window, keys: String) -> Tally {
    let mut health = HealthClient::new(connection.channel.clone());
    let mut decisions = DecisionServiceClient::new(connection.channel.clone());
    let mut ext_mcp = ExtMcpClient::new(connection.channel.clone());
    let mut ext_authz = AuthorizationClient::new(connection.channel.clone());
    // One client per caller: its pool keeps one HTTP/1.1 connection, as a gateway's would.
    let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut tally = Tally::default();
    let mut next = 0_usize;
    loop {
        let started = Instant::now();
        if started >= window.until {
            break;
        }
        let answered: Result<bool, String> = match &work {
            Work::Health => health
                .check(connection.request(HealthCheckRequest {
                    service: String::new(),
                }))
                .await
                .map(|response| response.into_inner().status == ServingStatus::Serving as i32)
                .map_err(|status| format!("{:?}: {}", status.code(), status.message())),
            Work::Authzen(bodies, addr) => {
                let body = bodies[next % bodies.len()].clone();
                next = next.wrapping_add(1);
                match evaluate(&http, *addr, body).await {
                    Ok(None) => Ok(true),
                    Ok(Some(why)) => {
                        tally.problem.get_or_insert(why);
                        Ok(false)
                    }
                    Err(problem) => Err(problem),
                }
            }
            Work::ForwardAuth(tool, addr) => {
                forward_auth(&http, *addr, tool)
                    .await
                    .map(|refused| match refused {
                        None => true,
                        Some(why) => {
                            tally.problem.get_or_insert(why);
                            false
                        }
                    })
            }
            Work::ExtAuthz(request) => match ext_authz
                .check(connection.request(request.as_ref().clone()))
                .await
            {
                // Envoy's reading: status 0 (OK) lets the request through.
                Ok(response) => match response.into_inner().status {
                    Some(status) if status.code == 0 => Ok(true),
                    other => {
                        tally.problem.get_or_insert(format!("not allowed: {other:?}"));
                        Ok(false)
                    }
                },
                Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
            },
            Work::ExtMcp(requests) => {
                let request = requests[next % requests.len()].clone();
                next = next.wrapping_add(1);
                match ext_mcp.check_request(connection.request(request)).await {
                    Ok(response) => match response.into_inner().result {
                        Some(mcp_request_result::Result::Pass(_)) => Ok(true),
                        other => {
                            tally.problem.get_or_insert(format!("not a pass: {other:?}"));
                            Ok(false)
                        }
                    },
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                }
            }
            Work::Decide(requests) => {
                let mut request = requests[next % requests.len()].clone();
                if request.request_id == KEYED {
                    request.request_id = format!("{keys}-{next}");
                }
                next = next.wrapping_add(1);
                match decisions.decide(connection.request(request)).await {
                    Ok(response) => match refusal(&response.into_inner().result) {
                        None => Ok(true),
                        Some(why) => {
                            tally.problem.get_or_insert(why);
                            Ok(false)
                        }
                    },
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                }
            }
        };
        let finished = Instant::now();
        let counts = started >= window.from && finished <= window.until;
        match answered {
            Ok(true) if counts => {
                tally.completed += 1;
                tally.latencies_us.push(micros(finished - started));
            }
            Ok(true) => {}
            Ok(false) => {
                tally.not_allowed += 1;
                tally
                    .problem
                    .get_or_insert_with(|| "an answer other than allow / SERVING".to_owned());
            }
            Err(problem) => {
                tally.errors += 1;
                tally.problem.get_or_insert(problem);
                // A failing server is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// An AuthZEN evaluation of the request's tool for its (asserted) principal, as a PEP sends it.
fn authzen_evaluation(request: &DecideRequest) -> Vec<u8> {
    let Some(decide_request::Target::Tool(tool)) = &request.target else {
        unreachable!("the bench's requests name tools");
    };
    let Some(decide_request::Caller::Principal(principal)) = &request.caller else {
        unreachable!("the bench's requests assert principals");
    };
    let attributes: serde_json::Map<String, serde_json::Value> = principal
        .attributes
        .iter()
        .map(|attribute| (attribute.name.clone(), attribute.values[0].clone().into()))
        .collect();
    serde_json::json!({
        "subject": {
            "type": "identity",
            "id": principal.subject,
            "properties": {"issuer": principal.issuer, "attributes": attributes},
        },
        "action": {"name": "tools/call"},
        "resource": {"type": "tool", "id": tool},
    })
    .to_string()
    .into_bytes()
}

/// One evaluation: `Ok(None)` for `decision: true`, else the reason code it gave.
async fn evaluate(http: &HttpClient, addr: SocketAddr, body: Vec<u8>) -> Result<Option<String>, String> {
    let request = hyper::Request::post(format!("http://{addr}/access/v1/evaluation"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|error| error.to_string())?;
    let response = http.request(request).await.map_err(|error| error.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| error.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
    }
    let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|error| error.to_string())?;
    if answer["decision"] == serde_json::Value::Bool(true) {
        return Ok(None);
    }
    Ok(Some(format!(
        "not allowed: {}",
        answer["context"]["reason"]["code"]
    )))
}

/// One forward-auth subrequest, as nginx's `auth_request` sends it: no body, the original
/// request's MCP headers and the caller's key. `Ok(None)` for a 200, else why not.
async fn forward_auth(http: &HttpClient, addr: SocketAddr, tool: &str) -> Result<Option<String>, String> {
    let request = hyper::Request::get(format!("http://{addr}/forward-auth"))
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header("x-api-key", BENCH_KEY)
        .body(Full::new(Bytes::new()))
        .map_err(|error| error.to_string())?;
    let response = http.request(request).await.map_err(|error| error.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| error.to_string())?
        .to_bytes();
    if status.is_success() {
        return Ok(None);
    }
    Ok(Some(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))))
}

/// What Envoy sends for a `tools/call` of `tool` by the bench key's holder: the MCP
/// headers of the forwarded request and the caller's own API key.
fn ext_authz_request(tool: &str) -> CheckRequest {
    let headers = [
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
        ("x-api-key", BENCH_KEY),
    ];
    CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(attribute_context::Request {
                http: Some(attribute_context::HttpRequest {
                    method: "POST".to_owned(),
                    path: "/mcp".to_owned(),
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

/// A `Decide` request as agentgateway's callout carries it: the backend and its own tool name, the
/// asserted principal in `metadata_context` (docs/decisions/0019).
fn ext_mcp_request(request: &DecideRequest) -> McpRequest {
    let string = |text: &str| Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    };
    let object = |fields: Vec<(String, Value)>| Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().collect(),
        })),
    };
    let Some(decide_request::Target::Tool(exposed)) = &request.target else {
        unreachable!("the bench's requests name tools");
    };
    let (service, tool) = exposed.split_once("__").expect("an exposed tool name");
    let Some(decide_request::Caller::Principal(principal)) = &request.caller else {
        unreachable!("the bench's requests assert principals");
    };
    let attributes = principal
        .attributes
        .iter()
        .map(|attribute| (attribute.name.clone(), string(&attribute.values[0])))
        .collect();
    let asserted = object(vec![
        ("issuer".to_owned(), string(&principal.issuer)),
        ("subject".to_owned(), string(&principal.subject)),
        ("attributes".to_owned(), object(attributes)),
    ]);
    McpRequest {
        service_names: vec![service.to_owned()],
        method: "tools/call".to_owned(),
        metadata_context: Some(Struct {
            fields: [("principal".to_owned(), asserted)].into_iter().collect(),
        }),
        mcp_request: Some(serde_json::json!({"name": tool}).to_string().into_bytes()),
        headers: Vec::new(),
    }
}

/// Why an answer is not an allow (`None` for an allow).
fn refusal(result: &Option<decide_response::Result>) -> Option<String> {
    match result {
        Some(decide_response::Result::Decision(decision)) => {
            if decision.outcome == DecisionOutcome::Allow as i32 {
                return None;
            }
            let code = decision
                .reason
                .as_ref()
                .and_then(|reason| ReasonCode::try_from(reason.code).ok())
                .map_or("no reason", |code| code.as_str_name());
            Some(format!("deny {code}"))
        }
        Some(decide_response::Result::Unauthenticated(_)) => Some("unauthenticated".to_owned()),
        Some(decide_response::Result::UnknownTool(_)) => Some("unknown tool".to_owned()),
        None => Some("no result".to_owned()),
    }
}

// ── The store baseline ─────────────────────────────────────────────────────

/// One writer appending batches of `rows` audit records back to back, as
/// the server's group commit does with `rows` callers waiting (it has one
/// writer, and `rows` callers have at most `rows` records outstanding).
pub async fn append_batches<S: Store>(store: S, rows: usize, window: Window) -> Tally {
    let mut tally = Tally::default();
    let mut sequence = 0_usize;
    loop {
        let started = Instant::now();
        if started >= window.until {
            break;
        }
        let batch: Vec<AuditRecord> = (0..rows)
            .map(|_| {
                sequence = sequence.wrapping_add(1);
                audit_row(sequence)
            })
            .collect();
        let appended = store.append_audit(&batch, &[]).await;
        let finished = Instant::now();
        match appended {
            Ok(()) if started >= window.from && finished <= window.until => {
                tally.completed += rows as u64;
                tally.latencies_us.push(micros(finished - started));
            }
            Ok(()) => {}
            Err(error) => {
                tally.errors += 1;
                tally.problem.get_or_insert(error.to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

/// A record shaped like the one a capped allow writes.
fn audit_row(sequence: usize) -> AuditRecord {
    AuditRecord {
        decision_id: Uuid::now_v7().to_string(),
        at_ms: now_ms(),
        request_id: None,
        gateway: "loopback".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(capgate_core::access::ReasonCode::Granted)),
        path: Some("/grants/1".to_owned()),
        principal_id: Some(format!("bench:agent-{:05}", sequence % 1000)),
        issuer: Some("bench".to_owned()),
        subject: Some(format!("agent-{:05}", sequence % 1000)),
        capability: Some("bench.metered.call".to_owned()),
        tool: Some("bench__metered".to_owned()),
        account_id: Some("bench-runner".to_owned()),
        limit_calls: Some(1_000_000_000),
        limit_per: Some("1d".to_owned()),
        usage_calls: Some(sequence as u64),
        policy_version: Some(format!("sha256:{}", "0".repeat(64))),
        policy_revision: Some(1),
        visible_count: None,
        visible: Vec::new(),
        door: Door::Capgate,
        first_decision_id: None,
        arguments_digest: None,
        arguments: None,
        arguments_omitted: None,
        // An identified principal's attributes, as the service keeps them for a replay.
        attributes: Some("{}".to_owned()),
        shadow: None,
    }
}

/// The wall clock in milliseconds since the epoch. A row only needs a current time (it lands in the
/// current month's audit partition, as the server's would); the product's clock helpers are private
/// to its rooms, and reading the system clock here is all they do.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

// ── Tallies ────────────────────────────────────────────────────────────────

/// When callers count: calls that start at or after `from` and end by `until`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    from: Instant,
    until: Instant,
}

impl Window {
    pub fn after(warmup: Duration, duration: Duration) -> Window {
        let from = Instant::now() + warmup;
        Window {
            from,
            until: from + duration,
        }
    }

    /// Whether a call starting at `now` starts too late to count: a caller stops there.
    pub fn closed(&self, now: Instant) -> bool {
        now >= self.until
    }

    /// Whether a call that ran from `started` to `finished` counts.
    pub fn counts(&self, started: Instant, finished: Instant) -> bool {
        started >= self.from && finished <= self.until
    }
}

/// What one caller tallied.
#[derive(Default)]
pub struct Tally {
    latencies_us: Vec<u32>,
    completed: u64,
    errors: u64,
    not_allowed: u64,
    problem: Option<String>,
}

impl Tally {
    /// A call that answered inside the window, after `latency`.
    pub fn answered(&mut self, latency: Duration) {
        self.completed += 1;
        self.latencies_us.push(micros(latency));
    }

    /// A call that failed; the first problem is kept for the report.
    pub fn failed(&mut self, problem: String) {
        self.errors += 1;
        self.problem.get_or_insert(problem);
    }

    pub fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.completed += other.completed;
        self.errors += other.errors;
        self.not_allowed += other.not_allowed;
        if self.problem.is_none() {
            self.problem = other.problem;
        }
    }

    pub fn into_measured(
        mut self,
        concurrency: usize,
        name: &'static str,
        label: String,
        seconds: f64,
    ) -> Measured {
        self.latencies_us.sort_unstable();
        Measured {
            concurrency,
            name,
            label,
            completed: self.completed,
            seconds,
            latencies_us: self.latencies_us,
            errors: self.errors,
            not_allowed: self.not_allowed,
            problem: self.problem,
        }
    }
}

/// One measurement's result.
#[derive(Debug, Clone)]
pub struct Measured {
    pub concurrency: usize,
    /// `health`, `store-append` or a scenario name.
    pub name: &'static str,
    pub label: String,
    /// Calls (or rows, for the store) completed within the window.
    pub completed: u64,
    pub seconds: f64,
    /// Per call (per batch, for the store), in microseconds, sorted.
    latencies_us: Vec<u32>,
    /// Calls that failed (gRPC error or timeout).
    pub errors: u64,
    /// Decisions that came back as something other than an allow.
    pub not_allowed: u64,
    /// The first failure, for the report.
    pub problem: Option<String>,
}

impl Measured {
    pub fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.completed as f64 / self.seconds
        } else {
            0.0
        }
    }

    pub fn percentile_ms(&self, fraction: f64) -> f64 {
        percentile(&self.latencies_us, fraction) as f64 / 1000.0
    }
}

/// The value below which `fraction` of the sorted samples fall (nearest rank).
pub fn percentile(sorted: &[u32], fraction: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX)
}
