//! `diff`'s second question: which grants kept by both versions changed their conditions
//! (`when`), and whether that lets the grant apply to more calls or to fewer. The decisions
//! `diff` compares do not consult conditions (a listing's: no call's arguments or instant is
//! known), so without this a loosened bound would pass unseen.
//!
//! A grant is the same grant on both sides when it has the same issuer, selector,
//! capabilities and account; its pointer, ceiling and conditions may differ. Conditions are
//! compared as written, in any order.

use std::collections::{BTreeMap, BTreeSet};

use capgate_core::access::{Condition, Grant, Literal, Op, Ruleset, Test, Window};
/// How a grant's conditions changed, where that can be told: what calls the grant applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The grant applies to every call it applied to, and more (a condition removed, a bound
    /// loosened, `in` gaining values).
    Widening,
    /// The grant applies to fewer calls (a condition added, a bound tightened).
    Narrowing,
    /// Neither can be told (another value, another operator, or both ways at once).
    Changed,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Widening => "widening",
            Direction::Narrowing => "narrowing",
            Direction::Changed => "changed",
        }
    }
}

/// A grant present on both sides whose conditions differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionChange {
    pub issuer: String,
    /// The grant's selector, sorted by name.
    pub attributes: BTreeMap<String, String>,
    /// The capabilities it names, sorted, without duplicates.
    pub capabilities: Vec<String>,
    pub account: String,
    /// The grant's pointer on each side (`/grants/g`).
    pub before_path: String,
    pub after_path: String,
    pub before: Vec<Condition>,
    pub after: Vec<Condition>,
    pub direction: Direction,
}

impl ConditionChange {
    /// `--fail-on widening`: a widening, or a change that cannot be told not to be one.
    pub fn may_widen(&self) -> bool {
        self.direction != Direction::Narrowing
    }
}

/// What makes a grant the same grant on both sides: issuer, selector, capabilities and
/// account (not its pointer, its ceiling or its conditions).
type GrantKey = (String, Vec<(String, String)>, Vec<String>, String);

fn grant_key(grant: &Grant) -> GrantKey {
    let mut selector = grant.selector.clone();
    selector.sort();
    let capabilities: BTreeSet<String> = grant.capabilities.iter().cloned().collect();
    (
        grant.issuer.clone(),
        selector,
        capabilities.into_iter().collect(),
        grant.account.id.clone(),
    )
}

/// The conditions as compared: their written forms, sorted (order and pointers aside).
fn written(conditions: &[Condition]) -> Vec<String> {
    let mut written: Vec<String> = conditions.iter().map(|c| c.test.written()).collect();
    written.sort();
    written
}

/// Every grant of `before` that `after` keeps (same issuer, selector, capabilities and
/// account; the n-th of a kind pairs with the n-th) with other conditions, in `after`'s
/// grant order. A grant added or removed is not here: its effect is a decision change.
pub fn condition_changes(before: &Ruleset, after: &Ruleset) -> Vec<ConditionChange> {
    let mut unpaired: BTreeMap<GrantKey, Vec<&Grant>> = BTreeMap::new();
    for grant in before.grants().iter().rev() {
        unpaired.entry(grant_key(grant)).or_default().push(grant);
    }
    let mut changes = Vec::new();
    for grant in after.grants() {
        let key = grant_key(grant);
        let Some(earlier) = unpaired.get_mut(&key).and_then(Vec::pop) else {
            continue;
        };
        if written(&earlier.conditions) == written(&grant.conditions) {
            continue;
        }
        let (issuer, selector, capabilities, account) = key;
        changes.push(ConditionChange {
            issuer,
            attributes: selector.into_iter().collect(),
            capabilities,
            account,
            before_path: earlier.path.clone(),
            after_path: grant.path.clone(),
            before: earlier.conditions.clone(),
            after: grant.conditions.clone(),
            direction: direction(&earlier.conditions, &grant.conditions),
        });
    }
    changes
}

/// What a set of conditions is compared on: one argument and one kind of operator (an
/// upper bound, a lower bound, a set of values, a prefix), or one zone's windows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Aspect {
    Argument(Vec<String>, &'static str),
    Time(String),
}

fn aspect(test: &Test) -> Aspect {
    match test {
        Test::Argument { path, op } => {
            let kind = match op {
                Op::AtMost(_) | Op::Below(_) => "upper",
                Op::AtLeast(_) | Op::Above(_) => "lower",
                Op::Equals(_) | Op::In(_) => "values",
                Op::StartsWith(_) => "prefix",
            };
            Aspect::Argument(path.segments.clone(), kind)
        }
        Test::Time(window) => Aspect::Time(window.zone_name.clone()),
    }
}

