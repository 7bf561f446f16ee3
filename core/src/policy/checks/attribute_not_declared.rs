//! `attribute_not_declared` (error): a selector discriminates on an attribute
//! its issuer does not declare — no principal of that issuer could carry it.
//! Applies to `static-key` issuers too.

use super::Findings;
use crate::policy::model::RawGrant;
use crate::policy::{pointer, Code};
use crate::principals::Issuer;

pub(super) fn check(findings: &mut Findings<'_>, issuer: &Issuer, grant: &RawGrant) {
    for (name, _) in &grant.selector {
        if !issuer.declares(name) {
            findings.error(
                Code::AttributeNotDeclared,
                format!("{}/to/attributes/{}", grant.path, pointer::escape(name)),
                format!(
                    "the issuer `{}` does not declare the attribute `{name}`, so the policy cannot select on it",
                    issuer.id
                ),
                &[(&format!("{}/attributes", issuer.path), "declared attributes")],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn each_undeclared_key_in_selector_order() {
        check(
            &artifact("grants:\n  - to: { issuer: ci, attributes: { team: a, role: automation, \"x/y\": b } }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n"),
            &[
                ("attribute_not_declared", "/grants/0/to/attributes/team"),
                ("attribute_not_declared", "/grants/0/to/attributes/x~1y"),
            ],
        );
    }

    #[test]
    fn the_last_declaration_of_a_duplicated_issuer_is_used() {
        let text = "version: 1\ncapabilities: []\naccounts: []\nprincipals:\n  issuers:\n    - { id: ci, kind: static-key, attributes: { role: a } }\n    - { id: ci, kind: static-key, attributes: { team: b } }\ngrants:\n  - to: { issuer: ci, attributes: { role: a } }\n    capabilities: [x]\n    using: acc\n";
        check(
            text,
            &[
                ("duplicate_id", "/principals/issuers/1"),
                ("attribute_not_declared", "/grants/0/to/attributes/role"),
                ("unknown_capability_in_grant", "/grants/0/capabilities/0"),
                ("unknown_account_in_grant", "/grants/0/using"),
            ],
        );
    }
}
