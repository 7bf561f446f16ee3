//! The `capgate` binary, run for real on `examples/` and `tests/fixtures/cli/`
//! (ruff's `tests/cli` style): each case snapshots the exit code, stdout and
//! stderr together, and asserts the facts the spec fixes (cli.md, docs/reference.md's
//! worked examples) so that a wrong snapshot cannot be
//! accepted by accident.
//!
//! Command lines are written as a shell would read them (words split on
//! spaces, `'…'` quoting), relative to the crate root.
//!
//! Snapshots live in `tests/snapshots/`; write new ones with
//! `INSTA_UPDATE=always cargo test --test cli` and read every one.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const POLICY: &str = "examples/policy.yaml";
const CATALOG: &str = "examples/catalog.yaml";
const AT: &str = "2026-01-02T00:00:00Z";

/// One run of the binary.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Exit code, stdout and stderr as one text, for a snapshot.
    fn snapshot(&self) -> String {
        format!(
            "exit: {}\n----- stdout -----\n{}----- stderr -----\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not JSON ({error}):\n{}", self.stdout))
    }
}

/// Splits a command line into words: spaces separate, `'…'` quotes
/// (so `''` is an empty word and `'org=Acme Corp'` one word).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                word.get_or_insert_with(String::new);
            }
            ' ' if !quoted => words.extend(word.take()),
            _ => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(!quoted, "unbalanced quote in {line:?}");
    words.extend(word);
    words
}

fn capgate(line: &str) -> Run {
    capgate_with_stdin(line, b"")
}

fn capgate_with_stdin(line: &str, stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(words(line))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // The binary may exit before reading its input (a usage error): a broken
    // pipe here is not a failure of the test.
    let _ = child.stdin.take().expect("piped stdin").write_all(stdin);
    let output = child.wait_with_output().expect("the binary finishes");
    let run = Run {
        code: output.status.code().expect("exited, not killed by a signal"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "the binary panicked:\n{}",
        run.stderr
    );
    run
}

/// `explain` on the example with its catalog, at a fixed instant.
fn explain(rest: &str) -> Run {
    capgate(&format!("explain {POLICY} --catalog {CATALOG} --at {AT} {rest}"))
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect("readable file")
}

fn strings(values: &Value, field: &str) -> Vec<String> {
    let items = values.as_array().expect("an array");
    items
        .iter()
        .map(|item| item[field].as_str().expect("a string").to_owned())
        .collect()
}

// ── validate ────────────────────────────────────────────────────────────────

#[test]
fn validate_the_example_finds_nothing() {
    let run = capgate("validate examples/policy.yaml");
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout.lines().count(), 1, "no diagnostics is one line");
    insta::assert_snapshot!("validate_example", run.snapshot());
}

#[test]
fn validate_the_example_with_its_catalog_warns_twice() {
    let run = capgate("validate examples/policy.yaml --catalog examples/catalog.yaml --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["policy"]["origin"], POLICY);
    let version = json["policy"]["version"].as_str().unwrap();
    assert!(version.starts_with("sha256:") && version.len() == 71);
    let diagnostics = json["diagnostics"].as_array().unwrap();
    assert_eq!(diagnostics.len(), 2);
    // Each unmapped tool is reported at its own upstream's entry (helpdesk, payments).
    let sites: Vec<(&Value, &Value)> = diagnostics
        .iter()
        .map(|diagnostic| (&diagnostic["path"], &diagnostic["position"]))
        .collect();
    assert_eq!(
        sites,
        [
            (&json!("/upstreams/0"), &json!({"line": 24, "column": 5})),
            (&json!("/upstreams/3"), &json!({"line": 57, "column": 5})),
        ]
    );
    for diagnostic in diagnostics {
        assert_eq!(diagnostic["severity"], "warning");
        assert_eq!(diagnostic["code"], "catalog_tool_unmapped");
        assert_eq!(diagnostic["related"], json!([]));
    }
    insta::assert_snapshot!("validate_example_catalog_json", run.snapshot());
}

#[test]
fn validate_warnings_only_exits_zero() {
    let run = capgate("validate tests/fixtures/cli/warnings.yaml");
    assert_eq!(run.code, 0);
    assert!(run
        .stdout
        .contains("warnings.yaml:6:5  warning  capability_not_realized\n"));
    assert!(run
        .stdout
        .contains("warnings.yaml:16:5  warning  unused_account\n"));
    insta::assert_snapshot!("validate_warnings", run.snapshot());
}

#[test]
fn validate_errors_human() {
    let run = capgate("validate tests/fixtures/cli/errors.yaml");
    assert_eq!(run.code, 1);
    // The header, message, pointer, related location and underlined snippet.
    let block = "tests/fixtures/cli/errors.yaml:5:5  error  duplicate_id\n\
                 \x20 the capability `crm.contact.read` is declared twice\n\
                 \x20 at /capabilities/1\n\
                 \x20 first declaration: tests/fixtures/cli/errors.yaml:4:5  /capabilities/0\n\
                 \x20 |\n\
                 5 |   - id: crm.contact.read\n\
                 \x20 |     ^^^^^^^^^^^^^^^^^^^^\n";
    assert!(run.stdout.starts_with(block), "{}", run.stdout);
    assert!(run
        .stdout
        .contains("35 |     using: 'crm-archiver'\n   |            ^^^^^^^^^^^^^^\n"));
    assert!(run.stdout.ends_with("errors.yaml: 7 errors, 1 warning\n"));
    insta::assert_snapshot!("validate_errors", run.snapshot());
}

#[test]
fn validate_errors_json() {
    let run = capgate("validate tests/fixtures/cli/errors.yaml --json");
    assert_eq!(run.code, 1);
    let json = run.json();
    assert_eq!(json["ok"], false);
    assert_eq!(
        strings(&json["diagnostics"], "code"),
        [
            "duplicate_id",
            "claim_mapping_expected",
            "attribute_not_declared",
            "unknown_capability_in_grant",
            "unknown_issuer_in_grant",
            "unknown_account_in_grant",
            "ambiguous_grant",
            "unused_account",
        ]
    );
    let first = &json["diagnostics"][0];
    let related = json!([{
        "path": "/capabilities/0",
        "position": {"line": 4, "column": 5},
        "note": "first declaration",
    }]);
    assert_eq!(first["related"], related);
    // Positions carry line and column only; the offset is not in the contract.
    assert!(first["position"].get("offset").is_none());
    insta::assert_snapshot!("validate_errors_json", run.snapshot());
}

#[test]
fn validate_yaml_syntax_and_schema_violations() {
    let syntax = capgate("validate tests/fixtures/cli/yaml-syntax.yaml");
    assert_eq!(syntax.code, 1);
    assert!(syntax
        .stdout
        .starts_with("tests/fixtures/cli/yaml-syntax.yaml:3:1  error  yaml_syntax\n"));
    insta::assert_snapshot!("validate_yaml_syntax", syntax.snapshot());

    let schema = capgate("validate tests/fixtures/cli/schema.yaml --json");
    assert_eq!(schema.code, 1);
    let json = schema.json();
    assert!(strings(&json["diagnostics"], "code")
        .iter()
        .all(|code| code == "schema_violation"));
    assert_eq!(json["diagnostics"][0]["path"], "/grants/0/limits/calls");
    insta::assert_snapshot!("validate_schema_json", schema.snapshot());
}

#[test]
fn validate_an_empty_document_has_no_position() {
    let run = capgate_with_stdin("validate - --json", b"");
    assert_eq!(run.code, 1);
    let json = run.json();
    assert_eq!(json["policy"]["origin"], "-");
    assert_eq!(json["diagnostics"][0]["position"], Value::Null);
    let human = capgate_with_stdin("validate -", b"");
    assert!(
        human.stdout.starts_with("-  error  schema_violation\n"),
        "{}",
        human.stdout
    );
}

// ── explain: the worked examples of docs/reference.md#worked-examples ───────────────────────

/// One row of the §4.11 table: principal and capability, the usage flags,
/// then the expected outcome, code, path, subject, account and `(calls, per)`.
struct Row {
    principal: &'static str,
    capability: &'static str,
    usage: &'static str,
    outcome: &'static str,
    code: &'static str,
    path: &'static str,
    subject: &'static str,
    account: Option<&'static str>,
    limits: Option<(u64, &'static str)>,
}

// One row per line, as in the spec's table.
#[rustfmt::skip]
const ROWS: &[Row] = &[
    Row { principal: "--issuer staff --attr dept=support", capability: "tickets.issue.read", usage: "--usage 0", outcome: "allow", code: "granted", path: "/grants/0", subject: "tickets.issue.read", account: Some("helpdesk-reader"), limits: Some((600, "1h")) },
    Row { principal: "--issuer staff --attr dept=support", capability: "tickets.issue.read", usage: "--usage 600", outcome: "deny", code: "limit_exhausted", path: "/grants/0", subject: "tickets.issue.read", account: None, limits: None },
    Row { principal: "--issuer staff --attr dept=support", capability: "tickets.issue.write", usage: "", outcome: "deny", code: "no_grant_matches", path: "/grants", subject: "tickets.issue.write", account: None, limits: None },
    Row { principal: "--issuer staff --attr dept=support --attr level=senior", capability: "tickets.issue.write", usage: "--usage 99", outcome: "allow", code: "granted", path: "/grants/1", subject: "tickets.issue.write", account: Some("helpdesk-agent"), limits: Some((100, "1h")) },
    Row { principal: "--issuer staff", capability: "docs.page.search", usage: "--usage unknown", outcome: "allow", code: "granted", path: "/grants/2", subject: "docs.page.search", account: Some("docs-reader"), limits: None },
    Row { principal: "--issuer staff --attr dept=support --attr level=senior", capability: "docs.page.search", usage: "--usage 0", outcome: "allow", code: "granted", path: "/grants/3", subject: "docs.page.search", account: Some("docs-reader"), limits: Some((2400, "1d")) },
    Row { principal: "--issuer staff --attr dept=support --attr level=intern", capability: "docs.page.search", usage: "", outcome: "allow", code: "granted", path: "/grants/4", subject: "docs.page.search", account: Some("docs-reader"), limits: Some((100, "1h")) },
    Row { principal: "--issuer staff --attr dept=finance", capability: "billing.refund.create", usage: "--usage none", outcome: "allow", code: "granted", path: "/grants/10", subject: "billing.refund.create", account: Some("payments-bot"), limits: Some((0, "1d")) },
    Row { principal: "--issuer staff --attr dept=finance", capability: "billing.refund.create", usage: "--usage 0", outcome: "deny", code: "limit_exhausted", path: "/grants/10", subject: "billing.refund.create", account: None, limits: None },
    Row { principal: "--issuer nightly --attr role=batch --attr env=prod", capability: "deploy.release.approve", usage: "", outcome: "deny", code: "account_disabled", path: "/grants/11", subject: "release-robot", account: None, limits: None },
    Row { principal: "--issuer mesh --attr 'org=Acme Corp' --attr unit=payments", capability: "billing.refund.create", usage: "--usage unknown", outcome: "deny", code: "usage_unknown", path: "/grants/7", subject: "payments-bot", account: None, limits: None },
    Row { principal: "--issuer mesh --attr 'org=Acme Corp' --attr unit=sre", capability: "metrics.dashboard-view", usage: "--usage 29", outcome: "allow", code: "granted", path: "/grants/8", subject: "metrics.dashboard-view", account: Some("metrics-viewer"), limits: Some((30, "1m")) },
    Row { principal: "--issuer staff --attr dept=support", capability: "crm.contact.read", usage: "--usage unknown", outcome: "deny", code: "capability_not_declared", path: "/capabilities", subject: "crm.contact.read", account: None, limits: None },
    Row { principal: "--issuer mesh --attr unit=payments", capability: "billing.refund.create", usage: "", outcome: "deny", code: "no_grant_matches", path: "/grants", subject: "billing.refund.create", account: None, limits: None },
];

#[test]
fn explain_reproduces_every_worked_example() {
    for row in ROWS {
        let args = format!(
            "{} --subject someone --capability {} {} --json",
            row.principal, row.capability, row.usage
        );
        let run = explain(&args);
        assert_eq!(run.code, 0, "{args}: {}", run.stderr);
        let json = run.json();
        let decision = &json["decision"];
        assert_eq!(decision["outcome"], row.outcome, "{args}");
        assert_eq!(decision["reason"]["code"], row.code, "{args}");
        assert_eq!(decision["reason"]["path"], row.path, "{args}");
        assert_eq!(decision["reason"]["subject"], row.subject, "{args}");
        let line = decision["reason"]["position"]["line"].as_u64();
        assert!(line.is_some_and(|line| line > 0), "{args}: {decision}");
        match row.account {
            Some(account) => {
                assert_eq!(decision["account"], json!({"id": account}), "{args}");
                match row.limits {
                    Some((calls, per)) => {
                        assert_eq!(decision["limits"]["calls"], calls, "{args}");
                        assert_eq!(decision["limits"]["per"], per, "{args}");
                    }
                    None => assert_eq!(decision["limits"], Value::Null, "{args}"),
                }
                assert!(!json["tools"].as_array().unwrap().is_empty(), "{args}");
            }
            None => {
                // A deny has no account and no limits: absent, not null.
                assert!(decision.get("account").is_none(), "{args}");
                assert!(decision.get("limits").is_none(), "{args}");
                assert!(json.get("tools").is_none(), "{args}: absent, not []");
            }
        }
    }
}

#[test]
fn explain_allow_human() {
    let run = explain(
        "--issuer staff --subject ana --attr dept=support --attr level=senior --attr team=blue \
         --capability tickets.issue.write --usage 99",
    );
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("\nALLOWED\n"));
    assert!(run
        .stdout
        .contains("  site      examples/policy.yaml:134:5  /grants/1\n"));
    assert!(run.stdout.contains("  ceiling   100 calls per 1h\n"));
    assert!(run.stdout.contains("discarded  team  "));
    insta::assert_snapshot!("explain_allow_human", run.snapshot());
}

#[test]
fn explain_limit_exhausted_human() {
    let run = explain(
        "--issuer staff --subject ana --attr dept=support --capability tickets.issue.read --usage 600",
    );
    assert_eq!(run.code, 0, "a deny still exits 0");
    assert!(run.stdout.contains("\nDENIED\n  reason    limit_exhausted — "));
    assert!(!run.stdout.contains("account"), "a deny names no account");
    insta::assert_snapshot!("explain_limit_exhausted_human", run.snapshot());
}

#[test]
fn explain_account_disabled_uses_static_key_defaults() {
    // No --attr: the static-key issuer's literal attributes are the defaults.
    let run = explain("--issuer nightly --subject nightly-runner --capability deploy.release.approve --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(
        json["principal"]["attributes"],
        json!({"env": "prod", "role": "batch"})
    );
    assert_eq!(json["decision"]["reason"]["code"], "account_disabled");
    insta::assert_snapshot!("explain_account_disabled_json", run.snapshot());
}

#[test]
fn explain_usage_unknown_human() {
    let run = explain(
        "--issuer mesh --subject payments-svc --attr 'org=Acme Corp' --attr unit=payments \
         --capability billing.refund.create --usage unknown",
    );
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("  reason    usage_unknown — "));
    assert!(run.stdout.contains("  subject   payments-bot\n"));
    insta::assert_snapshot!("explain_usage_unknown_human", run.snapshot());
}

