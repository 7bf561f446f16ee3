//! `ambiguous_grant` (error, docs/reference.md#ambiguity): two grants with different
//! accounts whose selectors overlap and that share a capability — one
//! principal could be given two execution accounts. Purely syntactic.
//!
//! Only pairs that share an issuer and a capability can be ambiguous, so the
//! pairs are found through a (issuer, capability) index instead of testing
//! all n² of them; they are reported in (earlier, later) order all the same.

use std::collections::{BTreeSet, HashMap};

use super::Findings;
use crate::policy::model::RawGrant;
use crate::policy::Code;

/// Selectors are disjoint iff the issuers differ or some key present in both
/// has different values; keys present in only one never separate them.
fn overlap(a: &RawGrant, b: &RawGrant) -> bool {
    a.issuer == b.issuer
        && a.selector.iter().all(|(name, value)| {
            b.selector
                .iter()
                .find(|(other, _)| other == name)
                .is_none_or(|(_, other_value)| other_value == value)
        })
}

pub(super) fn check(findings: &mut Findings<'_>, grants: &[RawGrant]) {
    let mut by_issuer_and_capability: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (index, grant) in grants.iter().enumerate() {
        for capability in &grant.capabilities {
            let list = by_issuer_and_capability
                .entry((grant.issuer.as_str(), capability.as_str()))
                .or_default();
            if list.last() != Some(&index) {
                list.push(index);
            }
        }
    }
    let mut pairs = BTreeSet::new();
    for list in by_issuer_and_capability.values() {
        for (at, &left) in list.iter().enumerate() {
            for &right in &list[at + 1..] {
                if grants[left].using != grants[right].using {
                    pairs.insert((left, right));
                }
            }
        }
    }
    for (left, right) in pairs {
        let (one, other) = (&grants[left], &grants[right]);
        if !overlap(one, other) {
            continue;
        }
        let shared: Vec<String> = one
            .capabilities
            .iter()
            .filter(|capability| other.capabilities.contains(capability))
            .map(|capability| format!("`{capability}`"))
            .collect();
        findings.error(
            Code::AmbiguousGrant,
            one.path.clone(),
            format!(
                "two grants cover {} for the same principal with different accounts (`{}` and `{}`); narrow one of the selectors",
                shared.join(", "),
                one.using,
                other.using
            ),
            &[(other.path.as_str(), "the other grant")],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::findings;

    fn two_accounts(grants: &str) -> String {
        format!(
            "version: 1\ncapabilities: [{{ id: x }}, {{ id: y }}]\nupstreams:\n  - id: u\n    transport: {{ kind: mcp-stdio, command: c }}\n    tools: [{{ name: a, capability: x }}, {{ name: b, capability: y }}]\naccounts:\n  - {{ id: a1, secret: {{ ref: \"env://A\" }} }}\n  - {{ id: a2, secret: {{ ref: \"env://B\" }} }}\nprincipals:\n  issuers:\n    - {{ id: corp, kind: oidc, attributes: {{ team: \"claim:team\", role: \"claim:role\" }} }}\n    - {{ id: other, kind: oidc }}\ngrants:\n{grants}"
        )
    }

    fn ambiguous(grants: &str) -> Vec<String> {
        findings(&two_accounts(grants))
            .into_iter()
            .filter(|(code, _)| code == "ambiguous_grant")
            .map(|(_, path)| path)
            .collect()
    }

    #[test]
    fn the_spec_examples() {
        let pair = |a: &str, b: &str| {
            format!("  - {{ to: {{ issuer: corp, attributes: {a} }}, capabilities: [x], using: a1 }}\n  - {{ to: {{ issuer: corp, attributes: {b} }}, capabilities: [x], using: a2 }}\n")
        };
        assert_eq!(ambiguous(&pair("{}", "{team: a}")), ["/grants/0"]);
        assert_eq!(ambiguous(&pair("{team: a}", "{role: b}")), ["/grants/0"]);
        assert!(ambiguous(&pair("{team: a}", "{team: b}")).is_empty());
        assert!(ambiguous(&pair("{team: a, role: b}", "{team: a, role: c}")).is_empty());
    }

    #[test]
    fn same_account_other_issuer_or_no_shared_capability_is_fine() {
        assert!(ambiguous("  - { to: { issuer: corp }, capabilities: [x], using: a1 }\n  - { to: { issuer: corp }, capabilities: [x], using: a1 }\n").is_empty());
        assert!(ambiguous("  - { to: { issuer: corp }, capabilities: [x], using: a1 }\n  - { to: { issuer: other }, capabilities: [x], using: a2 }\n").is_empty());
        assert!(ambiguous("  - { to: { issuer: corp }, capabilities: [x], using: a1 }\n  - { to: { issuer: corp }, capabilities: [y], using: a2 }\n").is_empty());
    }

    #[test]
    fn every_pair_once_in_order() {
        let grants = "  - { to: { issuer: corp }, capabilities: [x, y], using: a1 }\n  - { to: { issuer: corp }, capabilities: [y], using: a2 }\n  - { to: { issuer: corp }, capabilities: [x], using: a2 }\n";
        assert_eq!(ambiguous(grants), ["/grants/0", "/grants/0"]);
        let result = crate::policy::compile(two_accounts(grants).as_bytes(), None);
        let related: Vec<_> = result
            .diagnostics
            .iter()
            .filter(|d| d.code.as_str() == "ambiguous_grant")
            .map(|d| d.related[0].path.clone())
            .collect();
        assert_eq!(related, ["/grants/1", "/grants/2"]);
    }
}
