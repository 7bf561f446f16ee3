//! The OpenID AuthZEN 1.0 door (issue 11): the real `capgate serve` binary with `--http-listen`,
//! called by a real HTTP/1.1 client (hyper-util's), over PostgreSQL when `DATABASE_URL` is set
//! (SQLite otherwise), the audit read back from the store. Every answer is compared with what
//! capgate's own `Decide` answers for the same question, so the door is shown to add nothing.

mod support;

use std::net::SocketAddr;

use capgate::store::{AuditFilter, AuditRecord, Door, PostgresStore, SqliteStore, Store, StoreOptions};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{decide_request, AssertedPrincipal, DecideRequest};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use support::client::{ana, dee, example_with_ceiling, principal, summary, CATALOG};
use support::doors::http_addr;
use support::oidc::{KeyType, OidcProvider, AUDIENCE};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;
use tonic::Request;

const GATEWAY_TOKEN: &str = "authzen-gateway-token-4e4e";
const TRUSTED_TOKEN: &str = "authzen-trusted-token-7a7a";
const STATIC_KEY: &str = "authzen-static-key-1b1b";
const ADMIN_TOKEN: &str = "authzen-admin-token-9c9c";

/// A server with `--http-listen`, a plain and an asserting gateway token, and its store.
struct World {
    serve: Serve,
    http: SocketAddr,
    store: Audit,
    client: Client<HttpConnector, Full<Bytes>>,
    _database: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

enum Audit {
    Postgres(PostgresStore),
    Sqlite(String),
}

impl World {
    /// `policy` (with the example catalog when `catalog`), or no policy at all.
    async fn start(policy: Option<(&str, bool)>, extra: &[&str]) -> World {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let database = TestDatabase::create().await;
        let url = match &database {
            Some(database) => database.url(),
            None => format!("sqlite://{}", dir.path().join("capgate.db").display()),
        };
        let mut args: Vec<String> = vec![
            "--database-url".into(),
            url.clone(),
            "--http-listen".into(),
            "127.0.0.1:0".into(),
            "--gateway-token".into(),
            "edge-gw=env://CAPGATE_TEST_GATEWAY_TOKEN".into(),
            "--asserting-gateway-token".into(),
            "trusted-gw=env://CAPGATE_TEST_TRUSTED_TOKEN".into(),
            "--admin-token".into(),
            "admin=env://CAPGATE_TEST_ADMIN_TOKEN".into(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
        ];
        if let Some((text, catalog)) = policy {
            let file = dir.path().join("policy.yaml");
            std::fs::write(&file, text).expect("write the policy");
            args.extend(["--policy".into(), file.display().to_string()]);
            if catalog {
                let file = dir.path().join("catalog.yaml");
                std::fs::write(&file, CATALOG).expect("write the catalog");
                args.extend(["--catalog".into(), file.display().to_string()]);
            }
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let serve = Serve::start_with_env(
            &args,
            &[
                ("CAPGATE_TEST_GATEWAY_TOKEN", GATEWAY_TOKEN),
                ("CAPGATE_TEST_TRUSTED_TOKEN", TRUSTED_TOKEN),
                ("CAPGATE_TEST_STATIC_KEY", STATIC_KEY),
                ("CAPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN),
            ],
        )
        .await;
        let http = http_addr(&serve);
        let store = match &database {
            Some(database) => Audit::Postgres(database.store().await),
            None => Audit::Sqlite(url),
        };
        World {
            serve,
            http,
            store,
            client: Client::builder(TokioExecutor::new()).build_http(),
            _database: database,
            _dir: dir,
        }
    }

    /// A request to the AuthZEN port: (status, headers, body as JSON, or `null`).
    async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (u16, hyper::HeaderMap, Value) {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.http));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .client
            .request(request.body(Full::new(Bytes::from(body))).expect("a request"))
            .await
            .expect("an HTTP answer");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.expect("a body").to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, body)
    }

    /// POST `body` as JSON with a gateway token.
    async fn post(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        let (status, _, body) = self.post_with(path, token, body, &[]).await;
        (status, body)
    }

    async fn post_with(
        &self,
        path: &str,
        token: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, hyper::HeaderMap, Value) {
        let authorization = format!("Bearer {token}");
        let mut all = vec![
            ("content-type", "application/json"),
            ("authorization", authorization.as_str()),
        ];
        all.extend_from_slice(headers);
        self.call("POST", path, &all, body.to_string().into_bytes()).await
    }

    async fn decide_grpc(&self, request: DecideRequest) -> capgate::wire::proto::DecideResponse {
        let mut client = DecisionServiceClient::new(self.serve.channel().await);
        let mut request = Request::new(request);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {TRUSTED_TOKEN}").parse().expect("ascii"),
        );
        client.decide(request).await.expect("a decision").into_inner()
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        let filter = AuditFilter {
            limit: 10_000,
            ..Default::default()
        };
        match &self.store {
            Audit::Postgres(store) => store.query_audit(&filter).await,
            Audit::Sqlite(url) => {
                SqliteStore::connect(url, &StoreOptions::default())
                    .await
                    .expect("open the database")
                    .query_audit(&filter)
                    .await
            }
        }
        .expect("read the audit trail")
    }

