//! `evaluate` (policy-core §4.2): the first failing step decides. Deny is the
//! structural default — every early exit is a denial with its reason, and
//! reaching the allow means passing every step.

use super::{more_restrictive, Allow, Decision, Instant, Reason, ReasonCode, Ruleset, Usage};
use super::{CAPABILITIES_ANCHOR, GRANTS_ANCHOR};
use crate::principals::Principal;

/// The decision for `principal` invoking `capability` at `at` with `usage`.
/// Uses the ruleset's index: the cost is that of the grants of the
/// principal's issuer that name the capability, not of the whole policy.
pub fn evaluate<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let Some((index, declared)) = ruleset.capability(capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    let matching = ruleset
        .candidates(index, &principal.issuer)
        .iter()
        .map(|&grant| grant as usize)
        .filter(|&grant| ruleset.grants()[grant].selects(principal));
    decide(ruleset, &declared.id, matching, at, usage)
}

/// The same decision by a straightforward scan over every grant: the
/// reference the index is checked against, and the benchmark's baseline.
pub fn evaluate_linear<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let Some(declared) = ruleset.capabilities().iter().find(|c| c.id == capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    let matching = ruleset
        .grants()
        .iter()
        .enumerate()
        .filter(|(_, grant)| grant.matches(principal) && grant.names(&declared.id))
        .map(|(index, _)| index);
    decide(ruleset, &declared.id, matching, at, usage)
}

fn deny<'a>(code: ReasonCode, path: &'a str, subject: &'a str) -> Decision<'a> {
    Decision::Deny(Reason { code, path, subject })
}

/// Steps 3–8, given the matching grants in file order.
fn decide<'a>(
    ruleset: &'a Ruleset,
    capability: &'a str,
    matching: impl Iterator<Item = usize>,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let grants = ruleset.grants();
    let mut first: Option<usize> = None;
    let mut ambiguous = false;
    let mut first_disabled: Option<usize> = None;
    let mut winner: Option<usize> = None;
    for index in matching {
        let grant = &grants[index];
        match first {
            None => first = Some(index),
            Some(first) if grants[first].account.id != grant.account.id => ambiguous = true,
            Some(_) => {}
        }
        if grant.account.disabled && first_disabled.is_none() {
            first_disabled = Some(index);
        }
        let replaces = match winner {
            None => true,
            Some(incumbent) => more_restrictive(grant.limits.as_ref(), grants[incumbent].limits.as_ref()),
        };
        if replaces {
            winner = Some(index);
        }
    }

    // Step 3: nothing matches.
    let (Some(first), Some(winner)) = (first, winner) else {
        return deny(ReasonCode::NoGrantMatches, GRANTS_ANCHOR, capability);
    };
    // Step 4: defence in depth; a compiled policy cannot get here.
    if ambiguous {
        return deny(ReasonCode::AmbiguousGrant, &grants[first].path, capability);
    }
    // Step 5: any matching grant's account disabled (they all share one).
    if let Some(disabled) = first_disabled {
        let grant = &grants[disabled];
        return deny(ReasonCode::AccountDisabled, &grant.path, &grant.account.id);
    }
    // Steps 6–7: only the winner's ceiling is checked.
    let grant = &grants[winner];
    if let Some(limits) = &grant.limits {
        match usage {
            Usage::NotConsulted => {}
            Usage::Unknown => {
                return deny(ReasonCode::UsageUnknown, &grant.path, &grant.account.id);
            }
            Usage::Counted { calls, window_start } => {
                if limits.calls_counted(calls, window_start, at) >= limits.calls {
                    return deny(ReasonCode::LimitExhausted, &grant.path, capability);
                }
            }
        }
    }
    // Step 8.
    Decision::Allow(Allow {
        reason: Reason {
            code: ReasonCode::Granted,
            path: &grant.path,
            subject: capability,
        },
        account: &grant.account,
        limits: grant.limits.as_ref(),
        grant: winner,
    })
}
