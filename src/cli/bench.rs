//! `capgate bench`: a load generator for the decision service (a benchmark,
//! not a test; docs/benchmarks.md, "The service").
//!
//! It drives `Decide` over real gRPC on loopback with N concurrent callers,
//! each on its own tonic channel (one HTTP/2 connection per caller), for a
//! bounded time, and reports throughput, p50 and p99. In the same run and
//! at the same concurrency it measures two baselines:
//!
//! * `grpc.health.v1.Health/Check` on the same server and channels: the
//!   cost of a trivial unary call through the same tonic stack;
//! * `Store::append_audit` through the store's pool (the server's own pool
//!   when the server runs in-process): one writer committing batches of N
//!   audit-sized rows back to back, which is what the server's group commit
//!   does at most with N callers waiting (it has one writer, and N callers
//!   have at most N records outstanding). Its rows/s is the ceiling the audit
//!   design puts on `Decide` at that concurrency.
//!
//! Scenarios: `uncapped` (an uncapped grant: audit only), `capped` (a grant
//! with a ceiling no run can exhaust, spread over `--principals` principals:
//! counter read + consumption + audit) and `capped-hot` (the same with one
//! principal, so every consumption updates one counter row).
//!
//! Everything is bounded: callers stop issuing calls at the end of each
//! measurement, each call has a deadline, and the run works on a database
//! of its own — a fresh temporary SQLite file by default, or a fresh
//! `capgate_bench_<unique>` database on the PostgreSQL server that
//! `--database-url` names, dropped afterwards. Loopback only: `--server`
//! must name a loopback address (a load generator pointed elsewhere is a
//! load test of someone else's service).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::Request;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use uuid::Uuid;

use crate::service::{self, Config, PolicyFile, Running};
use crate::store::{
    with_store, AnyStore, AuditRecord, PostgresStore, RecordCode, RecordKind, RecordOutcome, SqliteStore,
    Store, StoreOptions,
};
use crate::wire::proto::decision_service_client::DecisionServiceClient;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{
    decide_request, decide_response, AssertedPrincipal, Attribute, DecideRequest, Outcome as DecisionOutcome,
    PublishPolicyRequest, ReasonCode,
};

use super::remote::{parse_duration, read_token, runtime};
use super::{to_json, Exit, Failure, Outcome};

/// The policy every run publishes: one issuer, one account, an uncapped
/// grant and a capped one whose ceiling (a billion calls a day) no run
/// reaches.
pub const POLICY: &str = r#"# capgate bench's policy (docs/benchmarks.md, "The service").
version: 1
capabilities:
  - id: bench.free.call
    description: A tool any bench agent may call, with no ceiling
  - id: bench.metered.call
    description: A tool under a ceiling no run exhausts
upstreams:
  - id: bench
    transport:
      kind: mcp-http
      url: https://bench.invalid/mcp
    tools:
      - name: free
        capability: bench.free.call
      - name: metered
        capability: bench.metered.call
accounts:
  - id: bench-runner
    secret: { ref: "env://CAPGATE_BENCH_RUNNER_TOKEN" }
principals:
  issuers:
    - id: bench
      kind: oidc
      discovery: https://login.bench.invalid/.well-known/openid-configuration
      audience: capgate-bench
      attributes:
        team: claim:team
grants:
  - to:
      issuer: bench
      attributes: { team: load }
    capabilities: [bench.free.call]
    using: bench-runner
  - to:
      issuer: bench
      attributes: { team: load }
    capabilities: [bench.metered.call]
    using: bench-runner
    limits: { calls: 1000000000, per: 1d }
"#;

