//! `unknown_account_in_grant` (error): a grant runs as an account that is
//! not declared.

use super::Findings;
use crate::policy::model::{Declared, RawGrant};
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, grant: &RawGrant) {
    if !declared.declares_account(&grant.using) {
        findings.error(
            Code::UnknownAccountInGrant,
            format!("{}/using", grant.path),
            format!(
                "the grant runs as the account `{}`, which is not declared{}",
                grant.using,
                did_you_mean(&grant.using, declared.accounts.iter().map(|a| a.id.as_str()))
            ),
            &[("/accounts", "declared accounts")],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn dangling_account() {
        check(
            &artifact(
                "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: nobody\n",
            ),
            &[
                ("unknown_account_in_grant", "/grants/0/using"),
                ("unused_account", "/accounts/0"),
            ],
        );
    }
}