    async fn record(&self, decision_id: &str) -> AuditRecord {
        self.audit()
            .await
            .into_iter()
            .find(|record| record.decision_id == decision_id)
            .unwrap_or_else(|| panic!("no audit record {decision_id}"))
    }
}

/// An asserted AuthZEN subject from a proto principal (as the example's tests name them).
fn subject(who: &AssertedPrincipal) -> Value {
    let mut attributes = serde_json::Map::new();
    for attribute in &who.attributes {
        attributes.insert(attribute.name.clone(), json!(attribute.values));
    }
    json!({"type": "identity", "id": who.subject, "properties": {"issuer": who.issuer, "attributes": attributes}})
}

fn evaluation(subject: Value, kind: &str, id: &str) -> Value {
    json!({"subject": subject, "action": {"name": "tools/call"}, "resource": {"type": kind, "id": id}})
}

fn grpc_ask(who: &AssertedPrincipal, kind: &str, id: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Principal(who.clone())),
        target: Some(match kind {
            "tool" => decide_request::Target::Tool(id.to_owned()),
            _ => decide_request::Target::Capability(id.to_owned()),
        }),
        request_id: String::new(),
        arguments_json: None,
    }
}

const EVALUATION: &str = "/access/v1/evaluation";
const EVALUATIONS: &str = "/access/v1/evaluations";
const SEARCH_RESOURCE: &str = "/access/v1/search/resource";
const SEARCH_SUBJECT: &str = "/access/v1/search/subject";

/// Every reason code the example policy can give (usage_unknown needs a store outage: tests/outage.rs
/// covers it for the pipeline all doors share), each through AuthZEN and through `Decide`: the
/// same outcome and code, the door recorded, and the context carrying pointer, account, ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reason_code_is_the_same_as_decide() {
    let policy = example_with_ceiling(1);
    let world = World::start(Some((&policy, true)), &[]).await;
    let senior = principal("staff", "sam", &[("dept", &["support"]), ("level", &["senior"])]);
    let robot = principal("nightly", "nightly-runner", &[("role", &["batch"])]);
    let cases: Vec<(&str, AssertedPrincipal, &str, &str, bool, &str)> = vec![
        (
            "granted",
            dee(),
            "tool",
            "knowledge__search_pages",
            true,
            "granted",
        ),
        (
            "capped grant",
            ana(),
            "tool",
            "helpdesk__get_ticket",
            true,
            "granted",
        ),
        (
            "exhausted",
            ana(),
            "tool",
            "helpdesk__list_tickets",
            false,
            "limit_exhausted",
        ),
        (
            "no grant",
            dee(),
            "tool",
            "payments__issue_refund",
            false,
            "no_grant_matches",
        ),
        (
            "undeclared",
            dee(),
            "capability",
            "nothing.here.at-all",
            false,
            "capability_not_declared",
        ),
        (
            "by capability",
            senior.clone(),
            "capability",
            "tickets.issue.write",
            true,
            "granted",
        ),
        (
            "unknown tool",
            dee(),
            "tool",
            "helpdesk__delete_ticket",
            false,
            "unknown_tool",
        ),
    ];
    for (name, who, kind, id, permitted, code) in &cases {
        let (status, body) = world
            .post(EVALUATION, TRUSTED_TOKEN, &evaluation(subject(who), kind, id))
            .await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(body["decision"], json!(permitted), "{name}: {body}");
        assert_eq!(body["context"]["reason"]["code"], json!(code), "{name}: {body}");
        let decision_id = body["context"]["decision_id"].as_str().expect("a decision id");
        let record = world.record(decision_id).await;
        assert_eq!(record.door, Door::Authzen, "{name}");
        assert_eq!(record.gateway, "trusted-gw", "{name}");
        if *permitted {
            assert!(body["context"]["reason"]["pointer"]
                .as_str()
                .unwrap()
                .starts_with("/grants/"));
            assert_eq!(
                body["context"]["account"]["id"].as_str(),
                record.account_id.as_deref()
            );
        }
    }
    // The capped grant: its ceiling after the one call it allowed.
    let (_, capped) = world
        .post(
            EVALUATION,
            TRUSTED_TOKEN,
            &evaluation(subject(&robot), "tool", "helpdesk-legacy__fetch_case"),
        )
        .await;
    assert_eq!(capped["context"]["ceiling"]["calls"], json!(5000), "{capped}");
    assert_eq!(capped["context"]["ceiling"]["remaining"], json!(4999), "{capped}");
    assert!(capped["context"]["account"]["secret_ref"]
        .as_str()
        .unwrap()
        .starts_with("vault://"));

    // The same questions through `Decide` (the counters have moved on: the exhausted one stays so).
    for (name, who, kind, id, permitted, code) in cases.iter().filter(|case| case.0 != "capped grant") {
        let response = world.decide_grpc(grpc_ask(who, kind, id)).await;
        if *code == "unknown_tool" {
            assert!(matches!(
                response.result,
                Some(capgate::wire::proto::decide_response::Result::UnknownTool(_))
            ));
            continue;
        }
        let (outcome, reason, _, _) = summary(&response);
        assert_eq!(
            outcome == capgate::wire::proto::Outcome::Allow,
            *permitted,
            "{name}"
        );
        assert_eq!(support::client::recorded_code(reason), *code, "{name}");
    }
    let metrics = http_get(metrics_addr(&world.serve), "/metrics").await.1;
    let counted = |code: &str| {
        prometheus_value(
            &metrics,
            "capgate_decisions_total",
            &[("door", "authzen"), ("code", code)],
        )
    };
    assert_eq!(counted("limit_exhausted"), Some(1.0), "{metrics}");
    assert_eq!(counted("granted"), Some(4.0), "{metrics}");
    // Every evaluation's duration, by route and status: at least the decisions counted above.
    let timed = prometheus_value(
        &metrics,
        "capgate_http_duration_seconds_count",
        &[
            ("http_route", "POST /access/v1/evaluation"),
            ("http_response_status_code", "200"),
        ],
    );
    assert!(timed.is_some_and(|count| count >= 5.0), "{metrics}");
}

