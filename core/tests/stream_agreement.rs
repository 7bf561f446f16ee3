//! The decision index decides a request stream as the scan does: on policies
//! from the benchmarks' stream generator (overlapping selectors, shared
//! accounts, disabled ones, ceilings of every kind), at random sizes and
//! seeds, `evaluate` and `evaluate_prepared` give `evaluate_linear`'s decision
//! on every request under every usage, and `visible` lists what the scan
//! allows. The property also runs with a deliberately wrong evaluator, which
//! it must catch.

// The benchmarks' generators; the fixed-policy one is not used here.
#[allow(dead_code)]
#[path = "../benches/support/mod.rs"]
mod support;

use capgate_core::access::{
    evaluate, evaluate_linear, evaluate_prepared, visible, Decision, Instant, Ruleset, Usage,
};
use capgate_core::principals::Principal;
use proptest::prelude::*;

use support::stream::{self, Stream};

const AT: Instant = 1_760_000_000_000;
const USAGES: [Usage; 4] = [
    Usage::NotConsulted,
    Usage::Unknown,
    Usage::Counted {
        calls: 0,
        window_start: AT,
    },
    Usage::Counted {
        calls: 10,
        window_start: AT - 1_000,
    },
];

/// An evaluator: `evaluate`, or a broken one.
trait Evaluator: for<'a> Fn(&'a Ruleset, &Principal, &'a str, Instant, Usage) -> Decision<'a> {}
impl<F> Evaluator for F where F: for<'a> Fn(&'a Ruleset, &Principal, &'a str, Instant, Usage) -> Decision<'a> {}

/// Every request of the stream, plus an undeclared capability for each
/// principal asked, decided alike by `indexed`, by a prepared principal and
/// by the scan; and every asked principal's listing equal to the scan's.
fn property_stream_agrees(indexed: impl Evaluator, stream: &Stream) -> Result<(), String> {
    let ruleset = &stream.ruleset;
    for n in 0..stream.requests.len() {
        let (principal, capability) = stream.request(n);
        let prepared = ruleset.prepare(principal);
        for capability in [capability, "nope.undeclared"] {
            for usage in USAGES {
                let slow = evaluate_linear(ruleset, principal, capability, AT, usage);
                let fast = indexed(ruleset, principal, capability, AT, usage);
                if fast != slow {
                    return Err(format!(
                        "{principal:?} `{capability}` {usage:?}: index {fast:?} / scan {slow:?}"
                    ));
                }
                let ready = evaluate_prepared(&prepared, capability, AT, usage);
                if ready != slow {
                    return Err(format!(
                        "{principal:?} `{capability}` {usage:?}: prepared {ready:?} / scan {slow:?}"
                    ));
                }
            }
        }
    }
    // The scan's listing is 200 scans: a few principals are enough.
    for principal in stream.principals.iter().take(6) {
        let shown: Vec<(&str, &str, &str)> = visible(ruleset, principal, AT)
            .iter()
            .map(|v| (v.capability.id.as_str(), v.account.id.as_str(), v.path))
            .collect();
        let scanned: Vec<(&str, &str, &str)> = ruleset
            .capabilities()
            .iter()
            .filter_map(
                |c| match evaluate_linear(ruleset, principal, &c.id, AT, Usage::NotConsulted) {
                    Decision::Allow(allow) => {
                        Some((c.id.as_str(), allow.account.id.as_str(), allow.reason.path))
                    }
                    Decision::Deny(_) => None,
                },
            )
            .collect();
        if shown != scanned {
            return Err(format!("{principal:?}: listed {shown:?} / scanned {scanned:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_index_decides_a_stream_as_the_scan_does(grants in 1usize..600, seed in any::<u64>()) {
        let stream = stream::build(grants, 40, 60, seed);
        property_stream_agrees(evaluate, &stream).map_err(TestCaseError::fail)?;
    }
}

/// A decision that forgets the principal's last attribute (by name): what an
/// index dropping one selector check would do, seen from outside.
fn forgets_an_attribute<'a>(
    r: &'a Ruleset,
    p: &Principal,
    c: &'a str,
    at: Instant,
    u: Usage,
) -> Decision<'a> {
    let mut forgetful = p.clone();
    forgetful.attributes.pop_last();
    evaluate(r, &forgetful, c, at, u)
}

#[test]
fn a_wrong_evaluator_is_caught_on_a_stream() {
    let stream = stream::build(1_000, 40, 200, support::SEED);
    assert!(property_stream_agrees(forgets_an_attribute, &stream).is_err());
    property_stream_agrees(evaluate, &stream).unwrap();
}
