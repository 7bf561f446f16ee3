//! Conditions on a call's arguments, end to end: the real `capgate serve` binary with
//! examples/refunds.yaml published (with its catalog), asked over gRPC `Decide` with
//! `arguments_json`, and its audit trail read back from the store and through `capgate audit`.
//!
//! * finance refunds any amount; support refunds at most 100, and only in Madrid office hours
//!   (the decision's instant is the server's clock, so the window is asserted either way with the
//!   example, and strictly with a variant published without it);
//! * a call without arguments is `arguments_missing`; malformed arguments are `INVALID_ARGUMENT`
//!   naming `arguments_json`, decide nothing, leave no record, and hold up nobody else;
//! * a `request_id` answers only for the same arguments;
//! * a record keeps the arguments' digest and never their values, unless the server was started
//!   with `--audit-arguments`, and then sensitive members are redacted and large arguments are
//!   not kept;
//! * a listing marks the refund tool conditional for support, not for finance.
//!
//! Every scenario runs on both stores: `sqlite::…` on a file in a temporary directory,
//! `postgres::…` on a fresh database in `DATABASE_URL` (skipped without it, unless
//! `CAPGATE_REQUIRE_POSTGRES=1`).

mod support;

use std::process::Command;
use std::time::Duration;

use capgate::store::{self, AnyStore, AuditFilter, AuditRecord, RecordOutcome, Store, StoreOptions};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{
    decide_request, list_visible_request, list_visible_response, AssertedPrincipal, DecideRequest,
    DecideResponse, ListVisibleRequest, Outcome, ReasonCode, Visible,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use support::client::{decision, principal, publish, summary, wait_serving};
use support::postgres::TestDatabase;
use support::process::Serve;

const REFUNDS: &str = include_str!("../examples/refunds.yaml");
const REFUNDS_CATALOG: &str = include_str!("../examples/refunds.catalog.yaml");
const REFUND: &str = "payments__create_refund";
const REFUND_CAPABILITY: &str = "billing.refund.create";

/// The example's office-hours window, which the variant below leaves out.
const OFFICE_HOURS: &str = r#"      - time:                          # /grants/0/when/2
          zone: Europe/Madrid
          days: [mon, tue, wed, thu, fri]
          from: "09:00"
          until: "18:00"
"#;

/// The example without its office-hours window: support's small refunds are allowed at any
/// instant, so a test can assert the allow whenever it runs.
fn refunds_at_any_hour() -> String {
    let variant = REFUNDS.replace(OFFICE_HOURS, "");
    assert_ne!(variant, REFUNDS, "the example's time window moved");
    variant
}

// ── The suite ─────────────────────────────────────────────────────────────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
}

crate::on_both_stores! {
    refunds_are_decided_on_their_arguments,
    malformed_arguments_are_refused_and_hold_up_nobody,
    a_request_id_answers_only_for_its_arguments,
    kept_arguments_are_redacted_and_bounded,
}

// ── A server with the refunds example ────────────────────────────────────

/// `capgate serve` on a fresh store of `kind`, the refunds example published, and the store
/// opened in this process to read the audit trail.
struct World {
    serve: Serve,
    url: String,
    store: AnyStore,
    _dir: tempfile::TempDir,
    _database: Option<TestDatabase>,
}

