//! A `request_id` answers only for the request it decided (issue 25, docs/decisions/0027): through
//! every door of the real binary, a request that reuses an id with another tool, another caller,
//! no credential, or after its caller's ceiling ran out is refused with words that name the id,
//! consumes nothing and is audited; a genuine retry still gets the first answer, on this replica
//! and on another, and is audited as a replay; a metric counts both.
//!
//! Needs `DATABASE_URL` (skipped without it, unless `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::process::Command;
use std::time::Duration;

use capgate::store::{AuditFilter, AuditRecord, Door, RecordOutcome, Store};
use serde_json::Value;
use support::client::wait_serving;
use support::doors::{Doors, KeyedCall, Read};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;

const GATEWAY: &str = "rid-gw";
const GATEWAY_TOKEN: &str = "rid-gateway-token-5e5e";
const ALPHA_KEY: &str = "rid-alpha-key-1a1a";
const BETA_KEY: &str = "rid-beta-key-2b2b";

/// Two static-key callers on one tool server. `alpha` reads notes under a ceiling of 2 per hour,
/// by either of two tools; nobody may write. `beta` reads without a ceiling.
const POLICY: &str = r#"
version: 1
capabilities:
  - id: notes.read
  - id: notes.write
upstreams:
  - id: notes
    transport: { kind: mcp-http, url: "https://notes.example.net/mcp" }
    tools:
      - { name: read_note, capability: notes.read }
      - { name: list_notes, capability: notes.read }
      - { name: write_note, capability: notes.write }
accounts:
  - id: notes-reader
    secret: { ref: "env://NOTES_READER_TOKEN" }
principals:
  issuers:
    - id: alpha
      kind: static-key
      subject: alpha
      secret: { ref: "env://RID_ALPHA_KEY" }
    - id: beta
      kind: static-key
      subject: beta
      secret: { ref: "env://RID_BETA_KEY" }
grants:
  - to: { issuer: alpha }
    capabilities: [notes.read]
    using: notes-reader
    limits: { calls: 2, per: 1h }
  - to: { issuer: beta }
    capabilities: [notes.read]
    using: notes-reader
"#;

const READ: &str = "notes__read_note";
const LIST: &str = "notes__list_notes";
const WRITE: &str = "notes__write_note";

/// Replicas of `capgate serve` on one fresh PostgreSQL database, with the policy above.
struct World {
    replicas: Vec<Serve>,
    database: TestDatabase,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start(replicas: usize) -> Option<World> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, POLICY).expect("write the policy");
        let url = database.url();
        let gateway = format!("{GATEWAY}=env://CAPGATE_TEST_RID_TOKEN");
        let mut started = Vec::new();
        for _ in 0..replicas {
            let serve = Serve::start_with_env(
                &[
                    "--database-url",
                    &url,
                    "--policy",
                    policy.to_str().expect("utf-8"),
                    "--http-listen",
                    "127.0.0.1:0",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--gateway-token",
                    &gateway,
                    "--forward-auth-request-id-header",
                    support::doors::FORWARD_AUTH_REQUEST_ID,
                ],
                &[
                    ("CAPGATE_TEST_RID_TOKEN", GATEWAY_TOKEN),
                    ("RID_ALPHA_KEY", ALPHA_KEY),
                    ("RID_BETA_KEY", BETA_KEY),
                ],
            )
            .await;
            wait_serving(&serve.channel().await, Duration::from_secs(10)).await;
            started.push(serve);
        }
        Some(World {
            replicas: started,
            database,
            _dir: dir,
        })
    }

    async fn doors(&self, replica: usize) -> Doors {
        Doors::connect(&self.replicas[replica], GATEWAY_TOKEN).await
    }

    async fn records(&self, request_id: &str) -> Vec<AuditRecord> {
        self.database
            .store()
            .await
            .query_audit(&AuditFilter {
                request_id: Some(request_id.to_owned()),
                oldest_first: true,
                limit: 1_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail")
    }

    /// Allowed decisions of `subject`, whatever their request id.
    async fn allows_of(&self, subject: &str) -> usize {
        let all = self
            .database
            .store()
            .await
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..AuditFilter::default()
            })
            .await
            .expect("read the audit trail");
        all.iter()
            .filter(|record| {
                record.outcome == RecordOutcome::Allow && record.subject.as_deref() == Some(subject)
            })
            .count()
    }

    /// `capgate audit --request-id ID --json`, as an operator runs it: one JSON record a line.
    fn audit_cli(&self, request_id: &str) -> Vec<Value> {
        let output = Command::new(env!("CARGO_BIN_EXE_capgate"))
            .args([
                "audit",
                "--database-url",
                &self.database.url(),
                "--request-id",
                request_id,
                "--json",
            ])
            .env_remove("CAPGATE_DATABASE_URL")
            .output()
            .expect("the binary runs");
        let stdout = String::from_utf8(output.stdout).expect("UTF-8");
        assert!(
            output.status.success(),
            "capgate audit failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let document: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|error| panic!("`capgate audit --json` is not JSON ({error}): {stdout}"));
        document
            .as_array()
            .unwrap_or_else(|| panic!("not an array of records: {document}"))
            .clone()
    }

    /// `capgate.request_ids` of replica `replica` for `door` and `result`, as Prometheus reads it.
    async fn request_id_metric(&self, replica: usize, door: Door, result: &str) -> f64 {
        let (_, text) = http_get(metrics_addr(&self.replicas[replica]), "/metrics").await;
        prometheus_value(
            &text,
            "capgate_request_ids_total",
            &[("door", door.as_str()), ("result", result)],
        )
        .unwrap_or(0.0)
    }
}

