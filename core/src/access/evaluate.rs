//! `evaluate` (docs/reference.md#the-steps): the first failing step decides. Deny is the
//! structural default — every early exit is a denial with its reason, and
//! reaching the allow means passing every step.

use super::conditions::{first_failing, Arguments, Outcome, Test};
use super::index::{Interned, Order};
use super::limits::{replaces, Rate};
use super::{Allow, Decision, Grant, Instant, Reason, ReasonCode, Ruleset, Usage};
use super::{CAPABILITIES_ANCHOR, GRANTS_ANCHOR};
use crate::principals::Principal;

/// The decision for `principal` invoking `capability` at `at` with `usage`.
/// Uses the ruleset's index: the cost is that of interning the principal's
/// attributes and of the grants of its issuer that name the capability, not
/// of the whole policy.
///
/// No arguments are given: a grant with conditions on arguments does not apply
/// (`arguments_missing`). A call's decision is `evaluate_call`'s.
pub fn evaluate<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
) -> Decision<'a> {
    evaluate_call(ruleset, principal, capability, at, usage, None)
}

/// The decision for a call of `capability` with `arguments` (`None`: not forwarded):
/// `evaluate`, with each matching grant's conditions checked against them and `at`.
pub fn evaluate_call<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
    arguments: Arguments<'_>,
) -> Decision<'a> {
    let Some((index, declared)) = ruleset.capability(capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    let interned = ruleset.index().intern(principal);
    let call = Call::Checked(arguments);
    decide_indexed(ruleset, index, &interned, at, usage, call)
}

/// Whether a decision checks the grants' conditions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call<'v> {
    /// A listing or the effective diff: conditions are not looked at (a grant applies
    /// if it matches), as ceilings are not consulted.
    NotConsulted,
    /// A call, with its arguments (`None`: not forwarded).
    Checked(Arguments<'v>),
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

    /// Whether a call of `capability` may be decided on its arguments: some grant that matches
    /// the principal and names the capability has a condition on an argument. When none has,
    /// any arguments (or none) give the same decision, so a call whose arguments are not known
    /// can still be decided exactly (`capgate replay` on a record that kept only their digest).
    pub fn reads_arguments(&self, capability: &str) -> bool {
        let Some((index, declared)) = self.ruleset.capability(capability) else {
            return false;
        };
        if !declared.realized {
            return false;
        }
        let grants = self.ruleset.grants();
        let mut reads = false;
        self.ruleset
            .index()
            .visit_matching(index, &self.interned, &mut |g: usize, _: Order| {
                reads = grants[g]
                    .conditions
                    .iter()
                    .any(|condition| matches!(condition.test, Test::Argument { .. }));
                reads
            });
        reads
    }

    /// The decision for the capability declared at `index`, as `evaluate` on
    /// its id would take it (its first declaration, if the id is declared twice),
    /// conditions not consulted: a listing's.
    pub(crate) fn decide_at(&self, index: usize, at: Instant, usage: Usage) -> Decision<'r> {
        let index = self.ruleset.first_declaration(index);
        let declared = &self.ruleset.capabilities()[index];
        if !declared.realized {
            return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
        }
        decide_indexed(self.ruleset, index, &self.interned, at, usage, Call::NotConsulted)
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
            let all = |visit: &mut Visit<'_>| ruleset.index().visit_matching(index, &self.interned, visit);
            let decision = decide(
                ruleset,
                &declared.id,
                Some(matches),
                all,
                at,
                Usage::NotConsulted,
                Call::NotConsulted,
            );
            if let Decision::Allow(allow) = decision {
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
    evaluate_prepared_call(prepared, capability, at, usage, None)
}

/// `evaluate_call` for a principal already prepared.
pub fn evaluate_prepared_call<'a>(
    prepared: &Prepared<'a>,
    capability: &'a str,
    at: Instant,
    usage: Usage,
    arguments: Arguments<'_>,
) -> Decision<'a> {
    let ruleset = prepared.ruleset;
    let Some((index, declared)) = ruleset.capability(capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    decide_indexed(
        ruleset,
        index,
        &prepared.interned,
        at,
        usage,
        Call::Checked(arguments),
    )
}

/// Steps 3–8 through the index, for a declared and realised capability.
fn decide_indexed<'a>(
    ruleset: &'a Ruleset,
    index: usize,
    interned: &Interned,
    at: Instant,
    usage: Usage,
    call: Call<'_>,
) -> Decision<'a> {
    let matches = ruleset.index().matches(index, interned);
    let all = |visit: &mut Visit<'_>| ruleset.index().visit_matching(index, interned, visit);
    decide(
        ruleset,
        &ruleset.capabilities()[index].id,
        matches,
        all,
        at,
        usage,
        call,
    )
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
    evaluate_linear_call(ruleset, principal, capability, at, usage, None)
}

/// `evaluate_call` by the scan.
pub fn evaluate_linear_call<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: Instant,
    usage: Usage,
    arguments: Arguments<'_>,
) -> Decision<'a> {
    let Some(declared) = ruleset.capabilities().iter().find(|c| c.id == capability) else {
        return deny(ReasonCode::CapabilityNotDeclared, CAPABILITIES_ANCHOR, capability);
    };
    if !declared.realized {
        return deny(ReasonCode::CapabilityNotRealized, &declared.path, &declared.id);
    }
    let matching = |grant: &Grant| grant.matches(principal) && grant.names(&declared.id);
    let matches = Matches::fold(ruleset.grants().iter().enumerate().filter(|(_, g)| matching(g)));
    let all = |visit: &mut Visit<'_>| {
        for g in 0..ruleset.grants().len() {
            if matching(&ruleset.grants()[g]) && visit(g, Order::FileOrder) {
                break;
            }
        }
    };
    let call = Call::Checked(arguments);
    decide(ruleset, &declared.id, matches, all, at, usage, call)
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
    /// Some match may carry conditions: step 6 must look at each (the index may say so
    /// of a list whose conditional grants did not match; the step then finds none).
    pub conditional: bool,
}

