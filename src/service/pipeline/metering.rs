//! Ceilings at decision time (docs/decisions/0025-ceilings-counted-in-the-audit-batch.md). A
//! first evaluation does not consult usage; usage can only turn an allow into a deny, so a
//! denial or an uncapped allow is final and never touches a counter. An allow whose winning
//! grant has a ceiling becomes a [`CounterAsk`]: the audit writer counts it in the transaction
//! that stores its record, in arrival order with the other capped calls of its batch, and the
//! decision is taken again with what counting found ([`settled`]). A call that could not be
//! counted is `Usage::Unknown` (denied `usage_unknown`), never zero.

use capgate_core::access::{
    evaluate_prepared_call, Arguments, Decision, Limits, Prepared, ReasonCode, Usage,
};

use crate::store::{CounterAsk, Tally};

use super::Metered;

/// What the first evaluation leaves to do.
pub(super) enum First<'a> {
    /// A denial or an uncapped allow: the decision.
    Final(Metered<'a>),
    /// An allow under a ceiling: the call to count.
    Capped(CounterAsk),
}

/// The first evaluation, usage not consulted.
pub(super) fn first<'a>(
    prepared: &Prepared<'a>,
    principal_id: &str,
    capability: &'a str,
    at: i64,
    arguments: Arguments<'_>,
) -> First<'a> {
    let decision = evaluate_prepared_call(prepared, capability, at, Usage::NotConsulted, arguments);
    match &decision {
        Decision::Allow(allow) => match allow.limits {
            Some(ceiling) => First::Capped(CounterAsk {
                principal_id: principal_id.to_owned(),
                capability: capability.to_owned(),
                at_ms: at,
                window_ms: ceiling.window_ms,
                limit: ceiling.calls,
            }),
            None => First::Final(unmetered(decision)),
        },
        Decision::Deny(_) => First::Final(unmetered(decision)),
    }
}

/// The decision once the counter answered: `tally` is what counting made of the call, `None`
/// when it could not be counted. The same inputs give the same decision, so the audit writer
/// (which records it inside the batch's transaction) and the request (which answers it) agree.
pub(super) fn settled<'a>(
    prepared: &Prepared<'a>,
    capability: &'a str,
    at: i64,
    arguments: Arguments<'_>,
    tally: Option<Tally>,
) -> Metered<'a> {
    let usage = usage_of(tally);
    let decision = evaluate_prepared_call(prepared, capability, at, usage, arguments);
    let ceiling = ceiling_of(prepared, capability, at, arguments);
    let Some(ceiling) = ceiling else {
        // The ceiling went with a policy change between the two evaluations: none can (the
        // prepared principal pins one version), but a decision without one is still whole.
        return unmetered(decision);
    };
    match tally {
        Some(Tally::Taken(now)) if decision.is_allow() => Metered {
            decision,
            ceiling: Some(ceiling),
            standing: Some(ceiling.standing(now.calls, now.window_start_ms)),
            usage_calls: Some(now.calls),
            resets_at: None,
        },
        Some(Tally::Taken(reading) | Tally::Refused(reading)) => {
            let exhausted = decision.reason().code == ReasonCode::LimitExhausted;
            Metered {
                decision,
                ceiling: Some(ceiling),
                standing: None,
                usage_calls: Some(ceiling.calls_counted(reading.calls, reading.window_start_ms, at)),
                // When the window read ends: the earliest a call can be allowed again.
                resets_at: exhausted
                    .then(|| reading.window_start_ms.saturating_add_unsigned(ceiling.window_ms)),
            }
        }
        None => Metered {
            decision,
            ceiling: Some(ceiling),
            standing: None,
            usage_calls: None,
            resets_at: None,
        },
    }
}

/// The usage a counted call is decided on: the window's calls before it when it was taken, the
/// calls found when it was refused, unknown when it could not be counted.
pub(super) fn usage_of(tally: Option<Tally>) -> Usage {
    match tally {
        Some(Tally::Taken(now)) => Usage::Counted {
            calls: now.calls.saturating_sub(1),
            window_start: now.window_start_ms,
        },
        Some(Tally::Refused(found)) => Usage::Counted {
            calls: found.calls,
            window_start: found.window_start_ms,
        },
        None => Usage::Unknown,
    }
}

/// The winning grant's ceiling, usage aside.
fn ceiling_of<'a>(
    prepared: &Prepared<'a>,
    capability: &'a str,
    at: i64,
    arguments: Arguments<'_>,
) -> Option<&'a Limits> {
    match evaluate_prepared_call(prepared, capability, at, Usage::NotConsulted, arguments) {
        Decision::Allow(allow) => allow.limits,
        Decision::Deny(_) => None,
    }
}

fn unmetered(decision: Decision<'_>) -> Metered<'_> {
    Metered {
        decision,
        ceiling: None,
        standing: None,
        usage_calls: None,
        resets_at: None,
    }
}
