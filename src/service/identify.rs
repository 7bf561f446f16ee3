//! Who is calling: a `Decide` or `ListVisible` caller, asserted by a trusted
//! gateway or presented as the caller's own credential, turned into the
//! principal the decision is about (docs/reference.md#issuers-and-attribute-mappings; docs/service.md).
//!
//! | caller | answer |
//! |---|---|
//! | `principal` from a gateway not trusted to assert | `PERMISSION_DENIED` |
//! | `principal`, trusted | normalised as asserted |
//! | `credential.api_key` | the `static-key` issuer whose key it is |
//! | `credential.client_certificate` from a gateway not trusted to assert | `PERMISSION_DENIED` |
//! | `credential.client_certificate`, trusted | the `mtls` issuer (the hint, or the only one) |
//! | `credential.bearer_token` | the `oidc` issuer whose discovery `issuer` is the token's `iss` (or the hint), verified against its keys |
//! | an `oidc` issuer's keys cannot be had | `UNAVAILABLE` (fail closed, no decision) |
//!
//! Every authentication problem is an answer (`unauthenticated{problem}`),
//! audited like a decision; what was presented is never recorded.

use std::sync::Arc;

use crate::identity::jwks::{KeysError, OidcDirectory};
use crate::identity::jwt;
use crate::identity::{self, KeyedIssuer, Presented};
use crate::telemetry::{throttle, Throttle};
use capgate_core::principals::{resolve_asserted, AuthProblem, Issuer, IssuerKind, Principal, Resolution};

use super::active::Active;
use super::auth::Gateway;
use super::pipeline::Refusal;

/// How the caller was named in the request, in any door's terms.
#[derive(Debug, Clone)]
pub enum Asked<'a> {
    /// The gateway names the principal itself (only gateways trusted to assert may).
    Principal(AssertedCaller<'a>),
    /// The caller's own credential, forwarded by the gateway; `None` when the request carried
    /// none. `hint` names the issuer to check it against.
    Credential {
        presented: Option<Presented<'a>>,
        hint: Option<&'a str>,
    },
    /// As `Credential`, with the subject the gateway says it belongs to (AuthZEN's `subject.id`,
    /// which its MCP binding requires to be the token's subject): a credential that authenticates
    /// anyone else is `credential_invalid`, decided and audited like any bad credential, so that
    /// no ceiling is spent and no allow is recorded for a subject the caller never proved.
    CredentialOf {
        presented: Option<Presented<'a>>,
        hint: Option<&'a str>,
        subject: &'a str,
    },
}

/// A principal as a gateway asserts it: an issuer id, a subject and `(name, value)` pairs (a
/// name given twice, or with two values, gives no attribute).
#[derive(Debug, Clone)]
pub struct AssertedCaller<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub attributes: Vec<(&'a str, &'a str)>,
}

/// Who the caller turned out to be, as far as it is known, for the audit
/// record, and the principal or the problem.
pub struct Identified {
    /// The declared issuer the caller was checked against (or named).
    pub issuer: Option<String>,
    /// The subject, once authenticated (or as asserted).
    pub subject: Option<String>,
    pub outcome: Result<Principal, AuthProblem>,
}

impl Identified {
    fn problem(issuer: Option<&str>, problem: AuthProblem) -> Self {
        Identified {
            issuer: issuer.map(str::to_owned),
            subject: None,
            outcome: Err(problem),
        }
    }

    /// A principal whose subject is not `claimed` did not prove to be `claimed`: the issuer it
    /// was checked against stays, the subject it turned out to be is not recorded as the caller.
    fn claimed_by(self, claimed: &str) -> Self {
        match &self.outcome {
            Ok(principal) if principal.subject != claimed => Identified {
                issuer: self.issuer,
                subject: None,
                outcome: Err(AuthProblem::CredentialInvalid),
            },
            _ => self,
        }
    }

    fn resolved(issuer: Option<&str>, resolution: Result<Resolution, AuthProblem>) -> Self {
        match resolution {
            Ok(Resolution { principal, .. }) => Identified {
                issuer: Some(principal.issuer.clone()),
                subject: Some(principal.subject.clone()),
                outcome: Ok(principal),
            },
            Err(problem) => Identified::problem(issuer, problem),
        }
    }
}

