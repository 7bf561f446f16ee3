//! `duplicate_id` (error): a capability, upstream, account or issuer id
//! declared twice. Reported at the later occurrence, related to the first.

use std::collections::HashMap;

use super::Findings;
use crate::policy::Code;

pub(super) fn check<'a>(
    findings: &mut Findings<'_>,
    what: &str,
    entries: impl Iterator<Item = (&'a String, &'a String)>,
) {
    let mut first_seen: HashMap<&String, &String> = HashMap::new();
    for (id, path) in entries {
        match first_seen.get(id) {
            Some(first) => findings.error(
                Code::DuplicateId,
                path.clone(),
                format!("the {what} `{id}` is declared twice"),
                &[(first.as_str(), "first declaration")],
            ),
            None => {
                first_seen.insert(id, path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::check;

    #[test]
    fn later_occurrence_related_to_the_first() {
        check(
            "version: 1\ncapabilities:\n  - id: a\n  - id: b\n  - id: a\n  - id: a\naccounts: []\nprincipals: { issuers: [] }\ngrants: []\n",
            &[
                ("duplicate_id", "/capabilities/2"),
                ("duplicate_id", "/capabilities/3"),
                ("capability_not_realized", "/capabilities/0"),
                ("capability_not_realized", "/capabilities/1"),
                ("capability_not_realized", "/capabilities/2"),
                ("capability_not_realized", "/capabilities/3"),
            ],
        );
    }

    #[test]
    fn related_points_at_the_first_declaration() {
        let result = crate::policy::compile(
            b"version: 1\ncapabilities: []\naccounts:\n  - id: x\n    secret: { ref: env://A }\n  - id: x\n    secret: { ref: env://B }\nprincipals: { issuers: [] }\ngrants: []\n",
            None,
        );
        let duplicate = &result.diagnostics[0];
        assert_eq!(duplicate.path, "/accounts/1");
        assert_eq!(duplicate.related[0].path, "/accounts/0");
        assert_eq!(duplicate.related[0].position.map(|p| p.line), Some(4));
    }
}
