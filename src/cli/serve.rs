//! `capgate serve`: the decision service (service.md). Runs until SIGTERM or
//! SIGINT, then stops accepting, finishes the calls in flight, flushes the
//! audit writer, flushes telemetry and exits 0. Logs go to standard error
//! (`--log-format`, filtered by `CAPGATE_LOG`, e.g. `CAPGATE_LOG=debug`);
//! traces and metrics go over OTLP with `--otlp-endpoint` and to
//! `--metrics-listen` as Prometheus text (`src/telemetry`). None of them
//! carries a token, a credential or a secret.
//!
//! A `--policy` that does not compile stops the start with the report
//! `validate` prints (exit 1); a configuration that cannot be used is a
//! usage error (exit 2), a store that cannot be opened exit 3.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::service::config::Connections;
use crate::service::{
    self, AuditArguments, Config, ConfigError, ExtAuthzSettings, ForwardAuthSettings, PolicyFile, StartError,
    Tls, Token,
};
use crate::telemetry::{self, Telemetry, TelemetryError};

use super::input::{Inputs, Loaded};
use super::remote::{parse_duration, runtime, Database};
use super::{validate, Exit, Failure, Outcome};

// Every flag can be set from the environment instead, `CAPGATE_` and the flag's name
// (`--store-timeout` is `CAPGATE_STORE_TIMEOUT`); a repeatable flag takes a comma-separated list
// there. The token flags' variables are plural (`CAPGATE_GATEWAY_TOKENS`), because deployments
// already keep a token's *value* in `CAPGATE_GATEWAY_TOKEN` and `CAPGATE_ADMIN_TOKEN` (referred
// to as `env://CAPGATE_GATEWAY_TOKEN`): read as a flag, a secret would be parsed as a
// `NAME=REF`. Help never shows a variable's value (`hide_env_values`): some hold secrets'
// locations, and an empty one would print as `[env: X=]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An address to listen on; repeat for several. Without tokens, every
    /// address must be loopback.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:50051",
        env = "CAPGATE_LISTEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub listen: Vec<SocketAddr>,
    /// Serve the OpenID AuthZEN 1.0 API (HTTP/JSON) here too; repeat for several. Off unless
    /// given; the same tokens, TLS and loopback rule as `--listen` (docs/gateways/authzen.md).
    #[arg(
        long,
        value_name = "ADDR",
        env = "CAPGATE_HTTP_LISTEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub http_listen: Vec<SocketAddr>,
    /// The base URL gateways reach `--http-listen` at (`https://pdp.example.net`, a path
    /// allowed): the AuthZEN metadata's endpoints are under it. Without it, they are under the
    /// address a connection was accepted on, never under the client's `Host` header.
    #[arg(
        long,
        value_name = "URL",
        env = "CAPGATE_HTTP_PUBLIC_URL",
        hide_env_values = true
    )]
    pub http_public_url: Option<String>,
    #[command(flatten)]
    pub database: Database,
    /// Publish this artifact at start-up when it differs from the active version.
    #[arg(long, value_name = "FILE", env = "CAPGATE_POLICY", hide_env_values = true)]
    pub policy: Option<PathBuf>,
    /// The declared catalog to publish with `--policy`.
    #[arg(
        long,
        value_name = "FILE",
        requires = "policy",
        env = "CAPGATE_CATALOG",
        hide_env_values = true
    )]
    pub catalog: Option<PathBuf>,
    /// With --audit-spool: how long a call waits for its batch's audit transaction before its
    /// record is spooled instead (a capped call is then `usage_unknown`, unless already committing).
    /// 500 ms is twice the slowest commit of a healthy store under load (docs/service.md).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration, env = "CAPGATE_STORE_TIMEOUT", hide_env_values = true)]
    pub store_timeout: Duration,
    /// How often the active version is re-read besides notifications.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, env = "CAPGATE_POLL_INTERVAL", hide_env_values = true)]
    pub poll_interval: Duration,
    /// How long the differences a shadow policy version records are kept (`policies shadow
    /// report` reads them); older ones are deleted every hour.
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration, env = "CAPGATE_SHADOW_RETENTION", hide_env_values = true)]
    pub shadow_retention: Duration,
    /// How long an audit commit may take before the batch goes to the spool.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration, env = "CAPGATE_AUDIT_TIMEOUT", hide_env_values = true)]
    pub audit_timeout: Duration,
    /// A directory for audit records the store cannot take (replayed later).
    /// Without it, a store that cannot take a record fails the call.
    #[arg(long, value_name = "DIR", env = "CAPGATE_AUDIT_SPOOL", hide_env_values = true)]
    pub audit_spool: Option<PathBuf>,
    /// At most this many records per audit transaction.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 512,
        env = "CAPGATE_AUDIT_BATCH",
        hide_env_values = true
    )]
    pub audit_batch: usize,
    /// At most this many audit transactions at once: the next batch commits while the last
    /// waits for its flush. Each holds a store connection while it runs.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        env = "CAPGATE_AUDIT_IN_FLIGHT",
        hide_env_values = true,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub audit_in_flight: u16,
    /// Connections in the store's pool. Default: 8 for PostgreSQL, 4 for SQLite.
    #[arg(
        long,
        value_name = "N",
        env = "CAPGATE_STORE_CONNECTIONS",
        hide_env_values = true,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub store_connections: Option<u32>,
    /// A connection that has not finished TLS (when configured) and its HTTP/2 preface by
    /// then is closed.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration, env = "CAPGATE_HANDSHAKE_TIMEOUT", hide_env_values = true)]
    pub handshake_timeout: Duration,
    /// A connection with no call open for this long is closed.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration, env = "CAPGATE_IDLE_TIMEOUT", hide_env_values = true)]
    pub idle_timeout: Duration,
    /// Send an HTTP/2 PING on a connection nothing was read from for this long…
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, env = "CAPGATE_KEEPALIVE_INTERVAL", hide_env_values = true)]
    pub keepalive_interval: Duration,
    /// …and close it when the PING is not answered within this.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, env = "CAPGATE_KEEPALIVE_TIMEOUT", hide_env_values = true)]
    pub keepalive_timeout: Duration,
    /// At most this many connections at once; more are closed as soon as they are accepted.
    /// Default: half the open-file limit (`ulimit -n`), at most 4096.
    #[arg(
        long,
        value_name = "N",
        env = "CAPGATE_MAX_CONNECTIONS",
        hide_env_values = true
    )]
    pub max_connections: Option<usize>,
    /// At most this many calls open at once on one connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS); a client queues or is refused the others.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 256,
        env = "CAPGATE_MAX_CONCURRENT_STREAMS",
        hide_env_values = true
    )]
    pub max_concurrent_streams: u32,
    /// A gateway token, `NAME=env://VAR` or `NAME=file:///path`; repeatable.
    /// NAME is the gateway's identity in the audit trail.
    #[arg(
        long,
        value_name = "NAME=REF",
        env = "CAPGATE_GATEWAY_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub gateway_token: Vec<String>,
    /// A gateway token also trusted to assert a principal instead of
    /// forwarding the caller's credential, as for `--gateway-token`. Other
    /// gateways asserting a principal get PERMISSION_DENIED.
    #[arg(
        long,
        value_name = "NAME=REF",
        env = "CAPGATE_ASSERTING_GATEWAY_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub asserting_gateway_token: Vec<String>,
    /// The longest a decision waits for an `oidc` issuer's discovery document
    /// and keys; past it, a bearer token is answered UNAVAILABLE.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, env = "CAPGATE_OIDC_FETCH_TIMEOUT", hide_env_values = true)]
    pub oidc_fetch_timeout: Duration,
    /// How often every `oidc` issuer's keys are refetched.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration, env = "CAPGATE_OIDC_REFRESH_INTERVAL", hide_env_values = true)]
    pub oidc_refresh_interval: Duration,
    /// Extra root certificates (PEM) to trust for `https` discovery and key
    /// set URLs, besides the system's (an identity provider with a private CA).
    #[arg(long, value_name = "FILE", env = "CAPGATE_OIDC_CA", hide_env_values = true)]
    pub oidc_ca: Option<PathBuf>,
    /// An admin token (publish, activate, read policies), as for `--gateway-token`.
    #[arg(
        long,
        value_name = "NAME=REF",
        env = "CAPGATE_ADMIN_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub admin_token: Vec<String>,
    /// ext_authz: the forwarded request's header that carries a `static-key` issuer's key.
    #[arg(
        long,
        value_name = "HEADER",
        default_value = "x-api-key",
        env = "CAPGATE_EXT_AUTHZ_API_KEY_HEADER",
        hide_env_values = true
    )]
    pub ext_authz_api_key_header: String,
    /// ext_authz: an MCP method to let through without a decision, besides `initialize`,
    /// `ping`, `tools/list` and `notifications/*`; repeat for several. Others are refused.
    #[arg(
        long,
        value_name = "METHOD",
        env = "CAPGATE_EXT_AUTHZ_ALLOW_METHOD",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub ext_authz_allow_method: Vec<String>,
    /// forward-auth (nginx `auth_request`, Caddy `forward_auth`, Traefik `forwardAuth`): the
    /// subrequest's header that carries the proxy's own gateway token.
    #[arg(
        long,
        value_name = "HEADER",
        default_value = "x-capgate-gateway-token",
        env = "CAPGATE_FORWARD_AUTH_TOKEN_HEADER",
        hide_env_values = true
    )]
    pub forward_auth_token_header: String,
    /// forward-auth: the header that names the MCP server of a tool named without its
    /// `<server>__` prefix (a path segment after `/forward-auth/` names it too).
    #[arg(
        long,
        value_name = "HEADER",
        default_value = "x-mcp-servername",
        env = "CAPGATE_FORWARD_AUTH_SERVER_HEADER",
        hide_env_values = true
    )]
    pub forward_auth_server_header: String,
    /// forward-auth: the header with an id the proxy makes for each request (nginx `$request_id`,
    /// Caddy `{http.request.uuid}`): a retry of the check with it gets the first answer. None
    /// by default: a client's own `x-request-id` is never taken.
    #[arg(
        long,
        value_name = "HEADER",
        env = "CAPGATE_FORWARD_AUTH_REQUEST_ID_HEADER",
        hide_env_values = true
    )]
    pub forward_auth_request_id_header: Option<String>,
    /// Keep the values of a tool call's arguments in each decision's audit record, not only
    /// their digest: members whose names look sensitive (password, secret, token, key,
    /// authorization, credential, cookie, session), and those named by `--audit-redact`, are
    /// redacted; arguments over 16 KiB are kept as their digest only. Off by default.
    #[arg(
        long,
        env = "CAPGATE_AUDIT_ARGUMENTS",
        hide_env_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub audit_arguments: bool,
    /// With `--audit-arguments`: redact this argument member too, by its whole name, in any
    /// letter case; repeat for several.
    #[arg(
        long,
        value_name = "NAME",
        env = "CAPGATE_AUDIT_REDACT",
        hide_env_values = true,
        value_delimiter = ',',
        requires = "audit_arguments"
    )]
    pub audit_redact: Vec<String>,
    /// The server's certificate chain (PEM): serve TLS.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        env = "CAPGATE_TLS_CERT",
        hide_env_values = true
    )]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        env = "CAPGATE_TLS_KEY",
        hide_env_values = true
    )]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        env = "CAPGATE_TLS_CLIENT_CA",
        hide_env_values = true
    )]
    pub tls_client_ca: Option<PathBuf>,
    /// `human` or `json` log lines.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Human, env = "CAPGATE_LOG_FORMAT", hide_env_values = true)]
    pub log_format: LogFormat,
    /// Export traces and metrics over OTLP/gRPC to this collector (`http://HOST:4317`, or
    /// `https://` with `--otlp-ca`).
    #[arg(long, value_name = "URL", value_parser = telemetry::parse_otlp_endpoint, env = "CAPGATE_OTLP_ENDPOINT", hide_env_values = true)]
    pub otlp_endpoint: Option<String>,
    /// The CA (PEM) that signs an `https://` collector's certificate.
    #[arg(
        long,
        value_name = "FILE",
        requires = "otlp_endpoint",
        env = "CAPGATE_OTLP_CA",
        hide_env_values = true
    )]
    pub otlp_ca: Option<PathBuf>,
    /// How often metrics are exported over OTLP (and the longest a span waits to be sent).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, env = "CAPGATE_OTLP_INTERVAL", hide_env_values = true)]
    pub otlp_interval: Duration,
    /// Serve the metrics as Prometheus text at `http://ADDR/metrics` (no token: they hold no
    /// secret; see docs/decisions/0010-telemetry.md).
    #[arg(
        long,
        value_name = "ADDR",
        env = "CAPGATE_METRICS_LISTEN",
        hide_env_values = true
    )]
    pub metrics_listen: Option<SocketAddr>,
}