impl World {
    /// `None`: PostgreSQL was asked for and there is none (the test is skipped).
    async fn start(kind: Kind, extra: &[&str]) -> Option<World> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (url, database) = match kind {
            Kind::Sqlite => (
                format!("sqlite://{}", dir.path().join("capgate.db").display()),
                None,
            ),
            Kind::Postgres => {
                let database = TestDatabase::create().await?;
                (database.url(), Some(database))
            }
        };
        let mut args = vec!["--database-url", url.as_str()];
        args.extend_from_slice(extra);
        let serve = Serve::start(&args).await;
        let channel = serve.channel().await;
        let published = publish(&channel, REFUNDS, Some(REFUNDS_CATALOG))
            .await
            .expect("publish the refunds example");
        assert!(published.accepted, "{:?}", published.diagnostics);
        wait_serving(&channel, Duration::from_secs(10)).await;
        let store = store::connect(&url, &StoreOptions::default())
            .await
            .expect("open the server's store");
        Some(World {
            serve,
            url,
            store,
            _dir: dir,
            _database: database,
        })
    }

    async fn client(&self) -> DecisionServiceClient<Channel> {
        DecisionServiceClient::new(self.serve.channel().await)
    }

    /// `who` calls the refund tool with `arguments` as JSON text (`None`: not forwarded).
    async fn refund(
        &self,
        who: AssertedPrincipal,
        arguments: Option<&str>,
        request_id: &str,
    ) -> Result<DecideResponse, Status> {
        self.client()
            .await
            .decide(refund(who, arguments, request_id))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn publish(&self, artifact: &str) {
        let published = publish(&self.serve.channel().await, artifact, Some(REFUNDS_CATALOG))
            .await
            .expect("publish");
        assert!(published.accepted, "{:?}", published.diagnostics);
    }

    /// The audit record of `decision_id` (durable before the answer).
    async fn record(&self, decision_id: &str) -> AuditRecord {
        let found = self
            .store
            .query_audit(&AuditFilter {
                decision_id: Some(decision_id.to_owned()),
                limit: 2,
                ..AuditFilter::default()
            })
            .await
            .expect("query the audit trail");
        assert_eq!(found.len(), 1, "{found:?}");
        found.into_iter().next().expect("one record")
    }

    /// Every record, newest first.
    async fn records(&self) -> Vec<AuditRecord> {
        self.store
            .query_audit(&AuditFilter {
                limit: 10_000,
                ..AuditFilter::default()
            })
            .await
            .expect("query the audit trail")
    }

    /// What `capgate audit --decision-id ID` prints, human and `--json`.
    fn audit_cli(&self, decision_id: &str) -> (String, Value) {
        let run = |json: bool| {
            let mut args = vec!["audit", "--database-url", &self.url, "--decision-id", decision_id];
            if json {
                args.push("--json");
            }
            let output = Command::new(env!("CARGO_BIN_EXE_capgate"))
                .args(&args)
                .env_remove("CAPGATE_DATABASE_URL")
                .output()
                .expect("run capgate audit");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8(output.stdout).expect("UTF-8")
        };
        let json: Value = serde_json::from_str(&run(true)).expect("JSON");
        (run(false), json[0].clone())
    }
}

fn refund(who: AssertedPrincipal, arguments: Option<&str>, request_id: &str) -> DecideRequest {
    DecideRequest {
        caller: Some(decide_request::Caller::Principal(who)),
        target: Some(decide_request::Target::Tool(REFUND.to_owned())),
        request_id: request_id.to_owned(),
        arguments_json: arguments.map(str::to_owned),
    }
}

fn support(subject: &str) -> AssertedPrincipal {
    principal("staff", subject, &[("dept", &["support"])])
}

fn finance(subject: &str) -> AssertedPrincipal {
    principal("staff", subject, &[("dept", &["finance"])])
}

/// `sha256:<hex>` of `text`: the digest of arguments whose canonical form `text` is.
fn sha256(text: &str) -> String {
    let hash = Sha256::digest(text.as_bytes());
    format!(
        "sha256:{}",
        hash.iter().map(|byte| format!("{byte:02x}")).collect::<String>()
    )
}

/// The account an allow runs as.
#[track_caller]
fn account(response: &DecideResponse) -> String {
    decision(response)
        .account
        .as_ref()
        .map(|account| account.id.clone())
        .unwrap_or_default()
}

#[track_caller]
fn invalid_arguments(result: Result<DecideResponse, Status>, what: &str) -> Status {
    let status = result.expect_err(what);
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    assert!(
        status.message().starts_with("`arguments_json`: "),
        "{what}: {status:?}"
    );
    let fields: Vec<String> = status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["arguments_json"], "{what}");
    status
}

fn visible(response: tonic::Response<capgate::wire::proto::ListVisibleResponse>) -> Visible {
    match response.into_inner().result {
        Some(list_visible_response::Result::Visible(visible)) => visible,
        other => panic!("expected a listing, got {other:?}"),
    }
}

// ── Scenarios ─────────────────────────────────────────────────────────────

