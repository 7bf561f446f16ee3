//! `PolicyService`: publishing, inspecting and rolling back policy versions
//! (docs/service.md). Every call needs an admin token (see `auth.rs`).
//!
//! A publish compiles with the same compiler as `capgate validate`; with any
//! error nothing is stored and the response carries the diagnostics. A valid
//! artifact is stored and activated by the store in one transaction, then
//! installed on this replica at once; the others learn of it through the
//! store's notifications or their next poll.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::store::{
    ActivateOutcome, Activation, Actor, CounterKey, NewPolicy, PublishOutcome, Store, StoreError,
    StoredPolicy,
};
use crate::telemetry::rpc::policy as traced;
use capgate_core::access::{effective_diff, Ruleset, Side};
use capgate_core::policy::{
    bounded, version_label, Bounds, Code as DiagnosticCode, CompiledPolicy, Diagnostic, Document, Severity,
};
use capgate_core::principals::IssuerKind;

use crate::clock::now as now_ms;
use crate::service::active::{compile_text, Active, Compiled, RefreshError, ReturnFreedMemory};
use crate::service::auth::Role;
use crate::service::{bounds, State};
use crate::wire::convert;
use crate::wire::proto::policy_service_server::PolicyService;
use crate::wire::proto::{
    ActivatePolicyRequest, ActivatePolicyResponse, DecisionChange, GetActivePolicyRequest,
    GetActivePolicyResponse, GetPolicyVersionRequest, GetPolicyVersionResponse, GetShadowPolicyRequest,
    GetShadowPolicyResponse, ListPolicyActivationsRequest, ListPolicyActivationsResponse,
    ListPolicyVersionsRequest, ListPolicyVersionsResponse, PolicyActivation, PublishPolicyRequest,
    PublishPolicyResponse, ResetUsageRequest, ResetUsageResponse, SetShadowPolicyRequest,
    SetShadowPolicyResponse,
};

/// `ListPolicyVersions` and `ListPolicyActivations` without a limit.
const DEFAULT_LIST: u32 = 100;
/// `ListPolicyVersions` and `ListPolicyActivations` at most.
const MAX_LIST: u32 = 1000;

/// A listing's limit as asked: 0 is the default, and no more than the most.
fn list_limit(limit: u32) -> u32 {
    if limit == 0 {
        DEFAULT_LIST
    } else {
        limit.min(MAX_LIST)
    }
}

/// The service's own warnings about a version it compiled: each `static-key` issuer whose key this
/// server cannot read (an unset `env://` variable, a missing file, a reference only a gateway
/// resolves), since every key presented for it would then be `credential_invalid`. Read where
/// the publish is answered, as every replica reads it; the key itself is never read into the
/// answer.
fn unreadable_secrets(policy: &CompiledPolicy, document: &Document) -> Vec<Diagnostic> {
    policy
        .issuers
        .iter()
        .filter(|issuer| issuer.kind == IssuerKind::StaticKey)
        .filter_map(|issuer| {
            let reference = issuer.secret_ref.as_deref()?;
            let problem = crate::identity::read_reference(reference).err()?;
            let path = format!("{}/secret/ref", issuer.path);
            Some(Diagnostic {
                severity: Severity::Warning,
                code: DiagnosticCode::SecretUnreadable,
                message: format!(
                    "the key of the static-key issuer `{}` cannot be read on this server: {problem}; every \
                     API key presented for it will be `credential_invalid` until it can",
                    issuer.id
                ),
                position: document.resolve(&path),
                path,
                related: Vec::new(),
            })
        })
        .collect()
}

/// What a publish's answer carries of its diagnostics: the first 100 of each code and 512 KiB of
/// their text, then one summary per code that was cut. A 100,000-tool catalog was 100,000
/// warnings and 14 MB, past the 4 MiB a default gRPC client accepts (docs/decisions/0015).
const ANSWER_DIAGNOSTICS: Bounds = Bounds {
    per_code: 100,
    bytes: 512 * 1024,
};

