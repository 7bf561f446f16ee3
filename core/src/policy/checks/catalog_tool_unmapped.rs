//! `catalog_tool_unmapped` (warning): a catalog tool no mapping covers
//! (including tools of undeclared upstreams). Nobody sees or calls it —
//! fail-closed already did the right thing — so it is only a warning.
//!
//! It is reported where the mapping would go: at the entry of the upstream
//! the catalog names (`/upstreams/u`, the last declaration when the id is
//! repeated, as for every look-up), so that a reader sees which upstream
//! offers the tool. Only a tool of an upstream the artifact does not declare
//! falls back to the `/upstreams` anchor, even when that section is absent.

use std::collections::{HashMap, HashSet};

use super::Findings;
use crate::capabilities::Catalog;
use crate::policy::model::Declared;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, catalog: &Catalog) {
    // Built once: checking stays linear in the catalog and the mappings.
    let mapped: HashSet<(&str, &str)> = declared
        .mappings()
        .map(|mapping| (mapping.upstream.as_str(), mapping.name.as_str()))
        .collect();
    // Later declarations overwrite earlier ones: the last one wins.
    let upstreams: HashMap<&str, &str> = declared
        .upstreams
        .iter()
        .map(|upstream| (upstream.id.as_str(), upstream.path.as_str()))
        .collect();
    for tool in &catalog.tools {
        if mapped.contains(&(tool.upstream.as_str(), tool.name.as_str())) {
            continue;
        }
        let path = upstreams
            .get(tool.upstream.as_str())
            .copied()
            .unwrap_or("/upstreams");
        findings.warning(
            Code::CatalogToolUnmapped,
            path.to_owned(),
            format!(
                "`{}/{}` is in the catalog and no mapping covers it: nobody sees or calls it",
                tool.upstream, tool.name
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, findings_with_catalog};

    #[test]
    fn at_the_upstream_it_belongs_to_or_the_anchor_for_an_undeclared_one() {
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
        assert_eq!(
            found,
            [
                ("catalog_tool_unmapped".to_owned(), "/upstreams/0".to_owned()),
                ("catalog_tool_unmapped".to_owned(), "/upstreams".to_owned()),
            ]
        );
    }
}