/// The example decided on the call's arguments; the record keeps their digest, never a value,
/// and the pointer of the condition that failed; a listing says which tools are conditional.
async fn refunds_are_decided_on_their_arguments(kind: Kind) {
    let Some(world) = World::start(kind, &[]).await else {
        return;
    };

    // Finance: any amount, at any time, as its own account.
    let large = r#"{"paymentId": "p-1", "amount": 5000, "currency": "EUR"}"#;
    let allowed = world
        .refund(finance("fay"), Some(large), "")
        .await
        .expect("an answer");
    let (outcome, code, path, _) = summary(&allowed);
    assert_eq!(
        (outcome, code, path.as_str()),
        (Outcome::Allow, ReasonCode::Granted, "/grants/1")
    );
    assert_eq!(account(&allowed), "finance-payments");
    let record = world.record(&allowed.decision_id).await;
    assert_eq!(
        record.arguments_digest.as_deref(),
        Some(sha256(r#"{"amount":5000,"currency":"EUR","paymentId":"p-1"}"#).as_str())
    );
    // Never the values, by default.
    assert_eq!((record.arguments, record.arguments_omitted), (None, None));

    // Support, 50 EUR, with the example's office hours: allowed inside them, denied on the
    // window (and on nothing else) outside them — whichever the server's clock says now.
    let small = r#"{"currency": "EUR", "amount": 50, "paymentId": "p-2"}"#;
    let answered = world
        .refund(support("sam"), Some(small), "")
        .await
        .expect("an answer");
    match summary(&answered) {
        (Outcome::Allow, ReasonCode::Granted, path, _) => {
            assert_eq!(path, "/grants/0");
            assert_eq!(account(&answered), "support-payments");
        }
        (Outcome::Deny, ReasonCode::ConditionFailed, path, subject) => {
            assert_eq!((path.as_str(), subject.as_str()), ("/grants/0/when/2", "time"));
        }
        other => panic!("support's small refund: {other:?}"),
    }

    // Support, 150: over the amount, at any time; the record names the condition.
    let over = r#"{"paymentId": "p-3", "amount": 150, "currency": "EUR"}"#;
    let denied = world
        .refund(support("sam"), Some(over), "")
        .await
        .expect("an answer");
    let (outcome, code, path, subject) = summary(&denied);
    assert_eq!(
        (outcome, code, path.as_str(), subject.as_str()),
        (
            Outcome::Deny,
            ReasonCode::ConditionFailed,
            "/grants/0/when/0",
            "amount"
        )
    );
    let record = world.record(&denied.decision_id).await;
    assert_eq!(record.outcome, RecordOutcome::Deny);
    assert_eq!(record.code.map(|code| code.as_str()), Some("condition_failed"));
    assert_eq!(record.path.as_deref(), Some("/grants/0/when/0"));
    assert_eq!(
        record.arguments_digest.as_deref(),
        Some(sha256(r#"{"amount":150,"currency":"EUR","paymentId":"p-3"}"#).as_str())
    );
    assert_eq!(record.arguments, None);

    // Support without arguments: the conditions cannot be read.
    let missing = world.refund(support("sam"), None, "").await.expect("an answer");
    let (outcome, code, _, _) = summary(&missing);
    assert_eq!((outcome, code), (Outcome::Deny, ReasonCode::ArgumentsMissing));
    let record = world.record(&missing.decision_id).await;
    assert_eq!(record.code.map(|code| code.as_str()), Some("arguments_missing"));
    // No arguments, no digest.
    assert_eq!(record.arguments_digest, None);

    // A listing: support's refunds are conditional, finance's are not.
    let listing = |who: AssertedPrincipal| {
        let world = &world;
        async move {
            let visible = visible(
                world
                    .client()
                    .await
                    .list_visible(ListVisibleRequest {
                        caller: Some(list_visible_request::Caller::Principal(who)),
                        request_id: String::new(),
                    })
                    .await
                    .expect("a listing"),
            );
            let capability = visible
                .capabilities
                .iter()
                .find(|item| item.capability == REFUND_CAPABILITY)
                .map(|item| item.conditional)
                .expect("refunds are visible");
            let tool = visible
                .tools
                .iter()
                .find(|tool| tool.exposed_name == REFUND)
                .map(|tool| tool.conditional)
                .expect("the refund tool is visible");
            (capability, tool)
        }
    };
    assert_eq!(listing(support("sam")).await, (true, true));
    assert_eq!(listing(finance("fay")).await, (false, false));

    // Without the window, support's small refund is allowed whenever the test runs.
    world.publish(&refunds_at_any_hour()).await;
    let allowed = world
        .refund(support("sam"), Some(small), "")
        .await
        .expect("an answer");
    let (outcome, code, path, _) = summary(&allowed);
    assert_eq!(
        (outcome, code, path.as_str()),
        (Outcome::Allow, ReasonCode::Granted, "/grants/0")
    );
    assert_eq!(account(&allowed), "support-payments");
    let record = world.record(&allowed.decision_id).await;
    assert_eq!(
        record.arguments_digest.as_deref(),
        Some(sha256(r#"{"amount":50,"currency":"EUR","paymentId":"p-2"}"#).as_str())
    );
}

/// Arguments that are not JSON, not an object, or over 64 KiB are refused `INVALID_ARGUMENT`
/// naming `arguments_json`: nothing decided, nothing recorded, and another caller asking at the
/// same time is answered.
async fn malformed_arguments_are_refused_and_hold_up_nobody(kind: Kind) {
    let Some(world) = World::start(kind, &[]).await else {
        return;
    };
    let oversized = format!(r#"{{"note":"{}"}}"#, "x".repeat(65 * 1024));
    let malformed: Vec<(&str, String)> = vec![
        ("not JSON", r#"{"amount": 50,"#.to_owned()),
        ("an array", r#"[{"amount": 50}]"#.to_owned()),
        ("65 KiB", oversized),
    ];
    for (what, text) in &malformed {
        let status = invalid_arguments(world.refund(support("mallory"), Some(text), "").await, what);
        match *what {
            "not JSON" => assert!(status.message().contains("not JSON"), "{status:?}"),
            "an array" => assert!(
                status.message().contains("an array, not a JSON object"),
                "{status:?}"
            ),
            _ => assert!(
                status.message().contains("more than the limit of 65536"),
                "{status:?}"
            ),
        }
    }

    // Many malformed requests at once, and a good one among them.
    let mut refused = Vec::new();
    for n in 0..16 {
        let (what, text) = malformed[n % malformed.len()].clone();
        let mut client = world.client().await;
        refused.push(tokio::spawn(async move {
            let request = refund(support("mallory"), Some(&text), &format!("bad-{n}"));
            (
                what,
                client.decide(request).await.map(tonic::Response::into_inner),
            )
        }));
    }
    let good = world
        .refund(
            finance("fay"),
            Some(r#"{"paymentId": "p-9", "amount": 10, "currency": "USD"}"#),
            "good-1",
        )
        .await
        .expect("the good request is answered");
    assert_eq!(summary(&good).0, Outcome::Allow);
    for refusal in refused {
        let (what, result) = refusal.await.expect("the task");
        invalid_arguments(result, what);
    }

    // Nothing of Mallory's was decided or recorded; Fay's good request was.
    let records = world.records().await;
    assert!(
        records
            .iter()
            .all(|record| record.subject.as_deref() != Some("mallory")),
        "{records:?}"
    );
    assert!(records
        .iter()
        .any(|record| record.decision_id == good.decision_id));
    // The server is still up and answering.
    assert_eq!(
        summary(
            &world
                .refund(finance("fay"), Some("{}"), "")
                .await
                .expect("an answer")
        )
        .0,
        Outcome::Allow
    );
}

/// A retry with the same `request_id` must carry the same arguments (in any member order): the
/// same arguments are replayed, other arguments are another request and refused.
async fn a_request_id_answers_only_for_its_arguments(kind: Kind) {
    let Some(world) = World::start(kind, &[]).await else {
        return;
    };
    let first = world
        .refund(
            support("sam"),
            Some(r#"{"paymentId": "p-4", "amount": 150, "currency": "EUR"}"#),
            "r-args-1",
        )
        .await
        .expect("an answer");
    assert_eq!(summary(&first).1, ReasonCode::ConditionFailed);

    // The same arguments, written in another order: the same request, replayed.
    let retry = world
        .refund(
            support("sam"),
            Some(r#"{"currency":"EUR","amount":150,"paymentId":"p-4"}"#),
            "r-args-1",
        )
        .await
        .expect("a replay");
    assert_eq!(retry.decision_id, first.decision_id);

    // Other arguments under the same id — here ones the grant would allow — are another request.
    for other in [
        Some(r#"{"paymentId": "p-4", "amount": 50, "currency": "EUR"}"#),
        Some("{}"),
        None,
    ] {
        let status = world
            .refund(support("sam"), other, "r-args-1")
            .await
            .expect_err("another request under the same id");
        assert_eq!(status.code(), Code::InvalidArgument, "{other:?}: {status:?}");
        assert!(
            status
                .message()
                .starts_with("`request_id` `r-args-1` was already used for another request"),
            "{other:?}: {status:?}"
        );
    }

    // The records: the decision, its replay, and three refused reuses, each with the digest of
    // the arguments it came with.
    let records = world
        .store
        .query_audit(&AuditFilter {
            request_id: Some("r-args-1".to_owned()),
            oldest_first: true,
            limit: 10,
            ..AuditFilter::default()
        })
        .await
        .expect("query");
    let outcomes: Vec<RecordOutcome> = records.iter().map(|record| record.outcome).collect();
    assert_eq!(
        outcomes,
        [
            RecordOutcome::Deny,
            RecordOutcome::Replayed,
            RecordOutcome::RequestIdReused,
            RecordOutcome::RequestIdReused,
            RecordOutcome::RequestIdReused,
        ]
    );
    let digests: Vec<Option<String>> = records
        .iter()
        .map(|record| record.arguments_digest.clone())
        .collect();
    let first_digest = Some(sha256(r#"{"amount":150,"currency":"EUR","paymentId":"p-4"}"#));
    assert_eq!(
        digests,
        [
            first_digest.clone(),
            first_digest,
            Some(sha256(r#"{"amount":50,"currency":"EUR","paymentId":"p-4"}"#)),
            Some(sha256("{}")),
            None,
        ]
    );
}

/// With `--audit-arguments`, a record keeps the arguments, every sensitive member redacted (by
/// the built-in words and by `--audit-redact`), and only the digest of arguments over 16 KiB;
/// `capgate audit` shows them.
async fn kept_arguments_are_redacted_and_bounded(kind: Kind) {
    let Some(world) = World::start(kind, &["--audit-arguments", "--audit-redact", "IBAN"]).await else {
        return;
    };
    let arguments = r#"{"paymentId": "p-5", "amount": 70, "currency": "EUR",
        "password": "hunter2", "payer": {"iban": "ES91-2100", "sessionToken": "s-123", "name": "Ana"}}"#;
    let allowed = world
        .refund(finance("fay"), Some(arguments), "")
        .await
        .expect("an answer");
    assert_eq!(summary(&allowed).0, Outcome::Allow);
    let record = world.record(&allowed.decision_id).await;
    // The digest is of the arguments as sent.
    let sent: serde_json::Map<String, Value> = serde_json::from_str(arguments).expect("JSON");
    assert_eq!(
        record.arguments_digest.as_deref(),
        Some(
            sha256(
                r#"{"amount":70,"currency":"EUR","password":"hunter2","payer":{"iban":"ES91-2100","name":"Ana","sessionToken":"s-123"},"paymentId":"p-5"}"#
            )
            .as_str()
        ),
        "{sent:?}"
    );
    let kept = record.arguments.clone().expect("the arguments are kept");
    assert_eq!(
        kept,
        r#"{"amount":70,"currency":"EUR","password":"[redacted]","payer":{"iban":"[redacted]","name":"Ana","sessionToken":"[redacted]"},"paymentId":"p-5"}"#
    );
    let whole = format!("{record:?}");
    for secret in ["hunter2", "ES91-2100", "s-123"] {
        assert!(!whole.contains(secret), "{secret} in {whole}");
    }

    // `capgate audit` shows the digest and what was kept, the JSON form as an object.
    let (human, json) = world.audit_cli(&allowed.decision_id);
    let digest = record.arguments_digest.clone().expect("a digest");
    assert!(
        human.contains(&format!("  arguments={digest} {kept}  ")),
        "{human}"
    );
    assert_eq!(json["arguments_digest"], Value::from(digest));
    assert_eq!(json["arguments"]["password"], Value::from("[redacted]"));
    assert_eq!(json["arguments"]["payer"]["name"], Value::from("Ana"));

    // Over 16 KiB once redacted (and within the 64 KiB a request may send): the digest and the
    // size only.
    let large = format!(
        r#"{{"paymentId": "p-6", "amount": 1, "currency": "EUR", "memo": "{}"}}"#,
        "m".repeat(20 * 1024)
    );
    let allowed = world
        .refund(finance("fay"), Some(&large), "")
        .await
        .expect("an answer");
    let record = world.record(&allowed.decision_id).await;
    assert!(record.arguments_digest.is_some());
    assert_eq!(record.arguments, None);
    let size = r#"{"amount":1,"currency":"EUR","memo":"","paymentId":"p-6"}"#.len() + 20 * 1024;
    assert_eq!(record.arguments_omitted, Some(size as u64));
    let (human, _) = world.audit_cli(&allowed.decision_id);
    assert!(
        human.contains(&format!("(values not kept: {size} bytes)")),
        "{human}"
    );
}
