//! The operator's questions, answered by the command line against real components: the binary
//! and `capgate::cli::run` over a SQLite file and a fresh PostgreSQL database, and a real server
//! on a loopback port for what goes through it (admin tokens, so the history names who).
//!
//! * `capgate audit`'s filters (tool, gateway, kind, decision id, request id), `--group-by`
//!   (counted by the store) and `--follow` (records inserted while it runs are printed);
//! * `capgate policies show|diff|history`, and the history an activation leaves;
//! * `capgate usage` and `capgate usage reset` (through the server, recorded);
//! * `capgate completions`.
//!
//! Each scenario runs on both stores: the answers must not depend on the store.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use capgate::cli::{Exit, Outcome};
use capgate::service::{self, Config, Token};
use capgate::store::{
    AnyStore, AuditRecord, CounterKey, PostgresStore, RecordCode, RecordKind, RecordOutcome, SqliteStore,
    Store, StoreOptions,
};
use capgate_core::access::ReasonCode;
use serde_json::{json, Value};
use support::client::{example_with_ceiling, CATALOG, POLICY};
use support::counting::consume;
use support::postgres::TestDatabase;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// One run of the binary, in an empty directory of its own.
fn binary(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(BIN)
        .args(args)
        .current_dir(dir.path())
        .env_remove("CAPGATE_DATABASE_URL")
        .output()
        .expect("the binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    )
}

/// `capgate ARGS` in this process, on a thread of its own (the command starts its own runtime).
fn capgate(args: &[&str]) -> Outcome {
    let args: Vec<String> = std::iter::once("capgate")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    std::thread::spawn(move || capgate::cli::run(args, &mut std::io::empty()))
        .join()
        .expect("the command does not panic")
}

fn parse(outcome: &Outcome) -> Value {
    serde_json::from_str(&outcome.stdout).unwrap_or_else(|_| panic!("JSON: {outcome:?}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A fresh, migrated store of each kind in turn: its URL and the store opened here.
fn on_sqlite(tour: impl FnOnce(&str, AnyStore)) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("capgate.db").display());
    let store = runtime().block_on(async {
        let store = SqliteStore::connect(&url, &StoreOptions::default())
            .await
            .expect("open SQLite");
        store.migrate().await.expect("migrate");
        store
    });
    tour(&url, AnyStore::Sqlite(store));
}

fn on_postgres(tour: impl FnOnce(&str, AnyStore)) {
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
    tour(&database.url(), AnyStore::Postgres(store));
}

/// Midnight UTC today, in milliseconds.
fn today() -> i64 {
    let now = capgate::clock::now();
    now - now.rem_euclid(86_400_000)
}

fn record(id: &str, at_ms: i64, principal: &str, capability: &str) -> AuditRecord {
    AuditRecord {
        decision_id: id.to_owned(),
        at_ms,
        gateway: "edge".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(ReasonCode::Granted)),
        principal_id: Some(principal.to_owned()),
        capability: Some(capability.to_owned()),
        ..AuditRecord::default()
    }
}

/// A call that ran as the billing account, under the grant at `path`.
fn billing(id: &str, at_ms: i64, principal: &str, path: &str) -> AuditRecord {
    AuditRecord {
        account_id: Some("billing".to_owned()),
        path: Some(path.to_owned()),
        tool: Some("billing__refund".to_owned()),
        ..record(id, at_ms, principal, "billing.refund.create")
    }
}

fn ids(found: &Value) -> Vec<String> {
    found
        .as_array()
        .expect("an array")
        .iter()
        .map(|record| record["decision_id"].as_str().expect("an id").to_owned())
        .collect()
}

// ── The audit trail ───────────────────────────────────────────────────────

fn audit_filters_and_groups(url: &str, store: AnyStore) {
    let yesterday = today() - 86_400_000;
    let mut records = vec![
        billing("d1", yesterday + 1_000, "staff:ana", "/grants/3"),
        billing("d2", yesterday + 2_000, "staff:ana", "/grants/3"),
        billing("d3", yesterday + 3_000, "staff:bo", "/grants/4"),
        // Today's: not yesterday's answer.
        billing("d4", today() + 1, "staff:bo", "/grants/4"),
        // Yesterday, another account.
        AuditRecord {
            account_id: Some("helpdesk-reader".to_owned()),
            path: Some("/grants/0".to_owned()),
            ..record("d5", yesterday + 4_000, "staff:cy", "tickets.issue.read")
        },
        AuditRecord {
            kind: RecordKind::List,
            gateway: "other-gw".to_owned(),
            request_id: Some("req-9".to_owned()),
            ..record("d6", yesterday + 5_000, "staff:cy", "tickets.issue.read")
        },
    ];
    records[1].request_id = Some("req-9".to_owned());
    runtime()
        .block_on(store.append_audit(&records, &[]))
        .expect("seed the audit trail");

    let query = |filter: &[&str]| {
        let mut args = vec!["audit", "--json", "--database-url", url];
        args.extend_from_slice(filter);
        let (code, stdout, stderr) = binary(&args);
        assert_eq!((code, stderr.as_str()), (0, ""), "{filter:?}: {stdout}");
        ids(&serde_json::from_str(&stdout).expect("JSON"))
    };
    assert_eq!(query(&["--tool", "billing__refund"]), ["d4", "d3", "d2", "d1"]);
    assert_eq!(query(&["--gateway", "other-gw"]), ["d6"]);
    assert_eq!(query(&["--kind", "list"]), ["d6"]);
    assert_eq!(query(&["--decision-id", "d3"]), ["d3"]);
    assert_eq!(query(&["--request-id", "req-9"]), ["d6", "d2"]);
    assert_eq!(query(&["--request-id", "req-9", "--gateway", "edge"]), ["d2"]);
    let (code, _, stderr) = binary(&["audit", "--kind", "call", "--database-url", url]);
    assert_eq!(code, 2, "{stderr}");

    // "Who used the billing account yesterday, and under which rule?" — one command.
    let question = [
        "audit",
        "--account",
        "billing",
        "--since",
        "yesterday",
        "--until",
        "today",
        "--group-by",
        "principal,rule",
        "--database-url",
        url,
    ];
    let (code, stdout, stderr) = binary(&question);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    let at = |ms: i64| capgate::clock::format(ms);
    let expected = format!(
        "principal  path       records  first{pad}  last\n\
         staff:ana  /grants/3  2        {}  {}\n\
         staff:bo   /grants/4  1        {}  {}\n\
         2 groups, 3 records\n",
        at(yesterday + 1_000),
        at(yesterday + 2_000),
        at(yesterday + 3_000),
        at(yesterday + 3_000),
        pad = " ".repeat(at(0).len() - "first".len()),
    );
    assert_eq!(stdout, expected);
    let mut json_question = question.to_vec();
    json_question.push("--json");
    let (code, stdout, _) = binary(&json_question);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).expect("JSON"),
        json!([
            {"principal": "staff:ana", "path": "/grants/3", "records": 2,
             "first_at": at(yesterday + 1_000), "last_at": at(yesterday + 2_000)},
            {"principal": "staff:bo", "path": "/grants/4", "records": 1,
             "first_at": at(yesterday + 3_000), "last_at": at(yesterday + 3_000)},
        ])
    );
    // The limit bounds the groups, and says so.
    let (_, stdout, _) = binary(&[
        "audit",
        "--group-by",
        "outcome,kind",
        "--limit",
        "1",
        "--database-url",
        url,
    ]);
    assert!(
        stdout.starts_with("outcome  kind    records") && stdout.contains("allow    decide  5 "),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("(the first 1 groups: raise --limit for more)\n"),
        "{stdout}"
    );
    for (args, problem) in [
        (
            &["--group-by", "principal,principal"][..],
            "`--group-by` names `principal` twice",
        ),
        (&["--group-by", "secret"], "expected one of principal, capability"),
        (&["--group-by", "principal", "--follow"], "cannot be used with"),
    ] {
        let mut all = vec!["audit", "--database-url", url];
        all.extend_from_slice(args);
        let (code, _, stderr) = binary(&all);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(problem), "{args:?}: {stderr}");
    }
}

