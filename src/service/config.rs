//! What `capgate serve` is configured with, resolved at start-up: listen
//! addresses, tokens read from their references, TLS material, timeouts. A
//! configuration that cannot be resolved stops the start, with a message that
//! names the flag — never one that carries a token.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::identity::jwks::OidcSettings;

/// Everything the server needs besides its store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Every address to listen on; `127.0.0.1:0` picks a free port.
    pub listen: Vec<SocketAddr>,
    /// `--http-listen`: where the AuthZEN HTTP/JSON door listens; empty, it is off
    /// (docs/decisions/0018). The same tokens, TLS and loopback rule as `listen`.
    pub http_listen: Vec<SocketAddr>,
    /// `--http-public-url`: the base URL of the AuthZEN metadata's endpoints;
    /// without it, the address a connection was accepted on (docs/decisions/0032).
    pub http_public_url: Option<String>,
    /// `--policy FILE [--catalog F]`: published at start-up if it differs from
    /// the active version.
    pub policy: Option<PolicyFile>,
    /// With a spool: how long a call waits for its batch's transaction (from
    /// when it starts) before its record is spooled instead.
    pub store_timeout: Duration,
    /// How long one audit batch may take to commit before it goes to the spool.
    pub audit_timeout: Duration,
    /// How often the active version is re-read, whatever notifications say.
    pub poll_interval: Duration,
    /// Where audit batches go while the store cannot take them.
    pub audit_spool: Option<PathBuf>,
    /// At most this many records per audit transaction.
    pub audit_batch: usize,
    /// At most this many audit transactions at once.
    pub audit_in_flight: usize,
    /// Connections in the store's pool; `None` is the store's default
    /// (PostgreSQL 8, SQLite 4).
    pub store_connections: Option<u32>,
    pub gateway_tokens: Vec<Token>,
    /// Gateway tokens also trusted to assert a principal.
    pub asserting_gateway_tokens: Vec<Token>,
    pub admin_tokens: Vec<Token>,
    pub tls: Option<Tls>,
    /// How `oidc` issuers' keys are fetched and cached.
    pub oidc: OidcSettings,
    /// Root certificates (DER) trusted for `https` discovery besides the system's.
    pub oidc_roots: Vec<Vec<u8>>,
    /// How long connections may take and stay, and how many (docs/decisions/0013).
    pub connections: Connections,
    /// How the ext_authz door reads a forwarded request (the forward-auth and ExtMCP doors read
    /// the API-key header and the allowed methods from it too).
    pub ext_authz: ExtAuthzSettings,
    /// How the forward-auth door reads a proxy's subrequest.
    pub forward_auth: ForwardAuthSettings,
    /// What the audit trail keeps of a tool call's arguments (`--audit-arguments`,
    /// `--audit-redact`).
    pub audit_arguments: AuditArguments,
    /// How long a shadow version's differences are kept (`serve --shadow-retention`).
    pub shadow_retention: Duration,
}

/// What a decision's audit record keeps of the call's arguments. Always their digest; their
/// values only when the operator opts in (`serve --audit-arguments`), and then with every member
/// whose name looks sensitive, or is named by `--audit-redact`, replaced by `"[redacted]"`
/// (src/service/pipeline/arguments.rs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditArguments {
    /// Keep the (redacted) values, not only the digest.
    pub keep: bool,
    /// Member names redacted besides the built-in ones, lower-case: a member is redacted when its
    /// name, lower-cased, equals one of them.
    pub redact: Vec<String>,
}

/// How the forward-auth door reads a proxy's bodyless subrequest (`--forward-auth-*`;
/// src/service/forward_auth.rs). Header names are lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuthSettings {
    /// The header the proxy sends its own gateway token in (`authorization` is the caller's).
    pub token_header: String,
    /// The header that names the MCP server, for a tool named without its `<server>__` prefix;
    /// a path segment after `/forward-auth/` names it too.
    pub server_header: String,
    /// The header that carries an id the proxy makes per request, for idempotency; none by
    /// default, so that no id a client chose is taken (docs/decisions/0027).
    pub request_id_header: Option<String>,
}

