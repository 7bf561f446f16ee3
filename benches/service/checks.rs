//! The bench's own unit checks. This bench has `harness = false`, so it is built without libtest
//! and a `#[test]` function in it would be compiled out; these are plain functions instead, which
//! the smoke run (`cargo test --benches`, see `main`) calls before it drives the service. A failing
//! assertion is reported under the check's name and fails that run.

use std::ffi::OsString;
use std::panic;

use clap::Parser as _;

use crate::callers::{percentile, policy, shadow_policy, Measured, Tally};
use crate::plan::{check_loopback, Args, Plan, Scenario, Shadow};
use crate::report::Paired;
use crate::summary::{median, summarize};

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
        "the_shadow_versions_agree_and_differ_as_named",
        the_shadow_versions_agree_and_differ_as_named,
    ),
    (
        "plans_are_bounded_and_deduplicated",
        plans_are_bounded_and_deduplicated,
    ),
    (
        "cargo_bench_is_told_from_cargo_test",
        cargo_bench_is_told_from_cargo_test,
    ),
    ("repeated_runs_fold_into_medians", repeated_runs_fold_into_medians),
    ("ratios_are_paired_run_by_run", ratios_are_paired_run_by_run),
    ("the_plot_is_well_formed", the_plot_is_well_formed),
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

/// The effective changes from the bench policy to a shadow version, for the bench's own callers
/// (issuer `bench`, team `load`), as `(capability, kind, account before, account after)`.
fn bench_changes(shadow: Shadow) -> Vec<(String, &'static str, Option<String>, Option<String>)> {
    use capgate_core::access::{effective_diff, Side};
    let key = std::path::Path::new("/bench/key");
    let compile = |artifact: String| {
        let compiled = capgate_core::policy::compile(artifact.as_bytes(), None);
        assert!(compiled.diagnostics.is_empty(), "{:?}", compiled.diagnostics);
        compiled.policy.expect("it compiles")
    };
    let (active, candidate) = (compile(policy(key)), compile(shadow_policy(key, shadow)));
    let (before, after) = (active.issuer_ids(), candidate.issuer_ids());
    effective_diff(
        Side {
            ruleset: &active.ruleset,
            issuers: &before,
        },
        Side {
            ruleset: &candidate.ruleset,
            issuers: &after,
        },
    )
    .into_iter()
    .filter(|change| {
        change.issuer == "bench" && change.attributes.get("team").map(String::as_str) == Some("load")
    })
    .map(|change| {
        (
            change.capability,
            change.kind.as_str(),
            change.before.and_then(|summary| summary.account),
            change.after.and_then(|summary| summary.account),
        )
    })
    .collect()
}

/// What the shadow scenarios measure rests on their names: an agreeing shadow changes nothing for
/// the bench's callers, a differing one changes the uncapped tool's account and nothing else.
fn the_shadow_versions_agree_and_differ_as_named() {
    assert_eq!(bench_changes(Shadow::Agrees), []);
    assert_eq!(
        bench_changes(Shadow::Differs),
        [(
            "bench.free.call".to_owned(),
            "changed",
            Some("bench-runner".to_owned()),
            Some("bench-other".to_owned())
        )]
    );
}

