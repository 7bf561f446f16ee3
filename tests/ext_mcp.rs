//! agentgateway's door (`agentgateway.dev.ext_mcp.ExtMcp`) through the real binary and a real
//! client generated from the protocol's proto, over PostgreSQL: `tools/call` decided like a
//! `Decide` (each outcome class, both caller kinds, the ceiling, an idempotent retry), the
//! methods that need no decision passed, every other refused, `tools/list` results cut to what
//! the caller may see, and bad input refused naming the field. Every decision and listing is
//! audited with `door = ext_mcp`.
//!
//! Needs `DATABASE_URL` (skipped without it, unless `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::collections::BTreeMap;

use capgate::store::{
    AuditFilter, AuditRecord, CounterKey, Door, PostgresStore, RecordOutcome, Store, StoreOptions,
};
use capgate::wire::ext_mcp::ext_mcp_client::ExtMcpClient;
use capgate::wire::ext_mcp::{
    authorization_error, mcp_request_result, mcp_response_result, AuthorizationError, McpRequest, McpResponse,
};
use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use tonic::transport::Channel;
use tonic::{Code, Request};

use support::client::{example_with_ceiling, CATALOG};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;

const GATEWAY_TOKEN: &str = "gw-plain-5e1f";
const TRUSTED_TOKEN: &str = "gw-trusted-77a0";
const NIGHTLY_KEY: &str = "nightly-key-9c2d";
/// Ana's ceiling on reading tickets in this test's policy.
const CEILING: u64 = 3;

struct World {
    serve: Serve,
    database: TestDatabase,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start() -> Option<World> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.yaml");
        let catalog = dir.path().join("catalog.yaml");
        std::fs::write(&policy, example_with_ceiling(CEILING)).expect("write the policy");
        std::fs::write(&catalog, CATALOG).expect("write the catalog");
        let url = database.url();
        let serve = Serve::start_with_env(
            &[
                "--database-url",
                &url,
                "--policy",
                policy.to_str().expect("utf-8"),
                "--catalog",
                catalog.to_str().expect("utf-8"),
                "--gateway-token",
                "plain-gw=env://CAPGATE_TEST_GATEWAY_TOKEN",
                "--asserting-gateway-token",
                "agentgateway=env://CAPGATE_TEST_TRUSTED_TOKEN",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            &[
                ("CAPGATE_TEST_GATEWAY_TOKEN", GATEWAY_TOKEN),
                ("CAPGATE_TEST_TRUSTED_TOKEN", TRUSTED_TOKEN),
                ("NIGHTLY_RUNNER_KEY", NIGHTLY_KEY),
            ],
        )
        .await;
        Some(World {
            serve,
            database,
            _dir: dir,
        })
    }

