//! The active policy of this replica: the compiled version every request
//! decides on, swapped atomically when the store says another version is
//! active (docs/service.md).
//!
//! A request takes an `Arc` of the active version once and decides on it to
//! the end, so a swap in the middle of a request changes nothing for it; the
//! response and the audit record name that version.
//!
//! The store is the source of truth. A replica re-reads it when told
//! (PostgreSQL `LISTEN/NOTIFY` through `Store::policy_changed`), every poll
//! interval whatever it was told, and right after its own publish or
//! activation. Every installation happens under one lock, after reading the
//! store's active pointer, so a slow refresh can never install a version
//! older than what the store said last.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tonic_health::ServingStatus;

use crate::identity::{read_static_keys, StaticKeys};
use crate::store::{Store, StoreError, StoredPolicy};
use crate::telemetry::{throttle, Throttle};
use capgate_core::capabilities::Catalog;
use capgate_core::policy::{compile, load_catalog, CompiledPolicy, Diagnostic, Document};

use super::health::Health;

/// A compiled, active version.
#[derive(Debug)]
pub struct Active {
    pub revision: u64,
    pub version: String,
    pub policy: CompiledPolicy,
    /// The parsed artifact, so that reason pointers resolve to positions.
    pub document: Document,
    /// `sha256:…` of the catalog text it was compiled with, if any: with the
    /// version, what tells an identical publish from a new one.
    pub catalog_version: Option<String>,
    /// The `static-key` issuers' keys, read when this version was installed.
    pub static_keys: StaticKeys,
    /// When this replica compiled it, right before installing it (`WatchPolicy`'s
    /// `installed_at`).
    pub installed_at_ms: i64,
}

impl Active {
    /// A compiled version ready to install; reads its static keys.
    pub fn new(
        revision: u64,
        version: String,
        policy: CompiledPolicy,
        document: Document,
        catalog_version: Option<String>,
    ) -> Self {
        let static_keys = read_static_keys(&policy.issuers, revision);
        Active {
            revision,
            version,
            policy,
            document,
            catalog_version,
            static_keys,
            installed_at_ms: crate::clock::now(),
        }
    }

    /// The position of a pointer in this version's artifact.
    pub fn document(&self) -> Option<&Document> {
        Some(&self.document)
    }
}

/// What compiling an artifact (and its catalog) gave.
pub enum Compiled {
    /// It compiled; the diagnostics are warnings.
    Ok {
        policy: Box<CompiledPolicy>,
        document: Box<Document>,
        diagnostics: Vec<Diagnostic>,
    },
    /// It did not; nothing may be stored or activated.
    Rejected { diagnostics: Vec<Diagnostic> },
    /// The catalog could not be loaded at all.
    BadCatalog(String),
}

/// Compiles on a blocking thread: an artifact may be 8 MiB.
pub async fn compile_text(artifact: String, catalog: Option<String>) -> Compiled {
    let work = move || {
        let catalog: Option<Catalog> = match catalog.as_deref().map(|text| load_catalog(text.as_bytes())) {
            None => None,
            Some(Ok(catalog)) => Some(catalog),
            Some(Err(error)) => return Compiled::BadCatalog(error.to_string()),
        };
        let compilation = compile(artifact.as_bytes(), catalog.as_ref());
        match (compilation.policy, compilation.document) {
            (Some(policy), Some(document)) => Compiled::Ok {
                policy: Box::new(policy),
                document: Box::new(document),
                diagnostics: compilation.diagnostics,
            },
            _ => Compiled::Rejected {
                diagnostics: compilation.diagnostics,
            },
        }
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(compiled) => compiled,
        Err(panic) => Compiled::BadCatalog(format!("the compiler failed: {panic}")),
    }
}

/// When dropped, hands the memory the process has freed back to the operating system.
///
/// A compilation of an 8 MiB artifact and catalog allocates a few hundred megabytes and frees them
/// when it is done; glibc's allocator keeps freed memory in its arenas, so the process stayed at
/// 790 MB after eight big publishes. `malloc_trim(0)` returns every free page, in every arena; it
/// runs once per compilation, which is rare (a publish, an activation, a version another replica
/// published). Elsewhere than glibc this does nothing.
/// docs/decisions/0015-bounded-listing-and-publish.md has the measurements.
pub struct ReturnFreedMemory;

