//! `capgate audit prune` end to end: the binary against real stores — a
//! SQLite file and a fresh PostgreSQL database — seeded through the store
//! port with records spread over months. Both stores must print the same
//! text: the prune's contract does not depend on the store.
//!
//! Also: `capgate audit` without a subcommand still queries, and the
//! command's usage errors (exit 2, naming the flag).

mod support;

use std::process::Command;

use capgate::store::{
    AuditFilter, AuditRecord, DecisionNote, Note, PostgresStore, RecordCode, RecordKind, RecordOutcome,
    SqliteStore, Store, StoreOptions,
};
use capgate_core::access::ReasonCode;
use serde_json::Value;
use support::postgres::TestDatabase;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// One run of the binary.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary in an empty directory of its own, so that a default
/// store it might open (`sqlite://capgate.db`) never lands in the tree.
fn capgate(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(BIN)
        .args(args)
        .current_dir(dir.path())
        .env_remove("CAPGATE_DATABASE_URL")
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Midnight UTC of the first of a month of 2025 (13: January 2026).
fn month_start(month: u8) -> i64 {
    let (year, month) = if month == 13 { (2026, 1) } else { (2025, month) };
    let month = time::Month::try_from(month).expect("a month");
    let date = time::Date::from_calendar_date(year, month, 1).expect("a date");
    i64::try_from(date.midnight().assume_utc().unix_timestamp_nanos() / 1_000_000).expect("in range")
}

/// Three records in each month from January to June 2025: the first
/// millisecond, one in the middle, the last millisecond.
fn records() -> Vec<AuditRecord> {
    let mut records = Vec::new();
    for month in 1..=6u8 {
        let (start, end) = (month_start(month), month_start(month + 1));
        for (i, at) in [start, start + 15 * 86_400_000, end - 1].into_iter().enumerate() {
            records.push(AuditRecord {
                decision_id: format!("d{month}{i}"),
                at_ms: at,
                gateway: "edge".to_owned(),
                kind: RecordKind::Decide,
                outcome: RecordOutcome::Allow,
                code: Some(RecordCode::Reason(ReasonCode::Granted)),
                principal_id: Some(if i == 1 { "staff:ana" } else { "staff:bo" }.to_owned()),
                capability: Some("tickets.read".to_owned()),
                ..AuditRecord::default()
            });
        }
    }
    records
}

fn everything() -> AuditFilter {
    AuditFilter {
        limit: 1_000,
        ..AuditFilter::default()
    }
}

const DRY_RUN: &str = "\
would drop audit_log_p2025_01  [2025-01-01T00:00:00Z, 2025-02-01T00:00:00Z)  3 record(s)
would drop audit_log_p2025_02  [2025-02-01T00:00:00Z, 2025-03-01T00:00:00Z)  3 record(s)
would drop audit_log_p2025_03  [2025-03-01T00:00:00Z, 2025-04-01T00:00:00Z)  3 record(s)
dry run: 3 month(s), 9 record(s) would be dropped; nothing was
kept whole: the month from 2025-04-01T00:00:00Z holds 2025-04-15T00:00:00Z, and everything after it
";

const PRUNED: &str = "\
dropped audit_log_p2025_01  [2025-01-01T00:00:00Z, 2025-02-01T00:00:00Z)  3 record(s)
dropped audit_log_p2025_02  [2025-02-01T00:00:00Z, 2025-03-01T00:00:00Z)  3 record(s)
dropped audit_log_p2025_03  [2025-03-01T00:00:00Z, 2025-04-01T00:00:00Z)  3 record(s)
dropped 3 month(s), 9 record(s)
kept whole: the month from 2025-04-01T00:00:00Z holds 2025-04-15T00:00:00Z, and everything after it
";

/// The whole tour on one store: `url` names it, `store` is the same store
/// opened in this process (migrated), to seed it and look at it.
fn prune_end_to_end<S: Store>(url: &str, store: &S) {
    let runtime = runtime();
    runtime
        .block_on(store.append_audit(&records(), &[]))
        .expect("seed the audit trail");
    let before = runtime.block_on(store.query_audit(&everything())).expect("query");
    assert_eq!(before.len(), 18);

    // The dry run says what would go, and nothing goes.
    let dry = capgate(&[
        "audit",
        "prune",
        "--before",
        "2025-04-15",
        "--dry-run",
        "--database-url",
        url,
    ]);
    assert_eq!((dry.code, dry.stderr.as_str()), (0, ""), "{dry:?}");
    assert_eq!(dry.stdout, DRY_RUN);
    assert_eq!(
        runtime.block_on(store.query_audit(&everything())).expect("query"),
        before
    );

    let json = capgate(&[
        "audit",
        "prune",
        "--before",
        "2025-04-15T00:00:00Z",
        "--dry-run",
        "--json",
        "--database-url",
        url,
    ]);
    assert_eq!(json.code, 0, "{json:?}");
    let document: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(document["dry_run"], true);
    assert_eq!(document["before"], "2025-04-15T00:00:00Z");
    assert_eq!(document["kept_from"], "2025-04-01T00:00:00Z");
    assert_eq!(document["records"], 9);
    assert_eq!(
        document["dropped"][0],
        serde_json::json!({
            "name": "audit_log_p2025_01",
            "from": "2025-01-01T00:00:00Z",
            "until": "2025-02-01T00:00:00Z",
            "records": 3,
        })
    );
    assert_eq!(
        runtime.block_on(store.query_audit(&everything())).expect("query"),
        before
    );

    // The prune does it: January to March go, April (which holds the cutoff)
    // and everything after it stay, record for record.
    let pruned = capgate(&["audit", "prune", "--before", "2025-04-15", "--database-url", url]);
    assert_eq!((pruned.code, pruned.stderr.as_str()), (0, ""), "{pruned:?}");
    assert_eq!(pruned.stdout, PRUNED);
    let kept: Vec<AuditRecord> = before
        .iter()
        .filter(|record| record.at_ms >= month_start(4))
        .cloned()
        .collect();
    assert_eq!(
        runtime.block_on(store.query_audit(&everything())).expect("query"),
        kept
    );

    let again = capgate(&["audit", "prune", "--before", "2025-04-15", "--database-url", url]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        again.stdout,
        "nothing to drop: no month of the audit trail ends by 2025-04-15T00:00:00Z\n\
         kept whole: the month from 2025-04-01T00:00:00Z holds 2025-04-15T00:00:00Z, and everything after it\n"
    );

    // `capgate audit` without a subcommand still queries.
    let query = capgate(&[
        "audit",
        "--principal",
        "staff:ana",
        "--json",
        "--database-url",
        url,
    ]);
    assert_eq!(query.code, 0, "{query:?}");
    let found: Value = serde_json::from_str(&query.stdout).expect("JSON");
    assert_eq!(found.as_array().map(Vec::len), Some(3), "April to June, one each");
    // The contract of `--json`: every column, by its name, in table order.
    let keys: Vec<&str> = found[0]
        .as_object()
        .expect("a record is an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "decision_id",
            "at_ms",
            "request_id",
            "gateway",
            "kind",
            "outcome",
            "code",
            "path",
            "principal_id",
            "issuer",
            "subject",
            "capability",
            "tool",
            "account_id",
            "limit_calls",
            "limit_per",
            "usage_calls",
            "policy_version",
            "policy_revision",
        ]
    );
    assert_eq!(
        (
            &found[0]["kind"],
            &found[0]["outcome"],
            &found[0]["code"],
            &found[0]["tool"]
        ),
        (
            &Value::from("decide"),
            &Value::from("allow"),
            &Value::from("granted"),
            &Value::Null
        )
    );
}