/// Compilations that callers' publishes and activations run at once on this replica. One holds an
/// artifact and a catalog of up to 8 MiB each with their parsed trees and findings, some hundred
/// megabytes at the limits; eight at once took 1.6 GiB. Two keep the peak bounded and still let a
/// small publish pass a big one.
const CONCURRENT_COMPILES: usize = 2;

/// How long a publish or an activation waits for a turn to compile before it is refused with
/// `RESOURCE_EXHAUSTED`.
const COMPILE_WAIT: Duration = Duration::from_secs(5);

/// The policy service over a store.
pub struct Policies<S: Store> {
    state: Arc<State<S>>,
    /// The turns to compile ([`CONCURRENT_COMPILES`]).
    compiling: Semaphore,
}

impl<S: Store> Policies<S> {
    pub fn new(state: Arc<State<S>>) -> Self {
        Policies {
            state,
            compiling: Semaphore::new(CONCURRENT_COMPILES),
        }
    }

    /// A turn to compile, held until the call is answered; `RESOURCE_EXHAUSTED` after
    /// [`COMPILE_WAIT`] without one.
    async fn turn(&self) -> Result<SemaphorePermit<'_>, Status> {
        match tokio::time::timeout(COMPILE_WAIT, self.compiling.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a wait that ran out is the only way here.
            Ok(Err(_)) | Err(_) => Err(Status::resource_exhausted(format!(
                "{CONCURRENT_COMPILES} publishes or activations are already compiling on this replica and \
                 none finished within {} s: retry later",
                COMPILE_WAIT.as_secs()
            ))),
        }
    }

    /// The version a change is diffed against: what the store says is active
    /// now, not what this replica happened to have installed. A stored
    /// version this build cannot compile must not block publishing its fix:
    /// then the installed one stands in.
    async fn before(&self) -> Result<Option<Arc<Active>>, Status> {
        match self.state.active.refresh(&self.state.store, None).await {
            Ok(before) => Ok(before),
            Err(RefreshError::Store(error)) => Err(unavailable(&error)),
            Err(error @ RefreshError::Uncompilable { .. }) => {
                tracing::warn!(%error, "diffing against the installed version instead");
                Ok(self.state.active.current())
            }
        }
    }

    /// The revisions the store's two pointers name now, for the flags of a [`PolicyVersion`].
    async fn pointers(&self) -> Result<Pointers, Status> {
        let store = &self.state.store;
        let active = store.active_policy().await.map_err(|error| unavailable(&error))?;
        let shadow = store.shadow_policy().await.map_err(|error| unavailable(&error))?;
        Ok(Pointers {
            active: active.map(|stored| stored.revision),
            shadow: shadow.map(|shadow| shadow.policy.revision),
        })
    }
}

/// Which revisions are active and shadow, read from the store.
struct Pointers {
    active: Option<u64>,
    shadow: Option<u64>,
}

impl Pointers {
    /// `stored` as the wire lists it, flagged as these pointers say.
    fn version(&self, stored: &StoredPolicy) -> crate::wire::proto::PolicyVersion {
        let mut version = policy_version(stored, self.active == Some(stored.revision));
        version.shadow = self.shadow == Some(stored.revision);
        version
    }
}

fn unavailable(error: &StoreError) -> Status {
    Status::unavailable(format!("the policy store is unavailable: {error}"))
}

fn conflict(expected: Option<u64>, active: Option<u64>) -> Status {
    let active = active.map_or_else(
        || "no revision".to_owned(),
        |revision| format!("revision {revision}"),
    );
    let expected = expected.map_or_else(|| "?".to_owned(), |revision| revision.to_string());
    Status::aborted(format!(
        "the active version is {active}, not the expected revision {expected}: nothing changed"
    ))
}

/// The effective diff from `before` (nothing, when no version was active) to `after`.
fn changes(before: Option<&Active>, after: &CompiledPolicy) -> Vec<DecisionChange> {
    let empty = Ruleset::default();
    let before_issuers = before
        .map(|active| active.policy.issuer_ids())
        .unwrap_or_default();
    let after_issuers = after.issuer_ids();
    let before_side = Side {
        ruleset: before.map_or(&empty, |active| &active.policy.ruleset),
        issuers: &before_issuers,
    };
    let after_side = Side {
        ruleset: &after.ruleset,
        issuers: &after_issuers,
    };
    effective_diff(before_side, after_side)
        .iter()
        .map(convert::change)
        .collect()
}

