//! Ceilings and the "most restrictive" order (docs/reference.md#the-winning-grant):
//! lower calls-per-time wins; equal rates go to the shorter window; any
//! ceiling beats none. Rates are compared exactly, in 128-bit integers.

use std::cmp::Ordering;

use super::Instant;

/// A rate ceiling: `calls` per window of `window_ms`, `per` as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limits {
    pub calls: u64,
    pub per: String,
    pub window_ms: u64,
}

impl Limits {
    /// Whether the window opened at `window_start` has ended at `at`: `window_ms` or more have
    /// passed. A window start in the future is never expired. This is the one place the rule is
    /// written; the evaluation and the service's counters both ask it.
    pub fn window_expired(&self, window_start: Instant, at: Instant) -> bool {
        i128::from(at) - i128::from(window_start) >= i128::from(self.window_ms)
    }

    /// The calls that count against this ceiling at `at`, given `calls` counted in the window
    /// opened at `window_start`: none once that window has expired.
    pub fn calls_counted(&self, calls: u64, window_start: Instant, at: Instant) -> u64 {
        if self.window_expired(window_start, at) {
            0
        } else {
            calls
        }
    }

    /// Where an allowed call leaves the window opened at `window_start` once `calls` are counted
    /// in it (this one included).
    pub fn standing(&self, calls: u64, window_start: Instant) -> Standing {
        let window = Instant::try_from(self.window_ms).unwrap_or(Instant::MAX);
        Standing {
            remaining: self.calls.saturating_sub(calls),
            resets_at: window_start.saturating_add(window),
        }
    }
}

/// Where an allowed call stands against its ceiling, after it was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Standing {
    /// Calls left in the window after this one.
    pub remaining: u64,
    /// When the window ends.
    pub resets_at: Instant,
}

/// A ceiling as the "most restrictive" order reads it: the number of calls and
/// the window, without `per`'s spelling. The decision index keeps one per
/// candidate grant, so the decision loop never reads the grant itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Rate {
    calls: u64,
    window_ms: u64,
}

impl Rate {
    pub(crate) fn of(limits: &Limits) -> Rate {
        Rate {
            calls: limits.calls,
            window_ms: limits.window_ms,
        }
    }
}

/// Compares rates `calls / window_ms`; no ceiling is an infinite rate.
fn rate_order(a: Option<Rate>, b: Option<Rate>) -> Ordering {
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

fn window_order(a: Option<Rate>, b: Option<Rate>) -> Ordering {
    let window = |rate: Option<Rate>| rate.map_or(u128::MAX, |r| u128::from(r.window_ms));
    window(a).cmp(&window(b))
}

/// The "most restrictive" order: the lower rate first, then the shorter
/// window; `Less` means `a` is the more restrictive.
pub(crate) fn restrictiveness(a: Option<Rate>, b: Option<Rate>) -> Ordering {
    rate_order(a, b).then_with(|| window_order(a, b))
}

/// `more_restrictive` on rates: the one rule, which both spellings call.
pub(crate) fn replaces(candidate: Option<Rate>, incumbent: Option<Rate>) -> bool {
    restrictiveness(candidate, incumbent) == Ordering::Less
}

/// Whether `restrictiveness` orders `rate` consistently with every other such
/// rate: it does for any ceiling whose window is not empty, and for none.
/// Among those it compares `calls / window_ms` as exact fractions, so it is a
/// total preorder, and the file-order fold of `replaces` picks the earliest
/// of the least elements — which a sort can precompute. A 0 ms window makes
/// the cross-multiplication call it equal to everything of rate 0 and of
/// rate ∞ alike, which is not transitive: only the fold defines its winner.
pub(crate) fn orders_totally(rate: Option<Rate>) -> bool {
    rate.is_none_or(|rate| rate.window_ms > 0)
}

/// Whether `candidate` replaces `incumbent` as the most restrictive ceiling:
/// a strictly lower rate, or an equal rate and a strictly shorter window.
/// Complete ties keep the incumbent (the earliest grant in file order).
pub fn more_restrictive(candidate: Option<&Limits>, incumbent: Option<&Limits>) -> bool {
    replaces(candidate.map(Rate::of), incumbent.map(Rate::of))
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
