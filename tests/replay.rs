//! `capgate replay` end to end: a real `capgate serve` decides calls and listings on
//! tests/fixtures/replay/active.yaml (and on examples/refunds.yaml, with and without
//! `--audit-arguments`) into a real store — an SQLite file and a fresh PostgreSQL database — a few
//! rows are added behind it through the store port (from before principals were kept, a retry
//! answered again, a listing recorded in part), and the binary replays the trail under the
//! candidates of tests/fixtures/replay/.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use capgate::store::{
    self, AnyStore, AuditRecord, RecordCode, RecordKind, RecordOutcome, Store, StoreOptions,
};
use capgate::wire::proto::decision_service_client::DecisionServiceClient;
use capgate::wire::proto::{list_visible_request, DecideRequest, ListVisibleRequest};
use capgate_core::access::ReasonCode;
use serde_json::Value;
use support::client::{for_capability, for_tool, principal, wait_serving};
use support::postgres::TestDatabase;
use support::process::Serve;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

enum Kind {
    Sqlite,
    Postgres,
}

crate::on_both_stores! {
    every_kind_of_change_is_counted_and_what_cannot_be_replayed_is_counted_by_cause,
    fail_on_widening_passes_a_candidate_that_only_narrows,
    kept_arguments_are_replayed_and_a_digest_alone_is_not_when_the_candidate_reads_them,
}

/// A fresh store: its URL and the store opened in this process (for rows added behind the
/// server), kept alive with what removes it.
struct Database {
    url: String,
    store: AnyStore,
    _dir: tempfile::TempDir,
    _postgres: Option<TestDatabase>,
}

async fn database(kind: Kind) -> Database {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (url, postgres) = match kind {
        Kind::Sqlite => (
            format!("sqlite://{}", dir.path().join("capgate.db").display()),
            None,
        ),
        Kind::Postgres => {
            let database = TestDatabase::create().await.expect("a PostgreSQL server");
            database.migrate().await.expect("migrate");
            (database.url(), Some(database))
        }
    };
    let store = store::connect(&url, &StoreOptions::default())
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    Database {
        url,
        store,
        _dir: dir,
        _postgres: postgres,
    }
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/replay")
        .join(name)
        .display()
        .to_string()
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .display()
        .to_string()
}

async fn serve(
    url: &str,
    policy: &str,
    extra: &[&str],
) -> (Serve, DecisionServiceClient<tonic::transport::Channel>) {
    let mut args = vec!["--database-url", url, "--policy", policy];
    args.extend(extra);
    let server = Serve::start(&args).await;
    let channel = server.channel().await;
    wait_serving(&channel, Duration::from_secs(20)).await;
    (server, DecisionServiceClient::new(channel))
}

async fn decide(
    client: &mut DecisionServiceClient<tonic::transport::Channel>,
    request: DecideRequest,
) -> String {
    let response = client.decide(request).await.expect("a decision").into_inner();
    response.decision_id
}

async fn list(client: &mut DecisionServiceClient<tonic::transport::Channel>, dept: &str) {
    client
        .list_visible(ListVisibleRequest {
            caller: Some(list_visible_request::Caller::Principal(principal(
                "staff",
                dept_subject(dept),
                &[("dept", &[dept])],
            ))),
            request_id: String::new(),
        })
        .await
        .expect("a listing");
}

fn dept_subject(dept: &str) -> &'static str {
    match dept {
        "support" => "ana",
        "finance" => "fay",
        _ => "eng",
    }
}

fn staff(dept: &str) -> capgate::wire::proto::AssertedPrincipal {
    principal("staff", dept_subject(dept), &[("dept", &[dept])])
}

/// One run of `capgate replay`.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| panic!("{error}: {}", self.stdout))
    }
}

fn replay(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(BIN)
        .arg("replay")
        .args(args)
        .current_dir(dir.path())
        .env_remove("CAPGATE_DATABASE_URL")
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    }
}