pub use crate::telemetry::LogFormat;

pub fn run(args: &Args, inputs: &mut Inputs<'_>) -> Result<Outcome, Failure> {
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
    let telemetry = telemetry_options(args)?;
    runtime()?.block_on(async {
        // Logs, exporters and the metrics endpoint first; flushed once the server has drained,
        // so that the last decisions and audit commits are in the final export.
        let telemetry = Telemetry::start(&telemetry).await.map_err(|error| match error {
            TelemetryError::Config(problem) => Failure::Usage(problem),
            bind @ TelemetryError::Bind { .. } => Failure::Input(bind.to_string()),
        })?;
        let served = service::run(&args.database.database_url, config, shutdown_signal()).await;
        telemetry.shutdown().await;
        served.map_err(|error| match error {
            StartError::Config(error) => Failure::Usage(error.to_string()),
            other => Failure::Input(other.to_string()),
        })
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
    config.http_listen = args.http_listen.clone();
    config.http_public_url = args.http_public_url.clone();
    config.policy = policy;
    config.store_timeout = args.store_timeout;
    config.poll_interval = args.poll_interval;
    config.shadow_retention = args.shadow_retention;
    config.audit_timeout = args.audit_timeout;
    config.audit_spool = args.audit_spool.clone();
    config.audit_batch = args.audit_batch;
    config.audit_in_flight = usize::from(args.audit_in_flight);
    config.store_connections = args.store_connections;
    config.connections = Connections {
        handshake_timeout: args.handshake_timeout,
        idle_timeout: args.idle_timeout,
        keepalive_interval: args.keepalive_interval,
        keepalive_timeout: args.keepalive_timeout,
        max_connections: args.max_connections,
        max_concurrent_streams: args.max_concurrent_streams,
    };
    let tokens = |flag: &str, specs: &[String]| -> Result<Vec<Token>, Failure> {
        specs
            .iter()
            .map(|spec| Token::resolve(flag, spec))
            .collect::<Result<_, _>>()
            .map_err(usage)
    };
    config.gateway_tokens = tokens("--gateway-token", &args.gateway_token)?;
    config.asserting_gateway_tokens = tokens("--asserting-gateway-token", &args.asserting_gateway_token)?;
    config.admin_tokens = tokens("--admin-token", &args.admin_token)?;
    if args
        .ext_authz_allow_method
        .iter()
        .any(|method| method == "tools/call")
    {
        return Err(Failure::Usage(
            "`--ext-authz-allow-method tools/call`: a tool call is always decided".to_owned(),
        ));
    }
    if args.ext_authz_api_key_header.trim().is_empty() {
        return Err(Failure::Usage(
            "`--ext-authz-api-key-header`: must name a header".to_owned(),
        ));
    }
    config.ext_authz = ExtAuthzSettings {
        // Envoy forwards header names lower-case.
        api_key_header: args.ext_authz_api_key_header.to_ascii_lowercase(),
        allowed_methods: args.ext_authz_allow_method.clone(),
    };
    let header = |flag: &str, name: &str| -> Result<String, Failure> {
        let name = name.trim().to_ascii_lowercase();
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte));
        if token {
            Ok(name)
        } else {
            Err(Failure::Usage(format!("`{flag} {name}`: not a header name")))
        }
    };
    config.forward_auth = ForwardAuthSettings {
        token_header: header("--forward-auth-token-header", &args.forward_auth_token_header)?,
        server_header: header("--forward-auth-server-header", &args.forward_auth_server_header)?,
        request_id_header: args
            .forward_auth_request_id_header
            .as_deref()
            .map(|name| header("--forward-auth-request-id-header", name))
            .transpose()?,
    };
    if let Some(empty) = args.audit_redact.iter().find(|name| name.trim().is_empty()) {
        return Err(Failure::Usage(format!(
            "`--audit-redact {empty}`: must name an argument member"
        )));
    }
    config.audit_arguments = AuditArguments {
        keep: args.audit_arguments,
        redact: args
            .audit_redact
            .iter()
            .map(|name| name.trim().to_lowercase())
            .collect(),
    };
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(Tls {
            cert: read_bytes(cert)?,
            key: read_bytes(key)?,
            client_ca: args.tls_client_ca.as_deref().map(read_bytes).transpose()?,
        });
    }
    if args.oidc_fetch_timeout.is_zero() || args.oidc_refresh_interval.is_zero() {
        return Err(Failure::Usage(
            "`--oidc-fetch-timeout` and `--oidc-refresh-interval` must be longer than 0ms".to_owned(),
        ));
    }
    config.oidc.fetch_timeout = args.oidc_fetch_timeout;
    config.oidc.refresh_interval = args.oidc_refresh_interval;
    if let Some(path) = &args.oidc_ca {
        config.oidc_roots = read_certificates(path)?;
    }
    config.check().map_err(usage)?;
    Ok(config)
}

