//! `unknown_capability_in_grant` (error): a grant names a capability that is
//! not declared. One diagnostic per offending list entry.

use super::Findings;
use crate::policy::model::{Declared, RawGrant};
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, grant: &RawGrant) {
    for (index, capability) in grant.capabilities.iter().enumerate() {
        if !declared.declares_capability(capability) {
            findings.error(
                Code::UnknownCapabilityInGrant,
                format!("{}/capabilities/{index}", grant.path),
                format!(
                    "the grant names the capability `{capability}`, which is not declared{}",
                    did_you_mean(capability, declared.capabilities.iter().map(|c| c.id.as_str()))
                ),
                &[("/capabilities", "declared capabilities")],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn each_unknown_entry() {
        check(
            &artifact("grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.write, crm.contact.read, x]\n    using: crm-ro\n"),
            &[
                ("unknown_capability_in_grant", "/grants/0/capabilities/0"),
                ("unknown_capability_in_grant", "/grants/0/capabilities/2"),
            ],
        );
    }
}