impl Default for ForwardAuthSettings {
    fn default() -> Self {
        ForwardAuthSettings {
            token_header: "x-capgate-gateway-token".to_owned(),
            server_header: "x-mcp-servername".to_owned(),
            request_id_header: None,
        }
    }
}

/// How the ext_authz door reads a forwarded request (`--ext-authz-*`; src/service/grpc/ext_authz.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtAuthzSettings {
    /// The header that carries a `static-key` issuer's key, lower-case as Envoy forwards it.
    pub api_key_header: String,
    /// MCP methods besides `initialize`, `ping`, `tools/list` and `notifications/*` that pass
    /// without a decision; every other method but `tools/call` is refused.
    pub allowed_methods: Vec<String>,
}

impl Default for ExtAuthzSettings {
    fn default() -> Self {
        ExtAuthzSettings {
            api_key_header: "x-api-key".to_owned(),
            allowed_methods: Vec::new(),
        }
    }
}

/// The bounds on the decision port's connections (`connections.rs` enforces them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// TLS (when configured) and the client's HTTP/2 connection preface must be done by then.
    pub handshake_timeout: Duration,
    /// A connection with no open stream for this long is closed.
    pub idle_timeout: Duration,
    /// A connection nothing was read from for this long is sent an HTTP/2 PING…
    pub keepalive_interval: Duration,
    /// …and closed when the PING is not answered within this.
    pub keepalive_timeout: Duration,
    /// At most this many connections at once, counted from accept to close; the ones past it
    /// are closed at once. `None`: half the process's open-file limit, at most
    /// [`Connections::DEFAULT_MAX`].
    pub max_connections: Option<usize>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS: the streams (calls) one connection may have open.
    pub max_concurrent_streams: u32,
}

impl Config {
    /// Listening on `listen` with every default and no tokens.
    pub fn new(listen: Vec<SocketAddr>) -> Self {
        Config {
            listen,
            http_listen: Vec::new(),
            http_public_url: None,
            policy: None,
            store_timeout: Duration::from_millis(500),
            audit_timeout: Duration::from_millis(1000),
            poll_interval: Duration::from_secs(2),
            audit_spool: None,
            audit_batch: 512,
            audit_in_flight: 1,
            store_connections: None,
            gateway_tokens: Vec::new(),
            asserting_gateway_tokens: Vec::new(),
            admin_tokens: Vec::new(),
            tls: None,
            oidc: OidcSettings::default(),
            oidc_roots: Vec::new(),
            connections: Connections {
                // A client on the same network does TLS and its preface in milliseconds.
                handshake_timeout: Duration::from_secs(5),
                // Long enough that a gateway between bursts keeps its connection.
                idle_timeout: Duration::from_secs(300),
                keepalive_interval: Duration::from_secs(30),
                keepalive_timeout: Duration::from_secs(10),
                max_connections: None,
                max_concurrent_streams: 256,
            },
            ext_authz: ExtAuthzSettings::default(),
            forward_auth: ForwardAuthSettings::default(),
            audit_arguments: AuditArguments::default(),
            shadow_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// Whether any token is configured (then every call must present one).
    pub fn authenticates(&self) -> bool {
        !self.gateway_tokens.is_empty()
            || !self.asserting_gateway_tokens.is_empty()
            || !self.admin_tokens.is_empty()
    }

    /// The checks that need no I/O: something to listen on, tokens where the
    /// network is not loopback, token names unique.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError::NoListenAddress);
        }
        if !self.authenticates() {
            if let Some(open) = (self.listen.iter())
                .chain(&self.http_listen)
                .find(|addr| !addr.ip().is_loopback())
            {
                return Err(ConfigError::UnauthenticatedNetwork(*open));
            }
        }
        let mut names: Vec<&str> = self
            .gateway_tokens
            .iter()
            .chain(&self.asserting_gateway_tokens)
            .chain(&self.admin_tokens)
            .map(|token| token.name.as_str())
            .collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(ConfigError::DuplicateTokenName(pair[0].to_owned()));
        }
        if let Some(url) = &self.http_public_url {
            if let Some(problem) = public_url_problem(url) {
                return Err(ConfigError::Invalid(format!(
                    "`--http-public-url {url}`: {problem}"
                )));
            }
        }
        if self.shadow_retention.is_zero() {
            // Zero would delete every difference the hour it was recorded: nothing left to report.
            return Err(ConfigError::Invalid(
                "`--shadow-retention` must be longer than 0ms".to_owned(),
            ));
        }
        if self.audit_batch == 0 {
            return Err(ConfigError::Invalid(
                "--audit-batch must be at least 1".to_owned(),
            ));
        }
        if self.audit_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "--audit-in-flight must be at least 1".to_owned(),
            ));
        }
        if self.store_connections == Some(0) {
            return Err(ConfigError::Invalid(
                "--store-connections must be at least 1".to_owned(),
            ));
        }
        self.connections.check()
    }
}

