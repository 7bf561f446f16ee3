//! The README's promises about the example service: every warning `capgate serve` prints when it
//! starts on the example policy is explained there, word for word, so a newcomer is never left
//! guessing whether a warning is expected.

mod support;

use std::time::Duration;

use support::process::Serve;

/// The `fields.message` of every WARN line in `logs` (JSON lines).
fn warnings(logs: &str) -> Vec<String> {
    logs.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["level"] == "WARN")
        .filter_map(|line| line["fields"]["message"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_warning_of_the_example_start_is_explained_in_the_readme() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let serve = Serve::start_example(dir.path()).await;
    // The identity provider's keys are fetched in the background: wait for that attempt to be
    // over (it fails at once here: the example's provider does not exist).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !serve.logs().contains("OIDC key fetch") && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let readme = std::fs::read_to_string("README.md").expect("the README");
    let seen = warnings(&serve.logs());
    assert!(seen.len() >= 2, "the example starts with warnings: {seen:?}");
    for warning in &seen {
        assert!(
            readme.contains(warning.as_str()),
            "README.md does not explain the warning `{warning}`"
        );
    }
}