#[test]
fn explain_capability_not_declared_json() {
    let run = explain("--issuer staff --subject ana --capability crm.contact.read --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["decision"]["reason"]["path"], "/capabilities");
    // `/capabilities` is the section anchor: the sequence's first `-`.
    assert_eq!(
        json["decision"]["reason"]["position"],
        json!({"line": 11, "column": 3})
    );
    insta::assert_snapshot!("explain_capability_not_declared_json", run.snapshot());
}

#[test]
fn explain_window_start_makes_time_matter() {
    let ask = |at: &str| {
        capgate(&format!(
            "explain {POLICY} --issuer staff --subject ana --attr dept=support \
             --capability tickets.issue.read --usage 600 \
             --window-start 2026-01-01T23:00:00+00:00 --at {at} --json"
        ))
    };
    // The 1h window opened at 23:00 UTC expires at 00:00 UTC exactly.
    let inside = ask("2026-01-02T00:59:59.999+01:00");
    assert_eq!(inside.json()["decision"]["reason"]["code"], "limit_exhausted");
    insta::assert_snapshot!("explain_window_start_inside_json", inside.snapshot());
    let expired = ask("2026-01-02t00:00:00z");
    let json = expired.json();
    assert_eq!(json["decision"]["outcome"], "allow");
    assert_eq!(json["at"], "2026-01-02T00:00:00Z");
    let usage = json!({"state": "counted", "calls": 600, "window_start": "2026-01-01T23:00:00Z"});
    assert_eq!(json["usage"], usage);
}

#[test]
fn explain_instants_are_utc_with_milliseconds_only_when_present() {
    let run = explain(
        "--issuer staff --subject a --capability docs.page.search --json \
         --usage 3 --window-start 2026-01-01T10:00:00.1234-02:30",
    );
    let json = run.json();
    assert_eq!(json["at"], "2026-01-02T00:00:00Z");
    assert_eq!(json["usage"]["window_start"], "2026-01-01T12:30:00.123Z");
    let none = explain("--issuer staff --subject a --capability docs.page.search --json --usage none");
    assert_eq!(none.json()["usage"], json!({"state": "not_consulted"}));
    let unknown = explain("--issuer staff --subject a --capability docs.page.search --json --usage unknown");
    assert_eq!(unknown.json()["usage"], json!({"state": "unknown"}));
}

#[test]
fn explain_defaults_at_to_now() {
    let run = capgate(&format!(
        "explain {POLICY} --issuer staff --subject a --capability docs.page.search --json"
    ));
    let json = run.json();
    let at = json["at"].as_str().unwrap();
    assert!(
        at.ends_with('Z') && at.len() >= 20 && at.as_bytes()[10] == b'T',
        "{at}"
    );
    assert!(at > "2025-", "{at}");
    assert_eq!(
        json["usage"]["window_start"], json["at"],
        "the window opens at `at` by default"
    );
    assert_eq!(json["usage"]["calls"], 0);
}

#[test]
fn explain_a_tool_resolves_to_its_capability() {
    let run =
        explain("--issuer staff --subject ana --attr dept=support --tool helpdesk-legacy__fetch_case --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["capability"], "tickets.issue.read");
    let tool = json!({"exposed_name": "helpdesk-legacy__fetch_case", "upstream": "helpdesk-legacy", "name": "fetch_case"});
    assert_eq!(json["tool"], tool);
    assert_eq!(json["unknown_tool"], false);
    assert_eq!(
        strings(&json["tools"], "exposed_name"),
        [
            "helpdesk__get_ticket",
            "helpdesk__list_tickets",
            "helpdesk-legacy__fetch_case"
        ]
    );
    insta::assert_snapshot!("explain_tool_json", run.snapshot());
}

#[test]
fn explain_an_unmapped_or_unknown_tool_has_no_decision() {
    // delete_ticket is in the catalog but unmapped: as unknown as a made-up name.
    for tool in ["helpdesk__delete_ticket", "nothing__here", "helpdesk"] {
        let run = explain(&format!("--issuer staff --subject ana --tool {tool} --json"));
        assert_eq!(run.code, 0, "{tool}");
        let json = run.json();
        assert_eq!(json["unknown_tool"], true, "{tool}");
        assert_eq!(json["capability"], Value::Null, "{tool}");
        assert_eq!(json["tool"], Value::Null, "{tool}");
        assert_eq!(json["decision"], Value::Null, "{tool}");
        assert!(json.get("tools").is_none(), "{tool}");
        assert_eq!(json["principal"]["id"], "staff:ana", "{tool}");
    }
    let human = explain("--issuer staff --subject ana --tool helpdesk__delete_ticket");
    assert!(human.stdout.contains("\nUNKNOWN TOOL\n"));
    insta::assert_snapshot!("explain_unknown_tool_human", human.snapshot());
}

#[test]
fn explain_an_unknown_tool_suggests_the_mapped_one_it_most_likely_meant() {
    let run = explain("--issuer staff --subject ana --tool helpdesk__get_tiket --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["unknown_tool"], true);
    assert_eq!(json["suggestion"], "helpdesk__get_ticket");
    let human = explain("--issuer staff --subject ana --tool helpdesk__get_tiket");
    assert!(
        human.stdout.contains("did you mean `helpdesk__get_ticket`?"),
        "{}",
        human.stdout
    );
    // Nothing close: no suggestion, and the member is absent.
    let run = explain("--issuer staff --subject ana --tool nothing__here --json");
    assert!(run.json().get("suggestion").is_none(), "{}", run.stdout);
}

#[test]
fn explain_issuer_unknown() {
    let run = explain("--issuer partners --subject ana --attr x=1 --tool helpdesk__get_ticket --json");
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["problem"], "issuer_unknown");
    assert_eq!(json["principal"], Value::Null);
    assert_eq!(json["decision"], Value::Null);
    assert_eq!(json["discarded"], json!([]));
    // The capability and tool are still filled from --tool.
    assert_eq!(json["capability"], "tickets.issue.read");
    assert_eq!(json["tool"]["exposed_name"], "helpdesk__get_ticket");
    assert!(json.get("tools").is_none());
    insta::assert_snapshot!("explain_issuer_unknown_json", run.snapshot());
}

#[test]
fn explain_blank_subject_is_credential_missing() {
    let run = explain("--issuer staff --subject '  ' --capability docs.page.search");
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("  problem   credential_missing — "));
    assert!(!run.stdout.contains("ALLOWED"));
    insta::assert_snapshot!("explain_credential_missing_human", run.snapshot());
    let json = explain("--issuer staff --subject '' --capability docs.page.search --json").json();
    assert_eq!(json["problem"], "credential_missing");
    assert_eq!(json["capability"], "docs.page.search");
    assert_eq!(json["unknown_tool"], false);
}

#[test]
fn explain_repeated_attributes_are_multi_valued() {
    // dept given twice: no dept attribute, so only the attribute-less grant
    // /grants/2 matches docs.page.search; the key is not "discarded".
    let json = explain(
        "--issuer staff --subject a --attr dept=support --attr dept=sales --attr zone=eu \
         --capability docs.page.search --json",
    )
    .json();
    assert_eq!(json["principal"]["attributes"], json!({}));
    assert_eq!(json["discarded"], json!(["zone"]));
    assert_eq!(json["decision"]["reason"]["path"], "/grants/2");

    // A static-key literal given once is replaced; --subject is used as given.
    let replaced = explain(
        "--issuer nightly --subject other --attr env=staging --capability deploy.release.approve --json",
    )
    .json();
    assert_eq!(replaced["principal"]["id"], "nightly:other");
    assert_eq!(
        replaced["principal"]["attributes"],
        json!({"env": "staging", "role": "batch"})
    );
    assert_eq!(replaced["decision"]["reason"]["code"], "no_grant_matches");

    // Given twice, it is removed.
    let removed = explain(
        "--issuer nightly --subject x --attr role=a --attr role=b --capability tickets.issue.read --json",
    )
    .json();
    assert_eq!(removed["principal"]["attributes"], json!({"env": "prod"}));
    assert_eq!(removed["decision"]["reason"]["code"], "no_grant_matches");

    // `k=` is the empty value, which no selector can match.
    let empty =
        explain("--issuer staff --subject a --attr dept= --capability tickets.issue.read --json").json();
    assert_eq!(empty["principal"]["attributes"], json!({"dept": ""}));
    assert_eq!(empty["decision"]["reason"]["code"], "no_grant_matches");
}

#[test]
fn explain_on_a_policy_that_does_not_compile_prints_validate() {
    for json in ["", "--json"] {
        let run = capgate(&format!(
            "explain tests/fixtures/cli/errors.yaml --issuer corp --subject a --capability crm.contact.read {json}"
        ));
        let validate = capgate(&format!("validate tests/fixtures/cli/errors.yaml {json}"));
        assert_eq!(run.code, 1);
        assert_eq!(run.stdout, validate.stdout);
        assert_eq!(run.stderr, "");
    }
}

// ── visible ─────────────────────────────────────────────────────────────────

#[test]
fn visible_for_senior_support_staff() {
    let args = format!(
        "visible {POLICY} --catalog {CATALOG} --issuer staff --subject ana --attr dept=support --attr level=senior"
    );
    let run = capgate(&args);
    assert_eq!(run.code, 0);
    insta::assert_snapshot!("visible_human", run.snapshot());

    let run = capgate(&format!("{args} --json"));
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(
        strings(&json["tools"], "exposed_name"),
        [
            "helpdesk__comment_ticket",
            "helpdesk__get_ticket",
            "helpdesk__list_tickets",
            "helpdesk-legacy__fetch_case",
            "knowledge__search_pages",
            "knowledge__semantic_search",
        ],
        "the §4.11 listing, in catalog order, never the unmapped delete_ticket"
    );
    assert_eq!(
        strings(&json["capabilities"], "capability"),
        ["tickets.issue.read", "tickets.issue.write", "docs.page.search"]
    );
    assert_eq!(json["capabilities"][2]["path"], "/grants/3");
    assert_eq!(json["tools"][0]["capability"], "tickets.issue.write");
    assert_eq!(json["tools"][0]["description"], "Add a comment to a ticket");
    assert_eq!(
        json["tools"][0]["input_schema"]["required"],
        json!(["ticketId", "body"])
    );
    insta::assert_snapshot!("visible_json", run.snapshot());
}

#[test]
fn visible_lists_suspended_grants_and_has_no_descriptors_without_a_catalog() {
    let json = capgate(&format!(
        "visible {POLICY} --issuer staff --subject f --attr dept=finance --json"
    ))
    .json();
    assert_eq!(
        strings(&json["capabilities"], "capability"),
        ["docs.page.search", "billing.refund.create"],
        "calls: 0 is still listed"
    );
    assert_eq!(json["tools"][2]["exposed_name"], "payments__issue_refund");
    assert_eq!(json["tools"][2]["description"], Value::Null);
    assert_eq!(json["tools"][2]["input_schema"], Value::Null);
}

#[test]
fn visible_without_a_principal_shows_nothing() {
    let run = capgate(&format!("visible {POLICY} --issuer partners --subject x --json"));
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["problem"], "issuer_unknown");
    assert_eq!(json["principal"], Value::Null);
    assert_eq!(json["capabilities"], json!([]));
    assert_eq!(json["tools"], json!([]));
    insta::assert_snapshot!("visible_issuer_unknown_json", run.snapshot());
}