impl Matches {
    /// The definition, one matching grant after another in file order: the
    /// scan uses it, and the index (`Index::matches`) must answer as it does.
    fn fold<'g>(matching: impl Iterator<Item = (usize, &'g Grant)>) -> Option<Matches> {
        let mut first: Option<(usize, &str)> = None;
        let mut ambiguous = false;
        let mut disabled = None;
        let mut winner: Option<(usize, Option<Rate>)> = None;
        let mut conditional = false;
        for (at, grant) in matching {
            conditional |= !grant.conditions.is_empty();
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
            conditional,
        })
    }
}

fn deny<'a>(code: ReasonCode, path: &'a str, subject: &'a str) -> Decision<'a> {
    Decision::Deny(Reason { code, path, subject })
}

/// Visits the matching grants (grant indices) until the visitor returns `true`, and says in
/// which order it visited them.
pub(crate) type Visit<'v> = dyn FnMut(usize, Order) -> bool + 'v;

/// Steps 3–8, given what the matching grants say (`None`: no grant matches) and, for
/// step 6, how to visit them all (`all`).
fn decide<'a>(
    ruleset: &'a Ruleset,
    capability: &'a str,
    matches: Option<Matches>,
    all: impl FnOnce(&mut Visit<'_>),
    at: Instant,
    usage: Usage,
    call: Call<'_>,
) -> Decision<'a> {
    let grants = ruleset.grants();
    // Step 3: nothing matches.
    let Some(Matches {
        winner,
        ambiguous,
        disabled,
        conditional,
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
    // Step 6: the matches whose conditions hold apply; the winner is theirs.
    let (winner, rests_on_conditions) = if conditional {
        match applying(ruleset, all, at, call) {
            Ok(applying) => applying,
            Err(reason) => return Decision::Deny(reason),
        }
    } else {
        (winner, false)
    };
    // Step 7: only the winner's ceiling is checked.
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
        conditional: rests_on_conditions,
    })
}

/// Step 6 over the matching grants: the winner among those that apply, and whether the
/// allow rests on conditions; or the denial when none applies.
///
/// Unconsulted (a listing), every match applies, and the allow rests on conditions when every
/// match carries some. Checked (a call), a grant applies when all its conditions hold, and
/// the allow rests on conditions when the winner carries some. When none applies, the denial
/// names one condition: the first, in file order of grants, whose argument is missing
/// (`arguments_missing`: the call might be allowed with it), else the first grant's first
/// failing condition (`condition_failed`).
///
/// Visited most restrictive first (`Order::Ranked`), the first grant that applies wins and
/// a call looks no further; in file order, the winner is the fold of `replaces`, as
/// `Matches::fold` takes it. Nothing is allocated.
fn applying<'a>(
    ruleset: &'a Ruleset,
    all: impl FnOnce(&mut Visit<'_>),
    at: Instant,
    call: Call<'_>,
) -> Result<(usize, bool), Reason<'a>> {
    let grants = ruleset.grants();
    let mut missing: Option<(usize, &'a super::Condition)> = None;
    let mut failed: Option<(usize, &'a super::Condition)> = None;
    let mut winner: Option<(usize, Option<Rate>)> = None;
    let mut every_conditional = true;
    all(&mut |g: usize, order: Order| {
        let grant = &grants[g];
        if let Call::Checked(arguments) = call {
            match first_failing(&grant.conditions, arguments, at) {
                None => {}
                Some((condition, outcome)) => {
                    let slot = if outcome == Outcome::Missing {
                        &mut missing
                    } else {
                        &mut failed
                    };
                    if slot.is_none_or(|(earlier, _)| g < earlier) {
                        *slot = Some((g, condition));
                    }
                    return false;
                }
            }
        }
        every_conditional &= !grant.conditions.is_empty();
        let rate = grant.limits.as_ref().map(Rate::of);
        match order {
            // The first that applies wins; a call looks no further, a listing visits every
            // match to say whether all carry conditions.
            Order::Ranked => {
                winner.get_or_insert((g, rate));
                matches!(call, Call::Checked(_))
            }
            Order::FileOrder => {
                if winner.is_none_or(|(_, incumbent)| replaces(rate, incumbent)) {
                    winner = Some((g, rate));
                }
                false
            }
        }
    });
    if let Some((winner, _)) = winner {
        let rests = match call {
            Call::NotConsulted => every_conditional,
            Call::Checked(_) => !grants[winner].conditions.is_empty(),
        };
        return Ok((winner, rests));
    }
    let (code, (_, condition)) = match (missing, failed) {
        (Some(found), _) => (ReasonCode::ArgumentsMissing, found),
        (None, Some(found)) => (ReasonCode::ConditionFailed, found),
        // Unreachable: a match that does not apply failed one way or the other. Deny.
        (None, None) => {
            return Err(Reason {
                code: ReasonCode::NoGrantMatches,
                path: GRANTS_ANCHOR,
                subject: "",
            })
        }
    };
    Err(Reason {
        code,
        path: &condition.path,
        subject: condition.test.subject(),
    })
}
