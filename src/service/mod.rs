//! The decision service (`capgate serve`): decisions, policy versions,
//! counters and audit over a store (docs/service.md).
//!
//! This file is the wiring: check the configuration, migrate, publish the
//! start-up file, install the active version, start the audit writer and
//! the policy follower, bind every listener, serve until told to stop, then
//! drain — stop accepting, finish in-flight requests, flush the audit
//! writer. The server is generic over [`Store`] and monomorphised once, at
//! start-up, from the database URL's scheme ([`run`]).
//!
//! | file | what it holds |
//! |---|---|
//! | `config.rs` | the resolved configuration (tokens by reference, TLS) |
//! | `connections.rs` | the decision port's connections: cap, handshake, TLS, idle close |
//! | `active.rs` | the active policy, its atomic swap and the store follower |
//! | `health.rs` | the gRPC health service's statuses |
//! | `pipeline/` | the decision pipeline: identify, resolve, evaluate, consume, audit, answer |
//! | `identify.rs` | who is calling: an asserted principal or the caller's own credential |
//! | `grpc/decisions.rs` | the `DecisionService` door (`Decide`, `ListVisible`) |
//! | `authzen/` | the OpenID AuthZEN 1.0 door over HTTP/JSON (`--http-listen`) |
//! | `grpc/ext_authz.rs` | Envoy's ext_authz door (`Authorization/Check`) |
//! | `grpc/policies.rs` | `PublishPolicy`, `GetActivePolicy`, `ListPolicyVersions`, `ActivatePolicy`, `GetPolicyVersion`, `ListPolicyActivations`, `ResetUsage` |
//! | `auth.rs` | bearer tokens and roles |
//! | `audit/` | the group-commit writer (`mod.rs`) and its local spool (`spool.rs`) |
//! | `retention.rs` | audit partitions made ahead of time |
//! | `bounds.rs` | input bounds |

pub mod active;
pub mod audit;
pub mod auth;
pub mod authzen;
pub mod bounds;
pub mod config;
pub mod connections;
pub mod forward_auth;
pub mod grpc;
pub mod health;
pub mod identify;
pub mod pipeline;
pub mod proxied;
pub mod retention;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use crate::identity::jwks::OidcDirectory;
use crate::store::{self, NewPolicy, PublishOutcome, Store, StoreError, StoreOptions};
use crate::wire::ext_mcp::ext_mcp_server::ExtMcpServer;
use crate::wire::proto::decision_service_server::DecisionServiceServer;
use crate::wire::proto::policy_service_server::PolicyServiceServer;
use active::{compile_text, Active, ActivePolicy, Compiled};
use audit::{AuditOptions, AuditWriter};
use auth::Tokens;
pub use config::{
    AuditArguments, Config, ConfigError, ExtAuthzSettings, ForwardAuthSettings, PolicyFile, Tls, Token,
};
use connections::{Acceptor, StreamLayer};
use grpc::decisions::Decisions;
use grpc::ext_authz::ExtAuthz;
use grpc::ext_mcp::ExtMcpDoor;
use grpc::lenient::AuthorizationService;
use grpc::policies::Policies;
use pipeline::Idempotency;

/// The author recorded for a version published by `serve --policy`.
pub const STARTUP_AUTHOR: &str = "serve --policy";

/// The largest `Decide`/`ListVisible` message: every bound in `bounds.rs`
/// at its maximum fits.
const MAX_DECISION_MESSAGE: usize = 5 * 1024 * 1024;

/// What every request handler shares.
pub struct State<S: Store> {
    pub store: S,
    pub active: ActivePolicy,
    pub audit: AuditWriter,
    pub tokens: Tokens,
    pub store_timeout: Duration,
    /// `request_id` turns on this replica, and the deployment's fingerprint key.
    pub idempotency: Idempotency,
    /// How long a copy of a request waits for the replica that claimed its `request_id` to
    /// answer: as long as a decision can take (a counter, an identity provider's keys, an audit
    /// commit), then `UNAVAILABLE`.
    pub claim_wait: Duration,
    /// The `oidc` issuers' discovery documents and keys.
    pub oidc: Arc<OidcDirectory>,
    /// What a decision's audit record keeps of the call's arguments.
    pub audit_arguments: AuditArguments,
    /// Turns true when the server is told to stop: long-lived streams (`WatchPolicy`) end on it,
    /// so that draining does not wait for them.
    pub stopping: watch::Receiver<bool>,
}