/// Diagnostics as an answer carries them: bounded ([`ANSWER_DIAGNOSTICS`]).
fn answered(diagnostics: Vec<Diagnostic>) -> Vec<crate::wire::proto::Diagnostic> {
    bounded(diagnostics, ANSWER_DIAGNOSTICS)
        .iter()
        .map(convert::diagnostic)
        .collect()
}

/// The label compared to tell whether a catalog changed.
fn catalog_label(catalog: Option<&str>) -> Option<String> {
    catalog.map(|text| version_label(text.as_bytes()))
}

#[tonic::async_trait]
impl<S: Store> PolicyService for Policies<S> {
    async fn publish_policy(
        &self,
        request: Request<PublishPolicyRequest>,
    ) -> Result<Response<PublishPolicyResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let request = request.into_inner();
        bounds::publish(&request)?;
        // Dropped last, once everything this call compiled is freed.
        let _return_memory = ReturnFreedMemory;
        let _turn = self.turn().await?;
        let PublishPolicyRequest {
            artifact,
            catalog,
            expected_active_revision,
            dry_run,
            comment,
            shadow,
        } = request;
        let version = version_label(artifact.as_bytes());
        traced(None, Some(&version));
        let (policy, document, diagnostics) = match compile_text(artifact.clone(), catalog.clone()).await {
            Compiled::Ok {
                policy,
                document,
                diagnostics,
            } => (policy, document, diagnostics),
            Compiled::Rejected { diagnostics } => {
                return Ok(Response::new(PublishPolicyResponse {
                    accepted: false,
                    revision: 0,
                    version,
                    diagnostics: answered(diagnostics),
                    changes: Vec::new(),
                    unchanged: false,
                }));
            }
            Compiled::BadCatalog(problem) => {
                return Err(Status::with_error_details(
                    Code::InvalidArgument,
                    format!("`catalog`: {problem}"),
                    ErrorDetails::with_bad_request_violation("catalog", problem),
                ));
            }
        };
        let mut diagnostics = diagnostics;
        diagnostics.extend(unreadable_secrets(&policy, &document));
        let diagnostics = answered(diagnostics);
        let catalog_version = catalog_label(catalog.as_deref());

        let store = &self.state.store;
        let before = self.before().await?;
        let changes = changes(before.as_deref(), &policy);

        if dry_run {
            let unchanged = before
                .as_ref()
                .is_some_and(|active| active.version == version && active.catalog_version == catalog_version);
            let conflicting = expected_active_revision
                .is_some_and(|expected| expected != before.as_ref().map_or(0, |active| active.revision));
            if conflicting {
                return Err(conflict(
                    expected_active_revision,
                    before.map(|active| active.revision),
                ));
            }
            return Ok(Response::new(PublishPolicyResponse {
                accepted: true,
                // A dry run stores nothing; the content it would leave unchanged is the active one's.
                revision: if unchanged {
                    before.map_or(0, |active| active.revision)
                } else {
                    0
                },
                version,
                diagnostics,
                changes: if unchanged { Vec::new() } else { changes },
                unchanged,
            }));
        }

