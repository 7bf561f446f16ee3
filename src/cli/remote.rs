//! What the service commands share: the async runtime they run on, the
//! store they open (`--database-url`), the server they call (`--server`,
//! the admin token) and the durations they take. The token is read from
//! `--token-file` or `CAPGATE_TOKEN`, never from an argument, so it does
//! not show in a process listing; and it is never printed.

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use crate::store::{self, AnyStore, StoreOptions};

use super::{Exit, Failure, Outcome};

/// The store a command opens, `--database-url` or `CAPGATE_DATABASE_URL`.
#[derive(Debug, clap::Args)]
pub struct Database {
    /// The store: `sqlite://PATH` (the default, a file in the working
    /// directory) or `postgres://…`.
    #[arg(
        long,
        value_name = "URL",
        env = "CAPGATE_DATABASE_URL",
        default_value = "sqlite://capgate.db",
        hide_env_values = true
    )]
    pub database_url: String,
}

impl Database {
    /// Opens the store, creating an SQLite file that is not there (`migrate`).
    pub async fn open(&self) -> Result<AnyStore, Failure> {
        store::connect(&self.database_url, &StoreOptions::default())
            .await
            .map_err(|error| Failure::Input(error.to_string()))
    }

    /// Opens a store a server has written (`audit`, `audit prune`): an SQLite file that is not
    /// there is named and not created, so that asking in the wrong folder leaves nothing behind.
    pub async fn open_existing(&self) -> Result<AnyStore, Failure> {
        if let Some(path) = sqlite_file(&self.database_url) {
            if !path.exists() {
                return Err(self.not_found(&format!("{} does not exist", path.display())));
            }
        }
        self.open().await
    }

    /// What a query says when the store it opened holds no capgate tables.
    pub fn explain(&self, error: store::StoreError) -> Failure {
        if error.is_missing_table() {
            self.not_found("it holds no capgate tables (no `capgate serve` or `capgate migrate` ran on it)")
        } else {
            Failure::Input(error.to_string())
        }
    }

    fn not_found(&self, why: &str) -> Failure {
        Failure::Input(format!(
            "no capgate store at `{}`: {why}; name the server's store with --database-url or \
             CAPGATE_DATABASE_URL",
            store::redact(&self.database_url)
        ))
    }
}

/// The file an `sqlite:` URL names, when it names one (not `:memory:`, not a `mode` of its own).
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" || query.split('&').any(|pair| pair.starts_with("mode=")) {
        return None;
    }
    Some(PathBuf::from(path))
}

/// The server a command calls, and the admin token it calls with.
#[derive(Debug, clap::Args)]
pub struct Server {
    /// The server's URL, e.g. `http://127.0.0.1:50051` (`https://` for TLS).
    #[arg(long, value_name = "URL", env = "CAPGATE_SERVER", hide_env_values = true)]
    pub server: String,
    /// A file holding the token this command calls the server with: a gateway token for
    /// `decide`, an admin token for `publish` and `policies` (otherwise `CAPGATE_TOKEN`; none for a
    /// loopback server without tokens).
    #[arg(long, value_name = "F")]
    pub token_file: Option<PathBuf>,
    /// A CA certificate (PEM) to verify the server's TLS certificate with.
    #[arg(long, value_name = "F")]
    pub tls_ca: Option<PathBuf>,
}

/// A connection to the server and the token to present.
pub struct Connection {
    pub channel: Channel,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Connection {
    /// A request carrying the token, if there is one.
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("authorization", token.clone());
        }
        request
    }
}

impl Server {
    pub async fn connect(&self) -> Result<Connection, Failure> {
        let token = self.token()?;
        let mut endpoint = Endpoint::from_shared(self.server.clone())
            .map_err(|_| Failure::Usage(format!("`--server {}` is not a URL", self.server)))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60));
        if self.server.starts_with("https://") || self.tls_ca.is_some() {
            let mut tls = ClientTlsConfig::new();
            if let Some(path) = &self.tls_ca {
                let pem = std::fs::read(path).map_err(|error| {
                    Failure::Input(format!("cannot read `{}`: {}", path.display(), error.kind()))
                })?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|error| Failure::Input(format!("TLS: {error}")))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| Failure::Input(format!("cannot reach `{}`: {error}", self.server)))?;
        Ok(Connection { channel, token })
    }

    fn token(&self) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>, Failure> {
        read_token(self.token_file.as_deref())
    }
}

/// The bearer token to present: `--token-file`, else `CAPGATE_TOKEN`, else
/// none. The error never repeats the token.
pub fn read_token(
    file: Option<&std::path::Path>,
) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>, Failure> {
    let raw = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|error| {
                Failure::Input(format!("cannot read `{}`: {}", path.display(), error.kind()))
            })?;
            Some(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        None => std::env::var("CAPGATE_TOKEN").ok(),
    };
    match raw.filter(|token| !token.is_empty()) {
        None => Ok(None),
        Some(token) => format!("Bearer {token}")
            .parse()
            .map(Some)
            .map_err(|_| Failure::Input("the token holds characters a header cannot carry".to_owned())),
    }
}

/// The runtime a service command runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::Input(format!("cannot start the async runtime: {error}")))
}

/// A call that failed, in one line. The message is the server's; it never
/// carries a token.
/// A compare-and-set call's error: `ABORTED` (another change came first) is a finding, printed
/// as one line and exit 1, as `publish` and `policies activate` both answer it; anything else is
/// the failure [`status_failure`] makes of it.
pub fn conflict_or_failure(status: &Status) -> Result<Outcome, Failure> {
    if status.code() == Code::Aborted {
        Ok(Outcome {
            stdout: String::new(),
            stderr: format!("error: {}\n", status.message()),
            exit: Exit::Findings,
        })
    } else {
        Err(status_failure(status))
    }
}

pub fn status_failure(status: &Status) -> Failure {
    let what = match status.code() {
        Code::Unauthenticated => "not authenticated",
        Code::PermissionDenied => "not allowed",
        Code::Unavailable => "unavailable",
        Code::InvalidArgument => "invalid argument",
        Code::NotFound => "not found",
        Code::Aborted => "conflict",
        Code::FailedPrecondition => "refused",
        _ => "failed",
    };
    Failure::Input(format!("{what}: {}", status.message()))
}

/// `50ms`, `2s`, `1m`, `12h`, `7d` or a plain number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "ms"),
    };
    let amount: u64 = digits
        .parse()
        .map_err(|_| "expected a duration such as `50ms`, `2s`, `1m` or `7d`".to_owned())?;
    let millis = match unit {
        "ms" => Some(amount),
        "s" => amount.checked_mul(1000),
        "m" => amount.checked_mul(60_000),
        "h" => amount.checked_mul(3_600_000),
        "d" => amount.checked_mul(86_400_000),
        _ => return Err(format!("unknown unit `{unit}`: use `ms`, `s`, `m`, `h` or `d`")),
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| "the duration is too long".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for bad in ["", "ms", "1w", "1y", "-1s", "1.5s", "1 h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("999999999999d").is_err(), "overflow is refused");
    }
}