/// The direction of a change from `before` to `after` (which differ): each aspect compared
/// on its own, then put together — all one way is that way, else `Changed`.
pub fn direction(before: &[Condition], after: &[Condition]) -> Direction {
    if after.is_empty() {
        return Direction::Widening;
    }
    if before.is_empty() {
        return Direction::Narrowing;
    }
    let mut aspects: BTreeMap<Aspect, (Vec<&Test>, Vec<&Test>)> = BTreeMap::new();
    for condition in before {
        aspects
            .entry(aspect(&condition.test))
            .or_default()
            .0
            .push(&condition.test);
    }
    for condition in after {
        aspects
            .entry(aspect(&condition.test))
            .or_default()
            .1
            .push(&condition.test);
    }
    let (mut wider, mut narrower) = (false, false);
    for (earlier, later) in aspects.values() {
        let same = |a: &[&Test], b: &[&Test]| {
            let mut a: Vec<String> = a.iter().map(|t| t.written()).collect();
            let mut b: Vec<String> = b.iter().map(|t| t.written()).collect();
            a.sort();
            b.sort();
            a == b
        };
        let step = match (earlier.as_slice(), later.as_slice()) {
            (a, b) if same(a, b) => None,
            // A test removed lets more calls through; one added, fewer.
            ([], _) => Some(Direction::Narrowing),
            (_, []) => Some(Direction::Widening),
            ([a], [b]) => compare(a, b),
            _ => Some(Direction::Changed),
        };
        match step {
            None => {}
            Some(Direction::Widening) => wider = true,
            Some(Direction::Narrowing) => narrower = true,
            Some(Direction::Changed) => return Direction::Changed,
        }
    }
    match (wider, narrower) {
        (true, false) => Direction::Widening,
        (false, true) => Direction::Narrowing,
        _ => Direction::Changed,
    }
}

/// One test against another of the same aspect: `None` when they admit the same values.
fn compare(before: &Test, after: &Test) -> Option<Direction> {
    // Whether `after` admits every value `before` admits, and the reverse.
    let ordered = |wider: bool, narrower: bool| match (wider, narrower) {
        (true, true) => None,
        (true, false) => Some(Direction::Widening),
        (false, true) => Some(Direction::Narrowing),
        (false, false) => Some(Direction::Changed),
    };
    match (before, after) {
        (Test::Argument { op: a, .. }, Test::Argument { op: b, .. }) => {
            if let (Some(x), Some(y)) = (bound(a), bound(b)) {
                if x.upper == y.upper {
                    return ordered(y.admits_all_of(x), x.admits_all_of(y));
                }
            }
            if let (Some(x), Some(y)) = (values(a), values(b)) {
                let within = |small: &[Literal], large: &[Literal]| small.iter().all(|v| large.contains(v));
                return ordered(within(x, y), within(y, x));
            }
            if let (Op::StartsWith(x), Op::StartsWith(y)) = (a, b) {
                return ordered(x.starts_with(y.as_str()), y.starts_with(x.as_str()));
            }
            Some(Direction::Changed)
        }
        (Test::Time(x), Test::Time(y)) if x.zone_name == y.zone_name => {
            let covers = |big: &Window, small: &Window| {
                big.days & small.days == small.days && big.from <= small.from && big.until >= small.until
            };
            ordered(covers(y, x), covers(x, y))
        }
        _ => Some(Direction::Changed),
    }
}

/// A numeric bound: which side, its value, and whether the value itself passes.
#[derive(Debug, Clone, Copy)]
struct Bound {
    upper: bool,
    value: f64,
    inclusive: bool,
}

impl Bound {
    /// Whether every number `other` (a bound on the same side) admits, this one admits.
    fn admits_all_of(self, other: Bound) -> bool {
        let beyond = if self.upper {
            self.value > other.value
        } else {
            self.value < other.value
        };
        beyond || (self.value == other.value && (self.inclusive || !other.inclusive))
    }
}

fn bound(op: &Op) -> Option<Bound> {
    let (upper, value, inclusive) = match *op {
        Op::AtMost(n) => (true, n, true),
        Op::Below(n) => (true, n, false),
        Op::AtLeast(n) => (false, n, true),
        Op::Above(n) => (false, n, false),
        _ => return None,
    };
    Some(Bound {
        upper,
        value,
        inclusive,
    })
}