/// `transition` → records, and `cause` → records, of a `--json` document.
fn counts(document: &Value, list: &str, key: &str) -> Vec<(String, u64)> {
    document[list]
        .as_array()
        .expect("an array")
        .iter()
        .map(|item| {
            (
                item[key].as_str().unwrap().to_owned(),
                item["records"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn of(counts: &[(String, u64)], name: &str) -> u64 {
    counts
        .iter()
        .find(|(key, _)| key == name)
        .unwrap_or_else(|| panic!("no `{name}` in {counts:?}"))
        .1
}

fn now_ms() -> i64 {
    capgate::clock::now()
}

/// The rows a server does not write today: one from before principals were kept (two), a retry
/// answered again, a listing recorded in part.
async fn rows_behind_the_server(store: &AnyStore) {
    let at = now_ms() - 60_000;
    let old = |id: &str| AuditRecord {
        decision_id: id.to_owned(),
        at_ms: at,
        gateway: "loopback".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(ReasonCode::Granted)),
        path: Some("/grants/0".to_owned()),
        principal_id: Some("staff:old".to_owned()),
        issuer: Some("staff".to_owned()),
        subject: Some("old".to_owned()),
        capability: Some("tickets.read".to_owned()),
        account_id: Some("reader".to_owned()),
        ..AuditRecord::default()
    };
    let replayed = AuditRecord {
        outcome: RecordOutcome::Replayed,
        code: None,
        first_decision_id: Some("old-1".to_owned()),
        ..old("retry-1")
    };
    let truncated = AuditRecord {
        kind: RecordKind::List,
        code: None,
        path: None,
        capability: None,
        account_id: None,
        principal_id: Some("staff:ana".to_owned()),
        subject: Some("ana".to_owned()),
        attributes: Some(r#"{"dept":"support"}"#.to_owned()),
        visible_count: Some(3),
        visible: vec!["tickets.read".to_owned()],
        ..old("listing-part")
    };
    store
        .append_audit(&[old("old-1"), old("old-2"), replayed, truncated], &[])
        .await
        .expect("append");
}

async fn every_kind_of_change_is_counted_and_what_cannot_be_replayed_is_counted_by_cause(kind: Kind) {
    let database = database(kind).await;
    let (server, mut client) = serve(&database.url, &fixture("active.yaml"), &[]).await;
    // deny → allow: support may refund under the candidate, 5 calls an hour.
    let widened = decide(&mut client, for_tool(staff("support"), "billing__refund")).await;
    // allow → deny: support no longer writes tickets.
    decide(
        &mut client,
        for_tool(staff("support"), "helpdesk__comment_ticket"),
    )
    .await;
    // ceiling changed: 10 → 20 an hour.
    decide(&mut client, for_capability(staff("support"), "tickets.read")).await;
    // account changed: docs-bot → docs-bot-2.
    decide(&mut client, for_tool(staff("support"), "docs__search")).await;
    // reason changed: no_grant_matches → account_disabled.
    decide(&mut client, for_capability(staff("support"), "reports.view")).await;
    // Unchanged: finance's reports; a tool neither version knows.
    decide(&mut client, for_tool(staff("finance"), "reports__view")).await;
    decide(&mut client, for_tool(staff("support"), "helpdesk__nope")).await;
    // Not replayable: an issuer nobody declares, so no principal.
    decide(
        &mut client,
        for_tool(principal("nobody", "x", &[]), "reports__view"),
    )
    .await;
    // Listings: support's changes (shows billing.refund, hides tickets.write); finance's does not.
    list(&mut client, "support").await;
    list(&mut client, "finance").await;
    drop(server);
    rows_behind_the_server(&database.store).await;

    let run = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--database-url",
        &database.url,
        "--json",
        "--examples",
        "1",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let document = run.json();
    let records = &document["records"];
    assert_eq!(records["read"], 14, "{document:#}");
    assert_eq!(records["replayed"], 9, "{document:#}");
    assert_eq!(records["unchanged"], 3, "{document:#}");
    assert_eq!(records["changed"], 6, "{document:#}");
    assert_eq!(records["not_replayable"], 5, "{document:#}");
    let transitions = counts(&document, "transitions", "transition");
    let names: Vec<&str> = transitions.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "deny_to_allow",
            "allow_to_deny",
            "account_changed",
            "ceiling_changed",
            "reason_changed",
            "listing_widened",
            "listing_narrowed",
            "listing_changed"
        ]
    );
    let counted: Vec<u64> = transitions.iter().map(|(_, records)| *records).collect();
    assert_eq!(counted, [1, 1, 1, 1, 1, 0, 0, 1], "{document:#}");
    let causes = counts(&document, "not_replayable", "cause");
    assert_eq!(of(&causes, "not_a_decision"), 1, "{causes:?}");
    assert_eq!(of(&causes, "unauthenticated"), 1, "{causes:?}");
    assert_eq!(of(&causes, "recorded_before_principals"), 2, "{causes:?}");
    assert_eq!(of(&causes, "listing_truncated"), 1, "{causes:?}");
    assert_eq!(of(&causes, "arguments_not_kept"), 0, "{causes:?}");
    assert_eq!(of(&causes, "unreadable"), 0, "{causes:?}");
    // The refund had no usage reading (no ceiling applied) and the candidate caps it; the ticket
    // read is checked against the one call it recorded.
    assert_eq!(document["ceilings"]["without_recorded_usage"], 1, "{document:#}");
    assert_eq!(document["ceilings"]["against_recorded_usage"], 1, "{document:#}");
    // The most affected: ana, six times.
    assert_eq!(document["principals"][0]["principal"], "staff:ana");
    assert_eq!(document["principals"][0]["records"], 6);
    // One example per transition, with both sides.
    let example = &document["transitions"][0]["examples"][0];
    assert_eq!(example["decision_id"], widened.as_str(), "{example:#}");
    assert_eq!(example["kind"], "decide");
    assert_eq!(example["tool"], "billing__refund");
    assert_eq!(example["before"]["outcome"], "deny");
    assert_eq!(example["before"]["code"], "no_grant_matches");
    assert_eq!(example["after"]["outcome"], "allow");
    assert_eq!(example["after"]["account"], "writer");
    assert_eq!(example["after"]["limits"]["calls"], 5);
    let listing = &document["transitions"][7]["examples"][0];
    assert_eq!(listing["kind"], "list");
    assert_eq!(listing["gained"], serde_json::json!(["billing.refund"]));
    assert_eq!(listing["lost"], serde_json::json!(["tickets.write"]));

    // The human report says the same.
    let human = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--database-url",
        &database.url,
    ]);
    assert_eq!(human.code, 0, "{}", human.stderr);
    for line in [
        "14 records read: 9 replayed (3 unchanged, 6 changed), 5 not replayable",
        "deny → allow               1  (widening)",
        "recorded before principals were kept",
        "1 checked against recorded usage, 1 against no recorded usage",
    ] {
        assert!(human.stdout.contains(line), "no `{line}` in:\n{}", human.stdout);
    }

    // --fail-on: a widening is found.
    for which in ["widening", "any"] {
        let failing = replay(&[
            "--policy",
            &fixture("candidate.yaml"),
            "--since",
            "1h",
            "--database-url",
            &database.url,
            "--fail-on",
            which,
        ]);
        assert_eq!(failing.code, 1, "--fail-on {which}: {}", failing.stderr);
    }
    // The version that decided them: nothing changes.
    let same = replay(&[
        "--policy",
        &fixture("active.yaml"),
        "--since",
        "1h",
        "--database-url",
        &database.url,
        "--fail-on",
        "any",
        "--json",
    ]);
    assert_eq!(same.code, 0, "{}{}", same.stdout, same.stderr);
    assert_eq!(same.json()["records"]["unchanged"], 9);
    // A window that holds none of them.
    let before = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "3h",
        "--until",
        "2h",
        "--database-url",
        &database.url,
        "--json",
    ]);
    assert_eq!(before.json()["records"]["read"], 0);
}