/// The caller's own credential in `subject.properties`: a token whose subject is `subject.id`
/// decides; one whose subject is someone else is `credential_invalid` (audited without the
/// subject); an expired one `credential_expired`; an API key authenticates its static-key
/// subject; a client certificate only from a gateway trusted to assert; an assertion likewise.
/// No token or key appears in any answer or log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_verified_and_must_be_the_subject() {
    let idp = OidcProvider::start().await;
    let policy = format!(
        r#"version: 1
capabilities:
  - id: docs.page.search
upstreams:
  - id: knowledge
    transport: {{ kind: mcp-http, url: "https://knowledge.example.net/mcp" }}
    tools:
      - {{ name: search, capability: docs.page.search }}
accounts:
  - id: docs-svc
    secret: {{ ref: "vault://secret/docs" }}
principals:
  issuers:
    - id: corp
      kind: oidc
      discovery: "{discovery}"
      audience: {AUDIENCE}
    - id: batch
      kind: static-key
      subject: nightly
      secret: {{ ref: "env://CAPGATE_TEST_STATIC_KEY" }}
    - id: edge
      kind: mtls
grants:
  - to: {{ issuer: corp }}
    capabilities: [docs.page.search]
    using: docs-svc
  - to: {{ issuer: batch }}
    capabilities: [docs.page.search]
    using: docs-svc
  - to: {{ issuer: edge }}
    capabilities: [docs.page.search]
    using: docs-svc
"#,
        discovery = idp.discovery_url()
    );
    let world = World::start(Some((&policy, false)), &[]).await;
    let kid = idp.kid(KeyType::Rsa);
    let token = idp.mint(&kid, &idp.claims("ana"));
    let with = |id: &str, properties: Value| {
        evaluation(
            json!({"type": "identity", "id": id, "properties": properties}),
            "tool",
            "knowledge__search",
        )
    };

    let (status, body) = world
        .post(EVALUATION, GATEWAY_TOKEN, &with("ana", json!({"token": token})))
        .await;
    assert_eq!((status, body["decision"].clone()), (200, json!(true)), "{body}");
    let record = world
        .record(body["context"]["decision_id"].as_str().unwrap())
        .await;
    assert_eq!(
        (record.issuer.as_deref(), record.subject.as_deref()),
        (Some("corp"), Some("ana"))
    );

    let (status, body) = world
        .post(EVALUATION, GATEWAY_TOKEN, &with("bob", json!({"token": token})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["decision"], json!(false));
    assert_eq!(
        body["context"]["reason"],
        json!({"code": "unauthenticated", "problem": "credential_invalid", "message": "the credential is not valid"})
    );
    let record = world
        .record(body["context"]["decision_id"].as_str().unwrap())
        .await;
    assert_eq!((record.subject.as_deref(), record.door), (None, Door::Authzen));

    let mut claims = idp.claims("ana");
    claims["exp"] = json!(1_000_000);
    claims["iat"] = json!(999_000);
    let expired = idp.mint(&kid, &claims);
    let (_, body) = world
        .post(EVALUATION, GATEWAY_TOKEN, &with("ana", json!({"token": expired})))
        .await;
    assert_eq!(
        body["context"]["reason"]["problem"],
        json!("credential_expired"),
        "{body}"
    );

    let (_, body) = world
        .post(
            EVALUATION,
            GATEWAY_TOKEN,
            &with("nightly", json!({"api_key": STATIC_KEY})),
        )
        .await;
    assert_eq!(body["decision"], json!(true), "{body}");
    let (_, body) = world
        .post(
            EVALUATION,
            GATEWAY_TOKEN,
            &with("nightly", json!({"api_key": "not-the-key"})),
        )
        .await;
    assert_eq!(
        body["context"]["reason"]["code"],
        json!("unauthenticated"),
        "{body}"
    );

    let certificate = with(
        "edge-1",
        json!({"client_certificate": "CN=edge-1,OU=payments", "issuer": "edge"}),
    );
    let (status, body) = world.post(EVALUATION, GATEWAY_TOKEN, &certificate).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["status"], json!(403));
    let (status, body) = world.post(EVALUATION, TRUSTED_TOKEN, &certificate).await;
    assert_eq!((status, body["decision"].clone()), (200, json!(true)), "{body}");

    let asserted = with("ana", json!({"issuer": "corp"}));
    let (status, body) = world.post(EVALUATION, GATEWAY_TOKEN, &asserted).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("may not assert"));
    let (_, body) = world.post(EVALUATION, TRUSTED_TOKEN, &asserted).await;
    assert_eq!(body["decision"], json!(true), "{body}");

    let logs = world.serve.logs();
    for secret in [
        token.as_str(),
        expired.as_str(),
        STATIC_KEY,
        GATEWAY_TOKEN,
        TRUSTED_TOKEN,
    ] {
        assert!(!logs.contains(secret), "a secret in the logs");
    }
    let audit = format!("{:?}", world.audit().await);
    assert!(!audit.contains(&token) && !audit.contains(STATIC_KEY));
}