/// The values `equals` or `in` admits.
fn values(op: &Op) -> Option<&[Literal]> {
    match op {
        Op::Equals(literal) => Some(std::slice::from_ref(literal)),
        Op::In(literals) => Some(literals),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conditions of the one grant of a small version 2 policy, `when` as written there.
    fn when(conditions: &[&str]) -> Vec<Condition> {
        let mut text = String::from(
            "version: 2
capabilities:
  - id: billing.refund.create
upstreams:
  - id: payments
    transport: { kind: mcp-http, url: https://payments.example.net/mcp }
    tools:
      - name: create_refund
        capability: billing.refund.create
accounts:
  - id: support-payments
    secret: { ref: \"env://SUPPORT\" }
principals:
  issuers:
    - id: staff
      kind: static-key
grants:
  - to: { issuer: staff }
    capabilities: [billing.refund.create]
    using: support-payments
",
        );
        if !conditions.is_empty() {
            text.push_str("    when:\n");
            for condition in conditions {
                text.push_str(&format!("      - {condition}\n"));
            }
        }
        let compiled = capgate_core::policy::compile(text.as_bytes(), None);
        let problems: Vec<&str> = compiled.diagnostics.iter().map(|d| d.message.as_str()).collect();
        let policy = compiled.policy.unwrap_or_else(|| panic!("{problems:?}"));
        policy.ruleset.grants()[0].conditions.clone()
    }

    fn way(before: &[&str], after: &[&str]) -> &'static str {
        direction(&when(before), &when(after)).as_str()
    }

    #[test]
    fn conditions_removed_widen_and_added_narrow() {
        let amount = "{ argument: amount, at_most: 100 }";
        let currency = "{ argument: currency, in: [EUR, USD] }";
        assert_eq!(way(&[amount, currency], &[]), "widening");
        assert_eq!(way(&[], &[amount]), "narrowing");
        assert_eq!(way(&[amount, currency], &[amount]), "widening");
        assert_eq!(way(&[amount], &[amount, currency]), "narrowing");
    }

    #[test]
    fn bounds_loosened_widen_and_tightened_narrow() {
        let cases = [
            (
                "{ argument: amount, at_most: 100 }",
                "{ argument: amount, at_most: 200 }",
                "widening",
            ),
            (
                "{ argument: amount, at_most: 200 }",
                "{ argument: amount, at_most: 100 }",
                "narrowing",
            ),
            (
                "{ argument: amount, below: 100 }",
                "{ argument: amount, at_most: 100 }",
                "widening",
            ),
            (
                "{ argument: amount, at_least: 10 }",
                "{ argument: amount, at_least: 5 }",
                "widening",
            ),
            (
                "{ argument: amount, at_least: 10 }",
                "{ argument: amount, above: 10 }",
                "narrowing",
            ),
            (
                "{ argument: currency, in: [EUR] }",
                "{ argument: currency, in: [EUR, USD] }",
                "widening",
            ),
            (
                "{ argument: currency, equals: EUR }",
                "{ argument: currency, in: [EUR, GBP] }",
                "widening",
            ),
            (
                "{ argument: currency, in: [EUR, USD] }",
                "{ argument: currency, in: [USD] }",
                "narrowing",
            ),
            (
                "{ argument: currency, in: [EUR] }",
                "{ argument: currency, in: [USD] }",
                "changed",
            ),
            (
                "{ argument: currency, starts_with: EU }",
                "{ argument: currency, starts_with: E }",
                "widening",
            ),
            (
                "{ argument: amount, at_most: 100 }",
                "{ argument: amount, at_least: 100 }",
                "changed",
            ),
            (
                "{ argument: amount, at_most: 100 }",
                "{ argument: total, at_most: 100 }",
                "changed",
            ),
            (
                "{ time: { zone: UTC, days: [mon], from: \"09:00\", until: \"17:00\" } }",
                "{ time: { zone: UTC, days: [mon, tue], from: \"08:00\", until: \"17:00\" } }",
                "widening",
            ),
            (
                "{ time: { zone: UTC, days: [mon], from: \"09:00\", until: \"17:00\" } }",
                "{ time: { zone: UTC, days: [mon], from: \"10:00\", until: \"17:00\" } }",
                "narrowing",
            ),
            (
                "{ time: { zone: UTC, days: [mon], from: \"09:00\", until: \"17:00\" } }",
                "{ time: { zone: Europe/Madrid, days: [mon], from: \"09:00\", until: \"17:00\" } }",
                "changed",
            ),
        ];
        for (before, after, expected) in cases {
            assert_eq!(way(&[before], &[after]), expected, "{before} → {after}");
        }
    }

    #[test]
    fn one_way_and_the_other_at_once_is_changed() {
        let loosened = [
            "{ argument: amount, at_most: 200 }",
            "{ argument: currency, in: [EUR] }",
        ];
        let before = [
            "{ argument: amount, at_most: 100 }",
            "{ argument: currency, in: [EUR, USD] }",
        ];
        assert_eq!(way(&before, &loosened), "changed");
        let both_looser = [
            "{ argument: amount, at_most: 200 }",
            "{ argument: currency, in: [EUR, USD, GBP] }",
        ];
        assert_eq!(way(&before, &both_looser), "widening");
    }
}