/// The most concurrent callers a run may have.
const MAX_CONCURRENCY: usize = 1024;
/// The longest measurement (and warm-up) a run may ask for.
const MAX_DURATION: Duration = Duration::from_secs(600);
/// The most distinct principals the capped scenario rotates through.
const MAX_PRINCIPALS: usize = 100_000;
/// Each call's deadline: a server that stops answering ends the run.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
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
    #[arg(long, value_enum, value_name = "SCENARIO", value_delimiter = ',', default_values_t = [ScenarioArg::All])]
    pub scenario: Vec<ScenarioArg>,
    /// How many distinct principals the callers rotate through (capped
    /// scenario: one counter row each).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub principals: usize,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScenarioArg {
    /// An uncapped grant: evaluation and the audit record.
    Uncapped,
    /// A capped grant over many principals: counter read and consumption too.
    Capped,
    /// A capped grant with one principal: every consumption on one row.
    CappedHot,
    /// All three.
    All,
}

/// What one measurement drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Uncapped,
    Capped,
    CappedHot,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Uncapped => "decide-uncapped",
            Scenario::Capped => "decide-capped",
            Scenario::CappedHot => "decide-capped-hot",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Scenario::Uncapped => "Decide uncapped",
            Scenario::Capped => "Decide capped",
            Scenario::CappedHot => "Decide capped, one key",
        }
    }
}

/// The checked arguments.
struct Plan {
    concurrency: Vec<usize>,
    duration: Duration,
    warmup: Duration,
    scenarios: Vec<Scenario>,
    principals: usize,
}

impl Plan {
    fn of(args: &Args) -> Result<Plan, Failure> {
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
        let mut scenarios = Vec::new();
        for wanted in &args.scenario {
            let some: &[Scenario] = match wanted {
                ScenarioArg::Uncapped => &[Scenario::Uncapped],
                ScenarioArg::Capped => &[Scenario::Capped],
                ScenarioArg::CappedHot => &[Scenario::CappedHot],
                ScenarioArg::All => &[Scenario::Uncapped, Scenario::Capped, Scenario::CappedHot],
            };
            for scenario in some {
                if !scenarios.contains(scenario) {
                    scenarios.push(*scenario);
                }
            }
        }
        Ok(Plan {
            concurrency,
            duration: args.duration,
            warmup: args.warmup,
            scenarios,
            principals: args.principals,
        })
    }
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    let plan = Plan::of(args)?;
    if let Some(url) = &args.server {
        check_loopback(url)?;
    }
    let token = match &args.server {
        Some(_) => read_token(args.token_file.as_deref())?,
        None => None,
    };
    // The server (or, with `--server`, the store baseline) runs on a
    // runtime like `capgate serve`'s; the callers on one of their own, as a
    // separate client process would.
    let server_runtime = runtime()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .map_err(|error| Failure::Input(format!("cannot start the async runtime: {error}")))?;

    let database = server_runtime.block_on(Database::open(args.database_url.as_deref()))?;
    let load_before = load_average();
    // Monomorphised as `capgate serve` is, so that the server measured is the one that runs.
    let measured = with_store!(database.store.clone(), store => bench_over(
        store,
        &server_runtime,
        &client_runtime,
        &plan,
        args.server.as_deref(),
        token.as_ref(),
    ));
    let load_after = load_average();
    let described = database.description.clone();
    let kind = database.kind;
    // Dropped (or removed) whatever happened.
    let cleaned = server_runtime.block_on(database.remove());
    let (target, measurements) = measured?;
    cleaned?;

    let report = Report {
        store: kind,
        database: described,
        target,
        plan: &plan,
        load_before,
        load_after,
        measurements,
    };
    let stdout = if args.json {
        to_json(&report.json())
    } else {
        report.table()
    };
    Ok(Outcome {
        stdout,
        stderr: String::new(),
        exit: Exit::Done,
    })
}

