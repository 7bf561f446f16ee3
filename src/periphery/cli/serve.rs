//! `capgate serve`: the decision service (service.md). Runs until SIGTERM or
//! SIGINT, then stops accepting, finishes the calls in flight, flushes the
//! audit writer and exits 0. Logs go to standard error (`--log-format`,
//! filtered by `CAPGATE_LOG`, e.g. `CAPGATE_LOG=debug`); they never carry a
//! token, a credential or a secret.
//!
//! A `--policy` that does not compile stops the start with the report
//! `validate` prints (exit 1); a configuration that cannot be used is a
//! usage error (exit 2), a store that cannot be opened exit 3.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::periphery::server::{self, Config, ConfigError, PolicyFile, StartError, Tls, Token};

use super::input::{Inputs, Loaded};
use super::remote::{parse_duration, runtime, Database};
use super::{validate, Exit, Failure, Outcome};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// An address to listen on; repeat for several. Without tokens, every
    /// address must be loopback.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    pub listen: Vec<SocketAddr>,
    #[command(flatten)]
    pub database: Database,
    /// Publish this artifact at start-up when it differs from the active version.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The declared catalog to publish with `--policy`.
    #[arg(long, value_name = "FILE", requires = "policy")]
    pub catalog: Option<PathBuf>,
    /// How long a counter read or consumption may take before usage is unknown.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = parse_duration)]
    pub store_timeout: Duration,
    /// How often the active version is re-read besides notifications.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How long an audit commit may take before the batch goes to the spool.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub audit_timeout: Duration,
    /// A directory for audit records the store cannot take (replayed later).
    /// Without it, a store that cannot take a record fails the call.
    #[arg(long, value_name = "DIR")]
    pub audit_spool: Option<PathBuf>,
    /// At most this many records per audit transaction.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub audit_batch: usize,
    /// A gateway token, `NAME=env://VAR` or `NAME=file:///path`; repeatable.
    /// NAME is the gateway's identity in the audit trail.
    #[arg(long, value_name = "NAME=REF")]
    pub gateway_token: Vec<String>,
    /// An admin token (publish, activate, read policies), as for `--gateway-token`.
    #[arg(long, value_name = "NAME=REF")]
    pub admin_token: Vec<String>,
    /// The server's certificate chain (PEM): serve TLS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// `human` or `json` log lines.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
    init_logging(args.log_format);
    let policy = match &args.policy {
        None => None,
        Some(path) => {
            let source = inputs.policy(path)?;
            let catalog = inputs.catalog(args.catalog.as_deref())?;
            let loaded = Loaded::compile(source, catalog.as_ref());
            if !loaded.compilation.ok() {
                return Ok(Outcome {
                    stdout: validate::report(&loaded, false),
                    stderr: format!("error: `{}` does not compile: not serving it\n", path.display()),
                    exit: Exit::Findings,
                });
            }
            let artifact = String::from_utf8(loaded.source.bytes)
                .map_err(|_| Failure::Input("the policy is not UTF-8".to_owned()))?;
            let catalog = match &args.catalog {
                Some(path) => Some(read_text(path)?),
                None => None,
            };
            Some(PolicyFile { artifact, catalog })
        }
    };
    let config = config(args, policy)?;
    runtime()?
        .block_on(server::run(
            &args.database.database_url,
            config,
            shutdown_signal(),
        ))
        .map_err(|error| match error {
            StartError::Config(error) => Failure::Usage(error.to_string()),
            other => Failure::Input(other.to_string()),
        })?;
    Ok(Outcome {
        stdout: String::new(),
        stderr: String::new(),
        exit: Exit::Done,
    })
}

fn config(args: &Args, policy: Option<PolicyFile>) -> Result<Config, Failure> {
    let usage = |error: ConfigError| Failure::Usage(error.to_string());
    let mut config = Config::new(args.listen.clone());
    config.policy = policy;
    config.store_timeout = args.store_timeout;
    config.poll_interval = args.poll_interval;
    config.audit_timeout = args.audit_timeout;
    config.audit_spool = args.audit_spool.clone();
    config.audit_batch = args.audit_batch;
    config.gateway_tokens = args
        .gateway_token
        .iter()
        .map(|spec| Token::resolve("--gateway-token", spec))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    config.admin_tokens = args
        .admin_token
        .iter()
        .map(|spec| Token::resolve("--admin-token", spec))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(Tls {
            cert: read_bytes(cert)?,
            key: read_bytes(key)?,
            client_ca: args.tls_client_ca.as_deref().map(read_bytes).transpose()?,
        });
    }
    config.check().map_err(usage)?;
    Ok(config)
}

fn read_bytes(path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|error| Failure::Input(format!("cannot read `{}`: {}", path.display(), error.kind())))
}

fn read_text(path: &std::path::Path) -> Result<String, Failure> {
    String::from_utf8(read_bytes(path)?)
        .map_err(|_| Failure::Input(format!("`{}` is not UTF-8", path.display())))
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("CAPGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(std::io::stderr);
    // A subscriber set already (a test harness) stays.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
