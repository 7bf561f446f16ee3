//! Running one suite's cases against its compiled policy: each case's actual
//! answer, compared field by field with what it expects. The decision is taken
//! exactly as `explain`, `visible` and `who-can` take it (the same core calls,
//! the same offline authentication), so a suite that passes says what those
//! commands would print.

use std::collections::BTreeMap;

use capgate_core::access::{evaluate_call, visible, who_can, Decision, Instant, Outcome, Usage};
use capgate_core::policy::CompiledPolicy;
use capgate_core::principals::{resolve_asserted, AuthProblem, Resolution};

use crate::identity::{self, jwt, StaticKeys};

use super::suite::{
    Ceiling, DecideCase, Located, Principal, PrincipalUse, Suite, UsageSpec, UsageWord, VisibleCase,
    WhoCanCase,
};
use super::Failure;

/// The three kinds of case, as named in the file and in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Decide,
    Visible,
    WhoCan,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Decide => "decide",
            Kind::Visible => "visible",
            Kind::WhoCan => "who_can",
        }
    }
}

/// One expectation that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The `expect` member: `reason`, `tools`, …
    pub field: &'static str,
    pub expected: String,
    pub actual: String,
}

/// What a case exercised, for coverage.
#[derive(Debug, Clone, Default)]
pub struct Exercised {
    /// Grant indices that decided (an allow's winner, a deny at `/grants/N`, a
    /// listed capability's winner).
    pub grants: Vec<usize>,
    pub capabilities: Vec<String>,
    pub accounts: Vec<String>,
    /// Conditions the decision consulted (their pointers), each with whether it held (else
    /// it failed or its argument was missing).
    pub conditions: Vec<(String, bool)>,
}

/// One case, run.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub kind: Kind,
    pub name: String,
    pub pointer: String,
    pub position: Option<capgate_core::policy::Position>,
    pub mismatches: Vec<Mismatch>,
    /// The pointer of what decided (the reason's pointer), when there is one.
    pub decided_by: Option<String>,
    pub exercised: Exercised,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// What a case asks of the suite's shared setup.
pub struct Context<'a> {
    pub suite: &'a Suite,
    pub policy: &'a CompiledPolicy,
    pub now: Instant,
    keys: StaticKeys,
    /// JWK sets read so far, by path.
    jwks: BTreeMap<std::path::PathBuf, jwt::Jwks>,
}

impl<'a> Context<'a> {
    /// The suite's static keys are the only ones a test knows: a test never
    /// reads the machine's `env://` or `file://` secrets.
    pub fn new(suite: &'a Suite, policy: &'a CompiledPolicy, now: Instant) -> Self {
        let keys = StaticKeys::resolve(
            &policy.issuers,
            |reference| {
                policy
                    .issuers
                    .iter()
                    .filter(|issuer| issuer.secret_ref.as_deref() == Some(reference))
                    .find_map(|issuer| suite.keys.get(&issuer.id))
                    .map(|key| key.clone().into_bytes())
                    .ok_or_else(|| "the suite gives no key for it under `keys`".to_owned())
            },
            |_, _| {},
        );
        Context {
            suite,
            policy,
            now,
            keys,
            jwks: BTreeMap::new(),
        }
    }

