//! `tool_not_in_catalog` (error): with a declared catalog, a mapping names a
//! tool its upstream does not offer — it would only fail at run time.

use super::Findings;
use crate::capabilities::Catalog;
use crate::policy::model::Declared;
use crate::policy::suggest::did_you_mean;
use crate::policy::Code;

pub(super) fn check(findings: &mut Findings<'_>, declared: &Declared, catalog: &Catalog) {
    for mapping in declared.mappings() {
        if !catalog.contains(&mapping.upstream, &mapping.name) {
            findings.error(
                Code::ToolNotInCatalog,
                format!("{}/name", mapping.path),
                format!(
                    "the declared catalog of `{}` has no tool `{}`{}",
                    mapping.upstream,
                    mapping.name,
                    did_you_mean(
                        &mapping.name,
                        catalog
                            .tools
                            .iter()
                            .filter(|tool| tool.upstream == mapping.upstream)
                            .map(|tool| tool.name.as_str())
                    )
                ),
                &[],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::checks::testing::{artifact, findings_with_catalog};

    #[test]
    fn a_mapping_the_catalog_lacks() {
        let text = artifact(
            "grants:\n  - to: { issuer: ci }\n    capabilities: [crm.contact.read]\n    using: crm-ro\n",
        );
        let found = findings_with_catalog(&text, Some(&[("crm", "other")]));
        assert_eq!(
            found,
            [
                (
                    "tool_not_in_catalog".to_owned(),
                    "/upstreams/0/tools/0/name".to_owned()
                ),
                ("catalog_tool_unmapped".to_owned(), "/upstreams/0".to_owned()),
            ]
        );
    }
}
