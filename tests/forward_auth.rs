//! The forward-auth door (issue 27) through the real binary: the bodyless subrequest nginx,
//! Caddy, Traefik and HAProxy send, answered with a status each proxy acts on — 200 with the
//! headers to copy upstream, 401 + `WWW-Authenticate`, 403, 429 + `Retry-After`, 503 — each
//! denial with a JSON-RPC error body; the method policy; the server from the path or a header;
//! bad input refused naming the header; every decision audited with `door = forward_auth` and
//! counted with its door. The proxies themselves drive it in gateways/peers.
//!
//! Needs `DATABASE_URL` (skipped without it, unless `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::time::Duration;

use capgate::store::{AuditFilter, AuditRecord, Door, RecordOutcome, Store};
use serde_json::Value;
use support::client::wait_serving;
use support::doors::Doors;
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;

const PLAIN_TOKEN: &str = "fa-plain-token-1c1c";
const ASSERTING_TOKEN: &str = "fa-tls-terminator-2d2d";
const ALPHA_KEY: &str = "fa-alpha-key-3e3e";

/// `alpha` (a static key) reads notes under a ceiling of one call per hour and searches them
/// without one; nobody writes; `mesh` callers in unit `ops` (client certificates) search.
const POLICY: &str = r#"
version: 1
capabilities:
  - id: notes.read
  - id: notes.search
  - id: notes.write
upstreams:
  - id: notes
    transport: { kind: mcp-http, url: "https://notes.example.net/mcp" }
    tools:
      - { name: read_note, capability: notes.read }
      - { name: search_notes, capability: notes.search }
      - { name: write_note, capability: notes.write }
accounts:
  - id: notes-reader
    secret: { ref: "env://NOTES_READER_TOKEN" }
principals:
  issuers:
    - id: alpha
      kind: static-key
      subject: alpha
      secret: { ref: "env://FA_ALPHA_KEY" }
    - id: mesh
      kind: mtls
      attributes:
        unit: dn:OU
grants:
  - to: { issuer: alpha }
    capabilities: [notes.read]
    using: notes-reader
    limits: { calls: 1, per: 1h }
  - to: { issuer: alpha }
    capabilities: [notes.search]
    using: notes-reader
  - to: { issuer: mesh, attributes: { unit: ops } }
    capabilities: [notes.search]
    using: notes-reader
"#;