    /// Resolves a principal as `explain` does; reading a JWK set is the only
    /// failure that stops the run.
    fn resolve(
        &mut self,
        used: &'a PrincipalUse,
        at: Instant,
    ) -> Result<Result<Resolution, AuthProblem>, Failure> {
        let principal = match used {
            PrincipalUse::Inline(principal) => principal,
            // `suite::load` refused undeclared names.
            PrincipalUse::Named(name) => {
                let suite: &'a Suite = self.suite;
                &suite.principals[name]
            }
        };
        Ok(match principal {
            Principal::Parts(parts) => {
                let pairs: Vec<(&str, &str)> = parts
                    .attributes
                    .iter()
                    .flat_map(|(name, values)| {
                        values
                            .values()
                            .iter()
                            .map(move |value| (name.as_str(), value.as_str()))
                    })
                    .collect();
                let issuer = self.policy.issuer(&parts.issuer);
                resolve_asserted(issuer, &parts.subject, &pairs, true)
            }
            Principal::ApiKey(key) => match identity::Presented::ApiKey(&key.api_key).check() {
                Err(problem) => Err(problem),
                Ok(()) => self
                    .keys
                    .authenticate(&self.policy.issuers, key.issuer.as_deref(), &key.api_key),
            },
            Principal::ClientDn(dn) => match identity::Presented::ClientCertificate(&dn.client_dn).check() {
                Err(problem) => Err(problem),
                Ok(()) => {
                    identity::client_certificate(&self.policy.issuers, dn.issuer.as_deref(), &dn.client_dn)
                }
            },
            Principal::Token(token) => {
                let path = match (&token.jwks, &self.suite.jwks) {
                    (Some(own), _) => self.suite.folder.join(own),
                    (None, Some(shared)) => shared.clone(),
                    (None, None) => {
                        return Err(Failure::Input(format!(
                        "`{}`: a `token` principal needs `jwks`, on the principal or at the top of the file",
                        self.suite.origin
                    )))
                    }
                };
                if !self.jwks.contains_key(&path) {
                    let bytes = std::fs::read(&path).map_err(|error| {
                        Failure::Input(format!(
                            "cannot read `{}`: {}",
                            path.display(),
                            super::super::input::describe(&error)
                        ))
                    })?;
                    let keys = jwt::parse_jwks(&bytes).map_err(|error| {
                        Failure::Input(format!("`{}` is not a usable JWK set: {error}", path.display()))
                    })?;
                    self.jwks.insert(path.clone(), keys);
                }
                let keys = &self.jwks[&path];
                super::super::args::offline_bearer(
                    self.policy,
                    token.issuer.as_deref(),
                    &token.token,
                    keys,
                    at,
                )
            }
        })
    }
}

/// Runs every selected case of the suite (by name), decide cases first, in file order.
pub fn run<'a>(
    context: &mut Context<'a>,
    selected: &dyn Fn(&str) -> bool,
) -> Result<Vec<CaseResult>, Failure> {
    let suite: &'a Suite = context.suite;
    let mut results = Vec::new();
    for case in suite.decide.iter().filter(|case| selected(&case.spec.case.name)) {
        results.push(decide(context, case)?);
    }
    for case in suite.visible.iter().filter(|case| selected(&case.case.name)) {
        results.push(listing(context, case)?);
    }
    for case in suite.who_can.iter().filter(|case| selected(&case.case.name)) {
        results.push(reach(context, case));
    }
    Ok(results)
}

fn result<T>(kind: Kind, name: &str, located: &Located<T>) -> CaseResult {
    CaseResult {
        kind,
        name: name.to_owned(),
        pointer: located.pointer.clone(),
        position: located.position,
        mismatches: Vec::new(),
        decided_by: None,
        exercised: Exercised::default(),
    }
}

/// Records a mismatch when an expectation is present and differs.
fn compare(
    mismatches: &mut Vec<Mismatch>,
    field: &'static str,
    expected: Option<&str>,
    actual: Option<&str>,
) {
    if let Some(expected) = expected {
        if Some(expected) != actual {
            mismatches.push(Mismatch {
                field,
                expected: expected.to_owned(),
                actual: actual.unwrap_or("(none)").to_owned(),
            });
        }
    }
}

/// `/grants/N` (or deeper) → N.
fn grant_index(pointer: &str) -> Option<usize> {
    let rest = pointer.strip_prefix("/grants/")?;
    rest.split('/').next()?.parse().ok()
}