fn call<'a>(key: Option<&'a str>, subject: &'a str, tool: &'a str, id: &'a str, at: i64) -> KeyedCall<'a> {
    KeyedCall {
        api_key: key,
        subject,
        tool,
        request_id: id,
        received_ms: at,
    }
}

/// The whole story through one door, with the original on replica 0 and every later request on
/// replica `later` (0: one replica; 1: another one, sharing the store).
async fn a_request_id_answers_only_its_own_request(door: Door, later: usize) {
    let Some(world) = World::start(later + 1).await else {
        return;
    };
    let mut first = world.doors(0).await;
    let mut then = world.doors(later).await;
    let id = format!("rid-{}-{later}", door.as_str());
    let id = id.as_str();
    let alpha = Some(ALPHA_KEY);

    // The original: alpha reads a note (1 of alpha's 2 calls).
    let original = first.keyed(door, call(alpha, "alpha", READ, id, 1_000)).await;
    assert!(original.is_allow(), "the original is allowed: {original:?}");

    // A genuine retry: the very same request, answered as the first time — except through
    // forward-auth, where the proxy forwards the request on every allow: an allow given twice would
    // run the call twice on one count, so it is refused (docs/decisions/0029 §5).
    let retry = then.keyed(door, call(alpha, "alpha", READ, id, 1_000)).await;
    let allows_replay = door != Door::ForwardAuth;
    if allows_replay {
        assert_eq!(retry, original, "a retry gets the original's answer");
    } else {
        assert!(
            matches!(retry, Read::ReusedId { .. }),
            "an allow given again through forward-auth: {retry:?}"
        );
    }

    // The same id for other requests: refused, each in words that name the id.
    let reuses = [
        (
            "another tool, with no grant",
            call(alpha, "alpha", WRITE, id, 1_000),
        ),
        ("another caller", call(Some(BETA_KEY), "beta", READ, id, 1_000)),
        ("no credential", call(None, "alpha", READ, id, 1_000)),
    ];
    let mut failures = Vec::new();
    for (what, reuse) in reuses {
        let read = then.keyed(door, reuse).await;
        if !matches!(read, Read::ReusedId { .. }) {
            failures.push(format!("{what}: {read:?}"));
        }
    }

    // alpha spends its second call, then is out of calls.
    let second = then
        .keyed(door, call(alpha, "alpha", READ, "rid-second", 2_000))
        .await;
    assert!(second.is_allow(), "{second:?}");
    let out = then
        .keyed(door, call(alpha, "alpha", READ, "rid-third", 3_000))
        .await;
    assert_eq!(
        out,
        Read::Deny {
            code: "limit_exhausted".to_owned(),
            decision_id: out.decision_id().map(str::to_owned),
        },
        "the ceiling is exhausted"
    );
    // A denial is given again on every door (nginx asks twice for a denial's body).
    let out_again = then
        .keyed(door, call(alpha, "alpha", READ, "rid-third", 3_000))
        .await;
    assert_eq!(out_again, out, "a retry of a denial gets the denial");
    // Out of calls, alpha reuses the id of its first allowed call for another tool of the same
    // capped capability: refused, not allowed past the ceiling.
    let past = then.keyed(door, call(alpha, "alpha", LIST, id, 4_000)).await;
    if !matches!(past, Read::ReusedId { .. }) {
        failures.push(format!("an exhausted ceiling, another tool: {past:?}"));
    }
    if door == Door::ExtAuthz {
        // Through Envoy the id is the client's own `x-request-id`: the same tool again, in a
        // new request through the proxy (received later), is another request, not a retry.
        let again = then.keyed(door, call(alpha, "alpha", READ, id, 5_000)).await;
        if !matches!(again, Read::ReusedId { .. }) {
            failures.push(format!(
                "an exhausted ceiling, a new request through Envoy: {again:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} reused {id} and was not refused:\n{}",
        door.as_str(),
        failures.join("\n")
    );

    // Nothing was consumed by the refusals: alpha was allowed exactly its two calls.
    assert_eq!(world.allows_of("alpha").await, 2, "alpha's allows");

    // The trail: the original, the replay pointing at it, and every refused reuse.
    let records = world.records(id).await;
    let original_id = records
        .iter()
        .find(|record| record.outcome == RecordOutcome::Allow)
        .map(|record| record.decision_id.clone())
        .unwrap_or_else(|| panic!("no original in {records:#?}"));
    let replays: Vec<&AuditRecord> = records
        .iter()
        .filter(|record| record.outcome == RecordOutcome::Replayed)
        .collect();
    let reused: Vec<&AuditRecord> = records
        .iter()
        .filter(|record| record.outcome == RecordOutcome::RequestIdReused)
        .collect();
    let expected_replays = usize::from(allows_replay);
    let expected_reuses = match door {
        Door::ExtAuthz => 5,
        Door::ForwardAuth => 5,
        _ => 4,
    };
    assert_eq!(
        (records.len(), replays.len(), reused.len()),
        (
            1 + expected_replays + expected_reuses,
            expected_replays,
            expected_reuses
        ),
        "{records:#?}"
    );
    assert!(records.iter().all(|record| record.door == door), "{records:#?}");
    for replay in &replays {
        assert_eq!(replay.first_decision_id.as_deref(), Some(original_id.as_str()));
    }
    for record in &reused {
        assert_eq!(
            record.first_decision_id.as_deref(),
            Some(original_id.as_str()),
            "{record:?}"
        );
        assert!(record.tool.is_some(), "what it asked for: {record:?}");
    }
    // Who tried: the other caller is named as itself.
    assert!(
        reused
            .iter()
            .any(|record| record.subject.as_deref() == Some("beta")),
        "{reused:#?}"
    );

    // The operator's view.
    let shown = world.audit_cli(id);
    let outcomes: Vec<&str> = shown
        .iter()
        .filter_map(|record| record["outcome"].as_str())
        .collect();
    assert_eq!(outcomes.len(), records.len(), "{shown:#?}");
    assert!(
        outcomes.contains(&"replayed") == allows_replay && outcomes.contains(&"request_id_reused"),
        "{outcomes:?}"
    );

    // Counted where they were answered.
    assert_eq!(
        world.request_id_metric(later, door, "replayed").await,
        (expected_replays + 1) as f64,
        "replays counted, the denial's among them"
    );
    assert_eq!(
        world.request_id_metric(later, door, "reused").await,
        expected_reuses as f64,
        "reuses counted"
    );

    for serve in &world.replicas {
        let logs = serve.logs();
        assert!(
            !logs.contains(ALPHA_KEY) && !logs.contains(BETA_KEY),
            "a key in the logs"
        );
    }
    assert!(!format!("{records:?}").contains(ALPHA_KEY), "a key in the trail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_answers_a_request_id_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::Capgate, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_answers_a_request_id_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::ExtAuthz, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_mcp_answers_a_request_id_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::ExtMcp, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authzen_answers_a_request_id_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::Authzen, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_answers_a_request_id_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::ForwardAuth, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_replicas_a_request_id_answers_only_for_its_request() {
    a_request_id_answers_only_its_own_request(Door::Capgate, 1).await;
    a_request_id_answers_only_its_own_request(Door::ExtAuthz, 1).await;
}
