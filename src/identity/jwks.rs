//! OIDC discovery documents and JWK sets, fetched over HTTPS and cached per discovery URL.
//!
//! [`OidcDirectory::keys`] answers "which issuer identifier and which keys does this discovery URL
//! stand for?" from a cache, and fetches only when it must:
//!
//! * **cold** (never fetched) or **stale** (last successful fetch older than
//!   [`OidcSettings::max_staleness`]): the discovery document, then its `jwks_uri`;
//! * **unknown `kid`**: the JWK set again (the discovery document is kept), because the issuer may
//!   have rotated its keys;
//! * **on a schedule**: [`OidcDirectory::refresh_all`] (or the task [`OidcDirectory::spawn_refresher`]
//!   starts) refetches both for every issuer seen so far, every [`OidcSettings::refresh_interval`].
//!
//! Fetches are bounded and fail closed:
//!
//! * **single flight**: one fetch per issuer at a time; callers that arrive meanwhile wait for it and
//!   use its result. The fetch runs in its own task, so a caller that goes away does not abort it.
//! * **rate limit**: at most one refetch for an unknown `kid` per issuer per
//!   [`OidcSettings::refetch_interval`] (a flood of tokens with made-up `kid`s costs the issuer one
//!   request per interval; a rotation just after a scheduled refresh is still picked up at once);
//!   and after a failed attempt, no attempt of any kind for [`OidcSettings::retry_interval`] (a flood
//!   against a provider that is down costs it one request per interval, and callers do not queue
//!   behind one timeout after another).
//! * **time bound**: a caller waits at most [`OidcSettings::fetch_timeout`] for keys, whatever the
//!   network does (the fetch itself is cut at the same bound).
//! * **last good keys**: when a refetch fails, the keys fetched before stay in use until they are
//!   [`OidcSettings::max_staleness`] old. Nothing a failing endpoint does makes a token valid: it can
//!   only make keys unavailable ([`KeysError::Unavailable`], which the service answers distinctly
//!   from an invalid credential). A token whose `kid` is unknown while the last fetch failed is
//!   `Unavailable` too: the key may exist, we cannot tell.
//!
//! HTTP rules: `https://` URLs, verified against the system's root certificates (plus any given to
//! [`OidcDirectory::with_roots`]); plain `http://` only to a loopback host (`localhost`,
//! `127.0.0.0/8`, `[::1]`), for local identity providers and tests; no credentials in URLs; at most
//! [`MAX_REDIRECTS`] redirects, each obeying the same rules and never going from `https` to
//! `http`; responses larger than [`OidcSettings::max_response_bytes`] are refused. The discovery
//! document's `issuer` is the `iss` tokens must carry; it is not required to prefix the discovery
//! URL (the URL comes from the policy, which is trusted).
//!
//! Logging: issuer and endpoint URLs and failure reasons, at `warn`; never a token (this module never
//! sees one).

use std::collections::HashMap;
use std::error::Error as StdError;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{header, Request, StatusCode, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::jwt::{parse_jwks, Jwks};

/// The most redirects followed for one fetch.
pub const MAX_REDIRECTS: usize = 3;

/// How keys are fetched and how long they are trusted. The defaults suit a service deciding on
/// every request: a decision waits at most 2 s for keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcSettings {
    /// The longest a caller waits for a fetch (discovery and JWK set together), and the cut-off of
    /// the fetch itself. Default 2 s.
    pub fetch_timeout: Duration,
    /// The shortest time between two refetches of an issuer's key set caused by unknown `kid`s,
    /// however many arrive. Default 30 s.
    pub refetch_interval: Duration,
    /// After a failed fetch, the shortest time before the next attempt of any kind. Default 5 s.
    pub retry_interval: Duration,
    /// How often [`OidcDirectory::spawn_refresher`] refetches every issuer. Default 10 min.
    pub refresh_interval: Duration,
    /// How long keys stay usable after their last successful fetch while refetches fail. Default
    /// 24 h: long enough to ride out an identity provider's outage, short enough that a key the
    /// issuer withdrew is not trusted for days.
    pub max_staleness: Duration,
    /// The largest discovery document or JWK set accepted. Default 1 MiB.
    pub max_response_bytes: usize,
}

