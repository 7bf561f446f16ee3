//! The decision service under load: a load generator, run as a bench of the product crate (a
//! benchmark, not a test, and not a command of the product; docs/benchmarks.md, "The service").
//!
//! ```sh
//! cargo bench --bench service -- --concurrency 1,16,64 --duration 3s --warmup 1s
//! cargo bench --bench service -- --database-url postgres://postgres@127.0.0.1:5432/postgres --json
//! ```
//!
//! It drives `Decide` over real gRPC on loopback with N concurrent callers,
//! each on its own tonic channel (one HTTP/2 connection per caller), for a
//! bounded time, and reports throughput, p50 and p99. In the same run and
//! at the same concurrency it measures three baselines:
//!
//! * `grpc.health.v1.Health/Check` on the same server and channels: the
//!   cost of a trivial unary call through the same tonic stack;
//! * `Store::append_audit` through the store's pool (the server's own pool
//!   when the server runs in-process): one writer committing batches of N
//!   audit-sized rows back to back, which is what the server's group commit
//!   does at most with N callers waiting (it has one writer, and N callers
//!   have at most N records outstanding). Its rows/s is the ceiling the audit
//!   design puts on `Decide` at that concurrency;
//! * `hot-row`: the store's old per-call conditional statement (the counter
//!   upsert a capped call ran alone, in its own transaction) looped on one
//!   row by N writers on connections of their own (at most 64; on SQLite one
//!   writer at a time, as the store's): the ceiling a hot key had before the
//!   count moved into the audit batch, against which `capped-hot` is read.
//!
//! `--repeat N` runs the whole plan N times (at most 9) and reports the median
//! of the runs per measurement, with the range of their throughputs; each
//! concurrency ends with the comparisons issue 14 sets targets for (capped ÷
//! uncapped, capped-hot ÷ uncapped, capped-hot ÷ hot-row). `--svg FILE` also
//! writes a plot of throughput and p99 against callers, `--json-file FILE` the JSON document
//! beside the table.
//!
//! Scenarios: `uncapped` (an uncapped grant: audit only), `capped` (a grant
//! with a ceiling no run can exhaust, spread over `--principals` principals:
//! counter read + consumption + audit), `capped-hot` (the same with one
//! principal, so every consumption updates one counter row) and
//! `uncapped-keyed` (`uncapped` with a fresh `request_id` per call: the claim
//! and the remembered answer, docs/decisions/0016, against `uncapped` as its
//! baseline), and `ext-mcp-uncapped` (`uncapped` through agentgateway's ExtMCP
//! door), `ext-authz-uncapped` (the same tool through Envoy's ext_authz door, the
//! caller's own API key of a `static-key` issuer) and `authzen-uncapped` (AuthZEN
//! evaluations over HTTP/1.1) and `forward-auth-uncapped` (a proxy's bodyless forward-auth
//! subrequest over HTTP/1.1, the bench key), each against `uncapped`; `ext-mcp-capped` and
//! `authzen-capped` against `capped`, `ext-authz-capped-hot` (the static key is one
//! principal) against `capped-hot`.
//!
//! Everything is bounded: callers stop issuing calls at the end of each
//! measurement, each call has a deadline, and the run works on a database
//! of its own — a fresh temporary SQLite file by default, or a fresh
//! `capgate_bench_<unique>` database on the PostgreSQL server that
//! `--database-url` names, dropped afterwards. Loopback only: `--server`
//! must name a loopback address.
//!
//! Two modes, told apart by the `--bench` flag that `cargo bench` passes to every `harness = false`
//! bench: with it, the measurement the arguments ask for; without it — `cargo test --benches`, as
//! CI runs it — the bench's own checks, then a smoke run (SQLite, one caller, 300 ms per
//! measurement) that fails unless every measurement answered, so CI proves the generator works
//! without spending the time a measurement takes.
//!
//! The files in `service/`: `plan` (the arguments and their bounds), `database` (the run's own
//! database), `callers` (connections, the load and its tallies), `hot_row` (the hot-row baseline),
//! `summary` (the runs folded into medians), `report` (table and JSON), `svg` (the plot), `checks`
//! (the unit checks).