#[test]
fn audit_filters_and_groups_on_sqlite() {
    on_sqlite(audit_filters_and_groups);
}

#[test]
fn audit_filters_and_groups_on_postgres() {
    on_postgres(audit_filters_and_groups);
}

/// `--follow` prints the last records, then each matching record as it reaches the store — also
/// one whose decision time is a little before the newest already printed (another replica's
/// batch) — and nothing that does not match, until its bound ends it with exit 0.
fn follow(url: &str, store: AnyStore) {
    let runtime = runtime();
    let now = capgate::clock::now();
    runtime
        .block_on(store.append_audit(
            &[
                record("old-1", now - 60_000, "staff:ana", "tickets.issue.read"),
                record("old-2", now - 50_000, "staff:ana", "tickets.issue.read"),
                record("old-3", now - 40_000, "staff:ana", "tickets.issue.read"),
            ],
            &[],
        ))
        .expect("seed");
    let mut child = Command::new(BIN)
        .args([
            "audit",
            "--principal",
            "staff:ana",
            "--follow",
            "--follow-for",
            "8s",
            "--limit",
            "2",
            "--json",
            "--database-url",
            url,
        ])
        .env_remove("CAPGATE_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let stdout = child.stdout.take().expect("piped");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = lines.send(line);
        }
    });
    let next = |what: &str| -> String {
        let line = received
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no line for {what}"));
        let record: Value = serde_json::from_str(&line).expect("one JSON object per line");
        record["decision_id"].as_str().expect("an id").to_owned()
    };
    // The last two, oldest first.
    assert_eq!(next("the first of the last two"), "old-2");
    assert_eq!(next("the second of the last two"), "old-3");
    let now = capgate::clock::now();
    runtime
        .block_on(store.append_audit(
            &[
                record("new-1", now, "staff:ana", "tickets.issue.read"),
                record("not-ana", now, "staff:bo", "tickets.issue.read"),
            ],
            &[],
        ))
        .expect("append");
    assert_eq!(next("a new record"), "new-1");
    // Committed later, decided a little earlier than the newest printed.
    runtime
        .block_on(store.append_audit(
            &[record("late", now - 2_000, "staff:ana", "tickets.issue.read")],
            &[],
        ))
        .expect("append");
    assert_eq!(next("a record that arrived late"), "late");
    let status = child.wait().expect("the follow ends");
    assert!(status.success(), "{status:?}");
    assert!(
        received.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing else is printed: not the other principal's, not one twice"
    );
}

