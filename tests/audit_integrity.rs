//! The audit trail loses nothing, whatever another request contained
//! (service.md "The audit trail", docs/decisions/0014): a value the store
//! cannot hold — PostgreSQL refuses U+0000 in text — is refused at the edge
//! naming its field, and a record that still cannot be written is set aside
//! alone instead of failing the batch it was committed with.
//!
//! Through the real binary (`tests/support/process.rs`) over PostgreSQL:
//! * [`nul_characters_are_refused_at_the_edge_and_harm_no_one_else`]: a NUL in
//!   any string of `Decide`, `ListVisible` or `PublishPolicy` is
//!   `INVALID_ARGUMENT` naming the field, while concurrent valid calls are
//!   all answered and all in `audit_log`;
//! * [`a_record_the_store_cannot_hold_fails_alone`]: a policy may declare a
//!   value the edge never sees (a static-key subject written `"…\0…"`), so
//!   its callers' records are refused by the store: those calls fail
//!   `UNAVAILABLE`, each logged with its decision id and counted, and every
//!   call batched with them is answered and recorded;
//! * [`a_spooled_record_the_store_refuses_is_quarantined`]: a spool file with
//!   such a record (as an older build would have written it) is replayed
//!   around it; the record goes to `rejected/`, logged and counted.
//!
//! Below the edge, on the real stores:
//! * [`the_writer_isolates_what_the_store_refuses`]: the audit writer, over
//!   PostgreSQL (NUL) and SQLite (a count past `BIGINT`), commits every good
//!   record of a batch and fails only the bad one's waiter;
//! * [`data_errors_are_told_from_outages`]: the store's classification that
//!   isolation relies on.
//!
//! The PostgreSQL tests need `DATABASE_URL` (skipped without it, unless
//! `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use capgate::service::audit::{AuditOptions, AuditUnavailable, AuditWriter, Durable};
use capgate::store::{
    AuditFilter, AuditRecord, PostgresStore, RecordCode, RecordKind, RecordOutcome, Remembered, SqliteStore,
    Store, StoreError, StoreOptions,
};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::policy_service_client::PolicyServiceClient;
use capgate::wire::proto::{
    credential, decide_request, list_visible_request, AssertedPrincipal, Attribute, Credential,
    DecideRequest, DecideResponse, ListPolicyVersionsRequest, ListVisibleRequest, PublishPolicyRequest,
};
use capgate_core::access::ReasonCode;
use tokio::task::JoinSet;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use support::client::{ana, dee, for_capability, for_tool, CATALOG, POLICY};
use support::otlp::{http_get, metrics_addr, prometheus_value};
use support::postgres::TestDatabase;
use support::process::Serve;
use support::proxy::{Mode, Proxy};

const GATEWAY_TOKEN: &str = "audit-integrity-gateway-token";
const ASSERTING_TOKEN: &str = "audit-integrity-asserting-token";
const ADMIN_TOKEN: &str = "audit-integrity-admin-token";
/// The example policy's static key (`nightly`, `env://NIGHTLY_RUNNER_KEY`).
const NIGHTLY_KEY: &str = "audit-integrity-nightly-key";
/// How long a spool replay may take to reach `audit_log`.
const REPLAYED_WITHIN: Duration = Duration::from_secs(15);

// ── The server under test ─────────────────────────────────────────────────

/// A `capgate serve` over a fresh PostgreSQL database, with its policy files.
struct Scene {
    serve: Serve,
    _dir: tempfile::TempDir,
    // Dropped last: the database goes after the server that used it.
    database: TestDatabase,
}

impl Scene {
    /// Serves `policy` (with the example catalog) and `extra` flags; `None`
    /// when the PostgreSQL tests are skipped.
    async fn start(policy: &str, extra: &[&str]) -> Option<Scene> {
        let database = TestDatabase::create().await?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        Some(Scene::start_in(database, dir, policy, extra).await)
    }