fn decide<'a>(context: &mut Context<'a>, case: &'a DecideCase) -> Result<CaseResult, Failure> {
    let spec = &case.spec.case;
    let mut out = result(Kind::Decide, &spec.name, &case.spec);
    let at = case.at.or(context.suite.at).unwrap_or(context.now);
    let usage = match spec.usage {
        None => Usage::Counted {
            calls: 0,
            window_start: case.window_start.unwrap_or(at),
        },
        Some(UsageSpec::Counted(calls)) => Usage::Counted {
            calls,
            window_start: case.window_start.unwrap_or(at),
        },
        Some(UsageSpec::Word(UsageWord::Unknown)) => Usage::Unknown,
        Some(UsageSpec::Word(UsageWord::None)) => Usage::NotConsulted,
    };
    let resolution = context.resolve(&spec.principal, at)?;
    let policy = context.policy;
    let capability = match (&spec.capability, &spec.tool) {
        (Some(capability), _) => Some(capability.as_str()),
        (None, Some(tool)) => policy.tools.resolve(tool).map(|tool| tool.capability.as_str()),
        (None, None) => None,
    };
    // What happened, as (decision, reason code, pointer, account, ceiling).
    let (decision, code, pointer, account, ceiling) =
        match (&resolution, capability) {
            (Err(problem), _) => ("deny", problem.as_str().to_owned(), None, None, None),
            (Ok(_), None) => ("deny", "unknown_tool".to_owned(), None, None, None),
            (Ok(resolution), Some(capability)) => {
                out.exercised.capabilities.push(capability.to_owned());
                let arguments = spec.arguments.as_ref();
                let decision = evaluate_call(
                    &policy.ruleset,
                    &resolution.principal,
                    capability,
                    at,
                    usage,
                    arguments,
                );
                let checked = crate::cli::explain::checked_conditions(
                    &policy.ruleset,
                    &resolution.principal,
                    capability,
                    &decision,
                    arguments,
                    at,
                );
                for checked in &checked {
                    for (condition, held) in &checked.outcomes {
                        let held = *held == Outcome::Holds;
                        out.exercised.conditions.push((condition.path.clone(), held));
                    }
                }
                match decision {
                    Decision::Allow(allow) => {
                        out.exercised.grants.push(allow.grant);
                        out.exercised.accounts.push(allow.account.id.clone());
                        (
                            "allow",
                            allow.reason.code.as_str().to_owned(),
                            Some(allow.reason.path.to_owned()),
                            Some(allow.account.id.clone()),
                            Some(allow.limits.map_or(
                                Ceiling::None(super::suite::NoCeiling::None),
                                |limits| Ceiling::Limits {
                                    calls: limits.calls,
                                    per: limits.per.clone(),
                                },
                            )),
                        )
                    }
                    Decision::Deny(reason) => {
                        if let Some(grant) = grant_index(reason.path) {
                            out.exercised.grants.push(grant);
                            if let Some(grant) = policy.ruleset.grants().get(grant) {
                                out.exercised.accounts.push(grant.account.id.clone());
                            }
                        }
                        (
                            "deny",
                            reason.code.as_str().to_owned(),
                            Some(reason.path.to_owned()),
                            None,
                            None,
                        )
                    }
                }
            }
        };
    let expect = &spec.expect;
    let mismatches = &mut out.mismatches;
    compare(mismatches, "decision", expect.decision.as_deref(), Some(decision));
    compare(mismatches, "reason", expect.reason.as_deref(), Some(&code));
    compare(
        mismatches,
        "pointer",
        expect.pointer.as_deref(),
        pointer.as_deref(),
    );
    let from_grant = pointer
        .as_deref()
        .and_then(grant_index)
        .map(|index| format!("/grants/{index}"));
    compare(
        mismatches,
        "grant",
        expect.grant.as_deref(),
        from_grant.as_deref(),
    );
    compare(
        mismatches,
        "account",
        expect.account.as_deref(),
        account.as_deref(),
    );
    if let Some(expected) = &expect.ceiling {
        if ceiling.as_ref() != Some(expected) {
            mismatches.push(Mismatch {
                field: "ceiling",
                expected: describe_ceiling(Some(expected)),
                actual: describe_ceiling(ceiling.as_ref()),
            });
        }
    }
    out.decided_by = pointer;
    Ok(out)
}

fn describe_ceiling(ceiling: Option<&Ceiling>) -> String {
    match ceiling {
        Some(Ceiling::Limits { calls, per }) => format!("{calls} per {per}"),
        Some(Ceiling::None(_)) => "none".to_owned(),
        None => "(no allow)".to_owned(),
    }
}