/// Runs `tour` on a fresh, migrated SQLite file: its URL and the store opened in this process.
fn on_sqlite(tour: impl FnOnce(&str, &SqliteStore)) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("capgate.db").display());
    let store = runtime().block_on(async {
        let store = SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("open SQLite");
        store.migrate().await.expect("migrate");
        store
    });
    tour(&url, &store);
}

/// Runs `tour` on a fresh, migrated PostgreSQL database, when there is a server to make one on.
fn on_postgres(tour: impl FnOnce(&str, &PostgresStore)) {
    let runtime = runtime();
    let Some(database) = runtime.block_on(TestDatabase::create()) else {
        return;
    };
    let store = runtime.block_on(async {
        let store = PostgresStore::connect_with(database.options.clone(), &StoreOptions::default())
            .await
            .expect("open the test database");
        store.migrate().await.expect("migrate");
        store
    });
    tour(&database.url(), &store);
}

#[test]
fn prune_on_sqlite() {
    on_sqlite(prune_end_to_end);
}

#[test]
fn prune_on_postgres() {
    on_postgres(prune_end_to_end);
}

/// A gateway's note (`NoteDecision`) shows under its record in `capgate audit`, human and
/// `--json`, and goes with the record's month when it is pruned.
fn notes_end_to_end<S: Store>(url: &str, store: &S) {
    let runtime = runtime();
    let at = month_start(2) + 3_600_000;
    let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        u64::try_from(at / 1000).unwrap(),
        0,
    ))
    .to_string();
    let record = AuditRecord {
        decision_id: id.clone(),
        at_ms: at,
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(ReasonCode::Granted)),
        principal_id: Some("staff:ana".to_owned()),
        capability: Some("billing.refund.create".to_owned()),
        account_id: Some("payments-bot".to_owned()),
        ..AuditRecord::default()
    };
    runtime
        .block_on(store.append_audit(&[record], &[]))
        .expect("seed the audit trail");
    let note = DecisionNote {
        decision_id: id.clone(),
        gateway: "edge".to_owned(),
        kind: Note::CredentialFailed,
        detail: "no resolver for scheme `gcp-secrets`".to_owned(),
        at_ms: at + 40,
    };
    assert!(runtime.block_on(store.note_decision(&note)).expect("note"));
    let other_gateway = DecisionNote {
        gateway: "other".to_owned(),
        ..note.clone()
    };
    assert!(!runtime
        .block_on(store.note_decision(&other_gateway))
        .expect("note"));

    let human = capgate(&["audit", "--database-url", url]);
    assert_eq!(human.code, 0, "{human:?}");
    assert!(
        human.stdout.contains(
            "\n    noted 2025-02-01T01:00:00.040Z  credential_failed  by edge: no resolver for scheme `gcp-secrets`\n"
        ),
        "{}",
        human.stdout
    );
    // The audit commands' times: dates and spans as well as instants.
    let february = capgate(&[
        "audit",
        "--since",
        "2025-02-01",
        "--until",
        "2025-03-01",
        "--json",
        "--database-url",
        url,
    ]);
    assert_eq!(february.code, 0, "{february:?}");
    let found: Value = serde_json::from_str(&february.stdout).expect("JSON");
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    let lately = capgate(&["audit", "--since", "1h", "--json", "--database-url", url]);
    assert_eq!(lately.code, 0, "{lately:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&lately.stdout).expect("JSON"),
        serde_json::json!([])
    );
    let json = capgate(&["audit", "--json", "--database-url", url]);
    let found: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(
        found[0]["notes"],
        serde_json::json!([{"decision_id": id, "gateway": "edge", "kind": "credential_failed",
                            "detail": "no resolver for scheme `gcp-secrets`", "at_ms": at + 40}])
    );

    let pruned = capgate(&["audit", "prune", "--before", "2025-03-15", "--database-url", url]);
    assert_eq!(pruned.code, 0, "{pruned:?}");
    assert!(runtime
        .block_on(store.decision_notes(std::slice::from_ref(&id)))
        .expect("notes")
        .is_empty());
}

