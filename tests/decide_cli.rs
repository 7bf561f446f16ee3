//! `capgate decide` against a real `capgate serve` process (SQLite, loopback):
//! the README's "ask the service" tour, end to end through the binary.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

/// A `capgate serve` process, killed when dropped.
struct Serve {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

fn serve() -> Serve {
    serve_example("policy.yaml", "catalog.yaml")
}

/// `capgate serve` on one of the examples, with its catalog.
fn serve_example(policy: &str, catalog: &str) -> Serve {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("capgate-decide-cli-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(BIN)
        .current_dir(&dir)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--policy"])
        .arg(example(policy))
        .arg("--catalog")
        .arg(example(catalog))
        .env_remove("CAPGATE_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Serve {
        child,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    }
}

fn decide(server: &Serve, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("decide")
        .args(["--server", &server.url])
        .args(args)
        .env_remove("CAPGATE_TOKEN")
        .output()
        .unwrap()
}

/// Retries until the server answers (it publishes the policy at start-up).
fn first_answer(server: &Serve, args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = decide(server, args);
        if output.status.success() {
            return String::from_utf8(output.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no answer: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn decide_prints_the_reason_the_account_and_the_remaining_calls() {
    let server = serve();
    let allowed = first_answer(
        &server,
        &[
            "--issuer",
            "staff",
            "--subject",
            "ana",
            "--attr",
            "dept=support",
            "--tool",
            "helpdesk__get_ticket",
        ],
    );
    assert!(allowed.contains("ALLOWED"), "{allowed}");
    assert!(allowed.contains("/grants/0"), "{allowed}");
    assert!(allowed.contains("helpdesk-reader"), "{allowed}");
    assert!(allowed.contains("600 calls per 1h; 599 left"), "{allowed}");

    // The second call consumed one more: the counter is the server's.
    let again = decide(
        &server,
        &[
            "--issuer",
            "staff",
            "--subject",
            "ana",
            "--attr",
            "dept=support",
            "--tool",
            "helpdesk__get_ticket",
        ],
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains("598 left"));

    // A suspended grant denies, with no account in the answer.
    let denied = decide(
        &server,
        &[
            "--issuer",
            "staff",
            "--subject",
            "bo",
            "--attr",
            "dept=finance",
            "--capability",
            "billing.refund.create",
            "--json",
        ],
    );
    assert!(denied.status.success());
    let value: serde_json::Value = serde_json::from_slice(&denied.stdout).unwrap();
    let decision = &value["result"]["decision"];
    assert_eq!(decision["outcome"], "deny");
    assert_eq!(decision["reason"]["code"], "limit_exhausted");
    assert_eq!(decision["reason"]["path"], "/grants/10");
    assert!(decision.get("account").is_none());
}

#[test]
fn an_unreachable_server_is_an_input_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = Command::new(BIN)
        .args(["decide", "--server", &format!("http://127.0.0.1:{port}")])
        .args(["--issuer", "staff", "--subject", "ana", "--capability", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot reach"));
}

/// An engineer asking to approve a release, on the refunds example, with `extra` flags.
fn approve_release<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--issuer",
        "staff",
        "--subject",
        "eng",
        "--attr",
        "dept=engineering",
        "--tool",
        "ci__approve_release",
    ];
    args.extend(extra);
    args
}

#[test]
fn decide_sends_the_calls_arguments_for_the_grants_conditions() {
    let server = serve_example("refunds.yaml", "refunds.catalog.yaml");
    let allowed = first_answer(
        &server,
        &approve_release(&["--arg", "environment=staging", "--arg", "release=v1.4.0"]),
    );
    assert!(allowed.contains("ALLOWED"), "{allowed}");
    assert!(allowed.contains("release-robot"), "{allowed}");

    let denied = decide(
        &server,
        &approve_release(&[
            "--args-json",
            r#"{"environment": "production", "release": "v1.4.0"}"#,
            "--json",
        ]),
    );
    assert!(
        denied.status.success(),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&denied.stdout).unwrap();
    let reason = &value["result"]["decision"]["reason"];
    assert_eq!(reason["code"], "condition_failed", "{value}");
    assert_eq!(reason["path"], "/grants/2/when/0");
    assert_eq!(reason["position"], serde_json::json!({"line": 74, "column": 9}));

    // No arguments sent: the condition cannot be checked.
    let missing = decide(&server, &approve_release(&["--json"]));
    let value: serde_json::Value = serde_json::from_slice(&missing.stdout).unwrap();
    assert_eq!(
        value["result"]["decision"]["reason"]["code"], "arguments_missing",
        "{value}"
    );
}

#[test]
fn malformed_arguments_are_refused_before_any_server_is_called() {
    // Nothing listens there: a usage error must come first.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (bad, says) in [
        (["--args-json", "[1]"], "`--args-json` must be a JSON object"),
        (["--args-json", "{"], "`--args-json` is not JSON"),
        (["--arg", "environment"], "--arg <PATH=VALUE>"),
    ] {
        let output = Command::new(BIN)
            .args(["decide", "--server", &format!("http://127.0.0.1:{port}")])
            .args(approve_release(&bad))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(says), "{bad:?}: {stderr}");
    }
}
