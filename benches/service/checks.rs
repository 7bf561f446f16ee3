//! The bench's own unit checks. This bench has `harness = false`, so it is built without libtest
//! and a `#[test]` function in it would be compiled out; these are plain functions instead, which
//! the smoke run (`cargo test --benches`, see `main`) calls before it drives the service. A failing
//! assertion is reported under the check's name and fails that run.

use std::ffi::OsString;
use std::panic;

use clap::Parser as _;

use crate::callers::{percentile, policy};
use crate::plan::{check_loopback, Args, Plan, Scenario};

/// Every check, by name.
const ALL: &[(&str, fn())] = &[
    (
        "only_loopback_servers_are_driven",
        only_loopback_servers_are_driven,
    ),
    (
        "percentiles_use_the_nearest_rank",
        percentiles_use_the_nearest_rank,
    ),
    (
        "the_bench_policy_compiles_cleanly",
        the_bench_policy_compiles_cleanly,
    ),
    (
        "plans_are_bounded_and_deduplicated",
        plans_are_bounded_and_deduplicated,
    ),
    (
        "cargo_bench_is_told_from_cargo_test",
        cargo_bench_is_told_from_cargo_test,
    ),
];

/// Runs every check, each to its end whatever the others did; returns how many failed.
pub fn run() -> usize {
    let mut failed = 0;
    for (name, check) in ALL {
        // The default panic hook has already printed the assertion and where it failed.
        let passed = panic::catch_unwind(check).is_ok();
        println!("check {name} ... {}", if passed { "ok" } else { "FAILED" });
        failed += usize::from(!passed);
    }
    failed
}

/// How many checks there are, for the summary.
pub fn count() -> usize {
    ALL.len()
}

fn only_loopback_servers_are_driven() {
    for url in [
        "http://127.0.0.1:50051",
        "http://127.9.9.9:1",
        "http://[::1]:50051",
        "http://localhost:50051",
    ] {
        assert!(check_loopback(url).is_ok(), "{url}");
    }
    for url in [
        "http://10.0.0.1:50051",
        "https://example.net",
        "http://[2001:db8::1]:1",
        "not a url",
    ] {
        assert!(check_loopback(url).is_err(), "{url}");
    }
}

fn percentiles_use_the_nearest_rank() {
    let samples: Vec<u32> = (1..=100).collect();
    assert_eq!(percentile(&samples, 0.50), 50);
    assert_eq!(percentile(&samples, 0.99), 99);
    assert_eq!(percentile(&samples, 1.0), 100);
    assert_eq!(percentile(&[7], 0.99), 7);
    assert_eq!(percentile(&[], 0.5), 0);
}

fn the_bench_policy_compiles_cleanly() {
    // The key file is read when a version is installed, not when it compiles.
    let compiled = capgate_core::policy::compile(policy(std::path::Path::new("/bench/key")).as_bytes(), None);
    assert!(compiled.diagnostics.is_empty(), "{:?}", compiled.diagnostics);
}

fn plans_are_bounded_and_deduplicated() {
    let plan = |arguments: &[&str]| {
        let args = Args::try_parse_from(["service"].iter().chain(arguments)).expect("the arguments parse");
        Plan::of(&args)
    };
    let checked = plan(&["--concurrency", "4,1,4", "--scenario", "capped,all"]).expect("a valid plan");
    assert_eq!(checked.concurrency, [4, 1]);
    assert_eq!(
        checked.scenarios,
        [
            Scenario::Capped,
            Scenario::Uncapped,
            Scenario::CappedHot,
            Scenario::UncappedKeyed,
            Scenario::ExtMcpUncapped,
            Scenario::ExtAuthzUncapped,
            Scenario::AuthzenUncapped,
            Scenario::ExtMcpCapped,
            Scenario::AuthzenCapped,
            Scenario::ExtAuthzCappedHot
        ]
    );
    for refused in [
        &["--concurrency", "0"][..],
        &["--concurrency", "1025"],
        &["--duration", "50ms"],
        &["--warmup", "11m"],
        &["--principals", "0"],
        &["--server", "http://192.0.2.1:50051"],
    ] {
        assert!(plan(refused).is_err(), "{refused:?}");
    }
}

fn cargo_bench_is_told_from_cargo_test() {
    let arguments = |all: &[&str]| all.iter().map(OsString::from).collect::<Vec<_>>();
    // `cargo bench --bench service -- --duration 1s` appends `--bench` after the user's arguments.
    assert!(crate::measuring(&arguments(&[
        "service",
        "--duration",
        "1s",
        "--bench"
    ])));
    assert!(crate::measuring(&arguments(&["service", "--bench"])));
    // `cargo test --benches` passes nothing, or libtest's own flags and filters.
    assert!(!crate::measuring(&arguments(&["service"])));
    assert!(!crate::measuring(&arguments(&[
        "service",
        "--nocapture",
        "bench"
    ])));
    // The flag is accepted, and a filter naming this bench does not skip it.
    let args =
        Args::try_parse_from(["service", "service", "--bench"]).expect("cargo bench's arguments parse");
    assert!(args.bench && !crate::skipped(&args));
    let other = Args::try_parse_from(["service", "jwt_verify", "--bench"]).expect("a filter parses");
    assert!(crate::skipped(&other));
}
