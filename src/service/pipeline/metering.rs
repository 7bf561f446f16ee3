//! Ceilings at decision time: for an allow whose winning grant has a ceiling, read the counter,
//! decide again with what it says, and consume one call atomically. Denials and uncapped allows
//! never touch the counter store: the first evaluation does not consult usage, and usage can
//! only turn an allow into a deny. A counter that fails or does not answer in time is
//! `Usage::Unknown` (a capped call is then denied `usage_unknown`), never zero.

use std::time::Duration;

use capgate_core::access::{evaluate, Decision, Limits, Reason, ReasonCode, Ruleset, Usage};
use capgate_core::principals::Principal;

use crate::service::active::Active;
use crate::service::State;
use crate::store::{Consumed, CounterKey, Store};
use crate::telemetry;

use super::Metered;

/// How many times a refused consumption is re-read and re-evaluated before the answer is
/// `limit_exhausted` regardless (the window keeps filling).
const CONSUME_ATTEMPTS: usize = 3;

pub(super) async fn evaluate_metered<'a, S: Store>(
    state: &State<S>,
    active: &'a Active,
    principal: &Principal,
    capability: &'a str,
    at: i64,
) -> Metered<'a> {
    let ruleset = &active.policy.ruleset;
    let first = evaluate(ruleset, principal, capability, at, Usage::NotConsulted);
    let (path, ceiling) = match &first {
        Decision::Allow(allow) => match allow.limits {
            Some(ceiling) => (allow.reason.path, ceiling),
            None => return unmetered(first),
        },
        Decision::Deny(_) => return unmetered(first),
    };
    let key = CounterKey {
        principal_id: &principal.id,
        capability,
    };
    let timeout = state.store_timeout;
    // When the window last read ends: the earliest a call can be allowed again once it is full.
    let mut resets_at = at.saturating_add_unsigned(ceiling.window_ms);
    for _ in 0..CONSUME_ATTEMPTS {
        let usage = read_usage(&state.store, key, at, timeout).await;
        let decision = evaluate(ruleset, principal, capability, at, usage);
        let found = match usage {
            Usage::Counted { calls, window_start } => {
                if !ceiling.window_expired(window_start, at) {
                    resets_at = window_start.saturating_add_unsigned(ceiling.window_ms);
                }
                Some(ceiling.calls_counted(calls, window_start, at))
            }
            Usage::Unknown | Usage::NotConsulted => None,
        };
        if !decision.is_allow() {
            let exhausted = decision.reason().code == ReasonCode::LimitExhausted;
            return Metered {
                decision,
                ceiling: Some(ceiling),
                standing: None,
                usage_calls: found,
                resets_at: exhausted.then_some(resets_at),
            };
        }
        let consumed = telemetry::counter_store(
            "consume",
            tokio::time::timeout(
                timeout,
                state.store.consume(key, at, ceiling.window_ms, ceiling.calls),
            ),
        )
        .await;
        match consumed {
            Ok(Ok(Consumed::Taken(now))) => {
                return Metered {
                    decision,
                    ceiling: Some(ceiling),
                    standing: Some(ceiling.standing(now.calls, now.window_start_ms)),
                    usage_calls: Some(now.calls),
                    resets_at: None,
                };
            }
            // Another request took the last call: read again and decide again.
            Ok(Ok(Consumed::Refused)) => continue,
            Ok(Err(error)) => {
                tracing::warn!(%error, "the counter store failed to consume; usage unknown");
                return unknown(ruleset, principal, capability, at, ceiling);
            }
            Err(_) => {
                tracing::warn!("the counter store did not consume in time; usage unknown");
                return unknown(ruleset, principal, capability, at, ceiling);
            }
        }
    }
    // Refused every time: whatever the reads said, the window is full.
    Metered {
        decision: Decision::Deny(Reason {
            code: ReasonCode::LimitExhausted,
            path,
            subject: capability,
        }),
        ceiling: Some(ceiling),
        standing: None,
        usage_calls: Some(ceiling.calls),
        resets_at: Some(resets_at),
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

fn unknown<'a>(
    ruleset: &'a Ruleset,
    principal: &Principal,
    capability: &'a str,
    at: i64,
    ceiling: &'a Limits,
) -> Metered<'a> {
    Metered {
        decision: evaluate(ruleset, principal, capability, at, Usage::Unknown),
        ceiling: Some(ceiling),
        standing: None,
        usage_calls: None,
        resets_at: None,
    }
}

/// The counter as usage: no row is a fresh window at `at`; a failure or a timeout is `Unknown`
/// (never zero).
async fn read_usage<S: Store>(store: &S, key: CounterKey<'_>, at: i64, timeout: Duration) -> Usage {
    match telemetry::counter_store("read", tokio::time::timeout(timeout, store.read_usage(key))).await {
        Ok(Ok(Some(counted))) => Usage::Counted {
            calls: counted.calls,
            window_start: counted.window_start_ms,
        },
        Ok(Ok(None)) => Usage::Counted {
            calls: 0,
            window_start: at,
        },
        Ok(Err(error)) => {
            tracing::warn!(%error, "the counter store failed to read; usage unknown");
            Usage::Unknown
        }
        Err(_) => {
            tracing::warn!("the counter store did not answer in time; usage unknown");
            Usage::Unknown
        }
    }
}