/// Refuses a `--server` that is not on this machine's loopback interface.
fn check_loopback(url: &str) -> Result<(), Failure> {
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

// ── The database of the run ────────────────────────────────────────────────

/// A database made for this run, removed by [`Database::remove`].
struct Database {
    store: AnyStore,
    kind: &'static str,
    description: String,
    cleanup: Cleanup,
}

enum Cleanup {
    /// Drop this database, connecting to the server as `admin`.
    Postgres {
        admin: Box<PgConnectOptions>,
        name: String,
    },
    /// Remove this file and SQLite's companions.
    Sqlite(PathBuf),
}

impl Database {
    async fn open(url: Option<&str>) -> Result<Database, Failure> {
        let input = |error: String| Failure::Input(error);
        match url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let admin = PgConnectOptions::from_str(url)
                    .map_err(|error| input(format!("`--database-url`: {error}")))?;
                let name = format!("capgate_bench_{}", unique());
                let mut connection = PgConnection::connect_with(&admin).await.map_err(|error| {
                    input(format!(
                        "cannot connect to `{}`: {error}",
                        crate::store::redact(url)
                    ))
                })?;
                connection
                    .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .await
                    .map_err(|error| input(format!("cannot create the database `{name}`: {error}")))?;
                let _ = connection.close().await;
                let opened =
                    PostgresStore::connect_with(admin.clone().database(&name), &StoreOptions::default())
                        .await
                        .map_err(|error| error.to_string());
                let cleanup = Cleanup::Postgres {
                    admin: Box::new(admin),
                    name: name.clone(),
                };
                match opened {
                    Ok(store) => Ok(Database {
                        store: AnyStore::Postgres(store),
                        kind: "postgres",
                        description: format!("fresh database {name} (dropped after)"),
                        cleanup,
                    }),
                    Err(error) => {
                        let _ = cleanup.run().await;
                        Err(input(format!("cannot open the database `{name}`: {error}")))
                    }
                }
            }
            Some(url) if url.starts_with("sqlite:") => {
                let path = url
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:")
                    .split('?')
                    .next()
                    .unwrap_or_default();
                let path = PathBuf::from(path);
                if path.as_os_str().is_empty() || path.exists() {
                    return Err(Failure::Usage(format!(
                        "`--database-url {url}`: the bench needs a file that does not exist yet \
                         (it publishes its own policy, and removes the file after)"
                    )));
                }
                Self::sqlite(path).await
            }
            Some(url) => Err(Failure::Usage(format!(
                "`--database-url {}`: expected `postgres://…` or `sqlite://PATH`",
                crate::store::redact(url)
            ))),
            None => {
                let path = std::env::temp_dir().join(format!("capgate-bench-{}.db", unique()));
                Self::sqlite(path).await
            }
        }
    }

    async fn sqlite(path: PathBuf) -> Result<Database, Failure> {
        let url = format!("sqlite://{}", path.display());
        let opened = SqliteStore::connect(&url, &StoreOptions::default()).await;
        let cleanup = Cleanup::Sqlite(path.clone());
        match opened {
            Ok(store) => Ok(Database {
                store: AnyStore::Sqlite(store),
                kind: "sqlite",
                description: format!("fresh file {} (removed after)", path.display()),
                cleanup,
            }),
            Err(error) => {
                let _ = cleanup.run().await;
                Err(Failure::Input(format!("cannot open `{url}`: {error}")))
            }
        }
    }

    async fn remove(self) -> Result<(), Failure> {
        let Database { store, cleanup, .. } = self;
        // The pools go first; `DROP DATABASE … WITH (FORCE)` ends any
        // connection still closing.
        drop(store);
        cleanup.run().await
    }
}

impl Cleanup {
    async fn run(self) -> Result<(), Failure> {
        match self {
            Cleanup::Postgres { admin, name } => {
                let mut connection = PgConnection::connect_with(&admin)
                    .await
                    .map_err(|error| Failure::Input(format!("cannot drop `{name}`: {error}")))?;
                connection
                    .execute(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .map_err(|error| Failure::Input(format!("cannot drop `{name}`: {error}")))?;
                let _ = connection.close().await;
                Ok(())
            }
            Cleanup::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    // Absent companions are expected.
                    let _ = std::fs::remove_file(file);
                }
                Ok(())
            }
        }
    }
}

