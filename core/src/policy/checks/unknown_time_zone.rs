//! `unknown_time_zone` (error, ours: docs/decisions/0034): a time condition names a zone
//! the IANA database compiled into capgate does not have.

use super::Findings;
use crate::policy::model::{RawGrant, Unreadable};
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, grant: &RawGrant) {
    for Unreadable::UnknownZone { path, zone } in &grant.unreadable {
        findings.error(
            Code::UnknownTimeZone,
            path.clone(),
            format!("`{zone}` is not a time zone of the IANA database (e.g. `Europe/Madrid`, `UTC`)"),
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, check};

    #[test]
    fn an_unknown_zone_is_named_and_a_known_one_passes() {
        let grant = |zone: &str| {
            artifact(&format!("grants:\n  - to: {{ issuer: ci }}\n    capabilities: [crm.contact.read]\n    using: crm-ro\n    when:\n      - time: {{ zone: {zone}, from: \"09:00\", until: \"18:00\" }}\n"))
                .replacen("version: 1", "version: 2", 1)
        };
        check(
            &grant("Mars/Olympus"),
            &[("unknown_time_zone", "/grants/0/when/0/time/zone")],
        );
        check(&grant("Europe/Madrid"), &[]);
    }
}
