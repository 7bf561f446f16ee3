//! What a run is asked to do: the command line of `cargo bench --bench service`, the scenarios, and
//! the checked [`Plan`] with its bounds (how many callers, how long, which server).

use std::path::PathBuf;
use std::time::Duration;

use capgate::cli::remote::parse_duration;
use capgate::cli::Failure;

/// The most concurrent callers a run may have.
const MAX_CONCURRENCY: usize = 1024;
/// The longest measurement (and warm-up) a run may ask for.
const MAX_DURATION: Duration = Duration::from_secs(600);
/// The most distinct principals the capped scenario rotates through.
const MAX_PRINCIPALS: usize = 100_000;
/// The most times a run may repeat its plan: nine runs of the longest plan already take hours.
const MAX_REPEAT: usize = 9;

/// The load generator for the decision service (docs/benchmarks.md, "The service"): `Decide` over
/// real gRPC on loopback, against three baselines measured in the same run.
#[derive(Debug, clap::Parser)]
#[command(
    name = "service",
    bin_name = "cargo bench --bench service --",
    color = clap::ColorChoice::Never
)]
pub struct Args {
    /// The store: a fresh temporary SQLite file when absent; `postgres://…`
    /// names a PostgreSQL server on which a fresh `capgate_bench_<unique>`
    /// database is created for the run and dropped after it;
    /// `sqlite://PATH` a file that must not exist yet (removed after).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Drive a server that already runs at this URL (a loopback address)
    /// instead of starting one in-process. The bench policy is published to it (an admin token from
    /// `--token-file` or `CAPGATE_TOKEN`, unless it runs without tokens); the
    /// store baseline then runs on `--database-url`, through a pool
    /// configured as the server's.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// A file holding the token to call `--server` with.
    #[arg(long, value_name = "F", requires = "server")]
    pub token_file: Option<PathBuf>,
    /// Concurrent callers: repeat, or give a list such as `1,16,64`.
    #[arg(long, value_name = "N", value_delimiter = ',', default_values_t = [1_usize, 16, 64])]
    pub concurrency: Vec<usize>,
    /// How long each measurement lasts (after its warm-up).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long each measurement runs before it starts counting.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// What to measure besides the baselines: repeat, or give a list.
    #[arg(long, alias = "scenarios", value_enum, value_name = "SCENARIO", value_delimiter = ',', default_values_t = [ScenarioArg::All])]
    pub scenario: Vec<ScenarioArg>,
    /// How many distinct principals the callers rotate through (capped
    /// scenario: one counter row each).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub principals: usize,
    /// The server's `--store-connections`: connections in the store's pool (the store baseline's
    /// too). Default: the server's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub store_connections: Option<u32>,
    /// The in-process server's `--audit-batch`: records and capped calls per audit transaction.
    /// Default: the server's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub audit_batch: Option<u32>,
    /// The in-process server's `--audit-in-flight`: audit transactions at once. Default: the
    /// server's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub audit_in_flight: Option<u32>,
    /// How many times to run the whole plan; the report gives, per
    /// measurement, the median of the runs (throughput, p50, p99) and the
    /// range of their throughputs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeat: usize,
    /// Also write a plot of throughput and p99 against callers, as SVG, to
    /// this file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON document to this file (the table still goes to standard output).
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// Passed by `cargo bench` to every `harness = false` bench: it is what tells a measurement
    /// (`cargo bench`) from the smoke run (`cargo test --benches`), and is otherwise ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
    /// `cargo bench FILTER` passes its filter to every bench: one this bench's name does not
    /// contain skips the run, so that filtering the other benches does not fail on this one.
    #[arg(hide = true)]
    pub filter: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScenarioArg {
    /// An uncapped grant: evaluation and the audit record.
    Uncapped,
    /// A capped grant over many principals: counter read and consumption too.
    Capped,
    /// A capped grant with one principal: every consumption on one row.
    CappedHot,
    /// The uncapped grant with a fresh `request_id` on every call: the claim and the remembered
    /// answer too.
    UncappedKeyed,
    /// The uncapped grant through agentgateway's ExtMCP door (`CheckRequest`), against `uncapped`.
    ExtMcpUncapped,
    /// The uncapped grant through Envoy's ext_authz door (`Check`, the caller's own API key),
    /// against `uncapped`.
    ExtAuthzUncapped,
    /// The uncapped grant through the AuthZEN door (`POST /access/v1/evaluation`, HTTP/1.1 JSON,
    /// the principal asserted), against `uncapped`. Only with the in-process server.
    AuthzenUncapped,
    /// The uncapped grant through the forward-auth door (a bodyless `GET /forward-auth`, HTTP/1.1,
    /// the MCP headers and the bench key), against `uncapped`. Only with the in-process server.
    ForwardAuthUncapped,
    /// The capped grant over `--principals` principals through ExtMCP, against `capped`.
    ExtMcpCapped,
    /// The capped grant over `--principals` principals through AuthZEN, against `capped`.
    AuthzenCapped,
    /// The capped grant through ext_authz: the static key is one principal, so one counter row,
    /// against `capped-hot`.
    ExtAuthzCappedHot,
    /// `uncapped` with a shadow version set that decides these calls as the active one does: every
    /// call evaluated twice, no difference recorded. Against `uncapped`.
    UncappedShadow,
    /// `capped` with that shadow version: the shadow's ceiling compared with the usage the active
    /// decision saw. Against `capped`.
    CappedShadow,
    /// `uncapped` with a shadow version that runs these calls as another account: every call a
    /// difference, written with its audit record. The worst case, against `uncapped`.
    UncappedShadowDiffers,
    /// All fourteen.
    All,
}

/// What one measurement drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Uncapped,
    Capped,
    CappedHot,
    UncappedKeyed,
    ExtMcpUncapped,
    ExtAuthzUncapped,
    AuthzenUncapped,
    ForwardAuthUncapped,
    ExtMcpCapped,
    AuthzenCapped,
    ExtAuthzCappedHot,
    UncappedShadow,
    CappedShadow,
    UncappedShadowDiffers,
}

