//! `unknown_issuer_in_grant` (error): a grant selects an issuer that is not
//! declared. Its selector keys are then not checked.

use super::Findings;
use crate::policy::model::{Declared, RawGrant};
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, grant: &RawGrant) {
    let known = declared.issuers.iter().map(|issuer| issuer.id.as_str());
    findings.error(
        Code::UnknownIssuerInGrant,
        format!("{}/to/issuer", grant.path),
        format!(
            "the grant selects the issuer `{}`, which is not declared{}",
            grant.issuer,
            did_you_mean(&grant.issuer, known)
        ),
        &[("/principals/issuers", "declared issuers")],
    );
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn undeclared_issuer_skips_the_attribute_check() {
        check(
            &artifact("grants:\n  - to: { issuer: partners, attributes: { zone: eu } }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n"),
            &[("unknown_issuer_in_grant", "/grants/0/to/issuer")],
        );
    }
}