/// Identifies the caller at `at_ms` (the decision's instant).
pub async fn identify(
    directory: &Arc<OidcDirectory>,
    active: &Active,
    gateway: &Gateway,
    asked: &Asked<'_>,
    at_ms: i64,
) -> Result<Identified, Refusal> {
    match asked {
        Asked::Principal(asserted) => {
            gateway.check_may_assert()?;
            Ok(asserted_identity(active, asserted))
        }
        Asked::Credential { presented, hint } => {
            credential(directory, active, gateway, *presented, *hint, at_ms).await
        }
        Asked::CredentialOf {
            presented,
            hint,
            subject,
        } => {
            let identified = credential(directory, active, gateway, *presented, *hint, at_ms).await?;
            Ok(identified.claimed_by(subject))
        }
    }
}

/// The caller's own credential, checked against the active version's issuers.
async fn credential(
    directory: &Arc<OidcDirectory>,
    active: &Active,
    gateway: &Gateway,
    presented: Option<Presented<'_>>,
    hint: Option<&str>,
    at_ms: i64,
) -> Result<Identified, Refusal> {
    let issuers = &active.policy.issuers;
    let Some(presented) = presented else {
        return Ok(Identified::problem(hint, AuthProblem::CredentialMissing));
    };
    if matches!(presented, Presented::ClientCertificate(_)) {
        gateway.check_may_forward_certificate()?;
    }
    if let Err(problem) = presented.check() {
        return Ok(Identified::problem(hint, problem));
    }
    Ok(match presented {
        Presented::ApiKey(key) => {
            Identified::resolved(hint, active.static_keys.authenticate(issuers, hint, key))
        }
        Presented::ClientCertificate(forwarded) => {
            Identified::resolved(hint, identity::client_certificate(issuers, hint, forwarded))
        }
        Presented::BearerToken(token) => bearer(directory, issuers, hint, token, at_ms).await?,
    })
}

/// The asserted principal, normalised as docs/reference.md#normalisation says, without a
/// static-key issuer's literal defaults: an asserted principal carries what
/// the gateway asserted. A name given twice, or with two values, gives no
/// attribute.
fn asserted_identity(active: &Active, asserted: &AssertedCaller<'_>) -> Identified {
    let AssertedCaller {
        issuer,
        subject,
        attributes,
    } = asserted;
    let outcome = resolve_asserted(active.policy.issuer(issuer), subject, attributes, false)
        .map(|resolution| resolution.principal);
    Identified {
        issuer: Some((*issuer).to_owned()),
        subject: Some((*subject).to_owned()),
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
) -> Result<Identified, Refusal> {
    let peeked = match jwt::peek(token) {
        Ok(peeked) => peeked,
        Err(error) => return Ok(Identified::problem(hint, error.problem())),
    };
    let candidates = match identity::candidates(issuers, IssuerKind::Oidc, hint) {
        Ok(candidates) => candidates,
        Err(problem) => return Ok(Identified::problem(hint, problem)),
    };
    let chosen: Vec<&Issuer> = if hint.is_some() {
        candidates
    } else {
        let Some(claimed) = peeked.issuer.as_deref() else {
            return Ok(Identified::problem(None, AuthProblem::CredentialInvalid));
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
            (true, None) => return Ok(Identified::problem(None, AuthProblem::IssuerUnknown)),
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
    Ok(Identified::resolved(checked.or(hint), outcome))
}

fn keys_unavailable(issuer: &Issuer, error: &KeysError) -> Refusal {
    // Every request with a token meets the same unreachable issuer.
    static UNAVAILABLE: Throttle = Throttle::every(throttle::EVERY);
    if let Some(held_back) = UNAVAILABLE.check() {
        tracing::warn!(
            issuer = %issuer.id,
            %error,
            requests_not_logged = held_back,
            "cannot authenticate a bearer token: keys unavailable"
        );
    }
    Refusal::Unavailable(format!(
        "the keys of issuer `{}` cannot be fetched, so the token cannot be checked; retry later",
        issuer.id
    ))
}
