//! `conditions_need_version_2` (error, ours: docs/decisions/0034): a grant carries `when`
//! in an artifact of version 1. A version 1 reader that does not know conditions (mcpizer,
//! or capgate before them) would grant without them; the version says they must be read.

use super::Findings;
use crate::policy::model::RawGrant;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, version: i128, grant: &RawGrant) {
    if version < 2 && (!grant.conditions.is_empty() || !grant.unreadable.is_empty()) {
        findings.error(
            Code::ConditionsNeedVersion2,
            format!("{}/when", grant.path),
            "a grant with conditions needs `version: 2`: a reader of version 1 would grant without them"
                .to_owned(),
            &[("/version", "the artifact's version")],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn when_in_version_1_is_refused_and_version_2_accepts_it() {
        let grant = "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n    when:\n      - { argument: id, starts_with: c- }\n";
        let text = artifact(grant);
        check(&text, &[("conditions_need_version_2", "/grants/0/when")]);
        check(&text.replacen("version: 1", "version: 2", 1), &[]);
    }
}
