//! `unused_account` (warning): an account no grant runs as, disabled or not.

use super::Findings;
use crate::policy::model::Declared;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared) {
    for account in &declared.accounts {
        if !declared.uses_account(&account.id) {
            findings.warning(
                Code::UnusedAccount,
                account.path.clone(),
                format!("no grant uses the account `{}`", account.id),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn an_account_nobody_uses() {
        check(&artifact("grants: []"), &[("unused_account", "/accounts/0")]);
    }
}