/// The shadow version a scenario runs beside the bench policy, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shadow {
    /// Decides the bench's calls as the active version does.
    Agrees,
    /// Runs the uncapped calls as another account.
    Differs,
}

impl Scenario {
    pub fn shadow(self) -> Option<Shadow> {
        match self {
            Scenario::UncappedShadow | Scenario::CappedShadow => Some(Shadow::Agrees),
            Scenario::UncappedShadowDiffers => Some(Shadow::Differs),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Uncapped => "decide-uncapped",
            Scenario::Capped => "decide-capped",
            Scenario::CappedHot => "decide-capped-hot",
            Scenario::UncappedKeyed => "decide-uncapped-keyed",
            Scenario::ExtMcpUncapped => "ext-mcp-uncapped",
            Scenario::ExtAuthzUncapped => "ext-authz-uncapped",
            Scenario::AuthzenUncapped => "authzen-uncapped",
            Scenario::ForwardAuthUncapped => "forward-auth-uncapped",
            Scenario::ExtMcpCapped => "ext-mcp-capped",
            Scenario::AuthzenCapped => "authzen-capped",
            Scenario::ExtAuthzCappedHot => "ext-authz-capped-hot",
            Scenario::UncappedShadow => "decide-uncapped-shadow",
            Scenario::CappedShadow => "decide-capped-shadow",
            Scenario::UncappedShadowDiffers => "decide-uncapped-shadow-differs",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Scenario::Uncapped => "Decide uncapped",
            Scenario::Capped => "Decide capped",
            Scenario::CappedHot => "Decide capped, one key",
            Scenario::UncappedKeyed => "Decide uncapped, with request_id",
            Scenario::ExtMcpUncapped => "ExtMCP CheckRequest uncapped",
            Scenario::ExtAuthzUncapped => "ext_authz Check uncapped",
            Scenario::AuthzenUncapped => "AuthZEN evaluation uncapped",
            Scenario::ForwardAuthUncapped => "forward-auth subrequest uncapped",
            Scenario::ExtMcpCapped => "ExtMCP CheckRequest capped",
            Scenario::AuthzenCapped => "AuthZEN evaluation capped",
            Scenario::ExtAuthzCappedHot => "ext_authz Check capped, one key",
            Scenario::UncappedShadow => "Decide uncapped, shadow agrees",
            Scenario::CappedShadow => "Decide capped, shadow agrees",
            Scenario::UncappedShadowDiffers => "Decide uncapped, shadow differs",
        }
    }
}

/// The checked arguments.
#[derive(Debug)]
pub struct Plan {
    /// Distinct, in the order given.
    pub concurrency: Vec<usize>,
    pub duration: Duration,
    pub warmup: Duration,
    /// Distinct, in the order given.
    pub scenarios: Vec<Scenario>,
    pub principals: usize,
    /// How many times the whole plan runs, 1 to [`MAX_REPEAT`].
    pub repeat: usize,
    /// The server's pool and batch size, where the run sets them.
    pub store_connections: Option<u32>,
    pub audit_batch: Option<u32>,
    pub audit_in_flight: Option<u32>,
}