// ── who-can ─────────────────────────────────────────────────────────────────

#[test]
fn who_can_issue_refunds() {
    let run = capgate(&format!("who-can {POLICY} --capability billing.refund.create"));
    assert_eq!(run.code, 0);
    insta::assert_snapshot!("who_can_human", run.snapshot());

    let run = capgate(&format!(
        "who-can {POLICY} --capability billing.refund.create --json"
    ));
    let json = run.json();
    assert_eq!(json["declared"], true);
    assert_eq!(json["realized"], true);
    assert_eq!(strings(&json["grants"], "path"), ["/grants/7", "/grants/10"]);
    assert_eq!(
        json["grants"][0]["attributes"],
        json!({"org": "Acme Corp", "unit": "payments"})
    );
    assert_eq!(
        json["grants"][1]["account"],
        json!({"id": "payments-bot", "disabled": false})
    );
    assert_eq!(json["grants"][1]["position"], json!({"line": 204, "column": 5}));
    let tools =
        json!([{"exposed_name": "payments__issue_refund", "upstream": "payments", "name": "issue_refund"}]);
    assert_eq!(json["tools"], tools);
    insta::assert_snapshot!("who_can_json", run.snapshot());
}

#[test]
fn who_can_reports_disabled_accounts_and_undeclared_capabilities() {
    let json = capgate(&format!(
        "who-can {POLICY} --capability deploy.release.approve --json"
    ))
    .json();
    assert_eq!(json["grants"][0]["account"]["disabled"], true);
    let run = capgate(&format!("who-can {POLICY} --capability crm.contact.read --json"));
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["declared"], false);
    assert_eq!(json["realized"], false);
    assert_eq!(json["grants"], json!([]));
    assert_eq!(json["tools"], json!([]));
}