#[path = "service/callers.rs"]
mod callers;
#[path = "service/checks.rs"]
mod checks;
#[path = "service/database.rs"]
mod database;
#[path = "service/hot_row.rs"]
mod hot_row;
#[path = "service/plan.rs"]
mod plan;
#[path = "service/report.rs"]
mod report;
#[path = "service/summary.rs"]
mod summary;
#[path = "service/svg.rs"]
mod svg;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use capgate::cli::remote::runtime;
use capgate::cli::Failure;
use capgate::service::{self, Config, PolicyFile, Running};
use capgate::store::{ShadowFilter, Store, StoreOptions};
use clap::Parser as _;

use callers::{Load, Measured, Window};
use database::Database;
use hot_row::Location;
use plan::{Args, Plan};
use report::{load_average, Report, Target};

/// What the smoke run measures: the defaults but for one caller, no warm-up and 300 ms per
/// measurement (3 baselines and 10 scenarios: about 5 s with the server's start).
const SMOKE: &[&str] = &[
    "service",
    "--concurrency",
    "1",
    "--warmup",
    "0ms",
    "--duration",
    "300ms",
];

fn main() -> ExitCode {
    let arguments: Vec<OsString> = std::env::args_os().collect();
    if measuring(&arguments) {
        measure(arguments)
    } else {
        smoke()
    }
}

/// Whether `cargo bench` started this process (it passes `--bench`; `cargo test` does not).
fn measuring(arguments: &[OsString]) -> bool {
    arguments.iter().skip(1).any(|argument| argument == "--bench")
}

/// Whether `cargo bench FILTER` asked for other benches only.
fn skipped(args: &Args) -> bool {
    args.filter
        .as_deref()
        .is_some_and(|filter| !"service".contains(filter))
}

