//! `claim_mapping_expected` (error): an `oidc` issuer maps attributes from
//! JWT claims, so every value must read `claim:<name>`.

use super::Findings;
use crate::policy::{pointer, Code};
use crate::principals::{Issuer, IssuerKind};

pub(super) fn check(findings: &mut Findings<'_>, issuer: &Issuer, name: &str, source: &str) {
    if issuer.kind == IssuerKind::Oidc && !source.starts_with("claim:") {
        findings.error(
            Code::ClaimMappingExpected,
            format!("{}/attributes/{}", issuer.path, pointer::escape(name)),
            format!("an `oidc` issuer declares attributes as `claim:<name>`; `{source}` is a literal"),
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn literal_on_oidc_issuer_with_escaped_name() {
        check(
            "version: 1\ncapabilities: []\naccounts: []\nprincipals:\n  issuers:\n    - id: corp\n      kind: oidc\n      attributes: { team: ventas, \"a/b~\": \"claim:x\", c: \"claim:c\", \"d/e\": lit }\ngrants: []\n",
            &[
                ("claim_mapping_expected", "/principals/issuers/0/attributes/team"),
                ("claim_mapping_expected", "/principals/issuers/0/attributes/d~1e"),
            ],
        );
    }
}