// ── diff ────────────────────────────────────────────────────────────────────

#[test]
fn diff_reports_gained_lost_and_changed() {
    let after = "tests/fixtures/cli/after.yaml";
    let run = capgate(&format!("diff {POLICY} {after}"));
    assert_eq!(run.code, 1, "changes exit 1");
    insta::assert_snapshot!("diff_human", run.snapshot());

    let run = capgate(&format!("diff {POLICY} {after} --json"));
    assert_eq!(run.code, 1);
    let json = run.json();
    let changes: Vec<String> = json["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {} {} {}",
                c["issuer"], c["attributes"], c["capability"], c["kind"]
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            r#""mesh" {"unit":"sre"} "metrics.dashboard-view" "changed""#,
            r#""staff" {"dept":"finance"} "billing.refund.create" "lost""#,
            r#""staff" {"dept":"sre"} "tickets.issue.read" "gained""#,
            r#""staff" {"dept":"support"} "tickets.issue.read" "changed""#,
            r#""staff" {"dept":"support","level":"intern"} "tickets.issue.read" "changed""#,
            r#""staff" {"dept":"support","level":"senior"} "tickets.issue.read" "changed""#,
        ]
    );
    let lost = &json["changes"][1];
    assert_eq!(
        lost["after"],
        json!({"outcome": "deny", "code": "no_grant_matches"})
    );
    assert_eq!(lost["before"]["limits"]["calls"], 0);
    let gained = &json["changes"][2];
    assert_eq!(
        gained["after"]["limits"],
        Value::Null,
        "an allow without a ceiling has `limits: null`"
    );
    insta::assert_snapshot!("diff_json", run.snapshot());

    let widening = capgate(&format!("diff {POLICY} {after} --fail-on widening"));
    assert_eq!(
        widening.code, 1,
        "a gained decision and a looser ceiling are widening"
    );
}

#[test]
fn diff_ignores_reorders_and_respellings_and_narrowing_is_not_widening() {
    let narrowed = "tests/fixtures/cli/narrowed.yaml";
    let run = capgate(&format!("diff {POLICY} {narrowed} --json"));
    assert_eq!(run.code, 1);
    let json = run.json();
    assert_eq!(
        json["changes"].as_array().unwrap().len(),
        1,
        "only the tighter ceiling is a change"
    );
    assert_eq!(json["changes"][0]["after"]["limits"]["calls"], 10);
    let widening = capgate(&format!("diff {POLICY} {narrowed} --fail-on widening"));
    assert_eq!(widening.code, 0);
    assert!(widening.stdout.starts_with("1 decision change (0 widening):\n"));
    let reverse = capgate(&format!("diff {narrowed} {POLICY} --fail-on widening"));
    assert_eq!(reverse.code, 1, "loosening the ceiling back is widening");
}

#[test]
fn diff_deny_to_deny_with_another_code_is_changed_and_not_widening() {
    let before = "tests/fixtures/cli/warnings.yaml";
    let text = String::from_utf8(read(before)).unwrap();
    // After: a tool realises crm.contact.archive (capability_not_realized
    // becomes no_grant_matches) and crm-reader is disabled (an allow is lost).
    let after = text
        .replace(
            "        capability: crm.contact.read\n",
            "        capability: crm.contact.read\n      - name: archive_contact\n        capability: crm.contact.archive\n",
        )
        .replace("  - id: crm-reader\n", "  - id: crm-reader\n    disabled: true\n");
    assert_ne!(after, text);
    let run = capgate_with_stdin(
        &format!("diff {before} - --json --fail-on widening"),
        after.as_bytes(),
    );
    assert_eq!(
        run.code,
        0,
        "neither a lost allow nor deny -> deny is widening: {}",
        run.snapshot()
    );
    let json = run.json();
    let changes: Vec<String> = json["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {} {} {}",
                c["attributes"], c["capability"], c["kind"], c["after"]["code"]
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            r#"{} "crm.contact.archive" "changed" "no_grant_matches""#,
            r#"{"team":"sales"} "crm.contact.archive" "changed" "no_grant_matches""#,
            r#"{"team":"sales"} "crm.contact.read" "lost" "account_disabled""#,
        ]
    );
    let before_summary = json!({"outcome": "deny", "code": "capability_not_realized"});
    assert_eq!(json["changes"][0]["before"], before_summary);
    assert_eq!(json["after"]["origin"], "-");
    let run = capgate_with_stdin(&format!("diff {before} -"), after.as_bytes());
    assert_eq!(run.code, 1);
    insta::assert_snapshot!("diff_deny_to_deny_human", run.snapshot());
}

#[test]
fn diff_of_identical_policies_has_no_changes() {
    // Both sides from one standard input: it is read once.
    let run = capgate_with_stdin("diff - - --json", &read(POLICY));
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(json["changes"], json!([]));
    assert_eq!(json["before"], json["after"]);
    let human = capgate(&format!("diff {POLICY} {POLICY}"));
    assert_eq!(human.code, 0);
    assert_eq!(human.stdout, "no decision changes between the two versions\n");
}

#[test]
fn diff_with_a_side_that_does_not_compile_exits_3() {
    let errors = "tests/fixtures/cli/errors.yaml";
    let run = capgate(&format!("diff {POLICY} {errors}"));
    assert_eq!(run.code, 3);
    let validate = capgate(&format!("validate {errors}"));
    assert_eq!(run.stdout, validate.stdout, "the failing side's validate output");
    insta::assert_snapshot!("diff_failing_side_human", run.snapshot());

    let run = capgate(&format!(
        "diff {errors} tests/fixtures/cli/yaml-syntax.yaml --json"
    ));
    assert_eq!(run.code, 3);
    let json = run.json();
    assert_eq!(json["before"]["origin"], errors);
    assert_eq!(strings(&json["errors"], "side"), ["before", "after"]);
    let validate = capgate(&format!("validate {errors} --json")).json();
    assert_eq!(json["errors"][0]["diagnostics"], validate["diagnostics"]);
    assert!(json.get("changes").is_none());
    insta::assert_snapshot!("diff_failing_sides_json", run.snapshot());
}

#[test]
fn diff_with_a_catalog_fails_a_side_with_an_unlisted_tool() {
    let run = capgate(&format!(
        "diff {POLICY} tests/fixtures/cli/warnings.yaml --catalog {CATALOG} --json"
    ));
    assert_eq!(run.code, 3);
    let json = run.json();
    assert_eq!(strings(&json["errors"], "side"), ["after"]);
    let codes = strings(&json["errors"][0]["diagnostics"], "code");
    assert!(
        codes.iter().any(|code| code == "tool_not_in_catalog"),
        "{codes:?}"
    );
}

// ── schema ──────────────────────────────────────────────────────────────────

#[test]
fn schema_prints_the_json_schema() {
    let run = capgate("schema");
    assert_eq!(run.code, 0);
    assert_eq!(run.stderr, "");
    let json = run.json();
    assert_eq!(json["$schema"], "https://json-schema.org/draft/2020-12/schema");
    let published: Value = serde_json::from_str(capgate_core::policy::schema::SCHEMA_JSON).unwrap();
    assert_eq!(json, published);
    assert_eq!(capgate("schema --json").code, 2, "schema takes no flags");
}

// ── usage errors, unreadable inputs, standard input ─────────────────────────

fn stderr_first_line(run: &Run) -> &str {
    run.stderr.lines().next().unwrap_or_default()
}

#[test]
fn usage_errors_exit_2_with_one_line_and_a_hint() {
    let explain = "explain examples/policy.yaml --issuer staff --subject a --capability x";
    let cases = [
        String::new(),
        "frobnicate".into(),
        "validate".into(),
        "validate examples/policy.yaml --strict".into(),
        "validate examples/policy.yaml --json --json".into(),
        "validate examples/policy.yaml --catalog examples/catalog.yaml --catalog examples/catalog.yaml"
            .into(),
        "explain examples/policy.yaml --issuer staff --subject a".into(),
        "explain examples/policy.yaml --subject a --capability x".into(),
        format!("{explain} --tool y"),
        format!("{explain} --issuer mesh"),
        format!("{explain} --attr dept"),
        format!("{explain} --attr =support"),
        format!("{explain} --at 2026-01-02"),
        format!("{explain} --at 2016-12-31T23:59:60Z"),
        format!("{explain} --at 2026-02-29T00:00:00Z"),
        format!("{explain} --at 2026-01-02T00:00:00+01"),
        format!("{explain} --at {AT} --at {AT}"),
        format!("{explain} --usage -1"),
        format!("{explain} --usage 18446744073709551616"),
        format!("{explain} --usage lots"),
        format!("{explain} --usage 1 --usage 2"),
        format!("{explain} --window-start yesterday"),
        format!("{explain} --usage unknown --window-start {AT}"),
        format!("{explain} --usage none --window-start {AT}"),
        format!("visible examples/policy.yaml --issuer staff --subject a --at {AT}"),
        "who-can examples/policy.yaml".into(),
        "diff examples/policy.yaml".into(),
        "diff examples/policy.yaml examples/policy.yaml --fail-on narrowing".into(),
    ];
    let mut transcript = String::new();
    for line in &cases {
        let run = capgate(line);
        assert_eq!(run.code, 2, "{line}: {}", run.stderr);
        if line.contains("--json") {
            // A `--json` run says it as a document too (and the line on stderr).
            let document: Value = serde_json::from_str(&run.stdout).expect("a JSON error");
            assert_eq!(document["error"]["exit"], 2, "{line}");
            assert!(stderr_first_line(&run).ends_with(document["error"]["message"].as_str().unwrap()));
        } else {
            assert_eq!(run.stdout, "", "{line}");
        }
        let stderr: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(stderr.len(), 2, "{line}: {}", run.stderr);
        assert!(stderr[0].starts_with("error: "), "{line}: {}", run.stderr);
        assert!(stderr[1].contains("--help"), "{line}: {}", run.stderr);
        transcript.push_str(&format!("$ capgate {line}\n{}\n", run.snapshot()));
    }
    insta::assert_snapshot!("usage_errors", transcript);
}