/// What is not a request gets the spec's error, naming the field and quoting nothing: no token,
/// a wrong token, a wrong content type, an oversize body, a body nested too deep, a missing or
/// mistyped field, an action capgate does not decide, a batch too long. None is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_spec_errors() {
    let world = World::start(Some((&example_with_ceiling(10), true)), &[]).await;
    let good = evaluation(subject(&dee()), "tool", "knowledge__search_pages");

    let (status, headers, body) = world
        .call(
            "POST",
            EVALUATION,
            &[("content-type", "application/json")],
            good.to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
    assert_eq!(body["error"]["status"], json!(401));
    let (status, body) = world.post(EVALUATION, "wrong-token-abc", &good).await;
    assert_eq!(status, 401);
    assert!(!body.to_string().contains("wrong-token-abc"));

    let authorization = format!("Bearer {TRUSTED_TOKEN}");
    let (status, _, body) = world
        .call(
            "POST",
            EVALUATION,
            &[("authorization", &authorization), ("content-type", "text/plain")],
            good.to_string().into_bytes(),
        )
        .await;
    assert_eq!(
        (status, body["error"]["message"].as_str().unwrap()),
        (400, "`content-type`: must be `application/json`")
    );

    let mut huge = good.clone();
    huge["context"] = json!({"padding": "x".repeat(70 * 1024)});
    let (status, body) = world.post(EVALUATION, TRUSTED_TOKEN, &huge).await;
    assert_eq!(status, 413, "{body}");
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let (status, _, body) = world
        .call(
            "POST",
            EVALUATION,
            &[
                ("authorization", &authorization),
                ("content-type", "application/json"),
            ],
            deep.into_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nests more than"));

    let cases = [
        (
            json!({"action": {"name": "tools/call"}, "resource": {"type": "tool", "id": "x"}}),
            "`subject`: required",
        ),
        (
            evaluation(json!({"type": "user", "id": "dee"}), "tool", "x"),
            "`subject.type`: must be `identity`",
        ),
        (
            evaluation(subject(&dee()), "document", "x"),
            "`resource.type`: must be `tool` or `capability`",
        ),
        (
            json!({"subject": subject(&dee()), "action": {"name": "tools/list"}, "resource": {"type": "tool", "id": "x"}}),
            "`action.name`: capgate decides `tools/call` only",
        ),
        (
            evaluation(subject(&dee()), "tool", &"t".repeat(600)),
            "`resource.id`: 600 bytes, more than the limit of 512",
        ),
        (
            evaluation(
                json!({"type": "identity", "id": "dee", "properties": {"token": 42}}),
                "tool",
                "x",
            ),
            "`subject.properties.token`: must be a string",
        ),
    ];
    for (request, message) in cases {
        let (status, body) = world.post(EVALUATION, TRUSTED_TOKEN, &request).await;
        assert_eq!(
            (status, body["error"]["message"].as_str().unwrap()),
            (400, message),
            "{request}"
        );
    }
    let batch = json!({"subject": subject(&dee()), "action": {"name": "tools/call"},
        "evaluations": (0..65).map(|_| json!({"resource": {"type": "tool", "id": "knowledge__search_pages"}})).collect::<Vec<_>>()});
    let (status, body) = world.post(EVALUATIONS, TRUSTED_TOKEN, &batch).await;
    assert_eq!(
        (status, body["error"]["message"].as_str().unwrap()),
        (400, "`evaluations`: 65 items, more than the limit of 64")
    );
    let (status, _, body) = world.call("GET", "/access/v1/nothing", &[], Vec::new()).await;
    assert_eq!((status, body["error"]["status"].clone()), (404, json!(404)));
    assert!(world
        .audit()
        .await
        .iter()
        .all(|record| record.door != Door::Authzen));
}

/// A retry with the same `X-Request-ID` gets the first answer back (same decision id, no second
/// consumption, one record), and the id is echoed as the spec requires; a batch's items replay
/// one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_request_id_is_answered_once() {
    let world = World::start(Some((&example_with_ceiling(1), true)), &[]).await;
    let ask = evaluation(subject(&ana()), "tool", "helpdesk__get_ticket");
    let id = [("x-request-id", "retry-1")];
    let (status, headers, first) = world.post_with(EVALUATION, TRUSTED_TOKEN, &ask, &id).await;
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-request-id").unwrap(), "retry-1");
    assert_eq!(first["decision"], json!(true));
    let (_, _, again) = world.post_with(EVALUATION, TRUSTED_TOKEN, &ask, &id).await;
    assert_eq!(again, first);
    let (_, _, other) = world
        .post_with(EVALUATION, TRUSTED_TOKEN, &ask, &[("x-request-id", "retry-2")])
        .await;
    assert_eq!(
        other["context"]["reason"]["code"],
        json!("limit_exhausted"),
        "{other}"
    );
    let decision_id = first["context"]["decision_id"].as_str().unwrap();
    let records = world.audit().await;
    assert_eq!(
        records
            .iter()
            .filter(|record| record.decision_id == decision_id)
            .count(),
        1
    );
    let record = world.record(decision_id).await;
    assert_eq!(record.request_id.as_deref(), Some("retry-1"));

    let batch = json!({"subject": subject(&dee()), "action": {"name": "tools/call"}, "evaluations": [
        {"resource": {"type": "tool", "id": "knowledge__search_pages"}},
        {"resource": {"type": "tool", "id": "payments__issue_refund"}}]});
    let (_, _, first) = world
        .post_with(EVALUATIONS, TRUSTED_TOKEN, &batch, &[("x-request-id", "b")])
        .await;
    let (_, _, again) = world
        .post_with(EVALUATIONS, TRUSTED_TOKEN, &batch, &[("x-request-id", "b")])
        .await;
    assert_eq!(first, again);
    assert_eq!(first["evaluations"].as_array().unwrap().len(), 2);
}