/// Every certificate of a PEM file, as DER; none is an input error.
fn read_certificates(path: &std::path::Path) -> Result<Vec<Vec<u8>>, Failure> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bytes = read_bytes(path)?;
    let certificates: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&bytes)
        .map(|certificate| certificate.map(|der| der.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|error| Failure::Input(format!("`{}` is not PEM: {error}", path.display())))?;
    if certificates.is_empty() {
        return Err(Failure::Input(format!(
            "`{}` holds no certificate",
            path.display()
        )));
    }
    Ok(certificates)
}

fn telemetry_options(args: &Args) -> Result<telemetry::Options, Failure> {
    if args.otlp_interval.is_zero() {
        return Err(Failure::Usage(
            "`--otlp-interval` must be longer than 0ms".to_owned(),
        ));
    }
    Ok(telemetry::Options {
        log_format: args.log_format,
        otlp_endpoint: args.otlp_endpoint.clone(),
        otlp_ca: args.otlp_ca.as_deref().map(read_bytes).transpose()?,
        otlp_interval: args.otlp_interval,
        metrics_listen: args.metrics_listen,
    })
}

fn read_bytes(path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|error| Failure::Input(format!("cannot read `{}`: {}", path.display(), error.kind())))
}

fn read_text(path: &std::path::Path) -> Result<String, Failure> {
    String::from_utf8(read_bytes(path)?)
        .map_err(|_| Failure::Input(format!("`{}` is not UTF-8", path.display())))
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The flags of `command` that cannot be set from a `CAPGATE_…` variable, or whose help
    /// would show the variable's value.
    fn flags_without_env(command: &clap::Command) -> Vec<String> {
        command
            .get_arguments()
            .filter(|arg| arg.get_long().is_some_and(|long| long != "help"))
            .filter(|arg| {
                let named = arg
                    .get_env()
                    .and_then(|env| env.to_str())
                    .is_some_and(|env| env.starts_with("CAPGATE_"));
                !named || !arg.is_hide_env_values_set()
            })
            .map(|arg| format!("--{}", arg.get_long().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn every_serve_flag_has_an_environment_variable() {
        let cli = super::super::Cli::command();
        let serve = cli.find_subcommand("serve").expect("a serve command");
        assert_eq!(flags_without_env(serve), [""; 0]);
        let mut names: Vec<&std::ffi::OsStr> = serve.get_arguments().filter_map(clap::Arg::get_env).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "two flags share a variable: {names:?}");
    }

    /// The check above can fail: a flag without a variable, one with a variable of another
    /// name, and one whose help would show the value are each named.
    #[test]
    fn a_flag_without_a_variable_is_named() {
        let fixture = clap::Command::new("fixture")
            .arg(
                clap::Arg::new("set")
                    .long("set")
                    .env("CAPGATE_SET")
                    .hide_env_values(true),
            )
            .arg(clap::Arg::new("bare").long("bare"))
            .arg(
                clap::Arg::new("other")
                    .long("other")
                    .env("OTHER")
                    .hide_env_values(true),
            )
            .arg(clap::Arg::new("shown").long("shown").env("CAPGATE_SHOWN"));
        assert_eq!(flags_without_env(&fixture), ["--bare", "--other", "--shown"]);
    }
}