#[test]
fn usage_errors_come_before_reading_any_file() {
    let run = capgate("explain missing.yaml --issuer a --subject b --capability c --usage x");
    assert_eq!(run.code, 2);
}

/// `capgate --help` sorts every command into what answers from the policy file alone and what
/// needs the service or its store, and says nothing false about either.
#[test]
fn the_top_level_help_says_which_commands_need_a_server() {
    let help = capgate("--help");
    assert_eq!(help.code, 0);
    assert!(
        !help.stdout.contains("answer from the policy file alone"),
        "{}",
        help.stdout
    );
    let commands: Vec<&str> = help
        .stdout
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert_eq!(commands.len(), 16, "{}", help.stdout);
    let group = |heading: &str| -> Vec<String> {
        let mut lines = help.stdout.lines().skip_while(|line| !line.starts_with(heading));
        lines.next().expect("the heading");
        let names = lines.next().expect("the group's line");
        names.split(',').map(|name| name.trim().to_owned()).collect()
    };
    let offline = group("Dry run, from the policy file alone");
    let online = group("The decision service:");
    let shell = group("The shell:");
    assert_eq!(
        offline,
        ["validate", "explain", "visible", "who-can", "diff", "test", "schema"]
    );
    for command in &commands {
        let placed = offline
            .iter()
            .chain(&online)
            .chain(&shell)
            .filter(|name| name == command)
            .count();
        assert_eq!(
            placed, 1,
            "`{command}` belongs to exactly one group: {}",
            help.stdout
        );
    }
    assert_eq!(offline.len() + online.len() + shell.len(), commands.len());
}

/// No command's help shows an empty default or an empty environment value, or names a key the
/// artifact does not have.
#[test]
fn help_texts_show_no_empty_values_and_no_wrong_keys() {
    for command in [
        "validate",
        "explain",
        "visible",
        "who-can",
        "diff",
        "schema",
        "serve",
        "migrate",
        "decide",
        "publish",
        "policies",
        "audit",
        "usage",
        "completions",
    ] {
        let help = capgate(&format!("{command} --help"));
        assert_eq!(help.code, 0, "{command}");
        for wrong in ["[default: \"\"]", "=]", "`principals.issuer`"] {
            assert!(
                !help.stdout.contains(wrong),
                "`{command} --help` shows {wrong}:\n{}",
                help.stdout
            );
        }
    }
}

/// `decide --help` says what `decide` does with a credential (the server checks it), names the
/// caller's token apart from the token the command calls the server with, and asks for a
/// gateway token, not an admin token.
#[test]
fn decide_help_describes_decide() {
    let help = capgate("decide --help");
    assert_eq!(help.code, 0);
    let flag = |name: &str| {
        help.stdout
            .lines()
            .find(|line| line.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{}", help.stdout))
            .to_owned()
    };
    assert!(
        flag("--caller-token <JWT>").contains("the server verifies it"),
        "{}",
        help.stdout
    );
    assert!(
        flag("--api-key <KEY>").contains("the server compares it"),
        "{}",
        help.stdout
    );
    assert!(
        flag("--token-file <F>").contains("a gateway token for `decide`"),
        "{}",
        help.stdout
    );
    assert!(!help.stdout.contains("--token <"), "{}", help.stdout);
    // The old spelling still works.
    let old = capgate("explain examples/policy.yaml --token x --capability docs.page.search");
    assert_eq!(old.code, 2, "{}", old.stderr);
    assert!(
        old.stderr.contains("`--caller-token` needs `--jwks FILE`"),
        "{}",
        old.stderr
    );
}

#[test]
fn help_and_version_go_to_stdout() {
    let help = capgate("explain --help");
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("--window-start <T>"));
    assert_eq!(help.stderr, "");
    let version = capgate("--version");
    assert_eq!(version.code, 0);
    assert!(version.stdout.starts_with("capgate "));
}

#[test]
fn unreadable_inputs_exit_3() {
    let cases = [
        "validate tests/fixtures/cli/no-such-file.yaml",
        "validate tests/fixtures/cli",
        "validate examples/policy.yaml --catalog tests/fixtures/cli/no-such-catalog.yaml",
        "validate examples/policy.yaml --catalog tests/fixtures/cli/catalog-not-a-list.yaml",
        "validate examples/policy.yaml --catalog tests/fixtures/cli/yaml-syntax.yaml",
        "explain tests/fixtures/cli/no-such-file.yaml --issuer a --subject b --capability c",
        "visible examples/policy.yaml --issuer a --subject b --catalog tests/fixtures/cli/catalog-not-a-list.yaml",
        "who-can tests/fixtures/cli/no-such-file.yaml --capability c",
        "diff examples/policy.yaml tests/fixtures/cli/no-such-file.yaml",
    ];
    let mut transcript = String::new();
    for line in cases {
        let run = capgate(line);
        assert_eq!(run.code, 3, "{line}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{line}");
        assert!(run.stderr.starts_with("error: cannot "), "{line}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{line}");
        transcript.push_str(&format!("$ capgate {line}\n{}\n", run.snapshot()));
    }
    insta::assert_snapshot!("unreadable_inputs", transcript);
}

#[test]
fn standard_input_is_a_policy() {
    let bytes = read(POLICY);
    let from_stdin = capgate_with_stdin("validate - --json", &bytes);
    let from_file = capgate(&format!("validate {POLICY} --json"));
    assert_eq!(from_stdin.code, 0);
    let (stdin_json, file_json) = (from_stdin.json(), from_file.json());
    assert_eq!(stdin_json["policy"]["origin"], "-");
    assert_eq!(stdin_json["policy"]["version"], file_json["policy"]["version"]);

    let explain = capgate_with_stdin(
        &format!("explain - --issuer staff --subject a --attr dept=support --capability tickets.issue.read --at {AT}"),
        &bytes,
    );
    assert_eq!(explain.code, 0);
    assert!(explain.stdout.contains("  site      -:125:5  /grants/0\n"));

    let broken = capgate_with_stdin("validate -", b"version: 1\ncapabilities: [\n");
    assert_eq!(broken.code, 1);
    assert!(broken.stdout.starts_with("-:"));
}

#[test]
fn odd_bytes_never_crash_the_binary() {
    let inputs: [&[u8]; 6] = [
        b"\xff\xfe\x00garbage",
        b"version: 1\n\t- [\n",
        b"a: &a [*a]\n",
        b"version: 1\r\ncapabilities: [{id: \"x\"}]\r\naccounts: []\r\nprincipals: {issuers: []}\r\ngrants: []\r",
        b"---\n---\n",
        "version: 1\ncapabilities:\n  - id: caf\u{e9}\t# \u{1f600}\n".as_bytes(),
    ];
    let commands = [
        "validate -".to_owned(),
        "validate - --json".to_owned(),
        format!("explain - --issuer x --subject y --capability z --at {AT}"),
        "visible - --issuer x --subject y --json".to_owned(),
        "who-can - --capability z".to_owned(),
        format!("diff - {POLICY}"),
    ];
    for input in inputs {
        for command in &commands {
            let run = capgate_with_stdin(command, input);
            assert!(
                matches!(run.code, 0 | 1 | 3),
                "{command} on {input:?}: {}",
                run.snapshot()
            );
        }
    }
}

#[test]
fn the_test_splitter_reads_quotes() {
    assert_eq!(words("a 'b c'  '' d=''"), ["a", "b c", "", "d="]);
}

// ── conditions: examples/refunds.yaml ───────────────────────────────────────

const REFUNDS: &str = "examples/refunds.yaml";
const REFUNDS_CATALOG: &str = "examples/refunds.catalog.yaml";
/// A Tuesday, 10:00 in Madrid: inside support's office hours.
const OFFICE_HOURS: &str = "2026-12-01T09:00:00Z";

/// `explain` on the refunds example for a support agent asking to refund, at `OFFICE_HOURS`
/// unless `rest` names another `--at`.
fn explain_refund(rest: &str) -> Run {
    let at = if rest.contains("--at ") {
        String::new()
    } else {
        format!(" --at {OFFICE_HOURS}")
    };
    capgate(&format!(
        "explain {REFUNDS} --catalog {REFUNDS_CATALOG} --issuer staff --subject sue --attr dept=support \
         --capability billing.refund.create{at} {rest}"
    ))
}

