//! What the service's log says about policy changes, read as an operator reads it: nothing about
//! a version that was refused.

mod support;

use std::process::Command;

use support::process::Serve;

const BIN: &str = env!("CARGO_BIN_EXE_capgate");

fn capgate(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("CAPGATE_SERVER")
        .env_remove("CAPGATE_TOKEN")
        .output()
        .expect("the binary runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_activation_logs_nothing_of_its_version() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let serve = Serve::start_example(dir.path()).await;
    let server = format!("http://{}", serve.addr);
    let tighter = dir.path().join("tighter.yaml");
    let example = std::fs::read_to_string("examples/policy.yaml").unwrap();
    std::fs::write(
        &tighter,
        example.replace("calls: 600, per: 1h", "calls: 300, per: 1h"),
    )
    .unwrap();
    let published = capgate(&[
        "publish",
        tighter.to_str().unwrap(),
        "--catalog",
        "examples/catalog.yaml",
        "--server",
        &server,
    ]);
    assert!(published.status.success(), "{published:?}");
    let key_warnings = |logs: &str| logs.matches("a static key cannot be read").count();
    let before = key_warnings(&serve.logs());

    // Refused (revision 2 is active, not 7): revision 1 is not installed, so its keys are not read.
    let refused = capgate(&[
        "policies",
        "activate",
        "1",
        "--expected-revision",
        "7",
        "--server",
        &server,
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert_eq!(key_warnings(&serve.logs()), before, "{}", serve.logs());

    let activated = capgate(&["policies", "activate", "1", "--server", &server]);
    assert!(activated.status.success(), "{activated:?}");
    let logs = serve.logs();
    assert_eq!(
        key_warnings(&logs),
        before + 1,
        "the activated version's keys are read once"
    );
}
