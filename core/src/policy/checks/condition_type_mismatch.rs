//! `condition_type_mismatch` (error, ours: docs/decisions/0034): a condition compares an
//! argument with a kind of value (string, number, boolean) that a tool's `inputSchema`
//! does not allow there, or that an earlier condition of the same grant on the same
//! argument does not use — such a condition could never hold with the other.

use super::argument_not_in_schema::{declares, Declares};
use super::Findings;
use crate::access::{Kind, Test};
use crate::capabilities::PlainValue;
use crate::policy::model::RawGrant;
use crate::policy::Code;

fn kinds(list: &[Kind]) -> String {
    list.iter()
        .map(|kind| kind.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Reports each mismatched condition; returns the argument paths a schema says are
/// integers (for the satisfiability check), or `None` if anything was reported.
pub(super) fn check(
    findings: &mut Findings<'_>,
    tools: &[(String, &PlainValue)],
    grant: &RawGrant,
) -> Option<Vec<String>> {
    let mut integers = Vec::new();
    let mut clean = true;
    let mut earlier: Vec<(&[String], Vec<Kind>, &str)> = Vec::new();
    for condition in &grant.conditions {
        let Test::Argument { path, op } = &condition.test else {
            continue;
        };
        let used = op.kinds();
        let mut problem = None;
        for (tool, schema) in tools {
            if let Declares::Kinds {
                kinds: allowed,
                integer,
            } = declares(schema, &path.segments)
            {
                if integer && !integers.contains(&path.written) {
                    integers.push(path.written.clone());
                }
                if let Some(wrong) = used.iter().find(|kind| !allowed.contains(kind)) {
                    problem.get_or_insert(format!(
                        "`{}` compares `{}` with {}, but the tool `{tool}` declares it {}",
                        op.keyword(),
                        path.written,
                        wrong.as_str(),
                        kinds(&allowed)
                    ));
                }
            }
        }
        if problem.is_none() {
            let before = earlier.iter().find(|(segments, kinds, _)| {
                *segments == path.segments.as_slice() && !kinds.iter().any(|k| used.contains(k))
            });
            if let Some((_, kinds_before, pointer)) = before {
                problem = Some(format!(
                    "`{}` compares `{}` with {}, but the condition at {pointer} compares it with {}: both cannot hold",
                    op.keyword(),
                    path.written,
                    kinds(&used),
                    kinds(kinds_before)
                ));
            }
        }
        if let Some(message) = problem {
            clean = false;
            findings.error(
                Code::ConditionTypeMismatch,
                format!("{}/{}", condition.path, op.keyword()),
                message,
                &[],
            );
        }
        earlier.push((&path.segments, used, &condition.path));
    }
    clean.then_some(integers)
}

#[cfg(test)]
mod tests {
    use super::super::argument_not_in_schema::tests::findings;

    #[test]
    fn a_number_compared_with_a_string_is_named_at_its_operator() {
        assert_eq!(
            findings("      - { argument: id, at_most: 5 }\n      - { argument: limit, in: [1, \"two\"] }\n      - { argument: limit, at_least: 1 }\n"),
            [
                ("condition_type_mismatch".to_owned(), "/grants/0/when/0/at_most".to_owned()),
                ("condition_type_mismatch".to_owned(), "/grants/0/when/1/in".to_owned()),
            ]
        );
    }

    #[test]
    fn two_conditions_on_one_argument_must_agree_on_its_kind() {
        assert_eq!(
            findings("      - { argument: free, equals: x }\n      - { argument: free, above: 3 }\n")
                .into_iter()
                .filter(|(code, _)| code == "condition_type_mismatch")
                .collect::<Vec<_>>(),
            [(
                "condition_type_mismatch".to_owned(),
                "/grants/0/when/1/above".to_owned()
            )]
        );
    }
}