fn plans_are_bounded_and_deduplicated() {
    let plan = |arguments: &[&str]| {
        let args = Args::try_parse_from(["service"].iter().chain(arguments)).expect("the arguments parse");
        Plan::of(&args)
    };
    let checked = plan(&["--concurrency", "4,1,4", "--scenario", "capped,all"]).expect("a valid plan");
    assert_eq!(checked.concurrency, [4, 1]);
    assert_eq!(checked.repeat, 1);
    assert_eq!(plan(&["--repeat", "9"]).expect("nine runs").repeat, 9);
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
            Scenario::ForwardAuthUncapped,
            Scenario::ExtMcpCapped,
            Scenario::AuthzenCapped,
            Scenario::ExtAuthzCappedHot,
            Scenario::UncappedShadow,
            Scenario::CappedShadow,
            Scenario::UncappedShadowDiffers
        ]
    );
    for refused in [
        &["--concurrency", "0"][..],
        &["--concurrency", "1025"],
        &["--duration", "50ms"],
        &["--warmup", "11m"],
        &["--principals", "0"],
        &["--server", "http://192.0.2.1:50051"],
        &["--repeat", "0"],
        &["--repeat", "10"],
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

/// A measurement of `name` at `concurrency` that answered `calls` calls in one second, each taking
/// `latency_ms`.
fn measured(concurrency: usize, name: &'static str, calls: u32, latency_ms: u64) -> Measured {
    let mut tally = Tally::default();
    for _ in 0..calls {
        tally.answered(std::time::Duration::from_millis(latency_ms));
    }
    tally.into_measured(concurrency, name, name.to_owned(), 1.0)
}

fn repeated_runs_fold_into_medians() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0]), 2.5);
    assert_eq!(median(&[]), 0.0);
    // Three runs of two measurements at one concurrency, then one at another: taken in that order.
    let runs = [
        measured(1, "health", 10, 1),
        measured(1, "hot-row", 5, 4),
        measured(1, "health", 30, 3),
        measured(1, "hot-row", 6, 2),
        measured(1, "health", 20, 2),
        measured(1, "hot-row", 7, 6),
        measured(16, "health", 40, 9),
    ];
    let summaries = summarize(&runs);
    let rows: Vec<(usize, &str, f64, f64, f64)> = summaries
        .iter()
        .map(|row| {
            (
                row.concurrency,
                row.name,
                row.per_second,
                row.p99_ms,
                row.max_per_second(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (1, "health", 20.0, 2.0, 30.0),
            (1, "hot-row", 6.0, 4.0, 7.0),
            (16, "health", 40.0, 9.0, 40.0)
        ]
    );
    assert_eq!(summaries[0].min_per_second(), 10.0);
    assert_eq!(summaries[0].runs, [10.0, 30.0, 20.0]);
    assert_eq!(summaries[0].completed, 60);
}

fn ratios_are_paired_run_by_run() {
    // The machine slowed down during the second run and during the third run's capped measurement:
    // the medians come from different runs and say 50 ÷ 90, the runs' own ratios 0.8, 0.8, 0.56.
    let capped = [80.0, 40.0, 50.0];
    let uncapped = [100.0, 50.0, 90.0];
    assert_eq!(median(&capped) / median(&uncapped), 50.0 / 90.0);
    let paired = Paired::of(&capped, &uncapped);
    assert_eq!(paired.runs, [0.8, 0.8, 50.0 / 90.0]);
    assert_eq!(paired.median(), Some(0.8));
    // Runs pair by position, an extra one ignored; a zero throughput gives no ratio.
    assert_eq!(Paired::of(&capped, &[100.0, 50.0, 90.0, 1.0]).runs.len(), 3);
    assert_eq!(Paired::of(&[0.0, 30.0], &[10.0, 60.0]).runs, [0.5]);
    assert_eq!(Paired::of(&[], &[]).median(), None);
}

fn the_plot_is_well_formed() {
    let runs = [
        measured(1, "health", 900, 1),
        measured(1, "store-append", 5000, 1),
        measured(1, "hot-row", 400, 2),
        measured(1, "decide-capped-hot", 300, 3),
        measured(16, "health", 9000, 2),
        measured(16, "store-append", 50_000, 3),
        // No call answered: a point left out, not a line drawn to zero.
        measured(16, "hot-row", 0, 0),
        measured(16, "decide-capped-hot", 2000, 8),
        measured(256, "health", 20_000, 13),
    ];
    let svg = crate::svg::plot(&summarize(&runs), &[1, 16, 256], "a <test> & plot");
    assert_eq!(crate::svg::problems(&svg, 4), Vec::<String>::new(), "{svg}");
    assert!(svg.contains("a &lt;test&gt; &amp; plot"));
    // The check can fail: a cut-off file, a line too many, a point that is not a number.
    let cut = &svg[..svg.len() / 2];
    assert!(!crate::svg::problems(cut, 4).is_empty());
    assert!(!crate::svg::problems(&svg, 5).is_empty());
    let broken = svg.replacen(r#"points=""#, r#"points="NaN,1 "#, 1);
    assert!(!crate::svg::problems(&broken, 4).is_empty());
    // Nothing measured: still a plot, with no line.
    let empty = crate::svg::plot(&[], &[1], "nothing");
    assert_eq!(crate::svg::problems(&empty, 0), Vec::<String>::new(), "{empty}");
}