    async fn client(&self) -> ExtMcpClient<Channel> {
        ExtMcpClient::new(self.serve.channel().await)
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::connect_with(self.database.options.clone(), &StoreOptions::default())
            .await
            .expect("open the store")
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        self.store()
            .await
            .query_audit(&AuditFilter {
                limit: 1000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail")
    }
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    request
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn object(fields: &[(&str, Value)]) -> Value {
    Value {
        kind: Some(Kind::StructValue(structure(fields))),
    }
}

fn structure(fields: &[(&str, Value)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// What the gateway's configuration puts in `metadata_context` for an asserted principal.
fn asserted(subject: &str, attributes: &[(&str, &str)]) -> Struct {
    let attributes: Vec<(&str, Value)> = attributes
        .iter()
        .map(|(name, value)| (*name, string(value)))
        .collect();
    structure(&[(
        "principal",
        object(&[
            ("issuer", string("staff")),
            ("subject", string(subject)),
            ("attributes", object(&attributes)),
        ]),
    )])
}

fn ana() -> Struct {
    asserted("ana", &[("dept", "support")])
}

fn call(service: &str, tool: &str, context: Struct) -> McpRequest {
    McpRequest {
        service_name: service.to_owned(),
        method: "tools/call".to_owned(),
        metadata_context: Some(context),
        mcp_request: Some(structure(&[("name", string(tool)), ("arguments", object(&[]))])),
    }
}

/// `Ok(())` for a pass, the error otherwise.
async fn check(
    client: &mut ExtMcpClient<Channel>,
    request: McpRequest,
    token: &str,
) -> Result<(), AuthorizationError> {
    let result = client
        .check_request(with_token(request, token))
        .await
        .expect("an answer")
        .into_inner();
    match result.result {
        Some(mcp_request_result::Result::Pass(_)) => Ok(()),
        Some(mcp_request_result::Result::Error(error)) => Err(error),
        other => panic!("neither a pass nor an error: {other:?}"),
    }
}

fn text<'a>(object: &'a Struct, key: &str) -> &'a str {
    match object.fields.get(key).and_then(|value| value.kind.as_ref()) {
        Some(Kind::StringValue(text)) => text,
        other => panic!("`{key}` is not a string: {other:?}"),
    }
}

/// The decision id an error's JSON-RPC payload carries, with its reason code.
fn payload(error: &AuthorizationError) -> (String, String) {
    let mcp_error = error.mcp_error.as_ref().expect("a JSON-RPC error payload");
    let Some(Kind::StructValue(data)) = mcp_error.fields.get("data").and_then(|data| data.kind.clone())
    else {
        panic!("no `data` in {mcp_error:?}");
    };
    (
        text(&data, "decision_id").to_owned(),
        text(&data, "code").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_calls_are_decided_and_audited_through_ext_mcp() {
    let Some(world) = World::start().await else {
        return;
    };
    let mut client = world.client().await;

    // An allow: agentgateway names the backend and its own tool name.
    check(&mut client, call("helpdesk", "get_ticket", ana()), TRUSTED_TOKEN)
        .await
        .expect("Ana may read tickets");

    // A retry with the same request id is the first answer again, and consumes nothing.
    let mut keyed = ana();
    keyed.fields.insert("request_id".to_owned(), string("agw-1"));
    for _ in 0..2 {
        check(
            &mut client,
            call("helpdesk", "list_tickets", keyed.clone()),
            TRUSTED_TOKEN,
        )
        .await
        .expect("the retry is answered as the original was");
    }
    check(&mut client, call("helpdesk", "get_ticket", ana()), TRUSTED_TOKEN)
        .await
        .expect("the third call of the window");
    let exhausted = check(&mut client, call("helpdesk", "get_ticket", ana()), TRUSTED_TOKEN)
        .await
        .expect_err("the ceiling is reached");
    assert_eq!(exhausted.code(), authorization_error::Code::ResourceExhausted);
    assert!(
        exhausted.reason.contains("limit_exhausted at /grants/0"),
        "{}",
        exhausted.reason
    );
    let (exhausted_id, exhausted_code) = payload(&exhausted);
    assert_eq!(exhausted_code, "limit_exhausted");

    // A denial: Dee has no grant on tickets.
    let denied = check(
        &mut client,
        call("helpdesk", "get_ticket", asserted("dee", &[])),
        TRUSTED_TOKEN,
    )
    .await
    .expect_err("Dee may not read tickets");
    assert_eq!(denied.code(), authorization_error::Code::PermissionDenied);
    let (denied_id, denied_code) = payload(&denied);
    assert_eq!(denied_code, "no_grant_matches", "{}", denied.reason);

    // An unknown tool, and a caller's own API key (the static-key issuer `nightly`).
    let unknown = check(
        &mut client,
        call("helpdesk", "no_such_tool", ana()),
        TRUSTED_TOKEN,
    )
    .await
    .expect_err("not in the catalog");
    assert_eq!(payload(&unknown).1, "unknown_tool");
    let keyed_caller = structure(&[("api_key", string(NIGHTLY_KEY))]);
    check(
        &mut client,
        call("helpdesk", "get_ticket", keyed_caller),
        GATEWAY_TOKEN,
    )
    .await
    .expect("the nightly runner's own key, forwarded by a plain gateway");
    let wrong_key = structure(&[("api_key", string("not-the-key"))]);
    let unauthenticated = check(
        &mut client,
        call("helpdesk", "get_ticket", wrong_key),
        GATEWAY_TOKEN,
    )
    .await
    .expect_err("an unknown key");
    assert_eq!(payload(&unauthenticated).1, "credential_invalid");

    // Methods that execute nothing pass without a decision; any other is refused.
    for method in ["initialize", "ping", "tools/list", "notifications/initialized"] {
        let request = McpRequest {
            method: method.to_owned(),
            ..call("helpdesk", "ignored", ana())
        };
        check(&mut client, request, TRUSTED_TOKEN)
            .await
            .unwrap_or_else(|error| panic!("{method}: {error:?}"));
    }
    let other = McpRequest {
        method: "resources/read".to_owned(),
        ..call("helpdesk", "ignored", ana())
    };
    let refused = check(&mut client, other, TRUSTED_TOKEN)
        .await
        .expect_err("fail closed");
    assert_eq!(refused.code(), authorization_error::Code::PermissionDenied);
    let nameless = McpRequest {
        mcp_request: Some(structure(&[])),
        ..call("helpdesk", "ignored", ana())
    };
    let invalid = check(&mut client, nameless, TRUSTED_TOKEN)
        .await
        .expect_err("no tool name");
    assert_eq!(invalid.code(), authorization_error::Code::Invalid);

    // The audit trail: one record per decision, each through this door, and the retry's as a
    // replay.
    let audit = world.audit().await;
    let replays = audit
        .iter()
        .filter(|record| record.outcome == RecordOutcome::Replayed)
        .count();
    assert_eq!(replays, 1, "the retry is recorded as a replay");
    let decides: Vec<&AuditRecord> = audit
        .iter()
        .filter(|record| record.kind.as_str() == "decide" && record.outcome != RecordOutcome::Replayed)
        .collect();
    assert_eq!(decides.len(), 8, "one per decision, none for the passes");
    assert!(decides.iter().all(|record| record.door == Door::ExtMcp));
    let by_id = |id: &str| {
        decides
            .iter()
            .find(|record| record.decision_id == id)
            .unwrap_or_else(|| panic!("no record {id}"))
    };
    assert_eq!(
        by_id(&exhausted_id).code.map(|code| code.as_str()),
        Some("limit_exhausted")
    );
    assert_eq!(by_id(&denied_id).tool.as_deref(), Some("helpdesk__get_ticket"));
    assert!(decides
        .iter()
        .any(|record| record.principal_id.as_deref() == Some("nightly:nightly-runner")));
    let counter = world
        .store()
        .await
        .read_usage(CounterKey {
            principal_id: "staff:ana",
            capability: "tickets.issue.read",
        })
        .await
        .expect("read the counter")
        .expect("a counter");
    assert_eq!(counter.calls, CEILING, "the retry consumed nothing");

    // Counted as decisions of this door, once each (the replayed retry is no new decision).
    let (status, metrics) = http_get(metrics_addr(&world.serve), "/metrics").await;
    assert_eq!(status, 200);
    let counted = |outcome: &str, code: &str| {
        prometheus_value(
            &metrics,
            "capgate_decisions_total",
            &[("door", "ext_mcp"), ("outcome", outcome), ("code", code)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(counted("allow", "granted"), 4.0, "{metrics}");
    assert_eq!(counted("deny", "limit_exhausted"), 1.0);
    assert_eq!(counted("deny", "no_grant_matches"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_list_result_is_cut_to_what_the_caller_may_see() {
    let Some(world) = World::start().await else {
        return;
    };
    let mut client = world.client().await;
    let tool = |name: &str| object(&[("name", string(name)), ("description", string("…"))]);
    let result = structure(&[(
        "tools",
        Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![
                    tool("get_ticket"),
                    tool("comment_ticket"),
                    tool("delete_ticket"),
                    tool("list_tickets"),
                    string("not a tool"),
                ],
            })),
        },
    )]);
    let response = McpResponse {
        service_name: "helpdesk".to_owned(),
        method: "tools/list".to_owned(),
        metadata_context: Some(ana()),
        mcp_response: Some(result),
    };
    let answered = client
        .check_response(with_token(response.clone(), TRUSTED_TOKEN))
        .await
        .expect("an answer")
        .into_inner();
    let Some(mcp_response_result::Result::Mutated(cut)) = answered.result else {
        panic!("not a mutated result: {answered:?}");
    };
    let Some(Kind::ListValue(ListValue { values })) =
        cut.fields.get("tools").and_then(|tools| tools.kind.clone())
    else {
        panic!("no tools in {cut:?}");
    };
    let names: Vec<String> = values
        .iter()
        .map(|value| match &value.kind {
            Some(Kind::StructValue(tool)) => text(tool, "name").to_owned(),
            other => panic!("not a tool: {other:?}"),
        })
        .collect();
    // Ana (support, not senior) reads tickets; writing needs seniority; delete is unmapped.
    assert_eq!(names, ["get_ticket", "list_tickets"]);

    // Any other method's result passes; a plain gateway may not assert for the listing.
    let other = McpResponse {
        method: "tools/call".to_owned(),
        ..response.clone()
    };
    let passed = client
        .check_response(with_token(other, TRUSTED_TOKEN))
        .await
        .expect("an answer")
        .into_inner();
    assert!(matches!(
        passed.result,
        Some(mcp_response_result::Result::Pass(_))
    ));
    let refused = client
        .check_response(with_token(response, GATEWAY_TOKEN))
        .await
        .expect_err("a plain gateway may not assert");
    assert_eq!(refused.code(), Code::PermissionDenied);

    let audit = world.audit().await;
    let listings: Vec<&AuditRecord> = audit
        .iter()
        .filter(|record| record.kind.as_str() == "list")
        .collect();
    assert_eq!(listings.len(), 1, "the refused listing is not one");
    assert_eq!(listings[0].door, Door::ExtMcp);
    assert_eq!(listings[0].principal_id.as_deref(), Some("staff:ana"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field_and_untrusted_assertions_are_refused() {
    let Some(world) = World::start().await else {
        return;
    };
    let mut client = world.client().await;
    let cases = [
        (
            McpRequest {
                service_name: "h".repeat(600),
                ..call("helpdesk", "get_ticket", ana())
            },
            "service_name",
        ),
        (
            call(
                "helpdesk",
                "get_ticket",
                asserted("ana\u{0}x", &[("dept", "support")]),
            ),
            "metadata_context.principal.subject",
        ),
        (
            call(
                "helpdesk",
                "get_ticket",
                structure(&[("token", string(&"t".repeat(17 * 1024)))]),
            ),
            "metadata_context.token",
        ),
        (call("helpdesk", &"x".repeat(600), ana()), "mcp_request.name"),
    ];
    for (request, field) in cases {
        let status = client
            .check_request(with_token(request, TRUSTED_TOKEN))
            .await
            .expect_err("bad input");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().contains(field), "{field}: {}", status.message());
    }
    let status = client
        .check_request(with_token(call("helpdesk", "get_ticket", ana()), GATEWAY_TOKEN))
        .await
        .expect_err("a plain gateway may not assert");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("--asserting-gateway-token"),
        "{}",
        status.message()
    );
    let status = client
        .check_request(Request::new(call("helpdesk", "get_ticket", ana())))
        .await
        .expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(world.audit().await.is_empty(), "nothing was decided");
}