struct World {
    serve: Serve,
    database: TestDatabase,
    plain: Doors,
    asserting: Doors,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start() -> Option<World> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, POLICY).expect("write the policy");
        let serve = Serve::start_with_env(
            &[
                "--database-url",
                &database.url(),
                "--policy",
                policy.to_str().expect("utf-8"),
                "--http-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--gateway-token",
                "nginx=env://FA_PLAIN_TOKEN",
                "--asserting-gateway-token",
                "terminator=env://FA_ASSERTING_TOKEN",
            ],
            &[
                ("FA_PLAIN_TOKEN", PLAIN_TOKEN),
                ("FA_ASSERTING_TOKEN", ASSERTING_TOKEN),
                ("FA_ALPHA_KEY", ALPHA_KEY),
            ],
        )
        .await;
        wait_serving(&serve.channel().await, Duration::from_secs(10)).await;
        let plain = Doors::connect(&serve, PLAIN_TOKEN).await;
        let asserting = Doors::connect(&serve, ASSERTING_TOKEN).await;
        Some(World {
            serve,
            database,
            plain,
            asserting,
            _dir: dir,
        })
    }

    async fn audit(&self) -> Vec<AuditRecord> {
        self.database
            .store()
            .await
            .query_audit(&AuditFilter {
                limit: 1_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail")
    }
}

/// One answer as a proxy and its client see it.
#[derive(Debug)]
struct Seen {
    status: u16,
    headers: hyper::HeaderMap,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The JSON-RPC error's `data.code`.
    fn code(&self) -> &str {
        self.body["error"]["data"]["code"].as_str().unwrap_or_default()
    }
}

async fn ask(doors: &Doors, path: &str, headers: &[(&str, &str)]) -> Seen {
    let (status, headers, body) = doors.forward_auth(path, headers).await;
    Seen {
        status,
        headers,
        body,
    }
}

fn call<'a>(tool: &'a str, key: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
        ("x-api-key", key),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_is_a_status_a_proxy_acts_on_with_a_json_rpc_error_for_the_client() {
    let Some(world) = World::start().await else {
        return;
    };
    let doors = &world.plain;

    // An allow: 200 and the headers a proxy copies upstream, the ceiling's for the client.
    let allowed = ask(doors, "/forward-auth", &call("notes__read_note", ALPHA_KEY)).await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(allowed.header("x-capgate-account"), Some("notes-reader"));
    let decision_id = allowed
        .header("x-capgate-decision-id")
        .expect("a decision id")
        .to_owned();
    assert_eq!(allowed.header("ratelimit-policy"), Some("\"capgate\";q=1;w=3600"));
    assert!(
        allowed
            .header("ratelimit")
            .is_some_and(|value| value.starts_with("\"capgate\";r=0;")),
        "{allowed:?}"
    );
    assert!(allowed.body.is_null(), "an allow has no body: {allowed:?}");

    // The ceiling: 429 with `Retry-After`.
    let exhausted = ask(doors, "/forward-auth", &call("notes__read_note", ALPHA_KEY)).await;
    assert_eq!(
        (exhausted.status, exhausted.code()),
        (429, "limit_exhausted"),
        "{exhausted:?}"
    );
    let retry_after: u64 = exhausted
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .expect("a Retry-After");
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(exhausted.body["error"]["code"], -32001);
    assert_eq!(exhausted.header("content-type"), Some("application/json"));

    // No grant: 403, the reason and where to change it.
    let denied = ask(doors, "/forward-auth", &call("notes__write_note", ALPHA_KEY)).await;
    assert_eq!(
        (denied.status, denied.code()),
        (403, "no_grant_matches"),
        "{denied:?}"
    );
    assert!(denied.body["error"]["data"]["pointer"].is_string(), "{denied:?}");

    // Not authenticated: 401 with the challenge, and no key is no better.
    let bad_key = ask(doors, "/forward-auth", &call("notes__read_note", "not-the-key")).await;
    assert_eq!(
        (bad_key.status, bad_key.code()),
        (401, "credential_invalid"),
        "{bad_key:?}"
    );
    assert!(
        bad_key
            .header("www-authenticate")
            .is_some_and(|value| value.starts_with("Bearer error=")),
        "{bad_key:?}"
    );
    let no_key = ask(
        doors,
        "/forward-auth",
        &[("mcp-method", "tools/call"), ("mcp-name", "notes__read_note")],
    )
    .await;
    assert_eq!(
        (no_key.status, no_key.code()),
        (401, "credential_missing"),
        "{no_key:?}"
    );
    assert_eq!(no_key.header("www-authenticate"), Some("Bearer"));

    // An unknown tool: MCP's own code.
    let unknown = ask(doors, "/forward-auth", &call("notes__drop_notes", ALPHA_KEY)).await;
    assert_eq!(
        (unknown.status, unknown.body["error"]["code"].as_i64()),
        (403, Some(-32602))
    );

    // The server from the path, or from its header, for a tool named without its prefix.
    let by_path = ask(doors, "/forward-auth/notes", &call("search_notes", ALPHA_KEY)).await;
    assert_eq!(by_path.status, 200, "{by_path:?}");
    let mut by_header = call("search_notes", ALPHA_KEY);
    by_header.push(("x-mcp-servername", "mcp/notes"));
    assert_eq!(ask(doors, "/forward-auth", &by_header).await.status, 200);

    // A client certificate is a TLS terminator's to forward: an asserting gateway's.
    let certificate = [
        ("mcp-method", "tools/call"),
        ("mcp-name", "notes__search_notes"),
        ("x-ssl-client-cert", "CN%3Dsvc-ops%2COU%3Dops%2CO%3DAcme"),
    ];
    let refused = ask(doors, "/forward-auth", &certificate).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("--asserting-gateway-token")),
        "{refused:?}"
    );
    let forwarded = ask(&world.asserting, "/forward-auth", &certificate).await;
    assert_eq!(forwarded.status, 200, "{forwarded:?}");

    // The trail: each decision through this door; the allow's id is the one the proxy copied.
    let audit = world.audit().await;
    assert!(
        audit.iter().all(|record| record.door == Door::ForwardAuth),
        "{audit:#?}"
    );
    let first = audit
        .iter()
        .find(|record| record.decision_id == decision_id)
        .expect("the allow's record");
    assert_eq!(
        (first.outcome, first.principal_id.as_deref()),
        (RecordOutcome::Allow, Some("alpha:alpha"))
    );
    assert_eq!(audit.len(), 9, "{audit:#?}");

    // Counted with their door, denials included.
    let (_, metrics) = http_get(metrics_addr(&world.serve), "/metrics").await;
    let counted = |outcome: &str, code: &str| {
        prometheus_value(
            &metrics,
            "capgate_decisions_total",
            &[("door", "forward_auth"), ("outcome", outcome), ("code", code)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(counted("allow", "granted"), 4.0, "{metrics}");
    assert_eq!(counted("deny", "limit_exhausted"), 1.0, "{metrics}");
    assert_eq!(counted("deny", "no_grant_matches"), 1.0, "{metrics}");
    assert!(!world.serve.logs().contains(ALPHA_KEY), "a key in the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_fail_closed_and_bad_subrequests_are_refused_naming_the_header() {
    let Some(world) = World::start().await else {
        return;
    };
    let doors = &world.plain;
    // What executes nothing passes without a decision: the session's methods, a `GET` stream, a
    // `DELETE` ending the session (as the proxy says the original method was).
    for headers in [
        vec![("mcp-method", "initialize")],
        vec![("mcp-method", "server/discover")],
        vec![("mcp-method", "tools/list")],
        vec![("mcp-method", "notifications/initialized")],
        vec![("x-forwarded-method", "DELETE")],
        vec![("x-original-method", "GET")],
        vec![("x-forwarded-method", "GET"), ("x-original-method", "get")],
    ] {
        let seen = ask(doors, "/forward-auth", &headers).await;
        assert_eq!(seen.status, 200, "{headers:?}: {seen:?}");
        assert!(
            seen.header("x-capgate-decision-id").is_none(),
            "nothing decided: {seen:?}"
        );
    }
    // Anything else fails closed: another method, a `POST` that does not say its method (an
    // older client's, whose body the subrequest does not carry), a call without its tool.
    for (headers, status, words) in [
        (
            vec![("mcp-method", "resources/read")],
            403,
            "--ext-authz-allow-method",
        ),
        (vec![("x-original-method", "POST")], 403, "Mcp-Method"),
        // The proxy says `POST` in one header; the client's own says `GET` in the other: one
        // method that carries a call is enough for the request to be decided as one.
        (
            vec![("x-forwarded-method", "GET"), ("x-original-method", "POST")],
            403,
            "Mcp-Method",
        ),
        (
            vec![("x-forwarded-method", "POST"), ("x-original-method", "get")],
            403,
            "Mcp-Method",
        ),
        // A proxy that does not say what the original request was.
        (vec![], 403, "Mcp-Method"),
        (vec![("mcp-method", "tools/call")], 400, "mcp-name"),
        (
            vec![("mcp-method", "tools/call"), ("mcp-name", &"x".repeat(600))],
            400,
            "mcp-name",
        ),
    ] {
        let seen = ask(doors, "/forward-auth", &headers).await;
        let message = seen.body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(seen.status, status, "{headers:?}: {seen:?}");
        assert!(message.contains(words), "{headers:?}: {message}");
    }
    // A header that is not UTF-8, sent raw.
    let mut stream = tokio::net::TcpStream::connect(doors.http).await.expect("connect");
    let mut bytes = format!(
        "GET /forward-auth HTTP/1.1\r\nHost: capgate\r\nx-capgate-gateway-token: {PLAIN_TOKEN}\r\n\
         mcp-method: tools/call\r\nmcp-name: notes__"
    )
    .into_bytes();
    bytes.push(0xff);
    bytes.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut stream, &bytes)
        .await
        .expect("send");
    let mut answer = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer)
        .await
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not UTF-8"), "{answer}");

    // The proxy's own token: a proxy that did not authenticate learns nothing else.
    let (status, _, body) = Doors::connect(&world.serve, "not-a-token")
        .await
        .forward_auth("/forward-auth", &call("notes__read_note", ALPHA_KEY))
        .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("proxy")),
        "{body}"
    );
    assert!(world.audit().await.is_empty(), "nothing was decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_cannot_be_read_is_503_usage_unknown() {
    let Some(world) = World::start().await else {
        return;
    };
    let admin = sqlx::PgPool::connect(&world.database.url())
        .await
        .expect("connect");
    sqlx::query("DROP TABLE usage_counters")
        .execute(&admin)
        .await
        .expect("drop the counters");
    admin.close().await;
    let unknown = ask(
        &world.plain,
        "/forward-auth",
        &call("notes__read_note", ALPHA_KEY),
    )
    .await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (503, "usage_unknown"),
        "{unknown:?}"
    );
    assert_eq!(unknown.header("retry-after"), Some("1"));
    // An uncapped call does not need the counters.
    let uncapped = ask(
        &world.plain,
        "/forward-auth",
        &call("notes__search_notes", ALPHA_KEY),
    )
    .await;
    assert_eq!(uncapped.status, 200, "{uncapped:?}");
}