/// Unique across runs: the process id and the clock.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    format!("{}_{nanos}", std::process::id())
}

// ── The run ────────────────────────────────────────────────────────────────

/// One measurement's result.
#[derive(Debug, Clone)]
struct Measured {
    concurrency: usize,
    /// `health`, `store-append` or a scenario name.
    name: &'static str,
    label: String,
    /// Calls (or rows, for the store) completed within the window.
    completed: u64,
    seconds: f64,
    /// Per call (per batch, for the store), in microseconds, sorted.
    latencies_us: Vec<u32>,
    /// Calls that failed (gRPC error or timeout).
    errors: u64,
    /// Decisions that came back as something other than an allow.
    not_allowed: u64,
    /// The first failure, for the report.
    problem: Option<String>,
}

impl Measured {
    fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.completed as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn percentile_ms(&self, fraction: f64) -> f64 {
        percentile(&self.latencies_us, fraction) as f64 / 1000.0
    }
}

/// The value below which `fraction` of the sorted samples fall (nearest rank).
fn percentile(sorted: &[u32], fraction: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// When callers count: calls that start at or after `from` and end by `until`.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: Instant,
    until: Instant,
}

impl Window {
    fn after(warmup: Duration, duration: Duration) -> Window {
        let from = Instant::now() + warmup;
        Window {
            from,
            until: from + duration,
        }
    }
}

/// What one caller tallied.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    completed: u64,
    errors: u64,
    not_allowed: u64,
    problem: Option<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.completed += other.completed;
        self.errors += other.errors;
        self.not_allowed += other.not_allowed;
        if self.problem.is_none() {
            self.problem = other.problem;
        }
    }

    fn into_measured(
        mut self,
        concurrency: usize,
        name: &'static str,
        label: String,
        seconds: f64,
    ) -> Measured {
        self.latencies_us.sort_unstable();
        Measured {
            concurrency,
            name,
            label,
            completed: self.completed,
            seconds,
            latencies_us: self.latencies_us,
            errors: self.errors,
            not_allowed: self.not_allowed,
            problem: self.problem,
        }
    }
}

fn micros(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX)
}

/// Where the callers went.
struct Target {
    url: String,
    in_process: bool,
}

fn progress(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "capgate bench: {line}");
}