/// The configured extra roots for `https` discovery, as rustls takes them.
fn oidc_roots(config: &Config) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    config
        .oidc_roots
        .iter()
        .map(|der| rustls::pki_types::CertificateDer::from(der.clone()))
        .collect()
}

/// Fetches the keys of the active version's `oidc` issuers in the
/// background, so that the first token does not wait for them. A failure is
/// logged by the directory and retried when a token arrives.
fn prefetch_keys(oidc: &Arc<OidcDirectory>, active: &Active) {
    for discovery in active
        .policy
        .issuers
        .iter()
        .filter_map(|issuer| issuer.discovery.clone())
    {
        let oidc = oidc.clone();
        tokio::spawn(async move {
            let _ = oidc.keys(&discovery, None).await;
        });
    }
}

/// 32 bytes from the operating system's random source, for a fingerprint key
/// (docs/decisions/0027 §3).
fn random_key() -> Result<[u8; 32], StartError> {
    let mut key = [0; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| StartError::Random)?;
    Ok(key)
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error(
        "the policy given with `--policy` does not compile ({errors} error(s)); run `capgate validate` on it"
    )]
    PolicyRejected { errors: usize },
    #[error("the catalog given with `--catalog` cannot be used: {0}")]
    Catalog(String),
    #[error("the stored active version cannot be used: {0}")]
    Active(String),
    #[error("the audit spool cannot be used: {0}")]
    Spool(std::io::Error),
    #[error("the operating system's random source failed: no fingerprint key can be drawn")]
    Random,
    #[error("cannot listen on `{addr}`: {error}")]
    Bind { addr: SocketAddr, error: std::io::Error },
    #[error("the TLS configuration cannot be used: {0}")]
    Tls(String),
    #[error("{0}")]
    Oidc(String),
}

/// A server that is running.
pub struct Running {
    /// The bound addresses, in the order given (ports resolved).
    pub addrs: Vec<SocketAddr>,
    /// The AuthZEN door's bound addresses (`--http-listen`), in the order given.
    pub http_addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), String>>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish, flushes the audit
    /// writer, and returns once all of that is done.
    pub async fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Waits for the server to end.
    pub async fn wait(self) -> Result<(), String> {
        match self.task.await {
            Ok(result) => result,
            Err(error) => Err(format!("the server task failed: {error}")),
        }
    }
}

/// Opens the store the URL names, migrates it, and serves until `shutdown`
/// resolves; then drains.
pub async fn run(
    database_url: &str,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    config.check()?;
    let options = StoreOptions {
        max_connections: config.store_connections,
        ..StoreOptions::default()
    };
    let opened = store::connect(database_url, &options).await?;
    tracing::info!(store = %store::redact(database_url), "store opened");
    // The one place the server is monomorphised: every request calls the store, so the server is
    // compiled once per implementation rather than run over `AnyStore`'s delegation.
    store::with_store!(opened, store => serve_until(store, config, shutdown).await)
}

async fn serve_until<S: Store>(
    store: S,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let running = start(store, config).await?;
    let stop = running.stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new calls; finishing the ones in flight");
        let _ = stop.send(true);
    });
    running.wait().await.map_err(StartError::Active)
}