#[test]
fn notes_on_sqlite() {
    on_sqlite(notes_end_to_end);
}

#[test]
fn notes_on_postgres() {
    on_postgres(notes_end_to_end);
}

/// A decision's arguments in `capgate audit`: the digest always, the kept (redacted) values
/// where the server kept them — as an object in `--json` — and a note where they were too large
/// to keep.
fn arguments_end_to_end<S: Store>(url: &str, store: &S) {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let base = AuditRecord {
        at_ms: month_start(3),
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Deny,
        code: Some(RecordCode::Reason(ReasonCode::ConditionFailed)),
        path: Some("/grants/0/when/0".to_owned()),
        principal_id: Some("staff:sam".to_owned()),
        capability: Some("billing.refund.create".to_owned()),
        tool: Some("payments__create_refund".to_owned()),
        arguments_digest: Some(digest.clone()),
        ..AuditRecord::default()
    };
    let digest_only = AuditRecord {
        decision_id: "0195a000-0000-7000-8000-000000000001".to_owned(),
        ..base.clone()
    };
    let kept = AuditRecord {
        decision_id: "0195a000-0000-7000-8000-000000000002".to_owned(),
        at_ms: base.at_ms + 1,
        arguments: Some(r#"{"amount":150,"password":"[redacted]"}"#.to_owned()),
        ..base.clone()
    };
    let omitted = AuditRecord {
        decision_id: "0195a000-0000-7000-8000-000000000003".to_owned(),
        at_ms: base.at_ms + 2,
        arguments_omitted: Some(20_000),
        ..base.clone()
    };
    runtime()
        .block_on(store.append_audit(&[digest_only, kept, omitted], &[]))
        .expect("seed the audit trail");

    let human = capgate(&["audit", "--database-url", url]);
    assert_eq!(human.code, 0, "{human:?}");
    let lines: Vec<&str> = human.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", human.stdout);
    assert!(
        lines[0].contains(&format!(
            "  at=/grants/0/when/0  arguments={digest} (values not kept: 20000 bytes)  "
        )),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(&format!(
            "  at=/grants/0/when/0  arguments={digest} {{\"amount\":150,\"password\":\"[redacted]\"}}  "
        )),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains(&format!("  at=/grants/0/when/0  arguments={digest}  gateway=")),
        "{}",
        lines[2]
    );

    let json = capgate(&["audit", "--json", "--database-url", url]);
    assert_eq!(json.code, 0, "{json:?}");
    let found: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let found = found.as_array().expect("an array");
    assert_eq!(found[0]["arguments_digest"], Value::from(digest.clone()));
    assert_eq!(found[0]["arguments_omitted"], Value::from(20_000));
    assert_eq!(found[0].get("arguments"), None);
    // The kept arguments are the object, not a string of JSON.
    assert_eq!(
        found[1]["arguments"],
        serde_json::json!({"amount": 150, "password": "[redacted]"})
    );
    assert_eq!(found[1].get("arguments_omitted"), None);
    assert_eq!(found[2]["arguments_digest"], Value::from(digest));
    assert_eq!(found[2].get("arguments"), None);
    // A record without arguments has none of the three.
    let bare = AuditRecord {
        decision_id: "0195a000-0000-7000-8000-000000000004".to_owned(),
        arguments_digest: None,
        ..base
    };
    let bare = serde_json::to_value(&bare).expect("JSON");
    assert_eq!(bare.get("arguments_digest"), None);
}

#[test]
fn arguments_on_sqlite() {
    on_sqlite(arguments_end_to_end);
}

#[test]
fn arguments_on_postgres() {
    on_postgres(arguments_end_to_end);
}

/// Asking in a folder with no store creates nothing and says which store it looked for; a store
/// nothing migrated says so, not "no such table".
#[test]
fn a_missing_store_is_named_and_not_created() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = |args: &[&str]| {
        let output = Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .env_remove("CAPGATE_DATABASE_URL")
            .output()
            .expect("the binary runs");
        (
            output.status.code(),
            String::from_utf8(output.stderr).expect("UTF-8"),
        )
    };
    for args in [
        &["audit"][..],
        &["audit", "--json"],
        &["audit", "prune", "--before", "2025-01-01"],
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no capgate store at `sqlite://capgate.db`") && stderr.contains("does not exist"),
            "{args:?}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    // An SQLite file that is there but was never migrated.
    std::fs::write(dir.path().join("empty.db"), b"").unwrap();
    let (code, stderr) = run(&["audit", "--database-url", "sqlite://empty.db"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("holds no capgate tables"), "{stderr}");
    assert!(!stderr.contains("no such table"), "{stderr}");
}

#[test]
fn usage_errors_name_the_flag() {
    let check = |args: &[&str], expected: &str| {
        let run = capgate(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert_eq!(run.stdout, "", "{args:?}");
        assert!(run.stderr.contains(expected), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.ends_with("For more information, try '--help'.\n"),
            "{args:?}: {run:?}"
        );
    };
    check(
        &["audit", "prune", "--before", "last tuesday"],
        "invalid value 'last tuesday' for '--before <T>': expected an RFC 3339 instant such as \
         `2026-01-02T15:04:05Z` or a date such as `2026-01-02`, `today`, `yesterday`, or a span \
         back from now such as `1h` or `7d`",
    );
    // A query's range must be one: `--since` after `--until` would silently match nothing.
    check(
        &["audit", "--since", "2999-12-01", "--until", "yesterday"],
        "`--since 2999-12-01T00:00:00Z` is not before `--until",
    );
    check(
        &["audit", "prune", "--before", "2025-02-30"],
        "invalid value '2025-02-30' for '--before <T>': day `30` does not exist in 2025-02",
    );
    check(&["audit", "prune"], "--before <T>");
    check(
        &["audit", "prune", "--before", "9999-01-01"],
        "error: `--before 9999-01-01T00:00:00Z` is in the future",
    );
    // The query's filters and the prune do not mix.
    check(
        &[
            "audit",
            "--principal",
            "staff:ana",
            "prune",
            "--before",
            "2025-01-01",
        ],
        "error:",
    );
    check(
        &["audit", "prune", "--before", "2025-01-01", "--principal", "x"],
        "'--principal'",
    );
}
