//! `dn_mapping_expected` (error, ours): an `mtls` issuer maps attributes from
//! the client certificate's DN, so every value must read `dn:<component>`.
//! Upstream does not check this and silently uses the literal.

use super::Findings;
use crate::policy::{pointer, Code};
use crate::principals::{Issuer, IssuerKind};

pub(super) fn check(findings: &mut Findings<'_>, issuer: &Issuer, name: &str, source: &str) {
    if issuer.kind == IssuerKind::Mtls && !source.starts_with("dn:") {
        findings.error(
            Code::DnMappingExpected,
            format!("{}/attributes/{}", issuer.path, pointer::escape(name)),
            format!("an `mtls` issuer declares attributes as `dn:<component>`; `{source}` is a literal"),
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn literal_on_mtls_issuer_in_the_same_loop_as_claims() {
        check(
            "version: 1\ncapabilities: []\naccounts: []\nprincipals:\n  issuers:\n    - id: mesh\n      kind: mtls\n      attributes: { org: \"dn:O\", unit: payments }\n    - id: corp\n      kind: oidc\n      attributes: { team: x }\n    - id: key\n      kind: static-key\n      attributes: { team: x }\ngrants: []\n",
            &[
                ("dn_mapping_expected", "/principals/issuers/0/attributes/unit"),
                ("claim_mapping_expected", "/principals/issuers/1/attributes/team"),
            ],
        );
    }
}