impl Drop for ReturnFreedMemory {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `malloc_trim` only releases free memory of the allocator's own arenas; it takes
        // the arenas' locks, so it is safe to call from any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// This replica's active version, shared by every request, and the shadow version evaluated beside
/// it (docs/decisions/0035).
#[derive(Clone)]
pub struct ActivePolicy {
    current: Arc<watch::Sender<Option<Arc<Active>>>>,
    /// The shadow version: read from the store with the active pointer, on every refresh.
    shadow: Arc<watch::Sender<Option<Arc<Active>>>>,
    refreshing: Arc<Mutex<()>>,
    health: Health,
}

/// Why the active version could not be refreshed.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored version that this build's compiler rejects (a version stored
    /// by an older or newer build). The replica keeps what it had.
    #[error("revision {revision} no longer compiles: {problem}")]
    Uncompilable { revision: u64, problem: String },
}

impl ActivePolicy {
    pub fn new(health: Health) -> Self {
        let (current, _) = watch::channel(None);
        let (shadow, _) = watch::channel(None);
        ActivePolicy {
            current: Arc::new(current),
            shadow: Arc::new(shadow),
            refreshing: Arc::new(Mutex::new(())),
            health,
        }
    }

    /// The version to decide on, if any is active.
    pub fn current(&self) -> Option<Arc<Active>> {
        self.current.borrow().clone()
    }

    /// The shadow version, if one is set and differs from the active one.
    pub fn shadow(&self) -> Option<Arc<Active>> {
        self.shadow.borrow().clone()
    }