fn listing<'a>(context: &mut Context<'a>, case: &'a VisibleCase) -> Result<CaseResult, Failure> {
    let spec = &case.case;
    let mut out = result(Kind::Visible, &spec.name, case);
    // A listing does not consult ceilings; `at` only matters to a token's `exp`.
    let at = context.suite.at.unwrap_or(context.now);
    let resolution = context.resolve(&spec.principal, at)?;
    let policy = context.policy;
    let shown = match &resolution {
        Ok(resolution) => visible(&policy.ruleset, &resolution.principal, at),
        Err(_) => Vec::new(),
    };
    let capabilities: Vec<String> = shown.iter().map(|shown| shown.capability.id.clone()).collect();
    for shown in &shown {
        out.exercised.capabilities.push(shown.capability.id.clone());
        out.exercised.accounts.push(shown.account.id.clone());
        out.exercised.grants.extend(grant_index(shown.path));
    }
    let tools: Vec<String> = policy
        .tools
        .realizing(|capability| capabilities.iter().any(|shown| shown == capability))
        .map(|tool| tool.exposed_name.clone())
        .collect();
    let expect = &spec.expect;
    let exact =
        |field: &'static str, expected: &Option<Vec<String>>, actual: &[String], out: &mut Vec<Mismatch>| {
            if let Some(expected) = expected {
                let mut wanted = expected.clone();
                wanted.sort();
                let mut got = actual.to_vec();
                got.sort();
                if wanted != got {
                    let missing: Vec<&String> = wanted.iter().filter(|name| !got.contains(name)).collect();
                    let extra: Vec<&String> = got.iter().filter(|name| !wanted.contains(name)).collect();
                    out.push(Mismatch {
                        field,
                        expected: list(expected),
                        actual: format!(
                            "{} (missing: {}; extra: {})",
                            list(actual),
                            list(&missing),
                            list(&extra)
                        ),
                    });
                }
            }
        };
    exact("tools", &expect.tools, &tools, &mut out.mismatches);
    exact(
        "capabilities",
        &expect.capabilities,
        &capabilities,
        &mut out.mismatches,
    );
    let sees = |name: &String| tools.contains(name) || capabilities.contains(name);
    let unseen: Vec<&String> = expect.includes.iter().filter(|name| !sees(name)).collect();
    if !unseen.is_empty() {
        out.mismatches.push(Mismatch {
            field: "includes",
            expected: format!("visible: {}", list(&unseen)),
            actual: "not visible".to_owned(),
        });
    }
    let seen: Vec<&String> = expect.excludes.iter().filter(|name| sees(name)).collect();
    if !seen.is_empty() {
        out.mismatches.push(Mismatch {
            field: "excludes",
            expected: format!("not visible: {}", list(&seen)),
            actual: "visible".to_owned(),
        });
    }
    if let Err(problem) = resolution {
        // Nothing is visible to a caller who did not authenticate; say why.
        if !out.mismatches.is_empty() {
            out.mismatches.push(Mismatch {
                field: "principal",
                expected: "an authenticated principal".to_owned(),
                actual: problem.as_str().to_owned(),
            });
        }
    }
    Ok(out)
}

fn reach(context: &Context<'_>, case: &WhoCanCase) -> CaseResult {
    let spec = &case.case;
    let mut out = result(Kind::WhoCan, &spec.name, case);
    let reach = who_can(&context.policy.ruleset, &spec.capability);
    if reach.declared {
        out.exercised.capabilities.push(spec.capability.clone());
    }
    let expect = &spec.expect;
    if let Some(expected) = &expect.grants {
        let mut wanted = expected.clone();
        wanted.sort();
        let mut got: Vec<String> = reach.grants.iter().map(|(_, grant)| grant.path.clone()).collect();
        got.sort();
        if wanted != got {
            out.mismatches.push(Mismatch {
                field: "grants",
                expected: list(expected),
                actual: list(&got),
            });
        }
    }
    let flag = |flag: bool| if flag { "true" } else { "false" };
    compare(
        &mut out.mismatches,
        "declared",
        expect.declared.map(flag),
        Some(flag(reach.declared)),
    );
    compare(
        &mut out.mismatches,
        "realized",
        expect.realized.map(flag),
        Some(flag(reach.realized)),
    );
    out
}

/// `[a, b]`.
fn list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("[{}]", items.join(", "))
}
