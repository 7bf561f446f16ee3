//! Ceilings and the "most restrictive" order (policy-core §4.6, seed 0013):
//! lower calls-per-time wins; equal rates go to the shorter window; any
//! ceiling beats none. Rates are compared exactly, in 128-bit integers.

use std::cmp::Ordering;

/// A rate ceiling: `calls` per window of `window_ms`, `per` as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limits {
    pub calls: u64,
    pub per: String,
    pub window_ms: u64,
}

/// Compares rates `calls / window_ms`; no ceiling is an infinite rate.
fn rate_order(a: Option<&Limits>, b: Option<&Limits>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => {
            let left = u128::from(a.calls) * u128::from(b.window_ms);
            let right = u128::from(b.calls) * u128::from(a.window_ms);
            left.cmp(&right)
        }
    }
}

fn window_order(a: Option<&Limits>, b: Option<&Limits>) -> Ordering {
    let window = |limits: Option<&Limits>| limits.map_or(u128::MAX, |l| u128::from(l.window_ms));
    window(a).cmp(&window(b))
}

/// Whether `candidate` replaces `incumbent` as the most restrictive ceiling:
/// a strictly lower rate, or an equal rate and a strictly shorter window.
/// Complete ties keep the incumbent (the earliest grant in file order).
pub fn more_restrictive(candidate: Option<&Limits>, incumbent: Option<&Limits>) -> bool {
    match rate_order(candidate, incumbent) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => window_order(candidate, incumbent) == Ordering::Less,
    }
}

/// Whether `after` is a looser ceiling than `before` (the effective diff's
/// widening test): `before` would win against it.
pub fn is_looser(after: Option<&Limits>, before: Option<&Limits>) -> bool {
    more_restrictive(before, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(calls: u64, window_ms: u64) -> Limits {
        Limits {
            calls,
            per: String::new(),
            window_ms,
        }
    }

    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;

    #[test]
    fn seed_0013_examples() {
        // 20/24h beats 500/1h.
        assert!(more_restrictive(Some(&limits(20, DAY)), Some(&limits(500, HOUR))));
        // Equal rate: the shorter window wins, either way round.
        assert!(more_restrictive(
            Some(&limits(100, HOUR)),
            Some(&limits(2400, DAY))
        ));
        assert!(!more_restrictive(
            Some(&limits(2400, DAY)),
            Some(&limits(100, HOUR))
        ));
        // Any ceiling beats none; none never beats a ceiling.
        assert!(more_restrictive(Some(&limits(1_000_000, 1000)), None));
        assert!(!more_restrictive(None, Some(&limits(1, 1))));
        // calls: 0 beats everything; between zeros the shorter window wins.
        assert!(more_restrictive(
            Some(&limits(0, DAY)),
            Some(&limits(1, DAY * 1000))
        ));
        assert!(more_restrictive(Some(&limits(0, HOUR)), Some(&limits(0, DAY))));
        // Complete ties keep the incumbent.
        assert!(!more_restrictive(
            Some(&limits(10, HOUR)),
            Some(&limits(10, HOUR))
        ));
        assert!(!more_restrictive(None, None));
    }

    #[test]
    fn exact_comparison_where_doubles_would_tie() {
        // (2^53 + 1) / 2^53 vs 1 / 1: doubles round the left rate to 1.0.
        let big = 1u64 << 53;
        assert!(more_restrictive(Some(&limits(1, 1)), Some(&limits(big + 1, big))));
    }

    #[test]
    fn looser_is_the_reverse_question() {
        assert!(is_looser(None, Some(&limits(1, HOUR))));
        assert!(is_looser(Some(&limits(2, HOUR)), Some(&limits(1, HOUR))));
        assert!(is_looser(Some(&limits(24, DAY)), Some(&limits(1, HOUR))));
        assert!(!is_looser(Some(&limits(1, HOUR)), Some(&limits(24, DAY))));
        assert!(!is_looser(None, None));
    }
}