    /// Watches installations (for tests and start-up logs).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Active>>> {
        self.current.subscribe()
    }

    /// Re-reads the store's active pointer and installs that version when it
    /// is not the one installed, then does the same for the shadow pointer.
    /// `candidate` is a version this replica just compiled (its own publish):
    /// used instead of compiling again when it is the one the store names.
    pub async fn refresh<S: Store>(
        &self,
        store: &S,
        candidate: Option<Arc<Active>>,
    ) -> Result<Option<Arc<Active>>, RefreshError> {
        let _serialised = self.refreshing.lock().await;
        let active = self.refresh_active(store, candidate.clone()).await?;
        self.refresh_shadow(store, candidate).await?;
        Ok(active)
    }

    /// Installs the shadow version the store names, or none. A shadow that this build cannot
    /// compile is logged and not evaluated: it never keeps the active version from being served.
    async fn refresh_shadow<S: Store>(
        &self,
        store: &S,
        candidate: Option<Arc<Active>>,
    ) -> Result<(), RefreshError> {
        let stored = store.shadow_policy().await?.map(|shadow| shadow.policy);
        let installed = self.shadow();
        let next = match stored {
            None => None,
            Some(stored)
                if installed
                    .as_ref()
                    .is_some_and(|shadow| shadow.revision == stored.revision) =>
            {
                return Ok(());
            }
            Some(stored) => match candidate.filter(|candidate| candidate.revision == stored.revision) {
                Some(candidate) => Some(candidate),
                None => match compile_stored(stored).await {
                    Ok(shadow) => Some(Arc::new(shadow)),
                    Err(error) => {
                        tracing::warn!(%error, "the shadow version is not evaluated");
                        None
                    }
                },
            },
        };
        if installed.as_ref().map(|shadow| shadow.revision) != next.as_ref().map(|shadow| shadow.revision) {
            tracing::info!(
                revision = next.as_ref().map(|shadow| shadow.revision),
                previous = installed.as_ref().map(|shadow| shadow.revision),
                "shadow policy version"
            );
            crate::telemetry::metrics().shadow_installed(next.as_ref().map(|shadow| shadow.revision));
            self.shadow.send_replace(next);
        }
        Ok(())
    }

    async fn refresh_active<S: Store>(
        &self,
        store: &S,
        candidate: Option<Arc<Active>>,
    ) -> Result<Option<Arc<Active>>, RefreshError> {
        let stored = store.active_policy().await?;
        let installed = self.current();
        let Some(stored) = stored else {
            // Nothing active in the store: keep what we have (a store is not
            // expected to lose its pointer; fail closed only at start-up).
            return Ok(installed);
        };
        if installed
            .as_ref()
            .is_some_and(|active| active.revision == stored.revision)
        {
            return Ok(installed);
        }
        let next = match candidate.filter(|candidate| candidate.revision == stored.revision) {
            Some(candidate) => candidate,
            None => Arc::new(compile_stored(stored).await?),
        };
        self.install(next.clone()).await;
        Ok(Some(next))
    }

    async fn install(&self, next: Arc<Active>) {
        let previous = self.current.send_replace(Some(next.clone()));
        crate::telemetry::metrics().policy_installed(next.revision);
        tracing::info!(
            revision = next.revision,
            version = %next.version,
            previous = previous.as_ref().map(|active| active.revision),
            "policy version active"
        );
        self.set_health(ServingStatus::Serving).await;
    }

    /// NOT_SERVING until a version is active (and SERVING after).
    pub async fn set_health(&self, status: ServingStatus) {
        self.health.set(status).await;
    }

    /// Follows the store until `stop` resolves: on every notification and
    /// every `interval`, whichever comes first.
    pub async fn follow<S: Store>(self, store: S, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut notifications_broken = false;
        // Every poll meets the same outage: its lines are written at most once a minute.
        let (lost_notifications, failed_refreshes) = (
            Throttle::every(throttle::OUTAGE_EVERY),
            Throttle::every(throttle::OUTAGE_EVERY),
        );
        let mut refresh_failing = false;
        loop {
            let notified = async {
                if notifications_broken {
                    // After an error, wait a poll before subscribing again.
                    std::future::pending::<()>().await;
                }
                store.policy_changed().await
            };
            tokio::select! {
                biased;
                _ = stop.changed() => return,
                result = notified => {
                    if let Err(error) = result {
                        if let Some(held_back) = lost_notifications.check() {
                            tracing::warn!(
                                %error,
                                losses_not_logged = held_back,
                                "policy notifications lost; polling until they resume"
                            );
                        }
                        notifications_broken = true;
                        continue;
                    }
                }
                () = tokio::time::sleep(interval) => notifications_broken = false,
            }
            match self.refresh(&store, None).await {
                Err(error) => {
                    refresh_failing = true;
                    if let Some(held_back) = failed_refreshes.check() {
                        tracing::warn!(
                            %error,
                            failures_not_logged = held_back,
                            "cannot refresh the active policy; keeping the current version"
                        );
                    }
                }
                Ok(_) if std::mem::take(&mut refresh_failing) => {
                    failed_refreshes.reset();
                    tracing::info!("the active policy is refreshed again");
                }
                Ok(_) => {}
            }
        }
    }
}

/// Compiles a stored version.
async fn compile_stored(stored: StoredPolicy) -> Result<Active, RefreshError> {
    // Dropped last, once the compilation's temporaries are freed.
    let _return_memory = ReturnFreedMemory;
    let StoredPolicy {
        revision,
        version,
        artifact,
        catalog,
        author: _,
        comment: _,
        created_at_ms: _,
    } = stored;
    let catalog_version = catalog
        .as_deref()
        .map(|text| capgate_core::policy::version_label(text.as_bytes()));
    match compile_text(artifact, catalog).await {
        Compiled::Ok {
            policy,
            document,
            diagnostics: _,
        } => Ok(Active::new(
            revision,
            version,
            *policy,
            *document,
            catalog_version,
        )),
        Compiled::Rejected { diagnostics } => Err(RefreshError::Uncompilable {
            revision,
            problem: format!(
                "{} error(s), the first `{}`",
                diagnostics.iter().filter(|d| d.is_error()).count(),
                diagnostics
                    .iter()
                    .find(|d| d.is_error())
                    .map_or("?", |d| d.code.as_str())
            ),
        }),
        Compiled::BadCatalog(problem) => Err(RefreshError::Uncompilable { revision, problem }),
    }
}