/// Why `url` cannot be the AuthZEN metadata's base URL, if it cannot: it must be `http://` or
/// `https://`, name a host, and carry no user, query, fragment or whitespace.
fn public_url_problem(url: &str) -> Option<&'static str> {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return Some("must start with `https://` or `http://`");
    };
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Some("must name a host");
    }
    if url.contains(['?', '#', '@']) || url.chars().any(char::is_whitespace) {
        return Some("must hold no user, query, fragment or whitespace");
    }
    None
}

impl Connections {
    /// The largest default connection cap, whatever the open-file limit.
    pub const DEFAULT_MAX: usize = 4096;

    /// Every duration longer than zero, every count at least 1; the error names the flag.
    fn check(&self) -> Result<(), ConfigError> {
        let durations = [
            ("--handshake-timeout", self.handshake_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--keepalive-interval", self.keepalive_interval),
            ("--keepalive-timeout", self.keepalive_timeout),
        ];
        if let Some((flag, _)) = durations.iter().find(|(_, duration)| duration.is_zero()) {
            return Err(ConfigError::Invalid(format!("`{flag}` must be longer than 0ms")));
        }
        if self.max_connections == Some(0) {
            return Err(ConfigError::Invalid(
                "`--max-connections` must be at least 1".to_owned(),
            ));
        }
        if self.max_concurrent_streams == 0 {
            return Err(ConfigError::Invalid(
                "`--max-concurrent-streams` must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }
}

/// The artifact (and catalog) `serve --policy` starts with, as text.
#[derive(Debug, Clone)]
pub struct PolicyFile {
    pub artifact: String,
    pub catalog: Option<String>,
}

/// TLS material, already read (PEM).
#[derive(Clone)]
pub struct Tls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// Present: clients must show a certificate signed by it (mutual TLS).
    pub client_ca: Option<Vec<u8>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is secret material: never printed.
        f.debug_struct("Tls")
            .field("cert", &format_args!("{} bytes", self.cert.len()))
            .field("key", &"[redacted]")
            .field("mutual", &self.client_ca.is_some())
            .finish()
    }
}

/// A bearer token: its name (the identity recorded in audit) and the SHA-256
/// of its value. Only the digest is kept, so the secret itself does not stay
/// in memory longer than it takes to read it, and comparisons run over a
/// fixed length whatever was presented.
#[derive(Clone)]
pub struct Token {
    pub name: String,
    pub(crate) digest: [u8; 32],
}

impl Token {
    /// A token with its value (for tests and for references already read).
    pub fn new(name: impl Into<String>, value: &[u8]) -> Self {
        Token {
            name: name.into(),
            digest: Sha256::digest(value).into(),
        }
    }

    /// Parses `NAME=env://VAR` or `NAME=file:///path` and reads the value.
    /// A file's trailing line break is not part of the token.
    pub fn resolve(flag: &str, spec: &str) -> Result<Token, ConfigError> {
        let bad = |problem: &str| ConfigError::Token {
            flag: flag.to_owned(),
            problem: problem.to_owned(),
        };
        let Some((name, reference)) = spec.split_once('=') else {
            return Err(bad("expected `NAME=env://VAR` or `NAME=file:///path`"));
        };
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(bad("the token name must be letters, digits, `-`, `_` or `.`"));
        }
        if !reference.starts_with("env://") && !reference.starts_with("file://") {
            return Err(bad("the reference must start with `env://` or `file://`"));
        }
        let value = crate::identity::read_reference(reference).map_err(|problem| bad(&problem))?;
        if value.is_empty() {
            return Err(bad(&format!("the token `{name}` is empty")));
        }
        Ok(Token::new(name, &value))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("digest", &"[redacted]")
            .finish()
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("nothing to listen on: give `--listen ADDR`")]
    NoListenAddress,
    #[error(
        "refusing to listen on `{0}` without tokens: unauthenticated calls are accepted only on \
         loopback addresses; configure `--gateway-token` and `--admin-token`, or listen on 127.0.0.1"
    )]
    UnauthenticatedNetwork(SocketAddr),
    #[error("`{flag}`: {problem}")]
    Token { flag: String, problem: String },
    #[error("the token name `{0}` is configured twice")]
    DuplicateTokenName(String),
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn open_addresses_need_tokens() {
        let local = Config::new(vec![addr("127.0.0.1:0"), addr("[::1]:0")]);
        assert_eq!(local.check(), Ok(()));
        let open = Config::new(vec![addr("127.0.0.1:0"), addr("0.0.0.0:7000")]);
        assert_eq!(
            open.check(),
            Err(ConfigError::UnauthenticatedNetwork(addr("0.0.0.0:7000")))
        );
        let mut guarded = open;
        guarded.gateway_tokens.push(Token::new("gw", b"s3cret"));
        assert_eq!(guarded.check(), Ok(()));
        guarded.admin_tokens.push(Token::new("gw", b"other"));
        assert_eq!(guarded.check(), Err(ConfigError::DuplicateTokenName("gw".into())));
    }