impl Default for OidcSettings {
    fn default() -> Self {
        OidcSettings {
            fetch_timeout: Duration::from_secs(2),
            refetch_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(5),
            refresh_interval: Duration::from_secs(10 * 60),
            max_staleness: Duration::from_secs(24 * 60 * 60),
            max_response_bytes: 1024 * 1024,
        }
    }
}

/// Why no keys can be offered for an issuer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// No usable keys: never fetched successfully, stale, or the token names a key the issuer could
    /// not be asked about. The reason names URLs and failures, never a token.
    #[error("the issuer's keys are unavailable: {reason}")]
    Unavailable { reason: String },
}

/// The HTTPS client could not be built (no usable TLS configuration).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the HTTPS client for OIDC discovery: {0}")]
pub struct SetupError(String);

/// The issuers' discovery documents and key sets, keyed by discovery URL. Share one per process.
pub struct OidcDirectory {
    fetcher: Fetcher,
    settings: OidcSettings,
    issuers: Mutex<HashMap<String, Arc<IssuerEntry>>>,
}

/// One discovery URL's cache.
struct IssuerEntry {
    discovery_url: String,
    /// The last successful fetch, read without waiting.
    current: RwLock<Option<Arc<Snapshot>>>,
    /// Why the last attempt failed; `None` after a success.
    last_error: Mutex<Option<String>>,
    /// Held for the whole of a fetch: the single-flight lock, and the rate limit's memory.
    attempts: Arc<tokio::sync::Mutex<Attempts>>,
}

struct Snapshot {
    issuer: String,
    jwks_uri: String,
    jwks: Arc<Jwks>,
    fetched_at: Instant,
}

#[derive(Default)]
struct Attempts {
    /// When the last attempt of any kind started.
    last: Option<Instant>,
    /// Whether it failed. Counted as failed from its start, so an attempt that never finishes is
    /// treated as one that failed.
    failed: bool,
    /// When the last refetch for an unknown `kid` started.
    last_for_kid: Option<Instant>,
}

/// Why keys are fetched; it decides what is fetched and which limit applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// No usable keys (never fetched, or stale): discovery and key set.
    Missing,
    /// The cached set lacks a token's `kid`: the key set only, rate-limited.
    UnknownKid,
    /// The periodic refresh: discovery and key set.
    Scheduled,
}

impl IssuerEntry {
    fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn record(&self, outcome: Result<Snapshot, String>) -> bool {
        let mut last_error = self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            Ok(snapshot) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(snapshot));
                *last_error = None;
                true
            }
            Err(reason) => {
                tracing::warn!(discovery = %self.discovery_url, error = %reason, "OIDC key fetch failed");
                *last_error = Some(reason);
                false
            }
        }
    }
}

impl OidcDirectory {
    /// A directory trusting the system's root certificates.
    pub fn new(settings: OidcSettings) -> Result<OidcDirectory, SetupError> {
        OidcDirectory::with_roots(settings, Vec::new())
    }