impl Plan {
    pub fn of(args: &Args) -> Result<Plan, Failure> {
        let mut concurrency = Vec::new();
        for &n in &args.concurrency {
            if n == 0 || n > MAX_CONCURRENCY {
                return Err(Failure::Usage(format!(
                    "`--concurrency {n}`: expected 1 to {MAX_CONCURRENCY}"
                )));
            }
            if !concurrency.contains(&n) {
                concurrency.push(n);
            }
        }
        if args.duration < Duration::from_millis(100) || args.duration > MAX_DURATION {
            return Err(Failure::Usage("`--duration`: expected 100ms to 10m".to_owned()));
        }
        if args.warmup > MAX_DURATION {
            return Err(Failure::Usage("`--warmup`: at most 10m".to_owned()));
        }
        if args.principals == 0 || args.principals > MAX_PRINCIPALS {
            return Err(Failure::Usage(format!(
                "`--principals`: expected 1 to {MAX_PRINCIPALS}"
            )));
        }
        if args.repeat == 0 || args.repeat > MAX_REPEAT {
            return Err(Failure::Usage(format!("`--repeat`: expected 1 to {MAX_REPEAT}")));
        }
        if let Some(url) = &args.server {
            check_loopback(url)?;
        }
        let mut scenarios = Vec::new();
        for wanted in &args.scenario {
            let some: &[Scenario] = match wanted {
                ScenarioArg::Uncapped => &[Scenario::Uncapped],
                ScenarioArg::Capped => &[Scenario::Capped],
                ScenarioArg::CappedHot => &[Scenario::CappedHot],
                ScenarioArg::UncappedKeyed => &[Scenario::UncappedKeyed],
                ScenarioArg::ExtMcpUncapped => &[Scenario::ExtMcpUncapped],
                ScenarioArg::ExtAuthzUncapped => &[Scenario::ExtAuthzUncapped],
                ScenarioArg::AuthzenUncapped => &[Scenario::AuthzenUncapped],
                ScenarioArg::ForwardAuthUncapped => &[Scenario::ForwardAuthUncapped],
                ScenarioArg::ExtMcpCapped => &[Scenario::ExtMcpCapped],
                ScenarioArg::AuthzenCapped => &[Scenario::AuthzenCapped],
                ScenarioArg::ExtAuthzCappedHot => &[Scenario::ExtAuthzCappedHot],
                ScenarioArg::UncappedShadow => &[Scenario::UncappedShadow],
                ScenarioArg::CappedShadow => &[Scenario::CappedShadow],
                ScenarioArg::UncappedShadowDiffers => &[Scenario::UncappedShadowDiffers],
                ScenarioArg::All => &[
                    Scenario::Uncapped,
                    Scenario::Capped,
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
                    Scenario::UncappedShadowDiffers,
                ],
            };
            for scenario in some {
                if !scenarios.contains(scenario) {
                    scenarios.push(*scenario);
                }
            }
        }
        if args.server.is_some() {
            // The HTTP doors' port is known only for the in-process server.
            let http = [
                ScenarioArg::AuthzenUncapped,
                ScenarioArg::AuthzenCapped,
                ScenarioArg::ForwardAuthUncapped,
            ];
            if args.scenario.iter().any(|wanted| http.contains(wanted)) {
                return Err(Failure::Usage(
                    "the `authzen-*` and `forward-auth-*` scenarios need the in-process server: drop \
                     `--server`"
                        .to_owned(),
                ));
            }
            scenarios.retain(|scenario| {
                !matches!(
                    scenario,
                    Scenario::AuthzenUncapped | Scenario::AuthzenCapped | Scenario::ForwardAuthUncapped
                )
            });
        }
        Ok(Plan {
            concurrency,
            duration: args.duration,
            warmup: args.warmup,
            scenarios,
            principals: args.principals,
            repeat: args.repeat,
            store_connections: args.store_connections,
            audit_batch: args.audit_batch,
            audit_in_flight: args.audit_in_flight,
        })
    }
}

/// Refuses a `--server` that is not on this machine's loopback interface: a load generator pointed
/// elsewhere is a load test of someone else's service.
pub fn check_loopback(url: &str) -> Result<(), Failure> {
    let uri: tonic::codegen::http::Uri = url
        .parse()
        .map_err(|_| Failure::Usage(format!("`--server {url}` is not a URL")))?;
    let host = uri.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(Failure::Usage(format!(
            "`--server {url}`: the bench drives loopback addresses only (127.0.0.0/8, ::1, localhost)"
        )))
    }
}