/// `cargo bench`: the measurement the arguments ask for, printed as `capgate` commands print
/// (the report on standard output, progress on standard error; exit 2 on a usage error, 3 on an
/// input that could not be used).
fn measure(arguments: Vec<OsString>) -> ExitCode {
    let args = match Args::try_parse_from(arguments) {
        Ok(args) => args,
        // Help (exit 0) or a usage error (exit 2), as clap renders them.
        Err(error) => error.exit(),
    };
    if skipped(&args) {
        progress("skipped: the filter does not name this bench");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(report) => {
            if let Some(path) = &args.svg {
                if let Err(error) = std::fs::write(path, report.svg()) {
                    return fail(&Failure::Input(format!(
                        "cannot write the plot to `{}`: {error}",
                        path.display()
                    )));
                }
                progress(&format!("plot written to {}", path.display()));
            }
            if let Some(path) = &args.json_file {
                if let Err(error) = std::fs::write(path, report.json()) {
                    return fail(&Failure::Input(format!(
                        "cannot write the JSON document to `{}`: {error}",
                        path.display()
                    )));
                }
            }
            let text = if args.json { report.json() } else { report.table() };
            // A reader that went away (`… | head`) is not an error of the bench's.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(failure) => fail(&failure),
    }
}

/// `cargo test --benches`: the checks, then a short run that must answer in every measurement.
/// The process's own arguments are libtest's (filters, `--nocapture`), which this bench does not
/// take: they are ignored.
fn smoke() -> ExitCode {
    let started = Instant::now();
    let failed = checks::run();
    let args = match Args::try_parse_from(SMOKE) {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    let report = match run(&args) {
        Ok(report) => report,
        Err(failure) => {
            fail(&failure);
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table());
    let mut problems: Vec<String> = Vec::new();
    // Three baselines and every scenario, once each: a measurement that went missing is a failure.
    let expected = 3 + report.plan.scenarios.len();
    if report.measurements.len() != expected {
        problems.push(format!(
            "{} measurement(s) instead of {expected}",
            report.measurements.len()
        ));
    }
    for measured in &report.measurements {
        // Denials are not failures of the generator: on a loaded machine a consumption slower than
        // the 50 ms store timeout is a real `usage_unknown` deny (the table shows them). But every
        // measurement must have answered, and no call may have failed.
        if measured.completed == 0 || measured.errors > 0 {
            problems.push(format!(
                "{}: {} answered, {} error(s); first problem: {}",
                measured.label,
                measured.completed,
                measured.errors,
                measured.problem.as_deref().unwrap_or("none")
            ));
        }
    }
    for problem in &problems {
        println!("smoke FAILED: {problem}");
    }
    println!(
        "service bench smoke: {} check(s), {} failed; {} measurement(s), {} failed; {:.1} s",
        checks::count(),
        failed,
        report.measurements.len(),
        problems.len(),
        started.elapsed().as_secs_f64()
    );
    if failed == 0 && problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A failure printed as `capgate` prints its own.
fn fail(failure: &Failure) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    match failure {
        Failure::Usage(message) => {
            let _ = writeln!(stderr, "error: {message}\nFor more information, try '--help'.");
            ExitCode::from(2)
        }
        Failure::Input(message) => {
            let _ = writeln!(stderr, "error: {message}");
            ExitCode::from(3)
        }
    }
}

/// One line of progress, on standard error.
pub fn progress(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "service bench: {line}");
}

/// The whole run: its database, the server, every measurement, the database removed.
fn run(args: &Args) -> Result<Report, Failure> {
    let plan = Plan::of(args)?;
    // The server (or, with `--server`, the store baseline) runs on the runtime every service
    // command runs on, `capgate serve`'s; the callers on one of their own, as a separate client
    // process would.
    let server_runtime = runtime()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .map_err(|error| Failure::Input(format!("cannot start the async runtime: {error}")))?;

    let options = StoreOptions {
        max_connections: plan.store_connections,
        ..StoreOptions::default()
    };
    let database = server_runtime.block_on(Database::open(args.database_url.as_deref(), &options))?;
    let load_before = load_average();
    let server = args.server.as_deref();
    // Only an external server is called with a token (clap refuses `--token-file` without it).
    let token_file = args.token_file.as_deref();
    let hot_row = database.hot_row();
    // The server as it runs in production: monomorphised for the store the URL names.
    let measured = capgate::store::with_store!(database.store.clone(), store => {
        drive(store, &server_runtime, &client_runtime, &plan, server, token_file, &hot_row)
    });
    let load_after = load_average();
    let described = database.description.clone();
    let kind = database.kind;
    // Dropped (or removed) whatever happened.
    let cleaned = server_runtime.block_on(database.remove());
    let (target, measurements) = measured?;
    cleaned?;
    let summaries = summary::summarize(&measurements);
    Ok(Report {
        store: kind,
        database: described,
        target,
        plan,
        load_before,
        load_after,
        measurements,
        summaries,
    })
}

/// Every measurement of the plan over `store`: the in-process server started on it (or the named
/// one driven), then, `plan.repeat` times, for each concurrency the three baselines and the
/// scenarios. The hot-row baseline connects to the run's database at `hot_row`, beside the store.
fn drive<S: Store>(
    store: S,
    server_runtime: &tokio::runtime::Runtime,
    client_runtime: &tokio::runtime::Runtime,
    plan: &Plan,
    server_url: Option<&str>,
    token_file: Option<&Path>,
    hot_row: &Location,
) -> Result<(Target, Vec<Measured>), Failure> {
    // The static key's file, for the run's length (a server elsewhere reads it too: loopback only).
    let keys =
        tempfile::tempdir().map_err(|error| Failure::Input(format!("a temporary directory: {error}")))?;
    let key_file = keys.path().join("bench.key");
    std::fs::write(&key_file, callers::BENCH_KEY)
        .map_err(|error| Failure::Input(format!("cannot write the bench key: {error}")))?;
    let policy = callers::policy(&key_file);
    // The server in-process, or the one named.
    let (running, target): (Option<Running>, Target) = match server_url {
        None => {
            let mut config = Config::new(vec![([127, 0, 0, 1], 0).into()]);
            config.http_listen = vec![([127, 0, 0, 1], 0).into()];
            if let Some(batch) = plan.audit_batch {
                config.audit_batch = batch as usize;
            }
            if let Some(in_flight) = plan.audit_in_flight {
                config.audit_in_flight = in_flight as usize;
            }
            config.policy = Some(PolicyFile {
                artifact: policy.clone(),
                catalog: None,
            });
            let running = server_runtime
                .block_on(service::start(store.clone(), config))
                .map_err(|error| Failure::Input(format!("the server did not start: {error}")))?;
            let url = format!("http://{}", running.addrs[0]);
            (
                Some(running),
                Target {
                    url,
                    in_process: true,
                },
            )
        }
        Some(url) => {
            server_runtime
                .block_on(store.migrate())
                .map_err(|error| Failure::Input(error.to_string()))?;
            (
                None,
                Target {
                    url: url.to_owned(),
                    in_process: false,
                },
            )
        }
    };

    // The AuthZEN door listens on its own HTTP port, known only for the in-process server.
    let http_addr = running
        .as_ref()
        .and_then(|running| running.http_addrs.first().copied());
    let connected = client_runtime.block_on(async {
        let most = plan.concurrency.iter().copied().max().unwrap_or(1);
        progress(&format!("opening {most} channel(s) to {}", target.url));
        let connections = callers::connect(&target.url, token_file, most).await?;
        if !target.in_process {
            callers::publish(&connections[0], &policy).await?;
        }
        Ok::<_, Failure>(connections)
    });
    let connections = match connected {
        Ok(connections) => connections,
        Err(failure) => {
            if let Some(running) = running {
                let _ = server_runtime.block_on(running.stop());
            }
            return Err(failure);
        }
    };

    let mut results = Vec::new();
    for round in 1..=plan.repeat {
        if plan.repeat > 1 {
            progress(&format!("run {round} of {}", plan.repeat));
        }
        for &n in &plan.concurrency {
            let some = &connections[..n];
            progress(&format!("{n} caller(s): health Check"));
            results.push(client_runtime.block_on(callers::measure_calls(
                some,
                Load::Health,
                plan,
                "health",
                "health Check (baseline)".to_owned(),
            )));
            progress(&format!("{n} caller(s): append_audit, batches of {n}"));
            let window = Window::after(plan.warmup, plan.duration);
            let tally = server_runtime.block_on(callers::append_batches(store.clone(), n, window));
            results.push(tally.into_measured(
                n,
                "store-append",
                format!("append_audit ×{n} (baseline)"),
                plan.duration.as_secs_f64(),
            ));
            progress(&format!(
                "{n} caller(s): the per-call counter statement on one row, {} writer(s)",
                hot_row::writers(n)
            ));
            let tally = server_runtime.block_on(hot_row::measure(hot_row, n, plan.warmup, plan.duration));
            results.push(tally.into_measured(n, "hot-row", hot_row.label(n), plan.duration.as_secs_f64()));
            for &scenario in &plan.scenarios {
                progress(&format!("{n} caller(s): {}", scenario.label()));
                let requests = callers::requests(scenario, plan.principals);
                let load = match scenario {
                    plan::Scenario::ExtMcpUncapped | plan::Scenario::ExtMcpCapped => Load::ExtMcp(&requests),
                    plan::Scenario::ExtAuthzUncapped => Load::ExtAuthz("bench__free"),
                    plan::Scenario::ExtAuthzCappedHot => Load::ExtAuthz("bench__metered"),
                    // `Plan::of` keeps this scenario for the in-process server only.
                    plan::Scenario::AuthzenUncapped | plan::Scenario::AuthzenCapped => match http_addr {
                        Some(addr) => Load::Authzen(&requests, addr),
                        None => continue,
                    },
                    plan::Scenario::ForwardAuthUncapped => match http_addr {
                        Some(addr) => Load::ForwardAuth("bench__free", addr),
                        None => continue,
                    },
                    _ => Load::Decide(&requests),
                };
                if let Some(shadow) = scenario.shadow() {
                    let artifact = callers::shadow_policy(&key_file, shadow);
                    client_runtime.block_on(callers::set_shadow(&connections[0], Some(&artifact)))?;
                }
                results.push(client_runtime.block_on(callers::measure_calls(
                    some,
                    load,
                    plan,
                    scenario.name(),
                    scenario.label().to_owned(),
                )));
                if scenario.shadow().is_some() {
                    client_runtime.block_on(callers::set_shadow(&connections[0], None))?;
                    // What the scenario rests on, seen in the store: an agreeing shadow leaves the
                    // count where it was, a differing one adds one row per call it measured.
                    let counted = server_runtime
                        .block_on(store.shadow_counts(&ShadowFilter::default()))
                        .map_err(|error| Failure::Input(error.to_string()))?;
                    let differences: u64 = counted.iter().map(|count| count.records).sum();
                    progress(&format!(
                        "{differences} shadow difference(s) recorded in this run so far"
                    ));
                }
            }
        }
    }
    drop(connections);
    if let Some(running) = running {
        server_runtime
            .block_on(running.stop())
            .map_err(|error| Failure::Input(format!("the server did not stop cleanly: {error}")))?;
    }
    Ok((target, results))
}