    /// A directory trusting the system's root certificates and `extra_roots` (a private CA).
    pub fn with_roots(
        settings: OidcSettings,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<OidcDirectory, SetupError> {
        Ok(OidcDirectory {
            fetcher: Fetcher::new(&settings, extra_roots)?,
            settings,
            issuers: Mutex::new(HashMap::new()),
        })
    }

    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    /// The issuer identifier and key set behind `discovery_url` (which must come from the policy,
    /// never from a token). With `kid`, a set that lacks it is refetched first, within the rate
    /// limit; the set returned may still lack it, and verification then reports `NoSuchKey`.
    pub async fn keys(
        &self,
        discovery_url: &str,
        kid: Option<&str>,
    ) -> Result<(String, Arc<Jwks>), KeysError> {
        let entry = self.entry(discovery_url);
        let seen = entry.snapshot();
        let fresh = seen.as_ref().filter(|snapshot| self.usable(snapshot));
        if let Some(snapshot) = fresh {
            if kid.is_none_or(|kid| snapshot.jwks.contains_kid(kid)) {
                return Ok((snapshot.issuer.clone(), snapshot.jwks.clone()));
            }
        }
        let trigger = if fresh.is_none() {
            Trigger::Missing
        } else {
            Trigger::UnknownKid
        };
        refetch(&self.fetcher, &self.settings, &entry, seen, trigger).await;

        let unavailable = |reason: String| Err(KeysError::Unavailable { reason });
        match entry.snapshot() {
            Some(snapshot) if self.usable(&snapshot) => {
                let known = kid.is_none_or(|kid| snapshot.jwks.contains_kid(kid));
                match entry.last_error() {
                    Some(reason) if !known => unavailable(format!(
                        "the token's key is not in the cached set and `{}` cannot be refetched: {reason}",
                        snapshot.jwks_uri
                    )),
                    _ => Ok((snapshot.issuer.clone(), snapshot.jwks.clone())),
                }
            }
            stale => {
                let reason = entry
                    .last_error()
                    .unwrap_or_else(|| format!("no answer within {:?}", self.settings.fetch_timeout));
                match stale {
                    Some(_) => unavailable(format!(
                        "keys from `{discovery_url}` are older than {:?} and cannot be refreshed: {reason}",
                        self.settings.max_staleness
                    )),
                    None => unavailable(format!("no keys fetched yet from `{discovery_url}`: {reason}")),
                }
            }
        }
    }

    /// Refetches the discovery document and key set of every issuer seen so far, concurrently,
    /// within each issuer's rate limit. Returns when all are done (each within the fetch timeout).
    pub async fn refresh_all(&self) {
        let entries: Vec<Arc<IssuerEntry>> = self
            .issuers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        let mut refreshes = tokio::task::JoinSet::new();
        for entry in entries {
            let seen = entry.snapshot();
            let (fetcher, settings) = (self.fetcher.clone(), self.settings.clone());
            refreshes
                .spawn(async move { refetch(&fetcher, &settings, &entry, seen, Trigger::Scheduled).await });
        }
        while refreshes.join_next().await.is_some() {}
    }

    /// Starts a task that calls [`refresh_all`](Self::refresh_all) every
    /// [`OidcSettings::refresh_interval`]; it ends once the directory is dropped.
    pub fn spawn_refresher(self: &Arc<Self>) -> JoinHandle<()> {
        let directory: Weak<OidcDirectory> = Arc::downgrade(self);
        // A zero period would make `interval_at` panic; treat it as "very often" instead.
        let interval = self.settings.refresh_interval.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(directory) = directory.upgrade() else {
                    return;
                };
                directory.refresh_all().await;
            }
        })
    }

    /// The issuer identifier behind `discovery_url` when usable keys are cached; never waits and
    /// never fetches (a request's fast path: most tokens find their issuer here).
    pub fn cached_issuer(&self, discovery_url: &str) -> Option<String> {
        let entry = self
            .issuers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(discovery_url)
            .cloned()?;
        let snapshot = entry.snapshot()?;
        self.usable(&snapshot).then(|| snapshot.issuer.clone())
    }

    fn entry(&self, discovery_url: &str) -> Arc<IssuerEntry> {
        let mut issuers = self
            .issuers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        issuers
            .entry(discovery_url.to_owned())
            .or_insert_with(|| {
                Arc::new(IssuerEntry {
                    discovery_url: discovery_url.to_owned(),
                    current: RwLock::new(None),
                    last_error: Mutex::new(None),
                    attempts: Arc::default(),
                })
            })
            .clone()
    }

    fn usable(&self, snapshot: &Snapshot) -> bool {
        snapshot.fetched_at.elapsed() <= self.settings.max_staleness
    }
}