fn bench_over<S: Store>(
    store: S,
    server_runtime: &tokio::runtime::Runtime,
    client_runtime: &tokio::runtime::Runtime,
    plan: &Plan,
    server_url: Option<&str>,
    token: Option<&MetadataValue<Ascii>>,
) -> Result<(Target, Vec<Measured>), Failure> {
    // The server in-process, or the one named.
    let (running, target): (Option<Running>, Target) = match server_url {
        None => {
            let mut config = Config::new(vec![([127, 0, 0, 1], 0).into()]);
            config.policy = Some(PolicyFile {
                artifact: POLICY.to_owned(),
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

    let measured = client_runtime.block_on(async {
        let most = plan.concurrency.iter().copied().max().unwrap_or(1);
        progress(&format!("opening {most} channel(s) to {}", target.url));
        let channels = connect(&target.url, most).await?;
        if !target.in_process {
            publish(&channels[0], token).await?;
        }
        Ok::<_, Failure>(channels)
    });
    let channels = match measured {
        Ok(channels) => channels,
        Err(failure) => {
            if let Some(running) = running {
                let _ = server_runtime.block_on(running.stop());
            }
            return Err(failure);
        }
    };

    let mut results = Vec::new();
    for &n in &plan.concurrency {
        let callers = &channels[..n];
        progress(&format!("{n} caller(s): health Check"));
        results.push(client_runtime.block_on(measure_calls(
            callers,
            token,
            Load::Health,
            plan,
            n,
            "health",
            "health Check (baseline)".to_owned(),
        )));
        progress(&format!("{n} caller(s): append_audit, batches of {n}"));
        let window = Window::after(plan.warmup, plan.duration);
        let tally = server_runtime.block_on(append_batches(store.clone(), n, window));
        results.push(tally.into_measured(
            n,
            "store-append",
            format!("append_audit ×{n} (baseline)"),
            plan.duration.as_secs_f64(),
        ));
        for &scenario in &plan.scenarios {
            progress(&format!("{n} caller(s): {}", scenario.label()));
            let requests = requests(scenario, plan.principals);
            results.push(client_runtime.block_on(measure_calls(
                callers,
                token,
                Load::Decide(&requests),
                plan,
                n,
                scenario.name(),
                scenario.label().to_owned(),
            )));
        }
    }
    drop(channels);
    if let Some(running) = running {
        server_runtime
            .block_on(running.stop())
            .map_err(|error| Failure::Input(format!("the server did not stop cleanly: {error}")))?;
    }
    Ok((target, results))
}

/// Opens `count` channels, each its own HTTP/2 connection.
async fn connect(url: &str, count: usize) -> Result<Vec<Channel>, Failure> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|_| Failure::Usage(format!("`--server {url}` is not a URL")))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(
            endpoint
                .connect()
                .await
                .map_err(|error| Failure::Input(format!("cannot reach `{url}`: {error}")))?,
        );
    }
    Ok(channels)
}

/// Publishes the bench policy to a server that runs elsewhere.
async fn publish(channel: &Channel, token: Option<&MetadataValue<Ascii>>) -> Result<(), Failure> {
    let mut client = PolicyServiceClient::new(channel.clone());
    let published = client
        .publish_policy(with_token(
            PublishPolicyRequest {
                artifact: POLICY.to_owned(),
                catalog: None,
                expected_active_revision: None,
                dry_run: false,
                comment: "capgate bench".to_owned(),
            },
            token,
        ))
        .await
        .map_err(|status| Failure::Input(format!("cannot publish the bench policy: {}", status.message())))?
        .into_inner();
    if !published.accepted {
        return Err(Failure::Input("the server refused the bench policy".to_owned()));
    }
    progress(&format!("bench policy active as revision {}", published.revision));
    Ok(())
}

fn with_token<T>(message: T, token: Option<&MetadataValue<Ascii>>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token.clone());
    }
    request
}

