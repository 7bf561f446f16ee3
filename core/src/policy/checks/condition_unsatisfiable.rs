//! `condition_unsatisfiable` (error, ours: docs/decisions/0034): no arguments and no
//! instant meet all of a grant's conditions — a time window that closes before it opens,
//! `below: 5` with `above: 5`, two `equals` that differ, a whole number strictly between
//! two adjacent integers. Such a grant would list its tools but never allow a call:
//! refusing it keeps a listing equal to what some call may do (docs/reference.md#listings).

use super::Findings;
use crate::access::{clock, witness, Test};
use crate::policy::model::RawGrant;
use crate::policy::Code;

/// `integers`: the argument paths a tool's schema says are whole numbers.
pub(super) fn check(findings: &mut Findings<'_>, grant: &RawGrant, integers: &[String]) {
    let conditions = &grant.conditions;
    for condition in conditions {
        if let Test::Time(window) = &condition.test {
            if window.from >= window.until {
                findings.error(
                    Code::ConditionUnsatisfiable,
                    format!("{}/time", condition.path),
                    format!(
                        "the window opens at {} and closes at {}: `from` must be before `until` (a window across midnight is two grants)",
                        clock(window.from),
                        clock(window.until)
                    ),
                    &[],
                );
                return;
            }
        }
    }
    let integers: Vec<&str> = integers.iter().map(String::as_str).collect();
    if witness(conditions, &integers).is_none() {
        findings.error(
            Code::ConditionUnsatisfiable,
            format!("{}/when", grant.path),
            "no call can meet all of these conditions together, so the grant would show its tools and allow nothing".to_owned(),
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::argument_not_in_schema::tests::findings;

    #[test]
    fn contradictions_are_refused_and_their_neighbours_pass() {
        let cases = [
            (
                "      - { argument: amount, below: 5 }\n      - { argument: amount, above: 5 }\n",
                Some("/grants/0/when"),
            ),
            (
                "      - { argument: amount, below: 5 }\n      - { argument: amount, above: 4 }\n",
                None,
            ),
            // `limit` is an integer in the tool's schema: nothing lies between 4 and 5.
            (
                "      - { argument: limit, below: 5 }\n      - { argument: limit, above: 4 }\n",
                Some("/grants/0/when"),
            ),
            (
                "      - { argument: id, in: [a, b] }\n      - { argument: id, equals: c }\n",
                Some("/grants/0/when"),
            ),
            (
                "      - time: { zone: UTC, from: \"18:00\", until: \"09:00\" }\n",
                Some("/grants/0/when/0/time"),
            ),
            (
                "      - time: { zone: UTC, days: [sat], from: \"09:00\", until: \"18:00\" }\n",
                None,
            ),
        ];
        for (conditions, expected) in cases {
            let found: Vec<String> = findings(conditions)
                .into_iter()
                .filter(|(code, _)| code == "condition_unsatisfiable")
                .map(|(_, path)| path)
                .collect();
            assert_eq!(
                found,
                expected.into_iter().map(str::to_owned).collect::<Vec<_>>(),
                "{conditions}"
            );
        }
    }
}