/// One single-flight, rate-limited fetch for `entry`, waited for at most `fetch_timeout`. `seen` is
/// the snapshot the caller found wanting: if another caller replaced it meanwhile, nothing is
/// fetched.
async fn refetch(
    fetcher: &Fetcher,
    settings: &OidcSettings,
    entry: &Arc<IssuerEntry>,
    seen: Option<Arc<Snapshot>>,
    trigger: Trigger,
) {
    let deadline = Instant::now() + settings.fetch_timeout;
    let Ok(mut attempts) = tokio::time::timeout_at(deadline, entry.attempts.clone().lock_owned()).await
    else {
        return; // Another caller's fetch is still running; its bound is ours too.
    };
    let current = entry.snapshot();
    let replaced = match (&current, &seen) {
        (Some(current), Some(seen)) => !Arc::ptr_eq(current, seen),
        (current, seen) => current.is_some() != seen.is_some(),
    };
    if replaced {
        return;
    }
    let within =
        |last: Option<Instant>, interval: Duration| last.is_some_and(|last| last.elapsed() < interval);
    if attempts.failed && within(attempts.last, settings.retry_interval) {
        return;
    }
    let now = Instant::now();
    if trigger == Trigger::UnknownKid {
        if within(attempts.last_for_kid, settings.refetch_interval) {
            return;
        }
        attempts.last_for_kid = Some(now);
    }
    attempts.last = Some(now);
    attempts.failed = true;

    let (fetcher, entry, timeout) = (fetcher.clone(), entry.clone(), settings.fetch_timeout);
    // Only a refetch for an unknown kid keeps the discovery document.
    let previous = current.filter(|_| trigger == Trigger::UnknownKid);
    let task = tokio::spawn(async move {
        let outcome =
            match tokio::time::timeout(timeout, fetch(&fetcher, &entry.discovery_url, previous)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
        attempts.failed = !entry.record(outcome);
        drop(attempts);
    });
    let _ = tokio::time::timeout_at(deadline, task).await;
}

/// Fetches the discovery document (unless `previous` gives its content) and the JWK set.
async fn fetch(
    fetcher: &Fetcher,
    discovery_url: &str,
    previous: Option<Arc<Snapshot>>,
) -> Result<Snapshot, String> {
    let (issuer, jwks_uri) = match previous {
        Some(previous) => (previous.issuer.clone(), previous.jwks_uri.clone()),
        None => {
            let body = fetcher.get(discovery_url).await?;
            let document: Value = serde_json::from_slice(&body)
                .map_err(|_| format!("the discovery document at `{discovery_url}` is not JSON"))?;
            let field = |name: &str| match document.get(name) {
                Some(Value::String(value)) if !value.is_empty() => Ok(value.clone()),
                _ => Err(format!(
                    "the discovery document at `{discovery_url}` has no `{name}` string"
                )),
            };
            let (issuer, jwks_uri) = (field("issuer")?, field("jwks_uri")?);
            check_url(&jwks_uri).map_err(|reason| format!("`jwks_uri` of `{discovery_url}`: {reason}"))?;
            (issuer, jwks_uri)
        }
    };
    let body = fetcher.get(&jwks_uri).await?;
    let jwks = parse_jwks(&body).map_err(|error| format!("`{jwks_uri}`: {error}"))?;
    if jwks.is_empty() {
        tracing::warn!(jwks_uri = %jwks_uri, skipped = jwks.skipped(), "the issuer publishes no usable signing key");
    }
    Ok(Snapshot {
        issuer,
        jwks_uri,
        jwks: Arc::new(jwks),
        fetched_at: Instant::now(),
    })
}

/// Checks a discovery or JWK set URL against the module's HTTP rules (module documentation).
/// The service can call it on start-up to refuse a policy's unusable `discovery` early.
pub fn check_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|_| format!("`{url}` is not an absolute URL"))?;
    let Some(authority) = uri.authority() else {
        return Err(format!("`{url}` is not an absolute URL"));
    };
    // Not echoed: the part before `@` may be a password.
    if authority.as_str().contains('@') {
        return Err("credentials in a discovery or JWK set URL are refused".into());
    }
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(authority.host()) => Ok(uri),
        Some("http") => Err(format!(
            "`{url}`: plain http is only allowed to a loopback host; use https"
        )),
        _ => Err(format!("`{url}`: only https URLs are fetched")),
    }
}

fn is_loopback(host: &str) -> bool {
    let bracketless = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
        || bracketless.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// A redirect's target, when it obeys [`check_url`] and does not leave https for http.
fn redirect_target(from: &Uri, location: &str) -> Result<Uri, String> {
    let absolute = if location.starts_with('/') && !location.starts_with("//") {
        format!(
            "{}://{}{location}",
            from.scheme_str().unwrap_or("https"),
            from.authority().map_or("", |authority| authority.as_str())
        )
    } else {
        location.to_owned()
    };
    let target =
        check_url(&absolute).map_err(|reason| format!("redirect from `{from}` refused: {reason}"))?;
    if from.scheme_str() == Some("https") && target.scheme_str() != Some("https") {
        return Err(format!("redirect from `{from}` to plain http refused"));
    }
    Ok(target)
}

/// GETs small JSON documents over HTTP/1.1 (rustls on ring for https).
#[derive(Clone)]
struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    max_bytes: usize,
}

