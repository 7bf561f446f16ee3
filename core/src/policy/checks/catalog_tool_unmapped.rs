//! `catalog_tool_unmapped` (warning): a catalog tool no mapping covers
//! (including tools of undeclared upstreams). Nobody sees or calls it —
//! fail-closed already did the right thing — so it is only a warning, at the
//! `/upstreams` anchor even when that section is absent.

use super::Findings;
use crate::capabilities::Catalog;
use crate::policy::model::Declared;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, catalog: &Catalog) {
    for tool in &catalog.tools {
        let mapped = declared
            .mappings()
            .any(|mapping| mapping.upstream == tool.upstream && mapping.name == tool.name);
        if !mapped {
            findings.warning(
                Code::CatalogToolUnmapped,
                "/upstreams".to_owned(),
                format!(
                    "`{}/{}` is in the catalog and no mapping covers it: nobody sees or calls it",
                    tool.upstream, tool.name
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, findings_with_catalog};

    #[test]
    fn unmapped_and_unknown_upstream_entries_once_each() {
        let text = artifact(
            "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n",
        );
        let found = findings_with_catalog(
            &text,
            Some(&[
                ("crm", "get_contact"),
                ("crm", "delete"),
                ("ghost", "x"),
                ("crm", "delete"),
            ]),
        );
        assert_eq!(found.len(), 2);
        assert!(found
            .iter()
            .all(|(code, path)| code == "catalog_tool_unmapped" && path == "/upstreams"));
    }
}