/// Starts a server over `store`: binds every listen address, migrates,
/// publishes `config.policy` if it differs from the active version, and
/// serves in a task of its own.
pub async fn start<S: Store>(store: S, config: Config) -> Result<Running, StartError> {
    config.check()?;
    // Every address first: a server that cannot listen (a port another one holds) changes
    // nothing in the store, not even the active version.
    async fn bind(addrs: &[std::net::SocketAddr]) -> Result<Vec<TcpListener>, StartError> {
        let mut listeners = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|error| StartError::Bind { addr, error })?;
            listeners.push(listener);
        }
        Ok(listeners)
    }
    let listeners = bind(&config.listen).await?;
    let http_listeners = bind(&config.http_listen).await?;
    store.migrate().await?;
    store.prepare_audit_periods(crate::clock::now()).await?;

    if let Some(file) = &config.policy {
        publish_startup_file(&store, file).await?;
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    let active = ActivePolicy::new(health::Health::new(health));
    active.set_health(ServingStatus::NotServing).await;
    let installed = active.refresh(&store, None).await.map_err(|error| match error {
        active::RefreshError::Store(error) => StartError::Store(error),
        other => StartError::Active(other.to_string()),
    })?;
    if installed.is_none() {
        tracing::warn!(
            "no policy version is active: health is NOT_SERVING and decisions answer UNAVAILABLE \
             until one is published"
        );
    }

    let (audit, audit_task) = AuditWriter::start(
        store.clone(),
        AuditOptions {
            batch: config.audit_batch,
            in_flight: config.audit_in_flight,
            timeout: config.audit_timeout,
            spool: config.audit_spool.clone(),
            // A decision waits for the audit store as long as for its counters.
            spool_after: config.store_timeout,
            replay_interval: config.poll_interval,
        },
    )
    .map_err(StartError::Spool)?;

    let (stop, stopped) = watch::channel(false);
    let follower = tokio::spawn(
        active
            .clone()
            .follow(store.clone(), config.poll_interval, stopped.clone()),
    );

    let oidc = Arc::new(
        OidcDirectory::with_roots(config.oidc.clone(), oidc_roots(&config))
            .map_err(|error| StartError::Oidc(error.to_string()))?,
    );
    if let Some(active) = &installed {
        prefetch_keys(&oidc, active);
    }
    let refresher = oidc.spawn_refresher();

    // The fingerprint key every replica of this store shares: the stored one, or this draw.
    let request_key = store.request_key(&random_key()?).await?;

    let state = Arc::new(State {
        store,
        active,
        audit,
        tokens: Tokens::new(
            config.gateway_tokens.clone(),
            config.asserting_gateway_tokens.clone(),
            config.admin_tokens.clone(),
        ),
        store_timeout: config.store_timeout,
        idempotency: Idempotency::new(&request_key),
        claim_wait: config.store_timeout * 2 + config.audit_timeout + config.oidc.fetch_timeout,
        oidc,
        audit_arguments: config.audit_arguments.clone(),
        stopping: stopped.clone(),
    });

    let mut addrs = Vec::with_capacity(listeners.len());
    for (listener, addr) in listeners.iter().zip(&config.listen) {
        let bound = listener
            .local_addr()
            .map_err(|error| StartError::Bind { addr: *addr, error })?;
        addrs.push(bound);
    }
    // The connection cap, handshake deadline, TLS and idle watch are the acceptor's; keepalive
    // pings and the stream limit are hyper's (docs/decisions/0013).
    let acceptor = Acceptor::new(&config.connections, config.tls.as_ref()).map_err(StartError::Tls)?;
    // The HTTP doors, when `--http-listen` is given: the same state, tokens and TLS, and the same
    // budget of connections.
    let http = authzen::HttpServer::bind(
        state.clone(),
        &config,
        http_listeners,
        (acceptor.budget(), acceptor.max_connections()),
        stopped.clone(),
    )
    .await?;
    let builder = Server::builder()
        .http2_keepalive_interval(Some(config.connections.keepalive_interval))
        .http2_keepalive_timeout(Some(config.connections.keepalive_timeout))
        .max_concurrent_streams(config.connections.max_concurrent_streams);
    // Reflection in both versions (grpcio-reflection and older grpcurl builds speak only
    // v1alpha), over every service this port serves (capgate's, Envoy's ext_authz, agentgateway's
    // ExtMCP, health, reflection itself), and the `google.rpc` error details
    // that `INVALID_ARGUMENT` carries, so that a client can decode `BadRequest` by reflection.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::wire::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::wire::proto::ENVOY_AUTHORIZATION_DESCRIPTOR_SET)
            // Both reflection services, so that either version lists both (each registers only
            // its own descriptor).
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|error| StartError::Active(format!("reflection: {error}")))?;
    let reflection = reflection()
        .build_v1()
        .map_err(|error| StartError::Active(format!("reflection: {error}")))?;
    let router = builder
        // A connection with a call open is not idle.
        .layer(StreamLayer)
        // One span per capgate RPC, with its duration and status (src/telemetry).
        .layer(crate::telemetry::RpcLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(
            DecisionServiceServer::new(Decisions::new(state.clone()))
                .max_decoding_message_size(MAX_DECISION_MESSAGE),
        )
        .add_service(
            // agentgateway's ExtMCP callout: `params` and `metadata_context` are bounded like a
            // Decide's fields once decoded, the message like a Decide.
            ExtMcpServer::new(ExtMcpDoor::new(state.clone(), &config.ext_authz))
                .max_decoding_message_size(MAX_DECISION_MESSAGE),
        )
        .add_service(
            PolicyServiceServer::new(Policies::new(state.clone()))
                .max_decoding_message_size(bounds::MAX_MESSAGE_BYTES),
        )
        .add_service(AuthorizationService::new(
            ExtAuthz::new(state.clone(), config.ext_authz.clone()),
            MAX_DECISION_MESSAGE,
        ));
    // Spawned once nothing can fail any more, so a start that fails leaves
    // no task behind.
    let preparer = tokio::spawn(retention::prepare_periodically(
        state.store.clone(),
        retention::PREPARE_INTERVAL,
        config.shadow_retention,
    ));
    drop(state);

    // Logged before `capgate serving`, the line that says the server is up.
    let http_addrs = http.addrs.clone();
    if !http.addrs.is_empty() {
        let shown: Vec<String> = http.addrs.iter().map(ToString::to_string).collect();
        tracing::info!(addresses = %shown.join(", "), tls = config.tls.is_some(), "serving HTTP: AuthZEN and forward-auth");
    }
    let shown: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    tracing::info!(
        addresses = %shown.join(", "),
        tls = config.tls.is_some(),
        mutual_tls = config.tls.as_ref().is_some_and(|tls| tls.client_ca.is_some()),
        max_connections = acceptor.max_connections(),
        "capgate serving"
    );
    let incoming = acceptor.incoming(listeners);
    if !config.authenticates() {
        tracing::warn!("no tokens configured: accepting unauthenticated calls, on loopback addresses only");
    }

    let mut signal = stopped;
    let task = tokio::spawn(async move {
        let served = router
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = signal.wait_for(|stop| *stop).await;
            })
            .await;
        // The AuthZEN connections drain on the same signal; their records reach the writer
        // before it is told to finish.
        http.stopped().await;
        follower.abort();
        preparer.abort();
        refresher.abort();
        // Every request handler is gone with the router: the writer commits
        // what is queued and ends.
        match tokio::time::timeout(Duration::from_secs(30), audit_task).await {
            Ok(_) => tracing::info!("audit flushed; stopped"),
            Err(_) => tracing::error!("the audit writer did not finish within 30 s"),
        }
        served.map_err(|error| format!("the server failed: {error}"))
    });
    Ok(Running {
        addrs,
        http_addrs,
        stop,
        task,
    })
}