/// A subrequest carries no arguments: a grant with an argument condition denies
/// `arguments_missing` here (a 403 like any policy denial, naming the condition), even when the
/// proxy sends the original body along; a grant whose condition is on the instant only decides
/// as anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_conditions_deny_arguments_missing_and_time_conditions_hold() {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use support::doors::{
        refund, Conditional, AMOUNT_CONDITION, CONDITIONAL_TOKEN, DESK_KEY, REFUND, RELEASE,
    };
    let Some(world) = Conditional::start().await else {
        return;
    };
    let doors = &world.doors;

    let missing = ask(doors, "/forward-auth", &call(REFUND, DESK_KEY)).await;
    assert_eq!(
        (missing.status, missing.code()),
        (403, "arguments_missing"),
        "{missing:?}"
    );
    assert_eq!(missing.body["error"]["code"], -32001, "{missing:?}");
    assert_eq!(
        missing.body["error"]["data"]["pointer"], AMOUNT_CONDITION,
        "{missing:?}"
    );
    let decision_id = missing.body["error"]["data"]["decision_id"]
        .as_str()
        .expect("a decision id");
    let record = world.record(decision_id).await;
    assert_eq!(
        (record.door, record.outcome, record.code.map(|code| code.as_str())),
        (Door::ForwardAuth, RecordOutcome::Deny, Some("arguments_missing"))
    );
    assert_eq!(record.path.as_deref(), Some(AMOUNT_CONDITION));

    // A body the proxy forwards is not read: the arguments in it would meet every condition.
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": REFUND, "arguments": refund(1.0, "EUR")}});
    let mut request = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{}/forward-auth", doors.http))
        .header("x-capgate-gateway-token", CONDITIONAL_TOKEN)
        .header("content-type", "application/json");
    for (name, value) in call(REFUND, DESK_KEY) {
        request = request.header(name, value);
    }
    let response = doors
        .http_client
        .request(
            request
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("a request"),
        )
        .await
        .expect("an HTTP answer");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.expect("a body").to_bytes();
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    assert_eq!(
        (status, answer["error"]["data"]["code"].as_str()),
        (403, Some("arguments_missing")),
        "{answer}"
    );

    // A condition on the instant alone needs no arguments.
    let release = ask(doors, "/forward-auth", &call(RELEASE, DESK_KEY)).await;
    assert_eq!(release.status, 200, "{release:?}");
    assert_eq!(release.header("x-capgate-account"), Some("release-robot"));
}