/// `evaluations` with each `evaluations_semantic`: all items, up to the first deny, up to the
/// first permit; the defaults apply to items that lack a part; no `evaluations` is a single one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_follow_the_three_semantics() {
    let world = World::start(Some((&example_with_ceiling(10), true)), &[]).await;
    let batch = |semantic: Option<&str>| {
        let mut batch = json!({"subject": subject(&dee()), "action": {"name": "tools/call"}, "evaluations": [
            {"resource": {"type": "tool", "id": "knowledge__search_pages"}},
            {"resource": {"type": "tool", "id": "payments__issue_refund"}},
            {"resource": {"type": "tool", "id": "knowledge__semantic_search"}}]});
        if let Some(semantic) = semantic {
            batch["options"] = json!({"evaluations_semantic": semantic});
        }
        batch
    };
    let decisions = |body: &Value| -> Vec<bool> {
        body["evaluations"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(|item| item["decision"].as_bool().unwrap())
            .collect()
    };
    let (_, all) = world.post(EVALUATIONS, TRUSTED_TOKEN, &batch(None)).await;
    assert_eq!(decisions(&all), [true, false, true]);
    let (_, all) = world
        .post(EVALUATIONS, TRUSTED_TOKEN, &batch(Some("execute_all")))
        .await;
    assert_eq!(decisions(&all), [true, false, true]);
    let (_, and) = world
        .post(EVALUATIONS, TRUSTED_TOKEN, &batch(Some("deny_on_first_deny")))
        .await;
    assert_eq!(decisions(&and), [true, false]);
    let (_, or) = world
        .post(EVALUATIONS, TRUSTED_TOKEN, &batch(Some("permit_on_first_permit")))
        .await;
    assert_eq!(decisions(&or), [true]);
    let (status, body) = world.post(EVALUATIONS, TRUSTED_TOKEN, &batch(Some("any"))).await;
    assert_eq!(status, 400, "{body}");
    let (_, single) = world
        .post(
            EVALUATIONS,
            TRUSTED_TOKEN,
            &evaluation(subject(&dee()), "tool", "knowledge__search_pages"),
        )
        .await;
    assert_eq!(single["decision"], json!(true), "{single}");
    // One record per decided item: 3 + 3 + 2 + 1 + 1.
    let recorded = world
        .audit()
        .await
        .iter()
        .filter(|record| record.door == Door::Authzen)
        .count();
    assert_eq!(recorded, 10);
}

/// A resource search is the listing: the tools (or capabilities) the subject may call, as
/// `ListVisible` shows them, in one page, with one audit record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_search_lists_what_the_subject_may_call() {
    let world = World::start(Some((&example_with_ceiling(10), true)), &[]).await;
    let search = |kind: &str| json!({"subject": subject(&dee()), "action": {"name": "tools/call"}, "resource": {"type": kind}});
    let (status, tools) = world.post(SEARCH_RESOURCE, TRUSTED_TOKEN, &search("tool")).await;
    assert_eq!(status, 200, "{tools}");
    let ids: Vec<&str> = tools["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["knowledge__search_pages", "knowledge__semantic_search"]);
    assert_eq!(tools["page"], json!({"next_token": "", "count": 2, "total": 2}));
    let (_, capabilities) = world
        .post(SEARCH_RESOURCE, TRUSTED_TOKEN, &search("capability"))
        .await;
    assert_eq!(
        capabilities["results"],
        json!([{"type": "capability", "id": "docs.page.search"}])
    );
    let record = world
        .record(tools["context"]["decision_id"].as_str().unwrap())
        .await;
    assert_eq!((record.door, record.visible_count), (Door::Authzen, Some(1)));
    let (status, _, ready) = world.call("GET", "/readyz", &[], Vec::new()).await;
    assert_eq!((status, ready["status"].clone()), (200, json!("ready")));
}