/// The requests a scenario rotates through.
fn requests(scenario: Scenario, principals: usize) -> Vec<DecideRequest> {
    let (tool, count) = match scenario {
        Scenario::Uncapped => ("bench__free", principals),
        Scenario::Capped => ("bench__metered", principals),
        Scenario::CappedHot => ("bench__metered", 1),
    };
    (0..count)
        .map(|index| DecideRequest {
            caller: Some(decide_request::Caller::Principal(AssertedPrincipal {
                issuer: "bench".to_owned(),
                subject: if scenario == Scenario::CappedHot {
                    "agent-hot".to_owned()
                } else {
                    format!("agent-{index:05}")
                },
                attributes: vec![Attribute {
                    name: "team".to_owned(),
                    values: vec!["load".to_owned()],
                }],
            })),
            target: Some(decide_request::Target::Tool(tool.to_owned())),
            request_id: String::new(),
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Load<'a> {
    Health,
    Decide(&'a [DecideRequest]),
}

/// N callers, one per channel, each calling back to back until the window
/// closes.
async fn measure_calls(
    channels: &[Channel],
    token: Option<&MetadataValue<Ascii>>,
    load: Load<'_>,
    plan: &Plan,
    concurrency: usize,
    name: &'static str,
    label: String,
) -> Measured {
    let window = Window::after(plan.warmup, plan.duration);
    let mut tasks = Vec::with_capacity(channels.len());
    for (index, channel) in channels.iter().enumerate() {
        let channel = channel.clone();
        let token = token.cloned();
        let work = match load {
            Load::Health => Work::Health,
            Load::Decide(requests) => {
                // Callers start at different principals, and each walks
                // through all of them.
                let start = index * requests.len() / channels.len().max(1);
                let mut mine = requests[start..].to_vec();
                mine.extend_from_slice(&requests[..start]);
                Work::Decide(mine)
            }
        };
        tasks.push(tokio::spawn(caller(channel, token, work, window)));
    }
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(error) => {
                total.errors += 1;
                total.problem.get_or_insert(format!("a caller failed: {error}"));
            }
        }
    }
    total.into_measured(concurrency, name, label, plan.duration.as_secs_f64())
}

enum Work {
    Health,
    Decide(Vec<DecideRequest>),
}

async fn caller(channel: Channel, token: Option<MetadataValue<Ascii>>, work: Work, window: Window) -> Tally {
    let mut health = HealthClient::new(channel.clone());
    let mut decisions = DecisionServiceClient::new(channel);
    let mut tally = Tally::default();
    let mut next = 0_usize;
    loop {
        let started = Instant::now();
        if started >= window.until {
            break;
        }
        let answered: Result<bool, String> = match &work {
            Work::Health => health
                .check(with_token(
                    HealthCheckRequest {
                        service: String::new(),
                    },
                    token.as_ref(),
                ))
                .await
                .map(|response| response.into_inner().status == ServingStatus::Serving as i32)
                .map_err(|status| format!("{:?}: {}", status.code(), status.message())),
            Work::Decide(requests) => {
                let request = requests[next % requests.len()].clone();
                next = next.wrapping_add(1);
                match decisions.decide(with_token(request, token.as_ref())).await {
                    Ok(response) => match refusal(&response.into_inner().result) {
                        None => Ok(true),
                        Some(why) => {
                            tally.problem.get_or_insert(why);
                            Ok(false)
                        }
                    },
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                }
            }
        };
        let finished = Instant::now();
        let counts = started >= window.from && finished <= window.until;
        match answered {
            Ok(true) if counts => {
                tally.completed += 1;
                tally.latencies_us.push(micros(finished - started));
            }
            Ok(true) => {}
            Ok(false) => {
                tally.not_allowed += 1;
                tally
                    .problem
                    .get_or_insert_with(|| "an answer other than allow / SERVING".to_owned());
            }
            Err(problem) => {
                tally.errors += 1;
                tally.problem.get_or_insert(problem);
                // A failing server is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

/// Why an answer is not an allow (`None` for an allow).
fn refusal(result: &Option<decide_response::Result>) -> Option<String> {
    match result {
        Some(decide_response::Result::Decision(decision)) => {
            if decision.outcome == DecisionOutcome::Allow as i32 {
                return None;
            }
            let code = decision
                .reason
                .as_ref()
                .and_then(|reason| ReasonCode::try_from(reason.code).ok())
                .map_or("no reason", |code| code.as_str_name());
            Some(format!("deny {code}"))
        }
        Some(decide_response::Result::Unauthenticated(_)) => Some("unauthenticated".to_owned()),
        Some(decide_response::Result::UnknownTool(_)) => Some("unknown tool".to_owned()),
        None => Some("no result".to_owned()),
    }
}

/// One writer appending batches of `rows` audit records back to back, as
/// the server's group commit does with `rows` callers waiting.
async fn append_batches<S: Store>(store: S, rows: usize, window: Window) -> Tally {
    let mut tally = Tally::default();
    let mut sequence = 0_usize;
    loop {
        let started = Instant::now();
        if started >= window.until {
            break;
        }
        let batch: Vec<AuditRecord> = (0..rows)
            .map(|_| {
                sequence = sequence.wrapping_add(1);
                audit_row(sequence)
            })
            .collect();
        let appended = store.append_audit(&batch, &[]).await;
        let finished = Instant::now();
        match appended {
            Ok(()) if started >= window.from && finished <= window.until => {
                tally.completed += rows as u64;
                tally.latencies_us.push(micros(finished - started));
            }
            Ok(()) => {}
            Err(error) => {
                tally.errors += 1;
                tally.problem.get_or_insert(error.to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

/// A record shaped like the one a capped allow writes.
fn audit_row(sequence: usize) -> AuditRecord {
    AuditRecord {
        decision_id: Uuid::now_v7().to_string(),
        at_ms: crate::clock::now(),
        request_id: None,
        gateway: "loopback".to_owned(),
        kind: RecordKind::Decide,
        outcome: RecordOutcome::Allow,
        code: Some(RecordCode::Reason(capgate_core::access::ReasonCode::Granted)),
        path: Some("/grants/1".to_owned()),
        principal_id: Some(format!("bench:agent-{:05}", sequence % 1000)),
        issuer: Some("bench".to_owned()),
        subject: Some(format!("agent-{:05}", sequence % 1000)),
        capability: Some("bench.metered.call".to_owned()),
        tool: Some("bench__metered".to_owned()),
        account_id: Some("bench-runner".to_owned()),
        limit_calls: Some(1_000_000_000),
        limit_per: Some("1d".to_owned()),
        usage_calls: Some(sequence as u64),
        policy_version: Some(format!("sha256:{}", "0".repeat(64))),
        policy_revision: Some(1),
    }
}

/// `/proc/loadavg`'s three averages, where there is one.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|field| field.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

// ── The report ─────────────────────────────────────────────────────────────

struct Report<'a> {
    store: &'static str,
    database: String,
    target: Target,
    plan: &'a Plan,
    load_before: Option<[f64; 3]>,
    load_after: Option<[f64; 3]>,
    measurements: Vec<Measured>,
}

/// A figure divided by a baseline's, when both exist.
fn ratio(value: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0 && value > 0.0).then(|| value / baseline)
}

struct Ratios {
    throughput: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl Report<'_> {
    fn baseline(&self, concurrency: usize, name: &str) -> Option<&Measured> {
        self.measurements
            .iter()
            .find(|measured| measured.concurrency == concurrency && measured.name == name)
    }

    /// A Decide figure against a baseline of the same concurrency.
    fn ratios(&self, measured: &Measured, baseline: &str) -> Option<Ratios> {
        if !measured.name.starts_with("decide") {
            return None;
        }
        let base = self.baseline(measured.concurrency, baseline)?;
        Some(Ratios {
            throughput: ratio(measured.per_second(), base.per_second()),
            p50: ratio(measured.percentile_ms(0.50), base.percentile_ms(0.50)),
            p99: ratio(measured.percentile_ms(0.99), base.percentile_ms(0.99)),
        })
    }

    fn header(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "capgate bench: store {} ({}); server {} at {}; one channel (HTTP/2 connection) per caller",
            self.store,
            self.database,
            if self.target.in_process {
                "in-process"
            } else {
                "external"
            },
            self.target.url,
        );
        let _ = writeln!(
            text,
            "each measurement: {} ms warm-up, then {} ms counted; {} principal(s) in rotation",
            self.plan.warmup.as_millis(),
            self.plan.duration.as_millis(),
            self.plan.principals,
        );
        let show = |load: Option<[f64; 3]>| {
            load.map_or_else(
                || "unknown".to_owned(),
                |[one, five, fifteen]| format!("{one:.2} {five:.2} {fifteen:.2}"),
            )
        };
        let _ = writeln!(
            text,
            "load average before: {}; after: {}",
            show(self.load_before),
            show(self.load_after)
        );
        text
    }

    fn table(&self) -> String {
        let mut text = self.header();
        text.push('\n');
        let _ = writeln!(
            text,
            "{:>7}  {:<30} {:>10} {:>8} {:>8}   {:>17}   {:>17}   {:>17}",
            "callers",
            "measurement",
            "per s",
            "p50 ms",
            "p99 ms",
            "per s ÷ hc / st",
            "p50 ÷ hc / st",
            "p99 ÷ hc / st"
        );
        let show = |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |value| format!("{value:.2}"));
        let pair = |health: &Option<Ratios>, store: &Option<Ratios>, pick: fn(&Ratios) -> Option<f64>| match (
            health, store,
        ) {
            (None, None) => String::new(),
            _ => format!(
                "{} / {}",
                show(health.as_ref().and_then(pick)),
                show(store.as_ref().and_then(pick))
            ),
        };
        let mut last = 0;
        for measured in &self.measurements {
            if last != 0 && measured.concurrency != last {
                text.push('\n');
            }
            last = measured.concurrency;
            let health = self.ratios(measured, "health");
            let store = self.ratios(measured, "store-append");
            let line = format!(
                "{:>7}  {:<30} {:>10.0} {:>8.3} {:>8.3}   {:>17}   {:>17}   {:>17}",
                measured.concurrency,
                measured.label,
                measured.per_second(),
                measured.percentile_ms(0.50),
                measured.percentile_ms(0.99),
                pair(&health, &store, |r| r.throughput),
                pair(&health, &store, |r| r.p50),
                pair(&health, &store, |r| r.p99),
            );
            let _ = writeln!(text, "{}", line.trim_end());
            if measured.errors > 0 || measured.not_allowed > 0 {
                let _ = writeln!(
                    text,
                    "{:>7}  ! {} error(s), {} answer(s) not allow (or not SERVING); first: {}",
                    "",
                    measured.errors,
                    measured.not_allowed,
                    measured.problem.as_deref().unwrap_or("?")
                );
            }
        }
        text.push_str(
            "\nhc = the health Check baseline, st = the append_audit baseline (rows/s; latency per \
             batch), same concurrency, same run.\n",
        );
        text
    }

    fn json(&self) -> Value {
        let figure = |value: Option<f64>| value.map_or(Value::Null, |value| json!(value));
        let rows: Vec<Value> = self
            .measurements
            .iter()
            .map(|measured| {
                let against = |baseline: &str| {
                    self.ratios(measured, baseline).map_or(Value::Null, |ratios| {
                        json!({
                            "per_second": figure(ratios.throughput),
                            "p50": figure(ratios.p50),
                            "p99": figure(ratios.p99),
                        })
                    })
                };
                json!({
                    "concurrency": measured.concurrency,
                    "measurement": measured.name,
                    "unit": if measured.name == "store-append" { "rows" } else { "calls" },
                    "completed": measured.completed,
                    "seconds": measured.seconds,
                    "per_second": measured.per_second(),
                    "p50_ms": measured.percentile_ms(0.50),
                    "p99_ms": measured.percentile_ms(0.99),
                    "max_ms": measured.percentile_ms(1.0),
                    "errors": measured.errors,
                    "not_allowed": measured.not_allowed,
                    "problem": measured.problem,
                    "ratio_to_health": against("health"),
                    "ratio_to_store": against("store-append"),
                })
            })
            .collect();
        json!({
            "store": self.store,
            "database": self.database,
            "server": self.target.url,
            "in_process": self.target.in_process,
            "channels": "one per caller",
            "warmup_ms": self.plan.warmup.as_millis() as u64,
            "duration_ms": self.plan.duration.as_millis() as u64,
            "principals": self.plan.principals,
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
            "measurements": rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
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

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&samples, 0.50), 50);
        assert_eq!(percentile(&samples, 0.99), 99);
        assert_eq!(percentile(&samples, 1.0), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn the_bench_policy_compiles_cleanly() {
        let compiled = capgate_core::policy::compile(POLICY.as_bytes(), None);
        assert!(compiled.diagnostics.is_empty(), "{:?}", compiled.diagnostics);
    }
}