/// The outcome of each condition `explain --json` listed for the first conditional grant.
fn outcomes(json: &Value) -> Vec<String> {
    json["conditions"][0]["conditions"]
        .as_array()
        .expect("the grant's conditions")
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["path"].as_str().unwrap(),
                c["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn explain_checks_each_condition_and_names_the_failing_one_with_its_position() {
    let run = explain_refund("--arg amount=150 --arg currency=EUR");
    assert_eq!(run.code, 0, "{}", run.snapshot());
    insta::assert_snapshot!("explain_condition_failed_human", run.snapshot());
    assert!(run
        .stdout
        .contains("arguments  {\"amount\":150,\"currency\":\"EUR\"}\n"));
    assert!(run
        .stdout
        .contains("  site      examples/refunds.yaml:54:9  /grants/0/when/0\n"));
    assert!(run.stdout.contains("    failed   amount at_most 100 "));

    let json = explain_refund("--arg amount=150 --arg currency=EUR --json").json();
    assert_eq!(json["arguments"], json!({"amount": 150, "currency": "EUR"}));
    let reason = &json["decision"]["reason"];
    assert_eq!(reason["code"], "condition_failed");
    assert_eq!(reason["path"], "/grants/0/when/0");
    assert_eq!(reason["subject"], "amount");
    assert_eq!(reason["position"], json!({"line": 54, "column": 9}));
    assert_eq!(json["conditions"][0]["grant"], "/grants/0");
    assert_eq!(json["conditions"][0]["applies"], false);
    assert_eq!(
        outcomes(&json),
        [
            "/grants/0/when/0 failed",
            "/grants/0/when/1 held",
            "/grants/0/when/2 held"
        ]
    );
    assert_eq!(
        json["conditions"][0]["conditions"][1],
        json!({"path": "/grants/0/when/1", "position": {"line": 56, "column": 9},
               "subject": "currency", "condition": "currency in [\"EUR\",\"USD\"]", "outcome": "held"})
    );

    // Each condition fails on its own: the currency, then the hour.
    let json = explain_refund(r#"--args-json '{"amount": 50, "currency": "GBP"}' --json"#).json();
    assert_eq!(json["decision"]["reason"]["path"], "/grants/0/when/1");
    assert_eq!(
        json["decision"]["reason"]["position"],
        json!({"line": 56, "column": 9})
    );
    let json = explain_refund("--arg amount=50 --arg currency=EUR --at 2026-12-01T18:30:00Z --json").json();
    assert_eq!(json["decision"]["reason"]["code"], "condition_failed");
    assert_eq!(json["decision"]["reason"]["path"], "/grants/0/when/2");
    assert_eq!(json["decision"]["reason"]["subject"], "time");

    // No arguments given: the argument conditions miss, the hour still holds.
    let json = explain_refund("--json").json();
    assert_eq!(json["arguments"], Value::Null);
    assert_eq!(json["decision"]["reason"]["code"], "arguments_missing");
    assert_eq!(json["decision"]["reason"]["path"], "/grants/0/when/0");
    assert_eq!(
        outcomes(&json),
        [
            "/grants/0/when/0 missing",
            "/grants/0/when/1 missing",
            "/grants/0/when/2 held"
        ]
    );
}

#[test]
fn explain_allows_a_call_that_meets_the_conditions_and_says_the_allow_is_conditional() {
    let run = explain_refund(r#"--args-json '{"amount": 500, "currency": "EUR"}' --arg amount=50 --json"#);
    assert_eq!(run.code, 0);
    let json = run.json();
    assert_eq!(
        json["arguments"],
        json!({"amount": 50, "currency": "EUR"}),
        "--arg wins over --args-json"
    );
    assert_eq!(json["decision"]["outcome"], "allow");
    assert_eq!(json["decision"]["conditional"], true);
    assert_eq!(json["conditions"][0]["applies"], true);
    insta::assert_snapshot!("explain_conditional_allow_json", run.snapshot());
    let human = explain_refund("--arg amount=50 --arg currency=USD");
    assert!(human.stdout.contains("ALLOWED"), "{}", human.stdout);
    assert!(human.stdout.contains("  conditional  yes"), "{}", human.stdout);
    assert!(human
        .stdout
        .contains("  grant examples/refunds.yaml:49:5  /grants/0  (applies)"));

    // The same arguments from a file.
    let folder = tempfile::tempdir().expect("a scratch folder");
    let file = folder.path().join("args.json");
    std::fs::write(
        &file,
        r#"{"amount": 50, "currency": "USD", "order": {"id": "o-1"}}"#,
    )
    .expect("write");
    let json = explain_refund(&format!(
        "--args-json @{} --arg order.total=7 --json",
        file.display()
    ))
    .json();
    assert_eq!(json["decision"]["outcome"], "allow");
    assert_eq!(json["arguments"]["order"], json!({"id": "o-1", "total": 7}));

    // An unconditional grant has no conditions to show, and its allow is not conditional.
    let json = capgate(&format!(
        "explain {REFUNDS} --issuer staff --subject fin --attr dept=finance --capability billing.refund.create --at {OFFICE_HOURS} --arg amount=100000 --json"
    ))
    .json();
    assert_eq!(json["decision"]["conditional"], false);
    assert!(json.get("conditions").is_none(), "{json}");
}

#[test]
fn malformed_call_arguments_are_usage_errors_naming_the_flag() {
    for (rest, says) in [
        ("--arg amount", "'--arg <PATH=VALUE>'"),
        ("--arg =5", "'--arg <PATH=VALUE>'"),
        ("--arg order..total=5", "empty member name"),
        ("--args-json '{\"amount\": '", "`--args-json` is not JSON"),
        (
            "--args-json '[1, 2]'",
            "`--args-json` must be a JSON object, not an array",
        ),
        (
            "--args-json 50",
            "`--args-json` must be a JSON object, not a number",
        ),
    ] {
        let run = explain_refund(rest);
        assert_eq!(run.code, 2, "{rest}: {}", run.snapshot());
        assert!(run.stdout.is_empty(), "{rest}");
        assert!(stderr_first_line(&run).contains(says), "{rest}: {}", run.stderr);
        let json = explain_refund(&format!("{rest} --json")).json();
        assert_eq!(json["error"]["exit"], 2, "{rest}");
    }
    let run = explain_refund("--args-json @tests/fixtures/cli/no-such-arguments.json");
    assert_eq!(
        run.code,
        3,
        "an unreadable file is an input error: {}",
        run.snapshot()
    );
    assert!(
        run.stderr.contains("`--args-json`: cannot read"),
        "{}",
        run.stderr
    );
    // Checked before the policy is read, as the other usage errors are.
    let run = capgate("explain missing.yaml --issuer a --subject b --capability c --args-json '[]'");
    assert_eq!(run.code, 2, "{}", run.snapshot());
}

#[test]
fn visible_marks_a_capability_whose_every_grant_is_conditional() {
    let visible = |dept: &str| {
        capgate(&format!(
            "visible {REFUNDS} --catalog {REFUNDS_CATALOG} --issuer staff --subject x --attr dept={dept}"
        ))
    };
    let run = visible("support");
    assert_eq!(run.code, 0);
    insta::assert_snapshot!("visible_conditional_human", run.snapshot());
    assert!(run.stdout.contains("  billing.refund.create  (conditional"));
    let json = capgate(&format!(
        "visible {REFUNDS} --issuer staff --subject x --attr dept=support --json"
    ))
    .json();
    assert_eq!(json["capabilities"][0]["conditional"], true);
    let json = capgate(&format!(
        "visible {REFUNDS} --issuer staff --subject x --attr dept=finance --json"
    ))
    .json();
    assert_eq!(json["capabilities"][0]["capability"], "billing.refund.create");
    assert_eq!(json["capabilities"][0]["conditional"], false);
    assert!(!visible("finance").stdout.contains("conditional"));
}

#[test]
fn who_can_shows_each_grants_conditions_with_their_sites() {
    let run = capgate(&format!("who-can {REFUNDS} --capability billing.refund.create"));
    assert_eq!(run.code, 0);
    insta::assert_snapshot!("who_can_conditions_human", run.snapshot());
    assert!(run.stdout.contains(
        "    when      amount at_most 100                                  examples/refunds.yaml:54:9  /grants/0/when/0\n"
    ), "{}", run.stdout);
    let json = capgate(&format!(
        "who-can {REFUNDS} --capability deploy.release.approve --json"
    ))
    .json();
    assert_eq!(
        json["grants"][0]["conditions"],
        json!([{"path": "/grants/2/when/0", "position": {"line": 74, "column": 9},
                "subject": "environment", "condition": "environment equals \"staging\""}])
    );
    let json = capgate(&format!(
        "who-can {REFUNDS} --capability billing.refund.create --json"
    ))
    .json();
    assert_eq!(json["grants"][0]["conditions"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["grants"][1]["conditions"], json!([]));
}

/// `diff` from the refunds example to the example with `edit` applied (through stdin).
fn diff_refunds(edit: impl FnOnce(String) -> String, rest: &str) -> Run {
    let text = String::from_utf8(read(REFUNDS)).expect("UTF-8");
    let after = edit(text.clone());
    assert_ne!(after, text, "the edit changes the example");
    capgate_with_stdin(
        &format!("diff {REFUNDS} - --catalog {REFUNDS_CATALOG} {rest}"),
        after.as_bytes(),
    )
}

/// `diff` the other way: from the edited example back to it.
fn diff_back(edit: impl FnOnce(String) -> String, rest: &str) -> Run {
    let text = String::from_utf8(read(REFUNDS)).expect("UTF-8");
    let before = edit(text.clone());
    capgate_with_stdin(
        &format!("diff - {REFUNDS} --catalog {REFUNDS_CATALOG} {rest}"),
        before.as_bytes(),
    )
}

fn kinds(run: &Run) -> Vec<String> {
    let json = run.json();
    json["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["after"]["path"].as_str().unwrap(),
                c["kind"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn diff_reports_a_loosened_bound_as_widening_and_a_tightened_one_as_narrowing() {
    let loosen = |text: String| text.replace("at_most: 100", "at_most: 200");
    let run = diff_refunds(loosen, "");
    assert_eq!(run.code, 1, "a condition change is a change");
    insta::assert_snapshot!("diff_conditions_human", run.snapshot());
    assert!(run
        .stdout
        .starts_with("no decision changes between the two versions\n"));
    assert!(run
        .stdout
        .contains("  widening  staff [dept=support]  →  billing.refund.create  as support-payments\n"));

    let run = diff_refunds(loosen, "--json");
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["changes"], json!([]));
    assert_eq!(kinds(&run), ["/grants/0 widening"]);
    insta::assert_snapshot!("diff_conditions_json", run.snapshot());
    assert_eq!(diff_refunds(loosen, "--fail-on widening").code, 1);

    // Back again: the bound tightens, which is a change but no widening.
    let run = diff_back(loosen, "--json");
    assert_eq!(run.code, 1);
    assert_eq!(kinds(&run), ["/grants/0 narrowing"]);
    let run = diff_back(loosen, "--fail-on widening");
    assert_eq!(run.code, 0, "{}", run.snapshot());
    assert!(
        run.stdout.contains("(0 widening, 1 narrowing, 0 changed)"),
        "{}",
        run.stdout
    );

    // A set of values gaining one widens; losing one narrows.
    let more = |text: String| text.replace("in: [EUR, USD]", "in: [EUR, USD, GBP]");
    assert_eq!(kinds(&diff_refunds(more, "--json")), ["/grants/0 widening"]);
    let fewer = |text: String| text.replace("in: [EUR, USD]", "in: [EUR]");
    assert_eq!(kinds(&diff_refunds(fewer, "--json")), ["/grants/0 narrowing"]);
    // A longer office day widens.
    let longer = |text: String| text.replace("until: \"18:00\"", "until: \"20:00\"");
    assert_eq!(kinds(&diff_refunds(longer, "--json")), ["/grants/0 widening"]);
}

#[test]
fn diff_classifies_removed_added_and_unordered_conditions() {
    // Every condition of the release grant removed: widening.
    let unconditional = |text: String| {
        text.replace(
            "    when:\n      - argument: environment          # /grants/2/when/0\n        equals: staging\n",
            "",
        )
    };
    let run = diff_refunds(unconditional, "--json --fail-on widening");
    assert_eq!(run.code, 1, "{}", run.snapshot());
    assert_eq!(kinds(&run), ["/grants/2 widening"]);
    // Conditions added to finance's unconditional grant: narrowing.
    let run = diff_refunds(
        |text| {
            text.replace(
                "    using: finance-payments\n",
                "    using: finance-payments\n    when:\n      - argument: currency\n        in: [EUR]\n",
            )
        },
        "--json --fail-on widening",
    );
    assert_eq!(run.code, 0, "{}", run.snapshot());
    assert_eq!(kinds(&run), ["/grants/1 narrowing"]);
    // Another value, neither wider nor narrower: changed, which may widen.
    let run = diff_refunds(
        |text| text.replace("equals: staging", "equals: production"),
        "--json --fail-on widening",
    );
    assert_eq!(kinds(&run), ["/grants/2 changed"]);
    assert_eq!(run.code, 1, "a change that cannot be ordered counts as widening");
    // A bound loosened and another tightened at once: changed.
    let run = diff_refunds(
        |text| {
            text.replace("at_most: 100", "at_most: 200")
                .replace("in: [EUR, USD]", "in: [EUR]")
        },
        "--json",
    );
    assert_eq!(kinds(&run), ["/grants/0 changed"]);
    // The conditions written in another order: nothing changed.
    let reordered = |text: String| {
        let currency = "      - argument: currency             # /grants/0/when/1\n        in: [EUR, USD]\n";
        let amount = "      - argument: amount               # /grants/0/when/0\n        at_most: 100\n";
        text.replace(&format!("{amount}{currency}"), &format!("{currency}{amount}"))
    };
    let run = diff_refunds(reordered, "");
    assert_eq!(run.code, 0, "{}", run.snapshot());
    assert_eq!(run.stdout, "no decision changes between the two versions\n");
}

// ── capgate test ────────────────────────────────────────────────────────────

/// The example suite copied into a scratch folder, with `edit` applied to the
/// test file, so a case can be broken without touching `examples/`.
fn suite_copy(edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let folder = tempfile::tempdir().expect("a scratch folder");
    for name in [
        "policy.yaml",
        "catalog.yaml",
        "staff.jwks.json",
        "policy.capgate-test.yaml",
    ] {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name);
        std::fs::copy(from, folder.path().join(name)).expect("copy an example");
    }
    let suite = folder.path().join("policy.capgate-test.yaml");
    let text = std::fs::read_to_string(&suite).expect("the suite");
    std::fs::write(&suite, edit(text)).expect("write the suite");
    folder
}

fn capgate_in(folder: &std::path::Path, line: &str) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_capgate"))
        .args(words(line))
        .current_dir(folder)
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn the_example_suite_passes_and_covers_the_whole_policy() {
    let run = capgate("test examples --min-coverage 100");
    insta::assert_snapshot!("test_examples", run.snapshot());
    assert_eq!(run.code, 0, "{}", run.stdout);
    let run = capgate("test examples --min-coverage 100 --json");
    assert_eq!(run.code, 0);
    let document = run.json();
    assert_eq!(document["summary"]["failed"], 0);
    assert!(document["summary"]["cases"].as_u64().unwrap_or(0) >= 27);
    assert_eq!(document["coverage"][0]["percent"], 100.0);
    assert_eq!(document["coverage"][0]["uncovered"], json!([]));
    // The refunds suite runs with it, and covers its policy's conditions too.
    assert_eq!(
        document["suites"][1]["file"],
        "examples/refunds.capgate-test.yaml"
    );
    assert_eq!(
        document["coverage"][1]["policy"]["origin"],
        "examples/refunds.yaml"
    );
    assert_eq!(document["coverage"][1]["percent"], 100.0);
    // Every kind of case is there, each at its own line of the test file.
    let cases = document["suites"][0]["cases"].as_array().expect("cases");
    for kind in ["decide", "visible", "who_can"] {
        assert!(cases.iter().any(|case| case["kind"] == kind), "no {kind} case");
    }
    assert!(cases.iter().all(|case| case["position"]["line"].is_u64()));
}

#[test]
fn a_failing_case_says_what_was_expected_what_came_and_where() {
    let folder = suite_copy(|text| {
        text.replace(
            "expect: { decision: deny, reason: limit_exhausted, pointer: /grants/10 }",
            "expect: { decision: deny, reason: granted, pointer: /grants/10 }",
        )
        .replace(
            "ceiling: { calls: 20, per: 1h } }",
            "ceiling: { calls: 21, per: 1h } }",
        )
        .replace("  nightly: example-nightly-key", "  nightly: another-key")
    });
    let run = capgate_in(folder.path(), "test --junit report.xml");
    assert_eq!(run.code, 1, "{}", run.stdout);
    insta::assert_snapshot!("test_failures", run.snapshot());
    // The finance case: its line in the test file, and the grant that decided with its line.
    assert!(
        run.stdout
            .contains("reason: expected granted, got limit_exhausted"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("decided by /grants/10 at policy.yaml:"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("ceiling: expected 21 per 1h, got 20 per 1h"),
        "{}",
        run.stdout
    );
    // A wrong suite key: the nightly runner no longer authenticates.
    assert!(run
        .stdout
        .contains("FAIL  decide   the nightly runner reads tickets with its key"));
    let junit = std::fs::read_to_string(folder.path().join("report.xml")).expect("the JUnit report");
    assert!(junit.starts_with("<?xml"), "{junit}");
    let failures = junit.matches("<failure ").count();
    let failed = run.stdout.matches("  FAIL  ").count();
    assert_eq!(failures, failed, "{junit}");
    assert!(junit.contains(&format!("failures=\"{failed}\"")), "{junit}");
    let run = capgate_in(folder.path(), "test --json");
    let document = run.json();
    assert_eq!(document["summary"]["exit"], 1);
    let finance = document["suites"][0]["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|case| case["name"] == "finance refunds are suspended")
        .expect("the finance case")
        .clone();
    assert_eq!(finance["passed"], false);
    assert_eq!(
        finance["mismatches"],
        json!([{"field": "reason", "expected": "granted", "actual": "limit_exhausted"}])
    );
    assert_eq!(finance["decided_by"]["pointer"], "/grants/10");
}

#[test]
fn filters_select_cases_and_coverage_can_fail_the_run() {
    let run = capgate("test examples --filter REFUND");
    assert_eq!(run.code, 0, "{}", run.stdout);
    let ran = run
        .stdout
        .lines()
        .filter(|line| line.starts_with("  ok "))
        .count();
    assert!(ran >= 3, "{}", run.stdout);
    assert!(run
        .stdout
        .lines()
        .filter(|line| line.starts_with("  ok "))
        .all(|line| line.contains("refund")));
    // The refund cases alone leave most of the policy unexercised, and say which parts.
    assert!(
        run.stdout
            .contains("not exercised: grant `/grants/0` at examples/policy.yaml:"),
        "{}",
        run.stdout
    );
    let run = capgate("test examples --filter refund --min-coverage 90");
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("below --min-coverage 90 %"), "{}", run.stdout);
    let run = capgate("test examples --filter refund --min-coverage 101");
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn a_test_file_that_cannot_be_used_says_where_and_exits_3() {
    let folder = tempfile::tempdir().expect("a scratch folder");
    std::fs::write(
        folder.path().join("policy.yaml"),
        std::fs::read(POLICY).expect("the example"),
    )
    .expect("write");
    std::fs::write(
        folder.path().join("bad.capgate-test.yaml"),
        "policy: policy.yaml\ndecide:\n  - name: typo\n    principal: { issuer: staff, subject: a }\n    capability: docs.page.search\n    expect: { decison: allow }\n  - name: both\n    principal: { issuer: staff, subject: a }\n    capability: docs.page.search\n    tool: knowledge__search_pages\n    expect: { decision: allow }\n",
    )
    .expect("write");
    std::fs::write(
        folder.path().join("refs.capgate-test.yaml"),
        "policy: policy.yaml\ndecide:\n  - name: undeclared\n    principal: nobody\n    capability: docs.page.search\n    expect: { decision: allow }\n",
    )
    .expect("write");
    std::fs::write(
        folder.path().join("missing.capgate-test.yaml"),
        "policy: absent.yaml\nwho_can:\n  - name: w\n    capability: docs.page.search\n    expect: { declared: true }\n",
    )
    .expect("write");
    let run = capgate_in(folder.path(), "test");
    insta::assert_snapshot!("test_unusable", run.snapshot());
    assert_eq!(run.code, 3);
    assert!(
        run.stdout
            .contains("bad.capgate-test.yaml:6:13: unknown member `decison` here"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("bad.capgate-test.yaml:7:5: a decide case names exactly one of `capability` or `tool`"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("refs.capgate-test.yaml:4:16: no principal `nobody` is declared"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("cannot read the policy `absent.yaml`: no such file"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_suite_whose_policy_does_not_compile_fails_with_its_diagnostics() {
    let folder = suite_copy(|text| text);
    let policy = folder.path().join("policy.yaml");
    let text = std::fs::read_to_string(&policy).expect("the policy");
    std::fs::write(
        &policy,
        text.replacen("using: docs-reader", "using: docs-writer", 1),
    )
    .expect("write");
    let run = capgate_in(folder.path(), "test");
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains("does not compile; no case ran"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("unknown_account_in_grant"), "{}", run.stdout);
}

#[test]
fn no_test_file_is_a_usage_error() {
    let folder = tempfile::tempdir().expect("a scratch folder");
    let run = capgate_in(folder.path(), "test");
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .contains("no test file (`*.capgate-test.yaml`) under `.`"),
        "{}",
        run.stderr
    );
    let run = capgate_in(folder.path(), "test --json");
    assert_eq!(run.json()["error"]["exit"], 2);
}

#[test]
fn the_test_schema_is_printed_and_describes_the_example_suite() {
    let run = capgate("schema --tests");
    assert_eq!(run.code, 0);
    let schema = run.json();
    assert_eq!(schema["$id"], "https://capgate.dev/schemas/policy-test-v1.json");
    for member in ["policy", "principals", "decide", "visible", "who_can"] {
        assert!(
            schema["properties"].get(member).is_some(),
            "no `{member}` in the schema"
        );
    }
    assert_ne!(capgate("schema").stdout, run.stdout);
}

/// The refunds suite copied into a scratch folder with its policy and catalog, `edit` applied
/// to the suite.
fn refunds_suite_copy(edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let folder = tempfile::tempdir().expect("a scratch folder");
    for name in [
        "refunds.yaml",
        "refunds.catalog.yaml",
        "refunds.capgate-test.yaml",
    ] {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name);
        std::fs::copy(from, folder.path().join(name)).expect("copy an example");
    }
    let suite = folder.path().join("refunds.capgate-test.yaml");
    let text = std::fs::read_to_string(&suite).expect("the suite");
    let edited = edit(text.clone());
    std::fs::write(&suite, edited).expect("write the suite");
    folder
}

#[test]
fn the_refunds_suite_covers_every_condition_both_ways() {
    let run = capgate("test examples/refunds.capgate-test.yaml --min-coverage 100 --json");
    assert_eq!(run.code, 0, "{}", run.stdout);
    let document = run.json();
    let coverage = &document["coverage"][0];
    assert_eq!(coverage["conditions"], json!({"covered": 4, "total": 4}));
    assert_eq!(coverage["uncovered"], json!([]));
    // The example policy has no conditions: none to cover, and its line says nothing of them.
    let run = capgate("test examples/policy.capgate-test.yaml --json");
    assert_eq!(
        run.json()["coverage"][0]["conditions"],
        json!({"covered": 0, "total": 0})
    );
}

#[test]
fn coverage_reports_a_condition_no_case_made_fail() {
    // Without the GBP case and the one without arguments (a missing argument counts as a
    // failure), no case makes the currency condition fail.
    let folder = refunds_suite_copy(|text| {
        let cut = |text: &str, from: &str, to: &str| {
            let start = text.find(from).expect("the case");
            let end = text.find(to).expect("the next case");
            format!("{}{}", &text[..start], &text[end..])
        };
        let text = cut(
            &text,
            "  - name: support's refund in GBP",
            "  - name: support's refund after office hours",
        );
        cut(
            &text,
            "  - name: support's refund without arguments",
            "  - name: engineering approves",
        )
    });
    let run = capgate_in(folder.path(), "test --min-coverage 100");
    assert_eq!(run.code, 1, "{}", run.stdout);
    insta::assert_snapshot!("test_uncovered_condition", run.snapshot());
    assert!(
        run.stdout.contains(
            "  not exercised: condition `currency in [\"EUR\",\"USD\"]` at refunds.yaml:56:9  /grants/0/when/1 (never failed)\n"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("conditions 3/4)"), "{}", run.stdout);
    assert!(
        run.stdout.contains("below --min-coverage 100 %"),
        "{}",
        run.stdout
    );
    let document = capgate_in(folder.path(), "test --json").json();
    assert_eq!(
        document["coverage"][0]["uncovered"],
        json!([{"kind": "condition", "id": "currency in [\"EUR\",\"USD\"]", "path": "/grants/0/when/1",
                "position": {"line": 56, "column": 9}, "held": true, "failed": false}])
    );

    // Without the cases that make the release condition hold and fail, it was never checked;
    // a missing argument counts as failing, so the amount stays covered without the 150 case.
    let folder = refunds_suite_copy(|text| {
        let start = text
            .find("  - name: support's refund of 150")
            .expect("the 150 case");
        let end = text
            .find("  - name: support's refund in GBP")
            .expect("the next case");
        let text = format!("{}{}", &text[..start], &text[end..]);
        let start = text
            .find("  - name: engineering approves")
            .expect("the staging case");
        let end = text.find("visible:").expect("the listings");
        format!("{}{}", &text[..start], &text[end..])
    });
    let document = capgate_in(folder.path(), "test --json").json();
    let uncovered: Vec<String> = document["coverage"][0]["uncovered"]
        .as_array()
        .expect("uncovered")
        .iter()
        .map(|item| format!("{} {} {}", item["kind"], item["path"], item["held"]))
        .collect();
    assert_eq!(
        uncovered,
        [
            r#""grant" "/grants/2" null"#,
            r#""capability" "/capabilities/1" null"#,
            r#""account" "/accounts/2" null"#,
            r#""condition" "/grants/2/when/0" false"#,
        ]
    );
}

#[test]
fn a_case_gives_arguments_as_an_object_and_may_expect_the_condition_codes() {
    let run = capgate("schema --tests");
    let schema = run.json();
    let case = &schema["$defs"]["decideCase"]["properties"];
    assert_eq!(case["arguments"]["type"], "object");
    assert!(case["at"].is_object());
    let codes = schema["$defs"]["code"]["enum"].as_array().expect("codes");
    for code in ["condition_failed", "arguments_missing"] {
        assert!(codes.contains(&json!(code)), "{code}");
    }
    let folder = refunds_suite_copy(|text| {
        text.replacen(
            "arguments: { paymentId: pay-2, amount: 50, currency: EUR }",
            "arguments: [50, EUR]",
            1,
        )
    });
    let run = capgate_in(folder.path(), "test");
    assert_eq!(run.code, 3, "{}", run.stdout);
    assert!(
        run.stdout.contains("refunds.capgate-test.yaml:26:16: "),
        "{}",
        run.stdout
    );
}

/// The store's pool is bounded both ways: none is no pool, and more than 1 024 is a typo.
#[test]
fn serve_refuses_a_store_pool_out_of_bounds() {
    for count in ["0", "1025", "many"] {
        let run = capgate(&format!("serve --store-connections {count}"));
        assert_eq!(run.code, 2, "--store-connections {count}: {}", run.stderr);
        assert!(
            run.stderr.contains("--store-connections"),
            "the error names the flag: {}",
            run.stderr
        );
    }
}