/// A subject search is `who-can`: the static-key identities a decision would let through, and
/// every grant's condition, for the admin only; no audit record (no caller was decided for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_search_says_who_can_call_a_tool() {
    let policy =
        example_with_ceiling(10).replace("env://NIGHTLY_RUNNER_KEY", "env://CAPGATE_TEST_STATIC_KEY");
    let world = World::start(Some((&policy, true)), &[]).await;
    let search = |kind: &str, id: &str, properties: Value| {
        json!({"subject": {"type": "identity", "properties": properties},
               "action": {"name": "tools/call"}, "resource": {"type": kind, "id": id}})
    };
    let world = &world;
    let ask = |body: Value| async move { world.post(SEARCH_SUBJECT, ADMIN_TOKEN, &body).await };

    let (status, found) = ask(search("tool", "helpdesk__get_ticket", json!({}))).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(
        found["results"],
        json!([{"type": "identity", "id": "nightly-runner",
                "properties": {"issuer": "nightly", "pointer": "/grants/5", "account": {"id": "helpdesk-reader"}}}])
    );
    assert_eq!(found["context"]["capability"], "tickets.issue.read");
    assert_eq!(
        found["context"]["conditions"],
        json!([
            {"pointer": "/grants/0", "issuer": "staff", "attributes": {"dept": "support"},
             "account": {"id": "helpdesk-reader"}, "ceiling": {"calls": 10, "per": "1h", "window_ms": 3_600_000}},
            {"pointer": "/grants/5", "issuer": "nightly", "attributes": {"role": "batch"},
             "account": {"id": "helpdesk-reader"}, "ceiling": {"calls": 5000, "per": "1d", "window_ms": 86_400_000}},
        ])
    );
    assert_eq!(found["page"], json!({"next_token": "", "count": 1, "total": 1}));

    // Narrowed to one issuer; a capability asked for directly; a disabled account lets nobody through.
    let (_, staff) = ask(search(
        "capability",
        "tickets.issue.read",
        json!({"issuer": "staff"}),
    ))
    .await;
    assert_eq!(staff["results"], json!([]));
    let pointers: Vec<&Value> = staff["context"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|condition| &condition["pointer"])
        .collect();
    assert_eq!(pointers, [&json!("/grants/0")]);
    let (_, disabled) = ask(search("tool", "releases__approve_release", json!({}))).await;
    assert_eq!(
        (
            disabled["results"].clone(),
            disabled["context"]["conditions"].clone()
        ),
        (json!([]), json!([]))
    );

    // Nobody, and why.
    let (_, unknown) = ask(search("tool", "helpdesk__nope", json!({}))).await;
    assert_eq!(unknown["context"]["reason"], json!({"code": "unknown_tool"}));
    let (_, undeclared) = ask(search("capability", "nope.nope.nope", json!({}))).await;
    assert_eq!(undeclared["context"]["reason"]["code"], "capability_not_declared");

    // The policy's map is the admin's to read; a malformed search is a 400 naming the field.
    let (status, body) = world
        .post(
            SEARCH_SUBJECT,
            TRUSTED_TOKEN,
            &search("tool", "helpdesk__get_ticket", json!({})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let mut wrong = search("tool", "helpdesk__get_ticket", json!({}));
    wrong["subject"]["type"] = json!("user");
    let (status, body) = ask(wrong).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subject.type"),
        "{body}"
    );
    assert!(world.audit().await.is_empty());
}

/// `/healthz` answers at once, `/readyz` is 503 until a version is active, and the metadata
/// names the endpoints under the address the PEP used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metadata() {
    let world = World::start(None, &[]).await;
    let (status, _, _) = world.call("GET", "/healthz", &[], Vec::new()).await;
    assert_eq!(status, 200);
    let (status, _, body) = world.call("GET", "/readyz", &[], Vec::new()).await;
    assert_eq!(status, 503, "{body}");
    let (status, body) = world
        .post(
            EVALUATION,
            TRUSTED_TOKEN,
            &evaluation(subject(&dee()), "tool", "x"),
        )
        .await;
    assert_eq!((status, body["error"]["status"].clone()), (503, json!(503)));
    let (status, _, metadata) = world
        .call("GET", "/.well-known/authzen-configuration", &[], Vec::new())
        .await;
    assert_eq!(status, 200);
    let base = format!("http://{}", world.http);
    assert_eq!(metadata["policy_decision_point"], json!(base));
    assert_eq!(
        metadata["access_evaluation_endpoint"],
        json!(format!("{base}/access/v1/evaluation"))
    );
    assert_eq!(
        metadata["search_resource_endpoint"],
        json!(format!("{base}/access/v1/search/resource"))
    );
    assert_eq!(
        metadata["search_subject_endpoint"],
        json!(format!("{base}/access/v1/search/subject"))
    );
}

/// Without tokens the AuthZEN port, like the gRPC one, listens on loopback only.
#[test]
fn an_open_port_off_loopback_is_refused() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args([
            "serve",
            "--database-url",
            "sqlite::memory:",
            "--http-listen",
            "0.0.0.0:0",
        ])
        .output()
        .expect("run capgate serve");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on `0.0.0.0:0` without tokens"),
        "{stderr}"
    );
}