    #[test]
    fn connection_bounds_must_be_positive_and_name_their_flag() {
        let mut config = Config::new(vec![addr("127.0.0.1:0")]);
        assert_eq!(config.check(), Ok(()));
        config.connections.idle_timeout = Duration::ZERO;
        assert_eq!(
            config.check(),
            Err(ConfigError::Invalid(
                "`--idle-timeout` must be longer than 0ms".into()
            ))
        );
        config.connections.idle_timeout = Duration::from_secs(1);
        config.connections.max_connections = Some(0);
        assert_eq!(
            config.check(),
            Err(ConfigError::Invalid(
                "`--max-connections` must be at least 1".into()
            ))
        );
        config.connections.max_connections = Some(1);
        config.connections.max_concurrent_streams = 0;
        assert_eq!(
            config.check(),
            Err(ConfigError::Invalid(
                "`--max-concurrent-streams` must be at least 1".into()
            ))
        );
        config.connections.max_concurrent_streams = 1;
        config.shadow_retention = Duration::ZERO;
        assert_eq!(
            config.check(),
            Err(ConfigError::Invalid(
                "`--shadow-retention` must be longer than 0ms".into()
            ))
        );
    }

    #[test]
    fn token_references_are_checked_and_never_echo_the_value() {
        assert!(matches!(
            Token::resolve("--gateway-token", "gw"),
            Err(ConfigError::Token { .. })
        ));
        assert!(matches!(
            Token::resolve("--gateway-token", "gw=s3cret"),
            Err(ConfigError::Token { .. })
        ));
        assert!(matches!(
            Token::resolve("--gateway-token", "=env://X"),
            Err(ConfigError::Token { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        let token = Token::resolve("--admin-token", &format!("ops=file://{}", path.display())).unwrap();
        assert_eq!(token.name, "ops");
        assert_eq!(token.digest, Token::new("ops", b"s3cret").digest);
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
