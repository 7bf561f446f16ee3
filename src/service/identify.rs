//! Who is calling: a `Decide` or `ListVisible` caller, asserted by a trusted
//! gateway or presented as the caller's own credential, turned into the
//! principal the decision is about (policy-core §1.9, §3.2; service.md §3).
//!
//! | caller | answer |
//! |---|---|
//! | `principal` from a gateway not trusted to assert | `PERMISSION_DENIED` |
//! | `principal`, trusted | normalised as asserted |
//! | `credential.api_key` | the `static-key` issuer whose key it is |
//! | `credential.client_certificate` | the `mtls` issuer (the hint, or the only one) |
//! | `credential.bearer_token` | the `oidc` issuer whose discovery `issuer` is the token's `iss` (or the hint), verified against its keys |
//! | an `oidc` issuer's keys cannot be had | `UNAVAILABLE` (fail closed, no decision) |
//!
//! Every authentication problem is an answer (`unauthenticated{problem}`),
//! audited like a decision; what was presented is never recorded.

use std::sync::Arc;

use tonic::Status;

use crate::identity::jwks::{KeysError, OidcDirectory};
use crate::identity::jwt;
use crate::identity::{self, KeyedIssuer, Presented};
use capgate_core::principals::{resolve_asserted, AuthProblem, Issuer, IssuerKind, Principal, Resolution};

use super::active::Active;
use super::auth::Caller;
use crate::wire::proto::{credential, AssertedPrincipal, Credential};