/// Writes `request` to the AuthZEN port on a connection of its own and reads the answer to the
/// end: (status, content-type, the body as JSON, the whole answer as text).
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> (u16, String, Value, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before it has read everything: a reset then is fine.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => answer.extend_from_slice(&chunk[..read]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the answer did not end");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, content_type, body, text)
}

/// Issue 28: every answer of the port that is not a decision carries the door's JSON error body,
/// those hyper writes itself for a head it cannot parse too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_before_the_router_carry_the_json_error_body() {
    let world = World::start(Some((&example_with_ceiling(10), true)), &[]).await;

    // The router's: a route asked with a method it does not serve.
    let (status, headers, body) = world.call("GET", EVALUATION, &[], Vec::new()).await;
    assert_eq!(status, 405, "{body}");
    assert_eq!(headers.get("content-type").unwrap(), "application/json");
    assert_eq!(headers.get("allow").unwrap(), "POST");
    assert_eq!(body["error"]["status"], json!(405));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("`GET` is not served at `/access/v1/evaluation`"),
        "{body}"
    );

    let long_target = format!("GET /{} HTTP/1.1\r\nhost: pdp\r\n\r\n", "a".repeat(70 * 1024));
    let many_fields = format!(
        "GET /healthz HTTP/1.1\r\nhost: pdp\r\n{}\r\n",
        (0..101)
            .map(|index| format!("x-field-{index}: v\r\n"))
            .collect::<String>()
    );
    let large_head = format!(
        "GET /healthz HTTP/1.1\r\nhost: pdp\r\n{}\r\n",
        (0..40)
            .map(|index| format!("x-field-{index}: {}\r\n", "v".repeat(4000)))
            .collect::<String>()
    );
    for (request, status, words) in [
        (
            "GET / HTTP/1.1\r\nbad header\r\n\r\n".to_owned(),
            400,
            "not HTTP/1.1",
        ),
        ("\x01\x02 nonsense\r\n\r\n".to_owned(), 400, "not HTTP/1.1"),
        (long_target, 414, "longer than 65534 bytes"),
        (many_fields, 431, "at most 100 header fields and 128 KiB"),
        (large_head, 431, "at most 100 header fields and 128 KiB"),
    ] {
        let (seen, content_type, body, text) = raw_exchange(world.http, request.as_bytes()).await;
        assert_eq!(seen, status, "{text}");
        assert_eq!(content_type, "application/json", "{text}");
        assert_eq!(body["error"]["status"], json!(status), "{text}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(words),
            "{text}"
        );
    }

    // After answers of the router on a kept-alive connection, hyper's answer still gets its body.
    let after = "GET /healthz HTTP/1.1\r\nhost: pdp\r\n\r\nHEAD /healthz HTTP/1.1\r\nhost: pdp\r\n\r\n\
                 GET /nowhere HTTP/1.1\r\nhost: pdp\r\n\r\nGET / HTTP/1.1\r\nbad header\r\n\r\n";
    let (_, _, _, text) = raw_exchange(world.http, after.as_bytes()).await;
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    assert!(text.contains("HTTP/1.1 404 Not Found"), "{text}");
    let (_, last) = text.rsplit_once("HTTP/1.1 ").expect("answers");
    assert!(last.starts_with("400 Bad Request"), "{text}");
    assert!(
        last.ends_with(r#"{"error":{"status":400,"message":"the request is not HTTP/1.1: its request line or a header field is malformed"}}"#),
        "{text}"
    );
}

/// Issue 28: the metadata's URLs come from `--http-public-url`, else from the address the
/// connection reached; never from the client's `Host` header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_is_under_the_public_url_never_the_clients_host() {
    let metadata = "/.well-known/authzen-configuration";
    let world = World::start(None, &[]).await;
    let (status, _, body) = world
        .call("GET", metadata, &[("host", "attacker.example")], Vec::new())
        .await;
    assert_eq!(status, 200, "{body}");
    let base = format!("http://{}", world.http);
    assert_eq!(body["policy_decision_point"], json!(base));
    assert_eq!(
        body["access_evaluation_endpoint"],
        json!(format!("{base}/access/v1/evaluation"))
    );
    assert!(!body.to_string().contains("attacker"), "{body}");
    // No `Host` at all (HTTP/1.0): the same.
    let (status, _, body, text) =
        raw_exchange(world.http, format!("GET {metadata} HTTP/1.0\r\n\r\n").as_bytes()).await;
    assert_eq!(
        (status, body["policy_decision_point"].clone()),
        (200, json!(base)),
        "{text}"
    );

    let world = World::start(None, &["--http-public-url", "https://pdp.example.net/authz/"]).await;
    let (status, _, body) = world
        .call("GET", metadata, &[("host", "attacker.example")], Vec::new())
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["policy_decision_point"],
        json!("https://pdp.example.net/authz")
    );
    assert_eq!(
        body["search_subject_endpoint"],
        json!("https://pdp.example.net/authz/access/v1/search/subject")
    );
}

/// A public URL that is not one stops the start, naming the flag.
#[test]
fn a_public_url_that_is_not_one_is_refused() {
    for (url, words) in [
        ("pdp.example.net", "must start with `https://` or `http://`"),
        ("https://", "must name a host"),
        (
            "https://user@pdp.example.net",
            "must hold no user, query, fragment or whitespace",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_capgate"))
            .args([
                "serve",
                "--database-url",
                "sqlite::memory:",
                "--http-listen",
                "127.0.0.1:0",
                "--http-public-url",
                url,
            ])
            .output()
            .expect("run capgate serve");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            stderr.contains(&format!("`--http-public-url {url}`: {words}")),
            "{url}: {stderr}"
        );
    }
}

