//! `evaluate` (docs/reference.md#the-steps): the first failing step decides. Deny is the
//! structural default — every early exit is a denial with its reason, and
//! reaching the allow means passing every step.

use super::index::Interned;
use super::limits::{replaces, Rate};
use super::{Allow, Decision, Grant, Instant, Reason, ReasonCode, Ruleset, Usage};
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

    /// `found(index, allow)` for every capability whose decision (as
    /// `decide_at` takes it) with usage not consulted is an allow, in
    /// declaration order: a listing. When no id is declared twice, only the
    /// capabilities some grant of the principal's issuer names are decided,
    /// walking that issuer's lists of the index; any other is denied by
    /// step 3 and so never found.
    pub(crate) fn each_allowed(&self, at: Instant, mut found: impl FnMut(usize, Allow<'r>)) {
        let ruleset = self.ruleset;
        if !ruleset.distinct_ids() {
            for index in 0..ruleset.capabilities().len() {
                if let Decision::Allow(allow) = self.decide_at(index, at, Usage::NotConsulted) {
                    found(index, allow);
                }
            }
            return;
        }
        ruleset.index().each_match(&self.interned, |index, matches| {
            let declared = &ruleset.capabilities()[index];
            if !declared.realized {
                return;
            }
            if let Decision::Allow(allow) =
                decide(ruleset, &declared.id, Some(matches), at, Usage::NotConsulted)
            {
                found(index, allow);
            }
        });
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
    let matches = ruleset.index().matches(index, interned);
    decide(ruleset, &ruleset.capabilities()[index].id, matches, at, usage)
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
    let matches = Matches::fold(
        ruleset
            .grants()
            .iter()
            .enumerate()
            .filter(|(_, grant)| grant.matches(principal) && grant.names(&declared.id)),
    );
    decide(ruleset, &declared.id, matches, at, usage)
}

/// What steps 4–7 read of the grants that match (there is at least one):
/// grant indices in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Matches {
    /// Step 7: the most restrictive ceiling, ties to the earliest grant.
    pub winner: usize,
    /// Step 4: if the matches run as more than one account, the first match.
    pub ambiguous: Option<usize>,
    /// Step 5: the first match whose account is disabled.
    pub disabled: Option<usize>,
}

impl Matches {
    /// The definition, one matching grant after another in file order: the
    /// scan uses it, and the index (`Index::matches`) must answer as it does.
    fn fold<'g>(matching: impl Iterator<Item = (usize, &'g Grant)>) -> Option<Matches> {
        let mut first: Option<(usize, &str)> = None;
        let mut ambiguous = false;
        let mut disabled = None;
        let mut winner: Option<(usize, Option<Rate>)> = None;
        for (at, grant) in matching {
            match first {
                None => first = Some((at, grant.account.id.as_str())),
                Some((_, account)) if account != grant.account.id => ambiguous = true,
                Some(_) => {}
            }
            if grant.account.disabled && disabled.is_none() {
                disabled = Some(at);
            }
            let rate = grant.limits.as_ref().map(Rate::of);
            if winner.is_none_or(|(_, incumbent)| replaces(rate, incumbent)) {
                winner = Some((at, rate));
            }
        }
        let ((first, _), (winner, _)) = (first?, winner?);
        Some(Matches {
            winner,
            ambiguous: ambiguous.then_some(first),
            disabled,
        })
    }
}

fn deny<'a>(code: ReasonCode, path: &'a str, subject: &'a str) -> Decision<'a> {
    Decision::Deny(Reason { code, path, subject })
}

/// Steps 3–8, given what the matching grants say (`None`: no grant matches).
fn decide<'a>(
    ruleset: &'a Ruleset,
    capability: &'a str,
    matches: Option<Matches>,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    let grants = ruleset.grants();
    // Step 3: nothing matches.
    let Some(Matches {
        winner,
        ambiguous,
        disabled,
    }) = matches
    else {
        return deny(ReasonCode::NoGrantMatches, GRANTS_ANCHOR, capability);
    };
    // Step 4: defence in depth; a compiled policy cannot get here.
    if let Some(first) = ambiguous {
        return deny(ReasonCode::AmbiguousGrant, &grants[first].path, capability);
    }
    // Step 5: any matching grant's account disabled (they all share one).
    if let Some(disabled) = disabled {
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