    async fn start_in(database: TestDatabase, dir: tempfile::TempDir, policy: &str, extra: &[&str]) -> Scene {
        let policy_file = dir.path().join("policy.yaml");
        let catalog_file = dir.path().join("catalog.yaml");
        std::fs::write(&policy_file, policy).expect("write the policy");
        std::fs::write(&catalog_file, CATALOG).expect("write the catalog");
        let url = database.url();
        let mut args = vec![
            "--database-url",
            &url,
            "--policy",
            policy_file.to_str().expect("a UTF-8 path"),
            "--catalog",
            catalog_file.to_str().expect("a UTF-8 path"),
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let serve = Serve::start_with_env(
            &args,
            &[
                ("NIGHTLY_RUNNER_KEY", NIGHTLY_KEY),
                ("AUDIT_INTEGRITY_GATEWAY", GATEWAY_TOKEN),
                ("AUDIT_INTEGRITY_ASSERTING", ASSERTING_TOKEN),
                ("AUDIT_INTEGRITY_ADMIN", ADMIN_TOKEN),
            ],
        )
        .await;
        Scene {
            serve,
            _dir: dir,
            database,
        }
    }

    /// The decision ids in `audit_log`, read directly.
    async fn stored_ids(&self) -> BTreeSet<String> {
        stored_records(&self.database.store().await)
            .await
            .into_iter()
            .map(|record| record.decision_id)
            .collect()
    }

    /// A counter's value in `GET /metrics` (0 when it has no series yet).
    async fn counter(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (status, text) = http_get(metrics_addr(&self.serve), "/metrics").await;
        assert_eq!(status, 200, "{text}");
        prometheus_value(&text, name, labels).unwrap_or(0.0)
    }

    /// The values of `field` in the JSON log lines whose message is
    /// `message`, once there are at least `count` (the log arrives through a
    /// pipe, a moment after the call it tells of); panics after 10 s.
    async fn logged_at_least(&self, message: &str, field: &str, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let values: Vec<String> = self
                .serve
                .logs()
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .filter(|line| line["fields"]["message"] == message)
                .filter_map(|line| line["fields"][field].as_str().map(str::to_owned))
                .collect();
            if values.len() >= count {
                return values;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} `{message}` lines:\n{}",
                values.len(),
                self.serve.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn stored_records<S: Store>(store: &S) -> Vec<AuditRecord> {
    store
        .query_audit(&AuditFilter {
            limit: 100_000,
            ..AuditFilter::default()
        })
        .await
        .expect("read the audit trail")
}

/// `message` with `authorization: Bearer token`.
fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("an ASCII token"),
    );
    request
}

fn credential(kind: credential::Kind, issuer: &str) -> Option<decide_request::Caller> {
    Some(decide_request::Caller::Credential(Credential {
        kind: Some(kind),
        issuer: issuer.to_owned(),
    }))
}

/// The nightly batch runner, by its API key, searching docs (`/grants/6`, no ceiling).
fn nightly_search() -> DecideRequest {
    DecideRequest {
        caller: credential(credential::Kind::ApiKey(NIGHTLY_KEY.to_owned()), ""),
        target: Some(decide_request::Target::Capability("docs.page.search".to_owned())),
        request_id: String::new(),
        arguments_json: None,
    }
}

/// The fields a refusal names: its `BadRequest` violations.
fn violated_fields(status: &Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

#[track_caller]
fn assert_refused(field: &str, result: Result<impl std::fmt::Debug, Status>) {
    let status = match result {
        Err(status) => status,
        Ok(answer) => panic!("a NUL in `{field}` was answered: {answer:?}"),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "`{field}`: {status:?}");
    assert!(
        status.message().contains(&format!("`{field}`")),
        "the message names `{field}`: {status:?}"
    );
    assert_eq!(violated_fields(&status), [field], "{status:?}");
}

// ── At the edge ───────────────────────────────────────────────────────────

/// One request carrying a NUL, the token it is sent with, and the field it
/// must be refused for.
enum Poisoned {
    Decide(&'static str, DecideRequest),
    List(&'static str, ListVisibleRequest),
}

fn nul_requests() -> Vec<(&'static str, Poisoned)> {
    let asserted = |principal: AssertedPrincipal| DecideRequest {
        caller: Some(decide_request::Caller::Principal(principal)),
        ..for_capability(dee(), "docs.page.search")
    };
    let mut decides: Vec<(&'static str, &'static str, DecideRequest)> = vec![
        // A plain gateway token is enough for these.
        (
            "credential.issuer",
            GATEWAY_TOKEN,
            DecideRequest {
                caller: credential(credential::Kind::ApiKey(NIGHTLY_KEY.to_owned()), "night\0ly"),
                ..nightly_search()
            },
        ),
        (
            "credential.api_key",
            GATEWAY_TOKEN,
            DecideRequest {
                caller: credential(credential::Kind::ApiKey("key\0".to_owned()), ""),
                ..nightly_search()
            },
        ),
        (
            "credential.bearer_token",
            GATEWAY_TOKEN,
            DecideRequest {
                caller: credential(credential::Kind::BearerToken("eyJ\0.x.y".to_owned()), "staff"),
                ..nightly_search()
            },
        ),
        (
            "credential.client_certificate",
            GATEWAY_TOKEN,
            DecideRequest {
                caller: credential(
                    credential::Kind::ClientCertificate("CN=svc\0,O=Acme Corp".to_owned()),
                    "mesh",
                ),
                ..nightly_search()
            },
        ),
        (
            "tool",
            GATEWAY_TOKEN,
            DecideRequest {
                target: Some(decide_request::Target::Tool("helpdesk__get\0_ticket".to_owned())),
                ..nightly_search()
            },
        ),
        (
            "capability",
            GATEWAY_TOKEN,
            DecideRequest {
                target: Some(decide_request::Target::Capability(
                    "docs.page\0.search".to_owned(),
                )),
                ..nightly_search()
            },
        ),
        (
            "request_id",
            GATEWAY_TOKEN,
            DecideRequest {
                request_id: "retry-\0-1".to_owned(),
                ..nightly_search()
            },
        ),
    ];
    // Asserting a principal takes a trusted gateway.
    let mut subject = dee();
    subject.subject = "dee\0".to_owned();
    let mut issuer = dee();
    issuer.issuer = "st\0aff".to_owned();
    let mut name = dee();
    name.attributes = vec![Attribute {
        name: "de\0pt".to_owned(),
        values: vec!["support".to_owned()],
    }];
    let mut value = ana();
    value.attributes[0].values = vec!["support\0".to_owned()];
    decides.extend([
        ("principal.subject", ASSERTING_TOKEN, asserted(subject.clone())),
        ("principal.issuer", ASSERTING_TOKEN, asserted(issuer)),
        ("principal.attributes[0].name", ASSERTING_TOKEN, asserted(name)),
        (
            "principal.attributes[0].values[0]",
            ASSERTING_TOKEN,
            asserted(value),
        ),
    ]);
    let mut requests: Vec<(&'static str, Poisoned)> = decides
        .into_iter()
        .map(|(field, token, request)| (field, Poisoned::Decide(token, request)))
        .collect();
    requests.extend([
        (
            "request_id",
            Poisoned::List(
                GATEWAY_TOKEN,
                ListVisibleRequest {
                    caller: Some(list_visible_request::Caller::Credential(Credential {
                        kind: Some(credential::Kind::ApiKey(NIGHTLY_KEY.to_owned())),
                        issuer: String::new(),
                    })),
                    request_id: "\0".to_owned(),
                },
            ),
        ),
        (
            "principal.subject",
            Poisoned::List(
                ASSERTING_TOKEN,
                ListVisibleRequest {
                    caller: Some(list_visible_request::Caller::Principal(subject)),
                    request_id: String::new(),
                },
            ),
        ),
    ]);
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nul_characters_are_refused_at_the_edge_and_harm_no_one_else() {
    let Some(scene) = Scene::start(
        POLICY,
        &[
            "--gateway-token",
            "edge=env://AUDIT_INTEGRITY_GATEWAY",
            "--asserting-gateway-token",
            "trusted=env://AUDIT_INTEGRITY_ASSERTING",
            "--admin-token",
            "admin=env://AUDIT_INTEGRITY_ADMIN",
        ],
    )
    .await
    else {
        return;
    };
    let channel = scene.serve.channel().await;

    // Valid callers keep calling while the poisoned requests arrive, so that
    // their records share audit batches.
    let mut valid = JoinSet::new();
    for caller in 0..6 {
        let mut client = DecisionServiceClient::new(channel.clone());
        valid.spawn(async move {
            let mut answers = Vec::new();
            for call in 0..40 {
                let request = match (caller + call) % 3 {
                    0 => with_token(for_capability(ana(), "tickets.issue.read"), ASSERTING_TOKEN),
                    1 => with_token(for_tool(dee(), "knowledge__search_pages"), ASSERTING_TOKEN),
                    _ => with_token(nightly_search(), GATEWAY_TOKEN),
                };
                answers.push(client.decide(request).await.map(tonic::Response::into_inner));
            }
            answers
        });
    }
    let mut decisions = DecisionServiceClient::new(channel.clone());
    for _round in 0..3 {
        for (field, request) in nul_requests() {
            match request {
                Poisoned::Decide(token, request) => {
                    assert_refused(field, decisions.decide(with_token(request, token)).await);
                }
                Poisoned::List(token, request) => {
                    assert_refused(field, decisions.list_visible(with_token(request, token)).await);
                }
            }
        }
    }

    // Publishing: a NUL in the comment is refused; in the artifact or the
    // catalog the compiler already refuses it (`yaml_syntax`, an unusable
    // catalog), so nothing is stored either way.
    let mut policies = PolicyServiceClient::new(channel.clone());
    let publish = |artifact: &str, catalog: &str, comment: &str| {
        with_token(
            PublishPolicyRequest {
                artifact: artifact.to_owned(),
                catalog: Some(catalog.to_owned()),
                comment: comment.to_owned(),
                ..PublishPolicyRequest::default()
            },
            ADMIN_TOKEN,
        )
    };
    let changed = POLICY.replace("calls: 600", "calls: 601");
    assert_refused(
        "comment",
        policies
            .publish_policy(publish(&changed, CATALOG, "tighter\0"))
            .await,
    );
    let unparsable = format!("# a NUL: \0\n{changed}");
    let rejected = policies
        .publish_policy(publish(&unparsable, CATALOG, "nul in the artifact"))
        .await
        .expect("a compile result")
        .into_inner();
    assert!(!rejected.accepted);
    assert_eq!(
        rejected
            .diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .collect::<Vec<_>>(),
        ["yaml_syntax"]
    );
    assert_refused(
        "catalog",
        policies
            .publish_policy(publish(&changed, &format!("\0{CATALOG}"), "nul in the catalog"))
            .await,
    );
    let versions = policies
        .list_policy_versions(with_token(ListPolicyVersionsRequest { limit: 10 }, ADMIN_TOKEN))
        .await
        .expect("list the versions")
        .into_inner();
    assert_eq!(versions.versions.len(), 1, "only the start-up version is stored");

    // Every valid call was answered, and is on record.
    let mut answered: Vec<DecideResponse> = Vec::new();
    while let Some(answers) = valid.join_next().await {
        for (index, answer) in answers.expect("a caller's task").into_iter().enumerate() {
            match answer {
                Ok(answer) => answered.push(answer),
                Err(status) => panic!("valid call {index} failed next to the poisoned ones: {status:?}"),
            }
        }
    }
    assert_eq!(answered.len(), 240);
    let ids: BTreeSet<String> = answered.iter().map(|a| a.decision_id.clone()).collect();
    let stored = scene.stored_ids().await;
    assert!(
        stored.is_superset(&ids),
        "{} answered calls are missing from audit_log",
        ids.difference(&stored).count()
    );
}

// ── Isolation, through the binary ─────────────────────────────────────────

/// The example policy, its static-key issuer's subject declared with a NUL
/// (`"nightly\0runner"` is a valid YAML escape, and the policy compiles):
/// every record of that caller holds a value PostgreSQL refuses, and no
/// request carries it, so the edge cannot see it. If the compiler ever
/// refuses such a subject, this test needs another record the store refuses;
/// [`the_writer_isolates_what_the_store_refuses`] covers isolation below the
/// edge meanwhile.
fn policy_with_a_nul_subject() -> String {
    let poisoned = POLICY.replace("subject: nightly-runner", "subject: \"nightly\\0runner\"");
    assert_ne!(poisoned, POLICY, "the example's static-key subject moved");
    poisoned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_the_store_cannot_hold_fails_alone() {
    let Some(scene) = Scene::start(&policy_with_a_nul_subject(), &[]).await else {
        return;
    };
    let channel = scene.serve.channel().await;

    let mut callers = JoinSet::new();
    for caller in 0..8 {
        let mut client = DecisionServiceClient::new(channel.clone());
        callers.spawn(async move {
            let mut answers = Vec::new();
            for call in 0..25 {
                let poisoned = (caller + call) % 5 == 0;
                let request = if poisoned {
                    nightly_search()
                } else if call % 2 == 0 {
                    for_capability(ana(), "tickets.issue.read")
                } else {
                    for_capability(dee(), "docs.page.search")
                };
                answers.push((
                    poisoned,
                    client.decide(request).await.map(tonic::Response::into_inner),
                ));
            }
            answers
        });
    }
    let mut answered = BTreeSet::new();
    let mut refused = 0;
    while let Some(answers) = callers.join_next().await {
        for (poisoned, answer) in answers.expect("a caller's task") {
            match (poisoned, answer) {
                // A capped call may deny `usage_unknown` on a busy machine: answered all the same.
                (false, Ok(answer)) => {
                    answered.insert(answer.decision_id);
                }
                (false, Err(status)) => panic!("a valid call failed next to a poisoned one: {status:?}"),
                (true, Err(status)) => {
                    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                    refused += 1;
                }
                (true, Ok(answer)) => panic!("answered without a durable record: {answer:?}"),
            }
        }
    }
    assert_eq!((answered.len(), refused), (160, 40));

    // A listing of that caller is one record per visible capability: it
    // fails as a whole, and alone too.
    let listing = DecisionServiceClient::new(channel.clone())
        .list_visible(ListVisibleRequest {
            caller: Some(list_visible_request::Caller::Credential(Credential {
                kind: Some(credential::Kind::ApiKey(NIGHTLY_KEY.to_owned())),
                issuer: String::new(),
            })),
            request_id: String::new(),
        })
        .await;
    assert_eq!(listing.map(|_| ()).unwrap_err().code(), Code::Unavailable);

    let stored = scene.stored_ids().await;
    assert!(stored.is_superset(&answered), "every answered call is on record");
    // Each refused record is logged with its decision id, and counted.
    let counted = scene
        .counter("capgate_audit_rejected_total", &[("source", "write")])
        .await as usize;
    let rejected: BTreeSet<String> = scene
        .logged_at_least(
            "audit record refused by the store; its call fails",
            "decision_id",
            counted,
        )
        .await
        .into_iter()
        .collect();
    assert_eq!(
        rejected.len(),
        counted,
        "one line per refused record, each its own id"
    );
    assert!(
        counted > refused,
        "the listing's records are counted too: {rejected:?}"
    );
    assert!(rejected.is_disjoint(&stored));
    assert_eq!(stored.len(), answered.len(), "what was answered, nothing else");
}

// ── The spool ─────────────────────────────────────────────────────────────

/// A record as a spool line holds it.
fn spool_line(record: &AuditRecord) -> String {
    serde_json::json!({ "record": record }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spooled_record_the_store_refuses_is_quarantined() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).expect("make the spool");
    // What an older build spooled during an outage: a record with a NUL in
    // its subject between two good ones, a response to remember whose
    // request id has one, and a second file queued behind the first.
    let now = capgate::clock::now();
    let (first, poisoned, second, third) = (
        sample(1, now),
        AuditRecord {
            subject: Some("ana\0".to_owned()),
            ..sample(2, now)
        },
        sample(3, now),
        sample(4, now),
    );
    let remembered = serde_json::json!({"remembered": {
        "gateway": "edge", "request_id": "retry\u{0}", "decision_id": first.decision_id,
        "at_ms": now, "response_hex": "0a00"
    }});
    std::fs::write(
        spool.join("audit-00000000000000000001-000001.jsonl"),
        format!(
            "{}\n{}\n{}\n{remembered}\n",
            spool_line(&first),
            spool_line(&poisoned),
            spool_line(&second)
        ),
    )
    .expect("write a spool file");
    std::fs::write(
        spool.join("audit-00000000000000000002-000001.jsonl"),
        format!("{}\n", spool_line(&third)),
    )
    .expect("write a spool file");

    let spool_arg = spool.to_str().expect("a UTF-8 path").to_owned();
    let scene = Scene::start_in(
        database,
        dir,
        POLICY,
        &["--audit-spool", &spool_arg, "--poll-interval", "200ms"],
    )
    .await;

    let wanted: BTreeSet<String> = [&first, &second, &third]
        .iter()
        .map(|record| record.decision_id.clone())
        .collect();
    let deadline = Instant::now() + REPLAYED_WITHIN;
    while !scene.stored_ids().await.is_superset(&wanted) {
        assert!(
            Instant::now() < deadline,
            "the good spooled records did not reach audit_log within {REPLAYED_WITHIN:?}:\n{}",
            scene.serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + REPLAYED_WITHIN;
    while !spool_files(&spool).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the spool is not emptied: {:?}",
            spool_files(&spool)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!scene.stored_ids().await.contains(&poisoned.decision_id));

    // The refused entries are kept aside, fsynced, in the spool format.
    let quarantined: Vec<serde_json::Value> = spool_files(&spool.join("rejected"))
        .iter()
        .flat_map(|path| {
            std::fs::read_to_string(path)
                .expect("read a quarantine file")
                .lines()
                .map(|line| serde_json::from_str(line).expect("a JSON line"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        quarantined,
        vec![
            serde_json::from_str::<serde_json::Value>(&spool_line(&poisoned)).unwrap(),
            remembered
        ]
    );
    let logged = scene
        .logged_at_least(
            "spooled audit entry refused by the store; quarantined",
            "decision_id",
            2,
        )
        .await;
    assert_eq!(logged, [poisoned.decision_id.clone(), first.decision_id.clone()]);
    assert_eq!(
        scene
            .counter("capgate_audit_rejected_total", &[("source", "replay")])
            .await,
        2.0
    );
}

/// The spool files (`audit-*.jsonl`) in `dir`, none when it does not exist.
fn spool_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    files
}

// ── Below the edge ────────────────────────────────────────────────────────

/// A plausible record, unique by `n`.
fn sample(n: u32, at_ms: i64) -> AuditRecord {
    AuditRecord {
        decision_id: format!("0198f000-0000-7000-8000-{n:012}"),
        at_ms,
        request_id: None,
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(ReasonCode::Granted)),
        path: Some("/grants/0".to_owned()),
        principal_id: Some(format!("staff:user-{n}")),
        issuer: Some("staff".to_owned()),
        subject: Some(format!("user-{n}")),
        capability: Some("tickets.issue.read".to_owned()),
        account_id: Some("helpdesk-reader".to_owned()),
        ..AuditRecord::default()
    }
}

/// Writes 60 single-record jobs at once through a writer over `store`, every
/// tenth made bad by `poison`: the good ones are stored, only the bad ones
/// fail, and the store holds exactly the good ones.
async fn isolation_through_the_writer<S: Store>(store: S, poison: fn(AuditRecord) -> AuditRecord) {
    let (writer, task) = AuditWriter::start(
        store.clone(),
        AuditOptions {
            batch: 512,
            in_flight: 1,
            timeout: Duration::from_secs(5),
            spool: None,
            spool_after: Duration::from_millis(50),
            replay_interval: Duration::from_secs(1),
        },
    )
    .expect("start the writer");
    let now = capgate::clock::now();
    let mut jobs = JoinSet::new();
    for n in 0..60 {
        let bad = n % 10 == 3;
        let record = if bad {
            poison(sample(n, now))
        } else {
            sample(n, now)
        };
        let writer = writer.clone();
        jobs.spawn(async move {
            let id = record.decision_id.clone();
            (id, bad, writer.write(vec![record], Vec::new()).await)
        });
    }
    let mut good = BTreeSet::new();
    while let Some(job) = jobs.join_next().await {
        let (id, bad, written) = job.expect("a job's task");
        if bad {
            assert_eq!(written, Err(AuditUnavailable), "{id}");
        } else {
            assert_eq!(written, Ok(Durable::Stored), "{id}");
            good.insert(id);
        }
    }
    let stored: BTreeSet<String> = stored_records(&store)
        .await
        .into_iter()
        .map(|record| record.decision_id)
        .collect();
    assert_eq!(stored, good);
    drop(writer);
    task.await.expect("the writer ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_isolates_what_the_store_refuses() {
    // SQLite holds a NUL; a count past BIGINT is refused by both stores.
    let file = tempfile::tempdir().expect("a temporary directory");
    let sqlite = SqliteStore::connect(
        &format!("sqlite://{}", file.path().join("capgate.db").display()),
        &StoreOptions::default(),
    )
    .await
    .expect("open SQLite");
    sqlite.migrate().await.expect("migrate");
    isolation_through_the_writer(sqlite, |record| AuditRecord {
        limit_calls: Some(u64::MAX),
        ..record
    })
    .await;

    let Some(database) = TestDatabase::create().await else {
        return;
    };
    isolation_through_the_writer(database.store().await, |record| AuditRecord {
        subject: Some("ana\0".to_owned()),
        ..record
    })
    .await;

    // A job is its records and its remembered response together: a request
    // id PostgreSQL refuses fails its job, record included, and only it.
    let store: PostgresStore = database.store().await;
    let (writer, task) = AuditWriter::start(
        store.clone(),
        AuditOptions {
            batch: 512,
            in_flight: 1,
            timeout: Duration::from_secs(5),
            spool: None,
            spool_after: Duration::from_millis(50),
            replay_interval: Duration::from_secs(1),
        },
    )
    .expect("start the writer");
    let now = capgate::clock::now();
    let answer = |record: &AuditRecord, request_id: &str| {
        (
            "edge".to_owned(),
            request_id.to_owned(),
            Remembered {
                decision_id: record.decision_id.clone(),
                response: vec![1, 2, 3],
                at_ms: now,
                fingerprint: Some([7; 32]),
            },
        )
    };
    let (good, bad) = (sample(100, now), sample(101, now));
    let (good_answer, bad_answer) = (answer(&good, "retry-1"), answer(&bad, "retry\0"));
    let (kept, refused) = tokio::join!(
        writer.write(vec![good.clone()], vec![good_answer]),
        writer.write(vec![bad.clone()], vec![bad_answer]),
    );
    assert_eq!((kept, refused), (Ok(Durable::Stored), Err(AuditUnavailable)));
    let ids: Vec<String> = stored_records(&store)
        .await
        .into_iter()
        .map(|record| record.decision_id)
        .collect();
    assert!(ids.contains(&good.decision_id) && !ids.contains(&bad.decision_id));
    assert!(store.remembered("edge", "retry-1").await.expect("read").is_some());
    drop(writer);
    task.await.expect("the writer ends");
}

/// What a failed append says about itself.
#[track_caller]
fn refused_for_data(result: Result<(), StoreError>) -> bool {
    match result {
        Ok(()) => panic!("the store took it"),
        Err(error) => error.is_data_error(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_errors_are_told_from_outages() {
    let now = capgate::clock::now();
    let huge = AuditRecord {
        limit_calls: Some(u64::MAX),
        ..sample(1, now)
    };
    let file = tempfile::tempdir().expect("a temporary directory");
    let sqlite = SqliteStore::connect(
        &format!("sqlite://{}", file.path().join("capgate.db").display()),
        &StoreOptions::default(),
    )
    .await
    .expect("open SQLite");
    sqlite.migrate().await.expect("migrate");
    assert!(refused_for_data(
        sqlite.append_audit(std::slice::from_ref(&huge), &[]).await
    ));
    // SQLite holds a NUL: it is PostgreSQL that cannot.
    let nul = AuditRecord {
        subject: Some("ana\0".to_owned()),
        ..sample(2, now)
    };
    sqlite
        .append_audit(std::slice::from_ref(&nul), &[])
        .await
        .expect("SQLite takes a NUL");

    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let store = database.store().await;
    assert!(refused_for_data(store.append_audit(&[nul], &[]).await));
    assert!(refused_for_data(store.append_audit(&[huge], &[]).await));
    let answer = (
        "edge".to_owned(),
        "retry\0".to_owned(),
        Remembered {
            decision_id: sample(3, now).decision_id,
            response: Vec::new(),
            at_ms: now,
            fingerprint: Some([7; 32]),
        },
    );
    assert!(refused_for_data(store.append_audit(&[], &[answer]).await));

    // A store that cannot be reached is no data error, however it fails.
    let proxy = Proxy::start(database.server_addr()).await;
    let options = StoreOptions {
        acquire_timeout: Duration::from_millis(500),
        ..StoreOptions::default()
    };
    let reached = PostgresStore::connect_with(database.options_via(proxy.addr), &options)
        .await
        .expect("open the store through the proxy");
    reached
        .append_audit(&[sample(4, now)], &[])
        .await
        .expect("an append through the proxy");
    for mode in [Mode::Refuse, Mode::Blackhole] {
        proxy.set(mode);
        let failed = reached.append_audit(&[sample(5, now)], &[]).await;
        assert!(!refused_for_data(failed), "with the store {mode:?}");
    }
}