/// The call's arguments come in `resource.properties.arguments`, else `context.arguments`: a
/// grant's conditions read them, their absence denies `arguments_missing`, and an `arguments`
/// that is not an object is a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arguments_come_in_the_resource_or_the_context() {
    use support::doors::{
        refund, Conditional, AMOUNT_CONDITION, CURRENCY_CONDITION, DESK_KEY, REFUND, RELEASE,
    };
    let Some(world) = Conditional::start().await else {
        return;
    };
    let desk = json!({"type": "identity", "id": "support-desk", "properties": {"api_key": DESK_KEY}});
    let ask = |resource_arguments: Option<Value>, context_arguments: Option<Value>| {
        let mut body = evaluation(desk.clone(), "tool", REFUND);
        if let Some(arguments) = resource_arguments {
            body["resource"]["properties"] = json!({"arguments": arguments});
        }
        if let Some(arguments) = context_arguments {
            body["context"] = json!({"arguments": arguments});
        }
        body
    };
    let reason = |answer: &Value| {
        (
            answer["decision"].clone(),
            answer["context"]["reason"]["code"].clone(),
            answer["context"]["reason"]["pointer"].clone(),
        )
    };
    let cases = [
        // (resource's, context's, decision, code, pointer)
        (Some(refund(99.0, "EUR")), None, true, "granted", "/grants/0"),
        (None, Some(refund(99.0, "EUR")), true, "granted", "/grants/0"),
        (
            Some(refund(101.0, "EUR")),
            None,
            false,
            "condition_failed",
            AMOUNT_CONDITION,
        ),
        (
            None,
            Some(refund(1.0, "JPY")),
            false,
            "condition_failed",
            CURRENCY_CONDITION,
        ),
        // The resource's are preferred, whichever way the context's would go.
        (
            Some(refund(1.0, "USD")),
            Some(refund(1000.0, "USD")),
            true,
            "granted",
            "/grants/0",
        ),
        (
            Some(refund(1000.0, "USD")),
            Some(refund(1.0, "USD")),
            false,
            "condition_failed",
            AMOUNT_CONDITION,
        ),
        (None, None, false, "arguments_missing", AMOUNT_CONDITION),
        (
            Some(json!({})),
            None,
            false,
            "arguments_missing",
            AMOUNT_CONDITION,
        ),
    ];
    for (resource_arguments, context_arguments, decision, code, pointer) in cases {
        let body = ask(resource_arguments, context_arguments);
        let (status, answer) = world.doors.post(EVALUATION, &body, &[]).await;
        assert_eq!(status, 200, "{body}: {answer}");
        assert_eq!(
            reason(&answer),
            (json!(decision), json!(code), json!(pointer)),
            "{body}: {answer}"
        );
        let decision_id = answer["context"]["decision_id"].as_str().expect("a decision id");
        let record = world.record(decision_id).await;
        assert_eq!(record.code.map(|code| code.as_str()), Some(code));
        assert_eq!(record.path.as_deref(), Some(pointer));
    }

    // A grant whose only condition is on the instant needs no arguments.
    let (status, answer) = world
        .doors
        .post(EVALUATION, &evaluation(desk.clone(), "tool", RELEASE), &[])
        .await;
    assert_eq!(
        (status, answer["decision"].clone()),
        (200, json!(true)),
        "{answer}"
    );

    // Not an object: a 400 naming the field, as every malformed request.
    for (body, field) in [
        (
            ask(Some(json!([99, "EUR"])), None),
            "`resource.properties.arguments`",
        ),
        (ask(None, Some(json!("amount=99"))), "`context.arguments`"),
        (
            ask(Some(refund(1.0, "EUR")), Some(json!(null))),
            "`context.arguments`",
        ),
    ] {
        let (status, answer) = world.doors.post(EVALUATION, &body, &[]).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["status"], json!(400), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{field}: {answer}");
    }

    // A batch: an item's own arguments, else the top level's context; a bad one is named by
    // its index, and refuses the whole batch before anything is decided.
    let batch = json!({"subject": desk, "action": {"name": "tools/call"},
    "context": {"arguments": refund(5.0, "EUR")},
    "evaluations": [
        {"resource": {"type": "tool", "id": REFUND}},
        {"resource": {"type": "tool", "id": REFUND, "properties": {"arguments": refund(500.0, "EUR")}}},
        {"resource": {"type": "tool", "id": REFUND}, "context": {"arguments": refund(5.0, "GBP")}},
        {"resource": {"type": "tool", "id": REFUND}, "context": {}},
    ]});
    let (status, answer) = world.doors.post(EVALUATIONS, &batch, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let seen: Vec<(Value, Value, Value)> = answer["evaluations"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(reason)
        .collect();
    assert_eq!(
        seen,
        [
            (json!(true), json!("granted"), json!("/grants/0")),
            (json!(false), json!("condition_failed"), json!(AMOUNT_CONDITION)),
            (json!(false), json!("condition_failed"), json!(CURRENCY_CONDITION)),
            (json!(false), json!("arguments_missing"), json!(AMOUNT_CONDITION)),
        ],
        "{answer}"
    );
    let mut bad = batch.clone();
    bad["evaluations"][1]["resource"]["properties"]["arguments"] = json!(7);
    let (status, answer) = world.doors.post(EVALUATIONS, &bad, &[]).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("`evaluations[1].resource.properties.arguments`")),
        "{answer}"
    );
}