/// How the caller was named in the request.
#[derive(Clone, Copy)]
pub enum Asked<'a> {
    Principal(&'a AssertedPrincipal),
    Credential(&'a Credential),
}

/// Who the caller turned out to be, as far as it is known, for the audit
/// record, and the principal or the problem.
pub struct Identity {
    /// The declared issuer the caller was checked against (or named).
    pub issuer: Option<String>,
    /// The subject, once authenticated (or as asserted).
    pub subject: Option<String>,
    pub outcome: Result<Principal, AuthProblem>,
}

impl Identity {
    fn problem(issuer: Option<&str>, problem: AuthProblem) -> Self {
        Identity {
            issuer: issuer.map(str::to_owned),
            subject: None,
            outcome: Err(problem),
        }
    }

    fn resolved(issuer: Option<&str>, resolution: Result<Resolution, AuthProblem>) -> Self {
        match resolution {
            Ok(Resolution { principal, .. }) => Identity {
                issuer: Some(principal.issuer.clone()),
                subject: Some(principal.subject.clone()),
                outcome: Ok(principal),
            },
            Err(problem) => Identity::problem(issuer, problem),
        }
    }
}

/// Identifies the caller at `at_ms` (the decision's instant).
pub async fn identify(
    directory: &Arc<OidcDirectory>,
    active: &Active,
    gateway: &Caller,
    asked: Asked<'_>,
    at_ms: i64,
) -> Result<Identity, Status> {
    let issuers = &active.policy.issuers;
    match asked {
        Asked::Principal(asserted) => {
            gateway.check_may_assert()?;
            Ok(asserted_identity(active, asserted))
        }
        Asked::Credential(Credential { kind, issuer }) => {
            let hint = (!issuer.is_empty()).then_some(issuer.as_str());
            let presented = match kind {
                Some(credential::Kind::BearerToken(token)) => Presented::BearerToken(token),
                Some(credential::Kind::ApiKey(key)) => Presented::ApiKey(key),
                Some(credential::Kind::ClientCertificate(forwarded)) => {
                    Presented::ClientCertificate(forwarded)
                }
                None => return Ok(Identity::problem(hint, AuthProblem::CredentialMissing)),
            };
            if let Err(problem) = presented.check() {
                return Ok(Identity::problem(hint, problem));
            }
            Ok(match presented {
                Presented::ApiKey(key) => {
                    Identity::resolved(hint, active.static_keys.authenticate(issuers, hint, key))
                }
                Presented::ClientCertificate(forwarded) => {
                    Identity::resolved(hint, identity::client_certificate(issuers, hint, forwarded))
                }
                Presented::BearerToken(token) => bearer(directory, issuers, hint, token, at_ms).await?,
            })
        }
    }
}

/// The asserted principal, normalised as policy-core §3.2 says, without a
/// static-key issuer's literal defaults: an asserted principal carries what
/// the gateway asserted. A name given twice, or with two values, gives no
/// attribute.
fn asserted_identity(active: &Active, asserted: &AssertedPrincipal) -> Identity {
    let AssertedPrincipal {
        issuer,
        subject,
        attributes,
    } = asserted;
    let pairs: Vec<(&str, &str)> = attributes
        .iter()
        .flat_map(|attribute| {
            attribute
                .values
                .iter()
                .map(|value| (attribute.name.as_str(), value.as_str()))
        })
        .collect();
    let outcome = resolve_asserted(active.policy.issuer(issuer), subject, &pairs, false)
        .map(|resolution| resolution.principal);
    Identity {
        issuer: Some(issuer.clone()),
        subject: Some(subject.clone()),
        outcome,
    }
}

/// A bearer JWT: pick the issuer, get its keys, verify, map the claims.
///
/// Without a hint, the issuers whose discovery document names the token's
/// (unverified) `iss` are tried; when several share it (one identity
/// provider, several audiences), the token must verify for exactly one.
async fn bearer(
    directory: &Arc<OidcDirectory>,
    issuers: &[Issuer],
    hint: Option<&str>,
    token: &str,
    at_ms: i64,
) -> Result<Identity, Status> {
    let peeked = match jwt::peek(token) {
        Ok(peeked) => peeked,
        Err(error) => return Ok(Identity::problem(hint, error.problem())),
    };
    let candidates = match identity::candidates(issuers, IssuerKind::Oidc, hint) {
        Ok(candidates) => candidates,
        Err(problem) => return Ok(Identity::problem(hint, problem)),
    };
    let chosen: Vec<&Issuer> = if hint.is_some() {
        candidates
    } else {
        let Some(claimed) = peeked.issuer.as_deref() else {
            return Ok(Identity::problem(None, AuthProblem::CredentialInvalid));
        };
        // Cached issuers are read without waiting; the others' discovery
        // documents are fetched at once, so with several providers down the
        // wait is one fetch timeout, not one each.
        let mut found: Vec<(usize, Result<String, KeysError>)> = Vec::with_capacity(candidates.len());
        let mut lookups = tokio::task::JoinSet::new();
        for (index, issuer) in candidates.iter().enumerate() {
            let discovery = issuer.discovery.clone().unwrap_or_default();
            match directory.cached_issuer(&discovery) {
                Some(url) => found.push((index, Ok(url))),
                None => {
                    let directory = directory.clone();
                    lookups.spawn(async move {
                        let looked_up = directory.keys(&discovery, None).await;
                        (index, looked_up.map(|(url, _)| url))
                    });
                }
            }
        }
        while let Some(joined) = lookups.join_next().await {
            if let Ok(result) = joined {
                found.push(result);
            }
        }
        found.sort_by_key(|(index, _)| *index);
        let mut matching = Vec::new();
        let mut unavailable = None;
        for (index, result) in found {
            let issuer = candidates[index];
            match result {
                Ok(url) if url == claimed => matching.push(issuer),
                Ok(_) => {}
                Err(error) => {
                    unavailable.get_or_insert((issuer, error));
                }
            }
        }
        match (matching.is_empty(), unavailable) {
            // An issuer that could not be asked might be the one: fail closed.
            (true, Some((issuer, error))) => return Err(keys_unavailable(issuer, &error)),
            (true, None) => return Ok(Identity::problem(None, AuthProblem::IssuerUnknown)),
            (false, _) => matching,
        }
    };

    let mut keyed = Vec::with_capacity(chosen.len());
    for issuer in chosen {
        let discovery = issuer.discovery.as_deref().unwrap_or_default();
        let (issuer_url, keys) = directory
            .keys(discovery, peeked.kid.as_deref())
            .await
            .map_err(|error| keys_unavailable(issuer, &error))?;
        keyed.push(KeyedIssuer {
            issuer,
            issuer_url,
            keys,
        });
    }
    let (checked, outcome) = identity::verify_bearer(&keyed, token, at_ms);
    Ok(Identity::resolved(checked.or(hint), outcome))
}

fn keys_unavailable(issuer: &Issuer, error: &KeysError) -> Status {
    tracing::warn!(issuer = %issuer.id, %error, "cannot authenticate a bearer token: keys unavailable");
    Status::unavailable(format!(
        "the keys of issuer `{}` cannot be fetched, so the token cannot be checked; retry later",
        issuer.id
    ))
}
