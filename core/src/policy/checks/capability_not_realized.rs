//! `capability_not_realized` (warning): a declared capability no tool
//! mapping (of any upstream) points to; granting it makes nothing visible.

use super::Findings;
use crate::policy::model::Declared;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared) {
    for capability in &declared.capabilities {
        if !declared.realizes(&capability.id) {
            findings.warning(
                Code::CapabilityNotRealized,
                capability.path.clone(),
                format!(
                    "no declared tool realises `{}`: granting it makes nothing visible",
                    capability.id
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn warning_in_declaration_order() {
        check(
            "version: 1\ncapabilities: [{ id: b }, { id: a }]\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n",
            &[("capability_not_realized", "/capabilities/0"), ("capability_not_realized", "/capabilities/1")],
        );
    }
}