impl Fetcher {
    fn new(
        settings: &OidcSettings,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<Fetcher, SetupError> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::warn!(%error, "a system root certificate could not be loaded");
        }
        roots.add_parsable_certificates(native.certs);
        for certificate in extra_roots {
            roots
                .add(certificate)
                .map_err(|error| SetupError(format!("an extra root certificate: {error}")))?;
        }
        if roots.is_empty() {
            tracing::warn!("no trusted root certificates: https discovery URLs cannot be fetched");
        }
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|error| SetupError(error.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(settings.fetch_timeout));
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Fetcher {
            client,
            max_bytes: settings.max_response_bytes,
        })
    }

    /// The body of a `200 OK` answer to `GET url`, following redirects within the rules.
    async fn get(&self, url: &str) -> Result<Bytes, String> {
        let mut uri = check_url(url)?;
        for _ in 0..=MAX_REDIRECTS {
            let request = Request::get(uri.clone())
                .header(header::ACCEPT, "application/json")
                .header(header::USER_AGENT, concat!("capgate/", env!("CARGO_PKG_VERSION")))
                .body(Empty::new())
                .map_err(|error| format!("`{uri}`: {error}"))?;
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("`{uri}`: {}", chain(&error)))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|location| location.to_str().ok())
                    .ok_or_else(|| format!("`{uri}` answered {status} without a usable Location"))?;
                uri = redirect_target(&uri, location)?;
                continue;
            }
            if status != StatusCode::OK {
                return Err(format!("`{uri}` answered {status}"));
            }
            return match Limited::new(response.into_body(), self.max_bytes).collect().await {
                Ok(body) => Ok(body.to_bytes()),
                Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                    Err(format!("`{uri}` answered more than {} bytes", self.max_bytes))
                }
                Err(error) => Err(format!("`{uri}`: {}", chain(error.as_ref()))),
            };
        }
        Err(format!("more than {MAX_REDIRECTS} redirects from `{url}`"))
    }
}

/// An error and its sources, `: `-separated (hyper's own message is only the outermost layer).
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_https_or_loopback_http() {
        for ok in [
            "https://idp.example/.well-known/openid-configuration",
            "https://idp.example:8443/x",
            "http://127.0.0.1:8080/x",
            "http://127.1.2.3/x",
            "http://localhost/x",
            "http://LOCALHOST:1/x",
            "http://[::1]:9/x",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example/x",
            "http://10.0.0.1/x",
            "http://localhost.evil.example/x",
            "http://[::2]/x",
            "ftp://idp.example/x",
            "/relative",
            "idp.example",
            "https://user:secret@idp.example/x",
            "",
        ] {
            let refused = check_url(bad).expect_err(bad);
            assert!(!refused.contains("secret"), "{refused}");
        }
    }

    #[test]
    fn redirects_obey_the_same_rules_and_never_downgrade() {
        let https: Uri = "https://idp.example/a".parse().expect("uri");
        let local: Uri = "http://127.0.0.1:1/a".parse().expect("uri");
        assert_eq!(
            redirect_target(&https, "/b").expect("relative").to_string(),
            "https://idp.example/b"
        );
        assert!(redirect_target(&https, "https://other.example/c").is_ok());
        assert!(
            redirect_target(&https, "http://127.0.0.1/c").is_err(),
            "https to http"
        );
        assert!(redirect_target(&https, "http://other.example/c").is_err());
        assert!(redirect_target(&https, "//other.example/c").is_err());
        assert!(redirect_target(&https, "b").is_err());
        assert_eq!(
            redirect_target(&local, "/b").expect("relative").to_string(),
            "http://127.0.0.1:1/b"
        );
        assert!(redirect_target(&local, "https://idp.example/b").is_ok());
        assert!(redirect_target(&local, "http://idp.example/b").is_err());
    }
}
