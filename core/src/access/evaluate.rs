//! `evaluate` (docs/reference.md#the-steps): the first failing step decides. Deny is the
//! structural default — every early exit is a denial with its reason, and
//! reaching the allow means passing every step.

use super::index::Interned;
use super::limits::{replaces, Rate};
use super::{Allow, Decision, Instant, Reason, ReasonCode, Ruleset, Usage};
use super::{CAPABILITIES_ANCHOR, GRANTS_ANCHOR};
use crate::principals::Principal;

/// The decision for `principal` invoking `capability` at `at` with `usage`.
/// Uses the ruleset's index: the cost is that of interning the principal's
/// attributes and of the grants of its issuer that name the capability, not
/// of the whole policy.
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
    decide_indexed(ruleset, index, &ruleset.index().intern(principal), at, usage)
}

/// A principal interned against one ruleset (`Ruleset::prepare`), for deciding
/// many capabilities without looking its attributes up again: a listing, or a
/// service that decides twice per request. It borrows the ruleset, so it
/// cannot be used with another one, whose numbering differs.
#[derive(Debug, Clone)]
pub struct Prepared<'r> {
    ruleset: &'r Ruleset,
    interned: Interned,
}

impl<'r> Prepared<'r> {
    pub(crate) fn new(ruleset: &'r Ruleset, interned: Interned) -> Self {
        Prepared { ruleset, interned }
    }

    pub fn ruleset(&self) -> &'r Ruleset {
        self.ruleset
    }

    /// The decision for the capability declared at `index`, as `evaluate` on
    /// its id would take it (its first declaration, if the id is declared twice).
    pub(crate) fn decide_at(&self, index: usize, at: Instant, usage: Usage) -> Decision<'r> {
        let index = self.ruleset.first_declaration(index);
        let declared = &self.ruleset.capabilities()[index];
        if !declared.realized {
            return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
        }
        decide_indexed(self.ruleset, index, &self.interned, at, usage)
    }
}

/// `evaluate` for a principal already prepared: the same decision, without
/// interning the principal again.
pub fn evaluate_prepared<'a>(
    prepared: &Prepared<'a>,
    capability: &'a str,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let ruleset = prepared.ruleset;
    let Some((index, declared)) = ruleset.capability(capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    decide_indexed(ruleset, index, &prepared.interned, at, usage)
}

/// Steps 3–8 through the index, for a declared and realised capability.
fn decide_indexed<'a>(
    ruleset: &'a Ruleset,
    index: usize,
    interned: &Interned,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let table = ruleset.index();
    let (offset, candidates) = table.candidates(index, interned);
    let matching = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| table.selects(candidate, interned))
        .map(|(at, candidate)| Matched {
            grant: candidate.grant as usize,
            account: candidate.account,
            disabled: candidate.disabled,
            rate: table.rate(offset + at),
        });
    decide(ruleset, &ruleset.capabilities()[index].id, matching, at, usage)
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
        .map(|(index, grant)| Matched {
            grant: index,
            account: grant.account.id.as_str(),
            disabled: grant.account.disabled,
            rate: grant.limits.as_ref().map(Rate::of),
        });
    decide(ruleset, &declared.id, matching, at, usage)
}

/// What steps 3–8 read of one matching grant. `account` is whatever identifies
/// the account: its id for the scan, its number in the index.
struct Matched<K> {
    grant: usize,
    account: K,
    disabled: bool,
    rate: Option<Rate>,
}

fn deny<'a>(code: ReasonCode, path: &'a str, subject: &'a str) -> Decision<'a> {
    Decision::Deny(Reason { code, path, subject })
}

/// Steps 3–8, given the matching grants in file order.
fn decide<'a, K: PartialEq>(
    ruleset: &'a Ruleset,
    capability: &'a str,
    matching: impl Iterator<Item = Matched<K>>,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let grants = ruleset.grants();
    let mut first: Option<(usize, K)> = None;
    let mut ambiguous = false;
    let mut first_disabled: Option<usize> = None;
    let mut winner: Option<(usize, Option<Rate>)> = None;
    for matched in matching {
        match &first {
            None => first = Some((matched.grant, matched.account)),
            Some((_, account)) if *account != matched.account => ambiguous = true,
            Some(_) => {}
        }
        if matched.disabled && first_disabled.is_none() {
            first_disabled = Some(matched.grant);
        }
        let replaces = match winner {
            None => true,
            Some((_, incumbent)) => replaces(matched.rate, incumbent),
        };
        if replaces {
            winner = Some((matched.grant, matched.rate));
        }
    }

    // Step 3: nothing matches.
    let (Some((first, _)), Some((winner, _))) = (first, winner) else {
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