/// `serve --policy FILE`: published first when its content differs from the
/// active version, so that the file the server started with is what runs.
async fn publish_startup_file<S: Store>(store: &S, file: &PolicyFile) -> Result<(), StartError> {
    let PolicyFile { artifact, catalog } = file;
    match compile_text(artifact.clone(), catalog.clone()).await {
        Compiled::Ok { policy, .. } => {
            let new = NewPolicy {
                version: policy.version.clone(),
                artifact: artifact.clone(),
                catalog: catalog.clone(),
                author: STARTUP_AUTHOR.to_owned(),
                comment: "published at start-up".to_owned(),
                created_at_ms: crate::clock::now(),
            };
            match store.publish(new, None).await? {
                PublishOutcome::Activated(stored) => {
                    tracing::info!(revision = stored.revision, version = %stored.version, "start-up policy published");
                }
                PublishOutcome::Unchanged(stored) => {
                    tracing::info!(revision = stored.revision, "start-up policy is already active");
                }
                PublishOutcome::Conflict { .. } => {
                    return Err(StartError::Active("the start-up publish conflicted".to_owned()));
                }
            }
            Ok(())
        }
        Compiled::Rejected { diagnostics } => Err(StartError::PolicyRejected {
            errors: diagnostics.iter().filter(|d| d.is_error()).count(),
        }),
        Compiled::BadCatalog(problem) => Err(StartError::Catalog(problem)),
    }
}