        let new = NewPolicy {
            version: version.clone(),
            artifact,
            catalog,
            author: caller.name.clone(),
            comment,
            created_at_ms: now_ms(),
        };
        if shadow {
            if let Some(expected) = expected_active_revision {
                let active = before.as_ref().map_or(0, |active| active.revision);
                if expected != active {
                    return Err(conflict(
                        Some(expected),
                        Some(active).filter(|revision| *revision > 0),
                    ));
                }
            }
            let stored = store
                .publish_shadow(new)
                .await
                .map_err(|error| unavailable(&error))?;
            traced(Some(stored.revision), None);
            tracing::info!(revision = stored.revision, %version, author = %caller.name, "shadow policy published");
            let candidate = Arc::new(Active::new(
                stored.revision,
                version.clone(),
                *policy,
                *document,
                catalog_version,
            ));
            if let Err(error) = self.state.active.refresh(store, Some(candidate)).await {
                tracing::warn!(%error, "published as shadow, but not yet installed on this replica");
            }
            return Ok(Response::new(PublishPolicyResponse {
                accepted: true,
                revision: stored.revision,
                version,
                diagnostics,
                changes,
                unchanged: false,
            }));
        }
        let published = store
            .publish(new, expected_active_revision)
            .await
            .map_err(|error| unavailable(&error))?;
        match published {
            PublishOutcome::Conflict { active } => Err(conflict(expected_active_revision, active)),
            PublishOutcome::Unchanged(stored) => {
                traced(Some(stored.revision), None);
                Ok(Response::new(PublishPolicyResponse {
                    accepted: true,
                    revision: stored.revision,
                    version,
                    diagnostics,
                    changes: Vec::new(),
                    unchanged: true,
                }))
            }
            PublishOutcome::Activated(stored) => {
                traced(Some(stored.revision), None);
                tracing::info!(revision = stored.revision, %version, author = %caller.name, "policy published");
                let candidate = Arc::new(Active::new(
                    stored.revision,
                    version.clone(),
                    *policy,
                    *document,
                    catalog_version,
                ));
                if let Err(error) = self.state.active.refresh(store, Some(candidate)).await {
                    // Stored and active in the store: the next poll installs it.
                    tracing::warn!(%error, "published, but not yet installed on this replica");
                }
                Ok(Response::new(PublishPolicyResponse {
                    accepted: true,
                    revision: stored.revision,
                    version,
                    diagnostics,
                    changes,
                    unchanged: false,
                }))
            }
        }
    }

    async fn get_active_policy(
        &self,
        request: Request<GetActivePolicyRequest>,
    ) -> Result<Response<GetActivePolicyResponse>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let GetActivePolicyRequest {} = request.into_inner();
        let stored = self
            .state
            .store
            .active_policy()
            .await
            .map_err(|error| unavailable(&error))?
            .ok_or_else(|| Status::not_found("no policy version is active"))?;
        traced(Some(stored.revision), Some(&stored.version));
        let mut version = policy_version(&stored, true);
        version.shadow = self.pointers().await?.shadow == Some(stored.revision);
        let StoredPolicy {
            artifact, catalog, ..
        } = stored;
        Ok(Response::new(GetActivePolicyResponse {
            version: Some(version),
            artifact,
            catalog,
        }))
    }

    async fn list_policy_versions(
        &self,
        request: Request<ListPolicyVersionsRequest>,
    ) -> Result<Response<ListPolicyVersionsResponse>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let ListPolicyVersionsRequest { limit } = request.into_inner();
        let limit = list_limit(limit);
        let pointers = self.pointers().await?;
        let versions = self
            .state
            .store
            .list_policies(limit)
            .await
            .map_err(|error| unavailable(&error))?
            .iter()
            .map(|stored| pointers.version(stored))
            .collect();
        Ok(Response::new(ListPolicyVersionsResponse { versions }))
    }

    async fn activate_policy(
        &self,
        request: Request<ActivatePolicyRequest>,
    ) -> Result<Response<ActivatePolicyResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let ActivatePolicyRequest {
            revision,
            expected_active_revision,
        } = request.into_inner();
        traced(Some(revision), None);
        // Dropped last, once everything this call compiled is freed.
        let _return_memory = ReturnFreedMemory;
        let _turn = self.turn().await?;
        let store = &self.state.store;
        let stored = store
            .policy(revision)
            .await
            .map_err(|error| unavailable(&error))?
            .ok_or_else(|| Status::not_found(format!("no stored revision {revision}")))?;
        // Refuse to activate what this build would not run. Its static keys are read (and their
        // problems logged) only once it is active: a refused activation says nothing about them.
        let (policy, document) = match compile_text(stored.artifact.clone(), stored.catalog.clone()).await {
            Compiled::Ok { policy, document, .. } => (policy, document),
            Compiled::Rejected { .. } | Compiled::BadCatalog(_) => {
                return Err(Status::failed_precondition(format!(
                    "revision {revision} does not compile with this build; it cannot be activated"
                )));
            }
        };
        let before = self.before().await?;
        let by = Actor {
            name: caller.name.clone(),
            at_ms: now_ms(),
        };
        match store
            .activate(revision, expected_active_revision, &by)
            .await
            .map_err(|error| unavailable(&error))?
        {
            ActivateOutcome::NotFound => Err(Status::not_found(format!("no stored revision {revision}"))),
            ActivateOutcome::Conflict { active } => Err(conflict(expected_active_revision, active)),
            ActivateOutcome::Activated(stored) => {
                // The revision is on the span already; recording it again would print it twice.
                traced(None, Some(&stored.version));
                tracing::info!(revision, author = %caller.name, "policy version activated");
                let candidate = Active::new(
                    revision,
                    stored.version.clone(),
                    *policy,
                    *document,
                    catalog_label(stored.catalog.as_deref()),
                );
                let changes = changes(before.as_deref(), &candidate.policy);
                if let Err(error) = self.state.active.refresh(store, Some(Arc::new(candidate))).await {
                    tracing::warn!(%error, "activated, but not yet installed on this replica");
                }
                // Activating the shadow's artifact retired the shadow, in the same transaction.
                let mut version = policy_version(&stored, true);
                version.shadow = self.pointers().await?.shadow == Some(revision);
                Ok(Response::new(ActivatePolicyResponse {
                    version: Some(version),
                    changes,
                }))
            }
        }
    }

    async fn set_shadow_policy(
        &self,
        request: Request<SetShadowPolicyRequest>,
    ) -> Result<Response<SetShadowPolicyResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let SetShadowPolicyRequest { revision } = request.into_inner();
        traced(revision, None);
        // Dropped last, once everything this call compiled is freed.
        let _return_memory = ReturnFreedMemory;
        let _turn = self.turn().await?;
        let store = &self.state.store;
        let by = Actor {
            name: caller.name.clone(),
            at_ms: now_ms(),
        };
        let Some(revision) = revision else {
            store
                .set_shadow(None, &by)
                .await
                .map_err(|error| unavailable(&error))?;
            tracing::info!(author = %caller.name, "shadow policy cleared");
            if let Err(error) = self.state.active.refresh(store, None).await {
                tracing::warn!(%error, "cleared, but not yet on this replica");
            }
            return Ok(Response::new(SetShadowPolicyResponse {
                version: None,
                changes: Vec::new(),
            }));
        };
        let stored = store
            .policy(revision)
            .await
            .map_err(|error| unavailable(&error))?
            .ok_or_else(|| Status::not_found(format!("no stored revision {revision}")))?;
        // Refuse to shadow what this build would not run, as an activation does.
        let (policy, document) = match compile_text(stored.artifact.clone(), stored.catalog.clone()).await {
            Compiled::Ok { policy, document, .. } => (policy, document),
            Compiled::Rejected { .. } | Compiled::BadCatalog(_) => {
                return Err(Status::failed_precondition(format!(
                    "revision {revision} does not compile with this build; it cannot be the shadow version"
                )));
            }
        };
        let before = self.before().await?;
        if !store
            .set_shadow(Some(revision), &by)
            .await
            .map_err(|error| unavailable(&error))?
        {
            return Err(Status::not_found(format!("no stored revision {revision}")));
        }
        tracing::info!(revision, author = %caller.name, "shadow policy set");
        let changes = changes(before.as_deref(), &policy);
        let candidate = Arc::new(Active::new(
            revision,
            stored.version.clone(),
            *policy,
            *document,
            catalog_label(stored.catalog.as_deref()),
        ));
        if let Err(error) = self.state.active.refresh(store, Some(candidate)).await {
            tracing::warn!(%error, "set, but not yet on this replica");
        }
        let mut version = policy_version(&stored, before.is_some_and(|active| active.revision == revision));
        version.shadow = true;
        Ok(Response::new(SetShadowPolicyResponse {
            version: Some(version),
            changes,
        }))
    }

    async fn get_shadow_policy(
        &self,
        request: Request<GetShadowPolicyRequest>,
    ) -> Result<Response<GetShadowPolicyResponse>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let GetShadowPolicyRequest {} = request.into_inner();
        let shadow = self
            .state
            .store
            .shadow_policy()
            .await
            .map_err(|error| unavailable(&error))?;
        let Some(shadow) = shadow else {
            return Ok(Response::new(GetShadowPolicyResponse::default()));
        };
        traced(Some(shadow.policy.revision), Some(&shadow.policy.version));
        let mut version = policy_version(&shadow.policy, false);
        version.active = self.pointers().await?.active == Some(shadow.policy.revision);
        version.shadow = true;
        Ok(Response::new(GetShadowPolicyResponse {
            version: Some(version),
            set_by: shadow.set.name,
            set_at: Some(convert::timestamp(shadow.set.at_ms)),
        }))
    }

    async fn get_policy_version(
        &self,
        request: Request<GetPolicyVersionRequest>,
    ) -> Result<Response<GetPolicyVersionResponse>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let GetPolicyVersionRequest { revision } = request.into_inner();
        traced(Some(revision), None);
        let store = &self.state.store;
        let stored = store
            .policy(revision)
            .await
            .map_err(|error| unavailable(&error))?
            .ok_or_else(|| Status::not_found(format!("no stored revision {revision}")))?;
        traced(None, Some(&stored.version));
        let version = self.pointers().await?.version(&stored);
        let StoredPolicy {
            artifact, catalog, ..
        } = stored;
        Ok(Response::new(GetPolicyVersionResponse {
            version: Some(version),
            artifact,
            catalog,
        }))
    }

    async fn list_policy_activations(
        &self,
        request: Request<ListPolicyActivationsRequest>,
    ) -> Result<Response<ListPolicyActivationsResponse>, Status> {
        self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let ListPolicyActivationsRequest { limit } = request.into_inner();
        let activations = self
            .state
            .store
            .activations(list_limit(limit))
            .await
            .map_err(|error| unavailable(&error))?
            .into_iter()
            .map(|activation| {
                let Activation {
                    at_ms,
                    actor,
                    kind,
                    from_revision,
                    to_revision,
                } = activation;
                PolicyActivation {
                    at: Some(convert::timestamp(at_ms)),
                    actor,
                    kind: kind.as_str().to_owned(),
                    from_revision,
                    to_revision,
                }
            })
            .collect();
        Ok(Response::new(ListPolicyActivationsResponse { activations }))
    }

    async fn reset_usage(
        &self,
        request: Request<ResetUsageRequest>,
    ) -> Result<Response<ResetUsageResponse>, Status> {
        let caller = self.state.tokens.authorize(request.metadata(), Role::Admin)?;
        let request = request.into_inner();
        bounds::reset_usage(&request)?;
        let ResetUsageRequest {
            principal_id,
            capability,
        } = request;
        let by = Actor {
            name: caller.name.clone(),
            at_ms: now_ms(),
        };
        let key = CounterKey {
            principal_id: &principal_id,
            capability: &capability,
        };
        let reset = self
            .state
            .store
            .reset_usage(key, &by)
            .await
            .map_err(|error| unavailable(&error))?;
        Ok(Response::new(match reset {
            None => ResetUsageResponse {
                reset: false,
                calls: 0,
                window_start: None,
            },
            Some(reading) => {
                tracing::info!(principal = %principal_id, %capability, calls = reading.calls, by = %caller.name, "usage counter reset");
                ResetUsageResponse {
                    reset: true,
                    calls: reading.calls,
                    window_start: Some(convert::timestamp(reading.window_start_ms)),
                }
            }
        }))
    }
}

/// A stored version as the wire lists it.
pub fn policy_version(stored: &StoredPolicy, active: bool) -> crate::wire::proto::PolicyVersion {
    let StoredPolicy {
        revision,
        version,
        artifact: _,
        catalog: _,
        author,
        comment,
        created_at_ms,
    } = stored;
    crate::wire::proto::PolicyVersion {
        revision: *revision,
        version: version.clone(),
        author: author.clone(),
        comment: comment.clone(),
        created_at: Some(convert::timestamp(*created_at_ms)),
        active,
        shadow: false,
    }
}