#[test]
fn follow_on_sqlite() {
    on_sqlite(follow);
}

#[test]
fn follow_on_postgres() {
    on_postgres(follow);
}

// ── Policy versions and usage, through a server ───────────────────────────

const ADMIN: &str = "admin-secret-token";
const GATEWAY: &str = "gateway-secret-token";

/// Publishes, shows, diffs and rolls back through a real server with tokens, then reads the
/// history; seeds counters and resets one through the server, then reads them from the store.
async fn policies_and_usage(url: String, store: AnyStore) {
    let mut config = Config::new(vec!["127.0.0.1:0".parse().expect("an address")]);
    config.admin_tokens = vec![Token::new("ops-admin", ADMIN.as_bytes())];
    config.gateway_tokens = vec![Token::new("edge", GATEWAY.as_bytes())];
    config.poll_interval = Duration::from_millis(200);
    let running = service::start(store.clone(), config)
        .await
        .expect("the server starts");
    let server = format!("http://{}", running.addrs[0]);
    let files = tempfile::tempdir().expect("a temporary directory");
    let write = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let admin = write("admin.token", ADMIN);
    let gateway = write("gateway.token", GATEWAY);
    let good = write("policy.yaml", POLICY);
    let tighter = write("tighter.yaml", &example_with_ceiling(300));
    let catalog = write("catalog.yaml", CATALOG);
    let as_admin = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--server", &server, "--token-file", &admin]);
        capgate(&all)
    };

    for (file, comment) in [(&good, "first"), (&tighter, "tighter")] {
        let published = as_admin(&["publish", file, "--catalog", &catalog, "--comment", comment]);
        assert_eq!(published.exit, Exit::Done, "{published:?}");
    }

    // `show`: the artifact as published, byte for byte; its catalog; both in JSON.
    let shown = as_admin(&["policies", "show", "1"]);
    assert_eq!((shown.exit, shown.stdout.as_str()), (Exit::Done, POLICY));
    let shown = as_admin(&["policies", "show", "1", "--catalog"]);
    assert_eq!(shown.stdout, CATALOG);
    let document = parse(&as_admin(&["policies", "show", "2", "--json"]));
    assert_eq!(
        (
            &document["revision"],
            &document["active"],
            &document["author"],
            &document["comment"]
        ),
        (&json!(2), &json!(true), &json!("ops-admin"), &json!("tighter"))
    );
    assert_eq!(document["artifact"], example_with_ceiling(300));
    let missing = as_admin(&["policies", "show", "9"]);
    assert_eq!(missing.exit, Exit::Input, "{missing:?}");
    assert!(
        missing.stderr.contains("not found: no stored revision 9"),
        "{}",
        missing.stderr
    );
    assert_eq!(
        parse(&as_admin(&["policies", "show", "9", "--json"]))["error"]["exit"],
        3
    );

    // `diff`: what `capgate diff` says of the same two files, exit 1 for changes.
    let stored = as_admin(&["policies", "diff", "1", "2"]);
    let local = capgate(&["diff", &good, &tighter, "--catalog", &catalog]);
    assert_eq!(stored.exit, Exit::Findings, "{stored:?}");
    assert_eq!((stored.exit, &stored.stdout), (local.exit, &local.stdout));
    assert!(stored.stdout.contains("3 decisions change"), "{}", stored.stdout);
    let same = as_admin(&["policies", "diff", "2", "2"]);
    assert_eq!(same.exit, Exit::Done, "{same:?}");
    let diffed = parse(&as_admin(&["policies", "diff", "1", "2", "--json"]));
    assert_eq!(diffed["before"]["origin"], "revision 1", "{diffed}");
    assert_eq!(diffed["changes"].as_array().map(Vec::len), Some(3));
    let widening = as_admin(&["policies", "diff", "2", "1", "--fail-on", "widening"]);
    assert_eq!(
        widening.exit,
        Exit::Findings,
        "a looser ceiling widens: {widening:?}"
    );

    // The rollback, and the history every activation left.
    let rolled = as_admin(&["policies", "activate", "1"]);
    assert_eq!(rolled.exit, Exit::Done, "{rolled:?}");
    let history = parse(&as_admin(&["policies", "history", "--json"]));
    let entries: Vec<(Value, Value, Value, Value)> = history
        .as_array()
        .expect("an array")
        .iter()
        .map(|entry| {
            (
                entry["kind"].clone(),
                entry["actor"].clone(),
                entry["from_revision"].clone(),
                entry["to_revision"].clone(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (json!("rollback"), json!("ops-admin"), json!(2), json!(1)),
            (json!("publish"), json!("ops-admin"), json!(1), json!(2)),
            (json!("publish"), json!("ops-admin"), Value::Null, json!(1)),
        ]
    );
    let human = as_admin(&["policies", "history", "--limit", "1"]);
    assert_eq!(human.stdout.lines().count(), 1, "{}", human.stdout);
    assert!(
        human.stdout.contains("  rollback      2 → 1      by ops-admin"),
        "{}",
        human.stdout
    );
    // Admin only: a gateway's token reads no history and resets no counter.
    for args in [
        &["policies", "history"][..],
        &["policies", "show", "1"],
        &["usage", "reset", "--principal", "staff:ana", "--capability", "x"],
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--server", &server, "--token-file", &gateway]);
        let refused = capgate(&all);
        assert_eq!(refused.exit, Exit::Input, "{args:?}: {refused:?}");
        assert!(
            refused.stderr.contains("not allowed"),
            "{args:?}: {}",
            refused.stderr
        );
    }

    // Usage: counters from the store, a reset through the server, recorded with its actor.
    let read = CounterKey {
        principal_id: "staff:ana",
        capability: "tickets.issue.read",
    };
    let window = capgate::clock::now();
    for _ in 0..3 {
        consume(&store, read, window, 3_600_000, 300).await;
    }
    let usage = |extra: &[&str]| {
        let mut all = vec!["usage", "--principal", "staff:ana", "--database-url", &url];
        all.extend_from_slice(extra);
        capgate(&all)
    };
    let counters = parse(&usage(&["--json"]));
    assert_eq!(
        counters,
        json!({"principal": "staff:ana",
               "counters": [{"capability": "tickets.issue.read", "calls": 3,
                             "window_start": capgate::clock::format(window)}],
               "resets": []})
    );
    let reset = as_admin(&[
        "usage",
        "reset",
        "--principal",
        "staff:ana",
        "--capability",
        "tickets.issue.read",
    ]);
    assert_eq!(reset.exit, Exit::Done, "{reset:?}");
    assert!(
        reset
            .stdout
            .starts_with("reset: `staff:ana` on `tickets.issue.read` had 3 call(s) in the window from "),
        "{}",
        reset.stdout
    );
    let again = as_admin(&[
        "usage",
        "reset",
        "--principal",
        "staff:ana",
        "--capability",
        "tickets.issue.read",
        "--json",
    ]);
    assert_eq!(parse(&again)["reset"], false, "{again:?}");
    let after = usage(&[]);
    assert_eq!(after.exit, Exit::Done, "{after:?}");
    let lines: Vec<&str> = after.stdout.lines().collect();
    assert_eq!(lines[0], "no usage counter for `staff:ana`", "{}", after.stdout);
    assert!(
        lines[1].starts_with("reset ")
            && lines[1].contains(" by ops-admin: tickets.issue.read, 3 call(s) in the window from "),
        "{}",
        after.stdout
    );
    assert_eq!(lines.len(), 2, "one reset recorded, not two: {}", after.stdout);
    let bad = as_admin(&["usage", "reset", "--principal", "", "--capability", "x"]);
    assert_eq!(bad.exit, Exit::Input, "{bad:?}");
    assert!(bad.stderr.contains("`principal_id`: required"), "{}", bad.stderr);

    running.stop().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_and_usage_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("capgate.db").display());
    let store = SqliteStore::connect(&url, &StoreOptions::default())
        .await
        .expect("open SQLite");
    store.migrate().await.expect("migrate");
    policies_and_usage(url, AnyStore::Sqlite(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_and_usage_on_postgres() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let store = database.store().await;
    policies_and_usage(database.url(), AnyStore::Postgres(store)).await;
}

// ── The shell ─────────────────────────────────────────────────────────────

/// Each shell's script names the new commands and flags: it is generated from the parser.
#[test]
fn completions_cover_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, stdout, stderr) = binary(&["completions", shell]);
        assert_eq!((code, stderr.as_str()), (0, ""), "{shell}");
        // fish spells a flag `-l group-by`, the others `--group-by`.
        for word in ["usage", "group-by", "follow", "history", "request-id"] {
            assert!(stdout.contains(word), "{shell} completes no `{word}`");
        }
    }
    let (code, _, stderr) = binary(&["completions", "powershell"]);
    assert_eq!(code, 2, "{stderr}");
}