async fn fail_on_widening_passes_a_candidate_that_only_narrows(kind: Kind) {
    let database = database(kind).await;
    let (server, mut client) = serve(&database.url, &fixture("active.yaml"), &[]).await;
    decide(
        &mut client,
        for_tool(staff("support"), "helpdesk__comment_ticket"),
    )
    .await;
    list(&mut client, "support").await;
    drop(server);
    let run = |which: &str| {
        replay(&[
            "--policy",
            &fixture("narrower.yaml"),
            "--since",
            "1h",
            "--database-url",
            &database.url,
            "--fail-on",
            which,
            "--json",
        ])
    };
    let widening = run("widening");
    assert_eq!(widening.code, 0, "{}{}", widening.stdout, widening.stderr);
    let transitions = counts(&widening.json(), "transitions", "transition");
    assert_eq!(of(&transitions, "allow_to_deny"), 1);
    assert_eq!(of(&transitions, "listing_narrowed"), 1);
    assert_eq!(run("any").code, 1);
}

async fn kept_arguments_are_replayed_and_a_digest_alone_is_not_when_the_candidate_reads_them(kind: Kind) {
    let database = database(kind).await;
    let policy = example("refunds.yaml");
    let catalog = example("refunds.catalog.yaml");
    let calls = |client: &mut DecisionServiceClient<tonic::transport::Channel>| {
        let mut client = client.clone();
        async move {
            // Engineering approves a staging release: its grant's condition reads `environment`.
            let mut release = for_tool(staff("engineering"), "ci__approve_release");
            release.arguments_json = Some(r#"{"environment": "staging"}"#.to_owned());
            decide(&mut client, release).await;
            // Finance refunds: its grant has no condition.
            let mut refund = for_tool(staff("finance"), "payments__create_refund");
            refund.arguments_json = Some(r#"{"amount": 500, "currency": "EUR"}"#.to_owned());
            decide(&mut client, refund).await;
        }
    };
    // First with the arguments kept, then with only their digest.
    let (server, mut client) = serve(
        &database.url,
        &policy,
        &["--catalog", &catalog, "--audit-arguments"],
    )
    .await;
    calls(&mut client).await;
    drop(server);
    let (server, mut client) = serve(&database.url, &policy, &["--catalog", &catalog]).await;
    calls(&mut client).await;
    drop(server);

    // The candidate approves production releases only.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let candidate: PathBuf = dir.path().join("refunds-production.yaml");
    let text = std::fs::read_to_string(&policy).expect("the example");
    let changed = text.replace("equals: staging", "equals: production");
    assert_ne!(changed, text, "the example's condition moved");
    std::fs::write(&candidate, changed).expect("write the candidate");
    let run = replay(&[
        "--policy",
        &candidate.display().to_string(),
        "--catalog",
        &catalog,
        "--since",
        "1h",
        "--database-url",
        &database.url,
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let document = run.json();
    assert_eq!(document["records"]["read"], 4, "{document:#}");
    // Both refunds (no condition reads their arguments) and the kept release.
    assert_eq!(document["records"]["replayed"], 3, "{document:#}");
    let transitions = counts(&document, "transitions", "transition");
    assert_eq!(of(&transitions, "allow_to_deny"), 1, "{document:#}");
    let example = &document["transitions"][1]["examples"][0];
    assert_eq!(example["after"]["code"], "condition_failed", "{example:#}");
    let causes = counts(&document, "not_replayable", "cause");
    assert_eq!(of(&causes, "arguments_not_kept"), 1, "{document:#}");
}

#[test]
fn a_candidate_that_does_not_compile_is_shown_as_validate_shows_it_and_exits_3() {
    let run = replay(&[
        "--policy",
        &fixture("malformed.yaml"),
        "--since",
        "1h",
        "--database-url",
        "sqlite:///nonexistent/capgate.db",
    ]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("malformed.yaml:25:12  error  unknown_account_in_grant"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("nothing replayed"), "{}", run.stderr);
    let json = replay(&["--policy", &fixture("malformed.yaml"), "--since", "1h", "--json"]);
    assert_eq!(json.code, 3);
    let document = json.json();
    assert_eq!(document["diagnostics"][0]["position"]["line"], 25);
    assert_eq!(document["diagnostics"][0]["position"]["column"], 12);
}

#[test]
fn a_store_that_cannot_be_reached_or_is_not_there_is_named() {
    // Nothing listens on port 1.
    let unreachable = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/capgate",
    ]);
    assert_eq!(unreachable.code, 3, "{}", unreachable.stderr);
    assert!(
        unreachable
            .stderr
            .contains("cannot open `postgres://postgres@127.0.0.1:1/capgate`"),
        "{}",
        unreachable.stderr
    );
    let missing = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--database-url",
        "sqlite://missing.db",
    ]);
    assert_eq!(missing.code, 3);
    assert!(
        missing
            .stderr
            .contains("no capgate store at `sqlite://missing.db`"),
        "{}",
        missing.stderr
    );
}

#[test]
fn usage_errors_exit_2() {
    let backwards = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--until",
        "2h",
    ]);
    assert_eq!(backwards.code, 2, "{}", backwards.stderr);
    assert!(
        backwards.stderr.contains("is not before `--until"),
        "{}",
        backwards.stderr
    );
    let no_window = replay(&["--policy", &fixture("candidate.yaml")]);
    assert_eq!(no_window.code, 2);
    assert!(no_window.stderr.contains("--since"), "{}", no_window.stderr);
    let bad_fail_on = replay(&[
        "--policy",
        &fixture("candidate.yaml"),
        "--since",
        "1h",
        "--fail-on",
        "sometimes",
    ]);
    assert_eq!(bad_fail_on.code, 2);
}
